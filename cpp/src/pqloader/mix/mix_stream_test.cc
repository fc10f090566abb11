#include "pqloader/mix/mix_stream.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include "pqloader/loader.h"
#include "pqloader/mix/mix_draws.h"
#include "pqloader/tensor/buffer_pool.h"
#include "pqloader/test_util.h"

namespace pqloader {
namespace {

struct Sources {
  std::vector<std::unique_ptr<Loader>> loaders;
  std::vector<MixSource> mix;
};

// Two shuffled sources of 23 and 9 rows (ids from 0 and from 1000), batch sizes 5 and 4.
Sources MakeSources(int workers, bool shuffle = true) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/a.parquet", {10, 13}, 0);
  testing::WriteIdFile(dir + "/b.parquet", {4, 5}, 1000);
  Sources s;
  int64_t batch = 5;
  uint64_t seed = 31;
  for (const char* f : {"/a.parquet", "/b.parquet"}) {
    LoaderOptions o;
    o.plan.batch_size = batch--;
    o.plan.shuffle = shuffle;
    o.plan.seed = seed++;
    o.num_workers = workers;
    s.loaders.push_back(Loader::Make({dir + f}, o).ValueOrDie());
    s.mix.push_back(MixSource{s.loaders.back().get(), o.plan.seed, ""});
  }
  return s;
}

// The ids of a source's epoch read under `seed`.
std::vector<int64_t> SourceEpoch(Loader* loader, uint64_t seed, int64_t epoch) {
  loader->set_seed(seed);
  EXPECT_TRUE(loader->StartEpoch(epoch).ok());
  return testing::DrainIds(loader);
}

// Every batch's ids and source indices.
void Drain(MixStream* stream, std::vector<std::vector<int64_t>>* ids,
           std::vector<int64_t>* sources) {
  while (true) {
    std::shared_ptr<arrow::Buffer> from;
    auto batch = stream->Next(std::chrono::nanoseconds::max(), nullptr, &from).ValueOrDie();
    if (batch == nullptr) return;
    const auto* id = reinterpret_cast<const int64_t*>(batch->columns[0].data->data());
    ids->emplace_back(id, id + batch->num_rows);
    const auto* f = reinterpret_cast<const int64_t*>(from->data());
    sources->insert(sources->end(), f, f + batch->num_rows);
  }
}

MixStreamOptions Options(int64_t epoch, int64_t first_batch) {
  MixStreamOptions o;
  o.seed = 5;
  o.cumulative = CumulativeWeights({1, 1});
  o.batch_size = 6;
  o.epoch = epoch;
  o.first_batch = first_batch;
  o.samples = 60;  // more than either source: both wrap
  o.num_batches = 10;
  return o;
}

// The sources of a batch's rows: the draws of its positions, grouped by source.
std::vector<int64_t> Grouped(const std::vector<int32_t>& draws, size_t batch_size) {
  std::vector<int64_t> out(draws.begin(), draws.end());
  for (size_t b = 0; b < out.size(); b += batch_size) {
    std::stable_sort(out.begin() + b, out.begin() + std::min(out.size(), b + batch_size));
  }
  return out;
}

// Batch b holds the rows its positions draw, grouped by source (source 0's first), each
// source's rows the next ones of its own epoch, then of its wraps under WrapSeed; the
// loaders get their seeds back.
TEST(MixStream, BatchesOutsideTheEpochBadWeightsAndOneLoaderTwiceAreRefused) {
  // Only Python checked them: first_batch -3 gave 13 batches of other rows, 11 none;
  // weights of NaN (of sum 0), or one Loader twice, failed at the first batch as
  // "started or stopped by another caller".
  auto s = MakeSources(1);
  for (int64_t first : {int64_t{-3}, int64_t{11}}) {
    EXPECT_FALSE(MixStream::Make(s.mix, Options(0, first), RecyclingPool::Global()).ok()) << first;
  }
  auto o = Options(0, 0);
  o.samples = -1;
  EXPECT_FALSE(MixStream::Make(s.mix, o, RecyclingPool::Global()).ok());
  o = Options(0, 0);
  o.num_batches = 11;  // 60 samples in batches of 6
  EXPECT_FALSE(MixStream::Make(s.mix, o, RecyclingPool::Global()).ok());
  for (const std::vector<double>& cumulative :
       {CumulativeWeights({0, 0}), std::vector<double>{-1, 1}, std::vector<double>{0.8, 0.3},
        std::vector<double>{0.5, 0.9}}) {
    o = Options(0, 0);
    o.cumulative = cumulative;
    EXPECT_FALSE(MixStream::Make(s.mix, o, RecyclingPool::Global()).ok());
  }
  auto twice = s.mix;
  twice[1] = twice[0];
  EXPECT_FALSE(MixStream::Make(twice, Options(0, 0), RecyclingPool::Global()).ok());
  EXPECT_TRUE(MixStream::Make(s.mix, Options(0, 10), RecyclingPool::Global()).ok());
}

TEST(MixStream, RowsFollowTheDrawsAndEachSourcesOwnEpochsAcrossWraps) {
  auto s = MakeSources(2);
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> from;
  {
    auto stream = MixStream::Make(s.mix, Options(3, 0), RecyclingPool::Global()).ValueOrDie();
    EXPECT_FALSE(stream->in_place());  // the sources wrap: copied
    Drain(stream.get(), &ids, &from);
  }
  for (int i = 0; i < 2; ++i) {  // given back by the stream
    EXPECT_EQ(s.loaders[i]->options().plan.seed, 31u + i);
  }
  ASSERT_EQ(ids.size(), 10u);
  std::vector<int32_t> draws(60);
  DrawSources(5, 3, 0, 60, CumulativeWeights({1, 1}), draws.data());
  const std::vector<int64_t> grouped = Grouped(draws, 6);
  ASSERT_EQ(from, grouped);
  std::vector<std::vector<int64_t>> expect(2);
  for (int i = 0; i < 2; ++i) {
    for (int wrap = 0; wrap < 8; ++wrap) {
      auto e = SourceEpoch(s.loaders[i].get(), WrapSeed(s.mix[i].seed, wrap), 3);
      expect[i].insert(expect[i].end(), e.begin(), e.end());
    }
  }
  std::vector<size_t> at(2, 0);
  int64_t p = 0;
  for (const auto& batch : ids) {
    for (int64_t id : batch) {
      const auto s_i = static_cast<size_t>(grouped[p++]);
      EXPECT_EQ(id, expect[s_i][at[s_i]++]) << "position " << p - 1;
    }
  }
}

// A stream started at batch k gives the batches k.. of the whole epoch, for any worker
// count.
TEST(MixStream, AStreamStartedLaterGivesTheRestOfTheEpoch) {
  std::vector<std::vector<int64_t>> full;
  std::vector<int64_t> from;
  {
    auto s = MakeSources(1);
    auto stream = MixStream::Make(s.mix, Options(0, 0), RecyclingPool::Global()).ValueOrDie();
    Drain(stream.get(), &full, &from);
  }
  for (int64_t first : {1, 4, 9}) {
    auto s = MakeSources(3);
    std::vector<std::vector<int64_t>> tail;
    std::vector<int64_t> f;
    auto stream = MixStream::Make(s.mix, Options(0, first), RecyclingPool::Global()).ValueOrDie();
    Drain(stream.get(), &tail, &f);
    EXPECT_EQ(tail, std::vector<std::vector<int64_t>>(full.begin() + first, full.end())) << first;
  }
}

// With then_next_epoch, the sources start epoch + 1 while the stream ends (after taking
// every row it still draws, here from the second batch on, across their wraps); the next
// epoch's stream keeps those runs: the same batches as streams made one by one.
TEST(MixStream, TheNextEpochStartedWhileOneEndsGivesTheSameBatches) {
  std::vector<std::vector<int64_t>> expect, got;
  std::vector<int64_t> from;
  for (int64_t epoch : {3, 4}) {
    auto s = MakeSources(2);
    auto stream = MixStream::Make(s.mix, Options(epoch, 0), RecyclingPool::Global()).ValueOrDie();
    Drain(stream.get(), &expect, &from);
  }
  auto s = MakeSources(2);
  for (int64_t epoch : {3, 4}) {
    MixStreamOptions o = Options(epoch, 0);
    o.then_next_epoch = epoch == 3;
    auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
    Drain(stream.get(), &got, &from);
  }
  EXPECT_EQ(got, expect);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(s.loaders[i]->stats().epochs_started_ahead, 1) << i;
    EXPECT_EQ(s.loaders[i]->options().plan.seed, 31u + i);  // given back
  }
}

// Kept draws (MixStreamOptions::kept_draws) are read, not drawn again: the epoch's own
// draws give the same batches (from its first batch, from a later one, and starting the
// next epoch early, which counts the rest of the epoch's draws); other bytes make other
// sources, and positions past the kept ones are drawn.
TEST(MixStream, KeptDrawsAreReadInsteadOfDrawn) {
  std::vector<int32_t> draws(60);
  DrawSources(5, 3, 0, 60, CumulativeWeights({1, 1}), draws.data());
  auto own = std::make_shared<const std::vector<uint8_t>>(draws.begin(), draws.end());
  for (int64_t first : {0, 4}) {
    for (bool then_next : {false, true}) {
      std::vector<std::vector<int64_t>> expect, got;
      std::vector<int64_t> from;
      for (bool kept : {false, true}) {
        auto s = MakeSources(2);
        MixStreamOptions o = Options(3, first);
        o.then_next_epoch = then_next;
        if (kept) o.kept_draws = own;
        auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
        Drain(stream.get(), kept ? &got : &expect, &from);
      }
      EXPECT_EQ(got, expect) << "first batch " << first << ", then_next " << then_next;
    }
  }
  std::vector<uint8_t> other(30);
  for (size_t p = 0; p < other.size(); ++p) other[p] = p % 3 == 0 ? 1 : 0;
  auto s = MakeSources(2);
  MixStreamOptions o = Options(3, 0);
  o.kept_draws = std::make_shared<const std::vector<uint8_t>>(other);
  auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> from;
  Drain(stream.get(), &ids, &from);
  ASSERT_EQ(from.size(), 60u);
  const std::vector<int64_t> kept = Grouped(std::vector<int32_t>(other.begin(), other.end()), 6);
  EXPECT_EQ(std::vector<int64_t>(from.begin(), from.begin() + 30), kept);
  EXPECT_EQ(std::vector<int64_t>(from.begin() + 30, from.end()),
            Grouped(std::vector<int32_t>(draws.begin() + 30, draws.end()), 6));
}

// A stream stopped before its end stops the next epoch it started: the next stream
// starts its own.
TEST(MixStream, TheNextEpochStartedEarlyIsDroppedIfTheStreamStopsBeforeItsEnd) {
  std::vector<std::vector<int64_t>> expect, got;
  std::vector<int64_t> from;
  {
    auto s = MakeSources(1);
    auto stream = MixStream::Make(s.mix, Options(1, 0), RecyclingPool::Global()).ValueOrDie();
    Drain(stream.get(), &expect, &from);
  }
  auto s = MakeSources(1);
  {
    MixStreamOptions o = Options(0, 0);
    o.then_next_epoch = true;
    auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
    for (int b = 0; b < 9; ++b) ASSERT_NE(stream->Next().ValueOrDie(), nullptr);
  }
  auto stream = MixStream::Make(s.mix, Options(1, 0), RecyclingPool::Global()).ValueOrDie();
  Drain(stream.get(), &got, &from);
  EXPECT_EQ(got, expect);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(s.loaders[i]->stats().epochs_started_ahead, 0) << i;
}

// A source started or stopped by another caller while a stream reads it is not read
// again (its end would look like the end of its epoch: rows repeated), and the stream's
// Stop() leaves the new run alone.
TEST(MixStream, ASourceStartedOrStoppedByAnotherCallerIsNeitherReadNorStopped) {
  auto s = MakeSources(1);
  const std::vector<int64_t> own = SourceEpoch(s.loaders[0].get(), 31, 0);
  MixStreamOptions o = Options(0, 0);
  o.write_in_place = false;
  auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
  ASSERT_NE(stream->Next().ValueOrDie(), nullptr);
  s.loaders[0]->Stop();
  arrow::Status st;
  for (int b = 1; b < 10 && st.ok(); ++b) st = stream->Next().status();
  EXPECT_TRUE(st.IsCancelled()) << st.ToString();
  EXPECT_NE(st.message().find("source 0 was started or stopped by another caller"), std::string::npos);
  // Source 0 started by its own user; then the stream stops: the run goes on.
  s.loaders[0]->set_seed(31);
  ASSERT_TRUE(s.loaders[0]->StartEpoch(0).ok());
  stream->Stop();
  EXPECT_EQ(testing::DrainIds(s.loaders[0].get()), own);
}

// The documented formula (docs/determinism.md), pinned: SplitMix64 of seed + wrap * phi.
TEST(MixStream, WrapSeedIsSplitMix64OfTheSeedAndWrap) {
  EXPECT_EQ(WrapSeed(5, 0), 5u);
  EXPECT_EQ(WrapSeed(12, 1), 10682531704454680323ull);
  EXPECT_EQ(WrapSeed(~uint64_t{0}, 3), 4048727598324417001ull);
}

// A source of weight 0 is never drawn, so never started (its engine reads nothing).
TEST(MixStream, ASourceOfWeightZeroIsNotStarted) {
  auto s = MakeSources(1);
  MixStreamOptions o = Options(0, 0);
  o.cumulative = CumulativeWeights({1, 0});
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> from;
  {
    auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
    Drain(stream.get(), &ids, &from);
  }
  EXPECT_EQ(from, std::vector<int64_t>(60, 0));
  EXPECT_EQ(s.loaders[1]->stats().units_read, 0);
  EXPECT_GT(s.loaders[0]->stats().units_read, 0);
}

TEST(MixStream, RefusesSourcesWithOtherColumns) {
  auto s = MakeSources(1);
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/c.parquet", {3}, 0);
  LoaderOptions o;
  o.dataset.columns.columns = {"x"};
  auto other = Loader::Make({dir}, o).ValueOrDie();
  s.mix[1] = MixSource{other.get(), 1, ""};
  auto made = MixStream::Make(s.mix, Options(0, 0), RecyclingPool::Global());
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("other columns"), std::string::npos) << made.status();
}

TEST(MixStream, RefusesPackedBatchesBeyondInt32CuSeqlens) {
  // The mixture makes its batches' cu_seqlens again over its own batch_size blocks: 2048
  // blocks of 2^20 tokens wrapped their int32 offsets (each source's own batches fit).
  const std::string path = testing::MakeTempDir() + "/tokens.parquet";
  testing::WriteTokensFile(path, {1, 2, 3, 4}, 2);
  std::vector<std::unique_ptr<Loader>> loaders;
  std::vector<MixSource> mix;
  for (uint64_t seed : {1, 2}) {
    LoaderOptions o;
    o.dataset.columns.columns = {"tokens"};
    o.pack_column = "tokens";
    o.pack.seq_len = int64_t{1} << 20;
    o.plan.batch_size = 1;
    o.plan.seed = seed;
    loaders.push_back(Loader::Make({path}, o).ValueOrDie());
    mix.push_back(MixSource{loaders.back().get(), seed, ""});
  }
  MixStreamOptions o = Options(0, 0);
  o.batch_size = 2048;
  o.samples = o.batch_size * o.num_batches;
  auto refused = MixStream::Make(mix, o, RecyclingPool::Global());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cu_seqlens"), std::string::npos) << refused.status();
  o.batch_size = 2047;
  o.samples = o.batch_size * o.num_batches;
  EXPECT_TRUE(MixStream::Make(mix, o, RecyclingPool::Global()).ok());
}

// Sources that gather their shuffle windows whole write the batches in place (no source
// wraps, the epoch from its first batch): the same batches as copied, for any worker
// count; afterwards the loaders give their own batches again.
// Unshuffled sources (no windows: each of their batches is assembled into the
// mixture's) likewise.
TEST(MixStream, SourcesWriteTheBatchesInPlaceAsACopyWouldBe) {
  for (int workers : {1, 3, -1, -3}) {
    std::vector<std::vector<int64_t>> copied, written;
    std::vector<int64_t> from_copied, from_written;
    auto s = MakeSources(std::abs(workers), workers > 0);
    ASSERT_EQ(s.loaders[0]->gathers_windows(), workers > 0);
    ASSERT_TRUE(s.loaders[0]->writes_in_place());
    MixStreamOptions o = Options(0, 0);
    o.cumulative = CumulativeWeights({3, 1});
    o.samples = 23;  // batches of 6, the last of 5
    o.num_batches = 4;
    for (bool in_place : {false, true}) {
      o.write_in_place = in_place;
      auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
      ASSERT_EQ(stream->in_place(), in_place);
      Drain(stream.get(), in_place ? &written : &copied, in_place ? &from_written : &from_copied);
    }
    EXPECT_EQ(written, copied) << workers;
    EXPECT_EQ(from_written, from_copied);
    ASSERT_EQ(written.size(), 4u);
    EXPECT_EQ(written.back().size(), 5u);
    for (int i = 0; i < 2; ++i) {  // each loader's own epoch, whole, again
      EXPECT_EQ(SourceEpoch(s.loaders[i].get(), s.mix[i].seed, 0).size(), i == 0 ? 23u : 9u);
    }
  }
}

// An epoch of more samples than its sources hold runs out of a source: it is copied,
// found without counting each batch's draws (2^62 samples allocated a count per batch
// and source, std::bad_alloc, before the first batch). Its first batches are those of a
// short epoch (the draws are a function of the position).
TEST(MixStream, AnEpochLongerThanItsSourcesIsCopiedWithoutPlanningEachBatch) {
  auto s = MakeSources(1);
  std::vector<std::vector<int64_t>> short_ids, long_ids;
  std::vector<int64_t> short_from;
  {
    auto short_stream = MixStream::Make(s.mix, Options(0, 0), RecyclingPool::Global()).ValueOrDie();
    Drain(short_stream.get(), &short_ids, &short_from);
  }
  ASSERT_EQ(short_ids.size(), 10u);
  MixStreamOptions o = Options(0, 0);
  o.samples = int64_t{1} << 62;
  o.num_batches = o.samples / o.batch_size;
  auto stream = MixStream::Make(s.mix, o, RecyclingPool::Global()).ValueOrDie();
  EXPECT_FALSE(stream->in_place());
  for (size_t b = 0; b < short_ids.size(); ++b) {
    auto batch = stream->Next().ValueOrDie();
    ASSERT_NE(batch, nullptr);
    const auto* id = reinterpret_cast<const int64_t*>(batch->columns[0].data->data());
    long_ids.emplace_back(id, id + batch->num_rows);
  }
  EXPECT_EQ(long_ids, short_ids);
}

// A column of one name and width but another dtype in a source (float32 "x" against
// int32 "x") is not written in place, where its bytes would be taken as they are: the
// copy refuses it at the first batch, naming the column.
TEST(MixStream, SourcesWithAnotherDtypeOfOneWidthAreNotWrittenInPlace) {
  auto s = MakeSources(1);
  const std::string dir = testing::MakeTempDir();
  {
    auto schema = arrow::schema({arrow::field("id", arrow::int64(), false),
                                 arrow::field("x", arrow::int32(), false)});
    arrow::Int64Builder ids;
    arrow::Int32Builder xs;
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(ids.Append(5000 + i).ok());
      ASSERT_TRUE(xs.Append(i).ok());
    }
    auto table = arrow::Table::Make(schema, {ids.Finish().ValueOrDie(), xs.Finish().ValueOrDie()});
    auto out = arrow::io::FileOutputStream::Open(dir + "/c.parquet").ValueOrDie();
    ASSERT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, 10).ok());
    ASSERT_TRUE(out->Close().ok());
  }
  LoaderOptions o;
  o.plan.batch_size = 4;
  o.plan.shuffle = true;
  auto other = Loader::Make({dir + "/c.parquet"}, o).ValueOrDie();
  ASSERT_TRUE(other->gathers_windows());
  s.mix[1] = MixSource{other.get(), 1, ""};
  MixStreamOptions opts = Options(0, 0);
  opts.samples = 20;
  opts.num_batches = 4;
  auto stream = MixStream::Make(s.mix, opts, RecyclingPool::Global()).ValueOrDie();
  EXPECT_FALSE(stream->in_place());
  auto batch = stream->Next();
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.status().message().find("'x'"), std::string::npos) << batch.status();
}

// Packed sources mixed: the mixture's cu_seqlens are made again over its own batch, a
// boundary at every block's start (a block whose document began in the block before,
// segment 0 after a segment 0 too) and wherever document_ids change inside a block.
TEST(MixStream, PackedSourcesMixedHaveABoundaryAtEveryBlocksStart) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {9, 3, 7, 2}, 2);  // documents over several blocks
  testing::WriteTokensFile(dir + "/b.parquet", {6, 10, 1}, 2);
  std::vector<std::unique_ptr<Loader>> loaders;
  std::vector<MixSource> mix;
  uint64_t seed = 1;
  for (const char* f : {"/a.parquet", "/b.parquet"}) {
    LoaderOptions o;
    o.dataset.columns.columns = {"tokens"};
    o.pack_column = "tokens";
    o.pack.seq_len = 4;
    o.pack.has_eos = true;
    o.pack.eos = 99;
    o.plan.batch_size = 2;
    o.plan.seed = seed;
    loaders.push_back(Loader::Make({dir + f}, o).ValueOrDie());
    mix.push_back(MixSource{loaders.back().get(), seed++, ""});
  }
  MixStreamOptions o = Options(0, 0);
  o.batch_size = 3;
  o.num_batches = 4;
  o.samples = 12;
  auto stream = MixStream::Make(mix, o, RecyclingPool::Global()).ValueOrDie();
  std::map<std::string, int> at;
  const auto& specs = loaders[0]->specs();  // the mixture's columns
  for (size_t c = 0; c < specs.size(); ++c) at[specs[c].name] = static_cast<int>(c);
  ASSERT_EQ(at.count("document_ids"), 1u);
  ASSERT_EQ(at.count("cu_seqlens"), 1u);
  int64_t batches = 0, continued = 0;
  while (true) {
    auto next = stream->Next(std::chrono::nanoseconds::max(), nullptr, nullptr);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    if (*next == nullptr) break;
    const Batch& b = **next;
    ++batches;
    const int64_t L = 4, total = b.num_rows * L;
    const auto* seg = b.columns[at["document_ids"]].data->data_as<int64_t>();
    std::vector<int32_t> want = {0};
    for (int64_t t = 1; t < total; ++t) {
      if (t % L == 0 && seg[t] == seg[t - 1]) ++continued;
      if (t % L == 0 || seg[t] != seg[t - 1]) want.push_back(static_cast<int32_t>(t));
    }
    want.push_back(static_cast<int32_t>(total));
    const BatchColumn& cu = b.columns[at["cu_seqlens"]];
    ASSERT_EQ(cu.shape.size(), 1u);
    const auto* c = cu.data->data_as<int32_t>();
    EXPECT_EQ(std::vector<int32_t>(c, c + cu.shape[0]), want) << "batch " << b.index;
  }
  EXPECT_EQ(batches, 4);
  EXPECT_GT(continued, 0) << "no block whose first segment index equals the last one's";
}

// Token lists padded per batch (lists= Pad) in each source: the mixture pads its own
// batches again as one Loader pads a batch of those rows: to the longest row, rounded up
// to multiple_of, each row's values on the collate's side (left here), with its value.
TEST(MixStream, ListsPaddedPerBatchArePaddedAgainOverTheMixedRows) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {5, 3, 7, 2}, 2);
  testing::WriteTokensFile(dir + "/b.parquet", {6, 1, 9}, 2);
  std::vector<std::unique_ptr<Loader>> loaders;
  std::vector<MixSource> mix;
  uint64_t seed = 1;
  int64_t batch = 2;
  for (const char* f : {"/a.parquet", "/b.parquet"}) {
    LoaderOptions o;
    o.dataset.columns.columns = {"tokens"};
    ColumnCollate pad;
    pad.mode = ColumnCollate::Mode::kPad;
    pad.multiple_of = 4;
    pad.pad_value = -1;
    pad.pad_left = true;
    o.lists["tokens"] = pad;
    o.plan.batch_size = batch++;
    o.plan.seed = seed;
    loaders.push_back(Loader::Make({dir + f}, o).ValueOrDie());
    mix.push_back(MixSource{loaders.back().get(), seed++, ""});
  }
  MixStreamOptions o = Options(0, 0);
  o.batch_size = 3;
  o.num_batches = 3;
  o.samples = 9;
  auto stream = MixStream::Make(mix, o, RecyclingPool::Global()).ValueOrDie();
  std::map<std::string, int> at;
  const auto& specs = loaders[0]->specs();  // the mixture's columns
  for (size_t c = 0; c < specs.size(); ++c) at[specs[c].name] = static_cast<int>(c);
  ASSERT_EQ(at.count("tokens"), 1u);
  ASSERT_EQ(at.count("tokens_length"), 1u);
  int64_t batches = 0;
  while (true) {
    auto next = stream->Next(std::chrono::nanoseconds::max(), nullptr, nullptr);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    if (*next == nullptr) break;
    const Batch& b = **next;
    ++batches;
    const BatchColumn& tok = b.columns[at["tokens"]];
    const auto* len = b.columns[at["tokens_length"]].data->data_as<int64_t>();
    int64_t longest = 0;
    for (int64_t r = 0; r < b.num_rows; ++r) longest = std::max(longest, len[r]);
    const int64_t L = (longest + 3) / 4 * 4;
    ASSERT_EQ(tok.shape, (std::vector<int64_t>{b.num_rows, L})) << "batch " << b.index;
    const auto* v = tok.data->data_as<int32_t>();
    for (int64_t r = 0; r < b.num_rows; ++r) {
      for (int64_t j = 0; j < L; ++j) {
        const int64_t k = j - (L - len[r]);  // the value's index in its row, < 0 in the padding
        EXPECT_EQ(v[r * L + j], k < 0 ? -1 : k) << "batch " << b.index << " row " << r << " at " << j;
      }
    }
  }
  EXPECT_EQ(batches, 3);
}

}  // namespace
}  // namespace pqloader
