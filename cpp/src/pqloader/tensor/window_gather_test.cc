#include "pqloader/tensor/window_gather.h"

#include "pqloader/tensor/group_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

namespace pqloader {

namespace {

uint8_t ByteOf(int unit, int64_t row, size_t col, int64_t j) {
  return static_cast<uint8_t>(unit * 97 + row * 31 + col * 7 + j);
}

std::shared_ptr<const DecodedUnit> MakeUnit(int unit, int64_t rows,
                                            const std::vector<int64_t>& widths) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = rows;
  for (size_t c = 0; c < widths.size(); ++c) {
    ColumnData d;
    d.row_bytes = widths[c];
    d.row_shape = {widths[c]};
    std::string bytes(rows * widths[c], '\0');
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < widths[c]; ++j) bytes[r * widths[c] + j] = ByteOf(unit, r, c, j);
    }
    d.data = arrow::Buffer::FromString(bytes);
    u->columns.push_back(d);
  }
  return u;
}

std::vector<ColumnSpec> Specs(const std::vector<int64_t>& widths) {
  std::vector<ColumnSpec> specs;
  for (size_t c = 0; c < widths.size(); ++c) {
    ColumnSpec s;
    s.name = std::to_string(c);
    s.dtype = DType::kUInt8;
    s.row_shape = {widths[c]};
    specs.push_back(s);
  }
  return specs;
}

// Every value width the gather has a path for: 1/2/4/8/16 bytes (typed gathers, AVX2 for
// 4 and 8), other narrow widths, and rows wider than the scratch path takes.
const std::vector<int64_t> kWidths = {1, 2, 4, 8, 16, 12, 40, 100};

// The rows of `units` (unit u's rows after unit u-1's) in a seeded random order.
std::vector<RowRef> Shuffled(const std::vector<int64_t>& rows_per_unit, uint32_t seed) {
  std::vector<RowRef> rows;
  for (size_t u = 0; u < rows_per_unit.size(); ++u) {
    for (int64_t r = 0; r < rows_per_unit[u]; ++r) rows.push_back(RowRef{static_cast<int64_t>(u), r});
  }
  std::shuffle(rows.begin(), rows.end(), std::mt19937(seed));
  return rows;
}

// `rows` as a gather's index: each row counted across `units`.
std::shared_ptr<arrow::Buffer> Index(const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                                     const std::vector<RowRef>& rows) {
  std::vector<int32_t> first(units.size(), 0);
  for (size_t u = 1; u < units.size(); ++u) {
    first[u] = first[u - 1] + static_cast<int32_t>(units[u - 1]->num_rows);
  }
  std::string index(rows.size() * sizeof(int32_t), '\0');
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t at = first[rows[i].unit] + static_cast<int32_t>(rows[i].row);
    std::memcpy(&index[i * sizeof(int32_t)], &at, sizeof(at));
  }
  return arrow::Buffer::FromString(index);
}

}  // namespace

TEST(WindowGather, BatchesCutFromWindowsEqualBatchesGatheredOneByOne) {
  // Two windows of three units each (uneven unit sizes; the second window's units are
  // row-major blocks, as a unit from the cache or the decoder can be), gathered by two
  // threads at once; then every batch of the stream, including those that span both
  // windows, is compared byte by byte with AssembleBatch of the same rows.
  const std::vector<int64_t> sizes = {37, 50, 13};
  std::vector<std::shared_ptr<const DecodedUnit>> w0, w1;
  for (int u = 0; u < 3; ++u) {
    w0.push_back(MakeUnit(u, sizes[u], kWidths));
    w1.push_back(WithRowMajor(MakeUnit(3 + u, sizes[u], kWidths), 64, arrow::default_memory_pool())
                     .ValueOrDie());
  }
  ASSERT_NE(w1[0]->row_major, nullptr);
  const std::vector<RowRef> r0 = Shuffled(sizes, 1), r1 = Shuffled(sizes, 2);
  auto specs = Specs(kWidths);
  auto g0 = WindowGather::Make(specs, w0, Index(w0, r0), arrow::default_memory_pool()).ValueOrDie();
  // Window 1's rows in chunks (as the loader cuts them at batch boundaries).
  auto g1 = WindowGather::Make(specs, w1, Index(w1, r1), arrow::default_memory_pool(), {32, 64, 100})
                .ValueOrDie();
  for (const auto& g : {g0, g1}) {
    arrow::Status a, b;
    std::thread t([&] { a = g->Run(); });
    b = g->Run();
    t.join();
    ASSERT_TRUE(a.ok()) << a.ToString();
    ASSERT_TRUE(b.ok()) << b.ToString();
    EXPECT_EQ(g->num_rows(), 100);
  }
  // Once gathered, a window no longer holds its units.
  EXPECT_EQ(w0[0].use_count(), 1);
  const int64_t values = 100 * std::accumulate(kWidths.begin(), kWidths.end(), int64_t{0});
  EXPECT_GE(g0->bytes(), values);  // each column's rows 64-byte aligned in its chunk
  EXPECT_LT(g0->bytes(), values + 64 * static_cast<int64_t>(kWidths.size()));

  // The stream: window 0's rows (units 0..2), then window 1's (units 3..5), compared
  // with batches gathered from the same bytes, columnar (AssembleBatch takes one layout).
  std::vector<std::shared_ptr<const DecodedUnit>> all = w0;
  for (int u = 0; u < 3; ++u) all.push_back(MakeUnit(3 + u, sizes[u], kWidths));
  std::vector<RowRef> stream = r0;
  for (const RowRef& r : r1) stream.push_back(RowRef{r.unit + 3, r.row});
  const std::vector<int64_t> starts = {0, 100};
  for (int64_t batch : {1, 7, 32, 100}) {
    for (int64_t first = 0; first < 200; first += batch) {
      const int64_t last = std::min<int64_t>(200, first + batch);
      std::vector<std::shared_ptr<WindowGather>> windows;
      std::vector<int64_t> window_starts;
      for (size_t k = 0; k < 2; ++k) {
        if (first < starts[k] + 100 && last > starts[k]) {
          windows.push_back(k == 0 ? g0 : g1);
          window_starts.push_back(starts[k]);
        }
      }
      auto got = WindowBatch(specs, windows, window_starts, first, last,
                             arrow::default_memory_pool());
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      std::vector<RowRef> rows(stream.begin() + first, stream.begin() + last);
      auto want = AssembleBatch(specs, all, 0, rows, {}, arrow::default_memory_pool()).ValueOrDie();
      ASSERT_EQ((*got)->num_rows, last - first);
      for (size_t c = 0; c < kWidths.size(); ++c) {
        const auto& gc = (*got)->columns[c];
        const auto& wc = want->columns[c];
        EXPECT_EQ(gc.shape, wc.shape) << "column " << c;
        ASSERT_EQ(gc.data->size(), wc.data->size());
        ASSERT_TRUE(gc.data->Equals(*wc.data))
            << "batch " << batch << " first " << first << " column " << c;
      }
      // A batch inside one chunk of one window is a slice of it: nothing copied.
      auto chunk = [](int64_t p) { return std::min<int64_t>((p - 100) / 32, 2); };
      const bool one_chunk = windows.size() == 1 && (first < 100 || chunk(first) == chunk(last - 1));
      EXPECT_EQ((*got)->owned_bytes == 0, one_chunk) << first << " " << last;
    }
  }
}

namespace {

// Bytes held in memory, read on demand (as a cache entry's column is read from its
// file); `fail`: every read fails.
class StringBytes : public DeferredBytes {
 public:
  StringBytes(std::shared_ptr<const std::string> s, int64_t offset, int64_t size, bool fail)
      : s_(std::move(s)), offset_(offset), size_(size), fail_(fail) {}
  int64_t size() const override { return size_; }
  arrow::Status ReadInto(uint8_t* out) const override {
    if (fail_) return arrow::Status::IOError("cannot read 'entry.pqc'");
    std::memcpy(out, s_->data() + offset_, static_cast<size_t>(size_));
    return arrow::Status::OK();
  }
  std::shared_ptr<const DeferredBytes> Slice(int64_t offset, int64_t length) const override {
    return std::make_shared<StringBytes>(s_, offset_ + offset, length, fail_);
  }

 private:
  std::shared_ptr<const std::string> s_;
  int64_t offset_, size_;
  bool fail_;
};

// `unit` with every column's bytes deferred (not read until gathered).
std::shared_ptr<const DecodedUnit> Deferred(const DecodedUnit& unit, bool fail = false) {
  auto u = std::make_shared<DecodedUnit>(unit);
  for (ColumnData& c : u->columns) {
    auto bytes = std::make_shared<const std::string>(c.data->ToString());
    c.deferred = std::make_shared<StringBytes>(bytes, 0, static_cast<int64_t>(bytes->size()), fail);
    c.data = nullptr;
  }
  return u;
}

}  // namespace

TEST(WindowGather, ColumnsNotReadYetAreReadStraightIntoTheGather) {
  // One window of three units, the middle one with every column deferred (a cache
  // entry's columns left in its file): gathered, it equals the window of the same bytes
  // in memory, for every width (the scratch path and the wide rows' path).
  const std::vector<int64_t> sizes = {37, 50, 13};
  std::vector<std::shared_ptr<const DecodedUnit>> mem, mixed;
  for (int u = 0; u < 3; ++u) {
    mem.push_back(MakeUnit(u, sizes[u], kWidths));
    mixed.push_back(u == 1 ? Deferred(*mem.back()) : mem.back());
  }
  ASSERT_EQ(mixed[1]->columns[0].data, nullptr);
  const std::vector<RowRef> rows = Shuffled(sizes, 3);
  const auto specs = Specs(kWidths);
  auto want = WindowGather::Make(specs, mem, Index(mem, rows), arrow::default_memory_pool()).ValueOrDie();
  auto got = WindowGather::Make(specs, mixed, Index(mixed, rows), arrow::default_memory_pool()).ValueOrDie();
  ASSERT_TRUE(want->Run().ok());
  const arrow::Status st = got->Run();
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t c = 0; c < kWidths.size(); ++c) {
    ASSERT_TRUE(got->Rows(c, 0, 100)->Equals(*want->Rows(c, 0, 100))) << "column " << c;
  }
  // A read that fails is the gather's error (the batch's, which names its files).
  std::vector<std::shared_ptr<const DecodedUnit>> failing = {mem[0], Deferred(*mem[1], true),
                                                             mem[2]};
  auto bad = WindowGather::Make(specs, failing, Index(failing, rows), arrow::default_memory_pool()).ValueOrDie();
  const arrow::Status err = bad->Run();
  EXPECT_TRUE(err.IsIOError()) << err.ToString();
  EXPECT_NE(err.message().find("entry.pqc"), std::string::npos) << err.ToString();
}

TEST(WindowGather, AChunkGoesBackToThePoolWhenItsLastBatchIsDropped) {
  const std::vector<int64_t> sizes = {40, 40};
  std::vector<std::shared_ptr<const DecodedUnit>> units = {MakeUnit(0, 40, {4, 8}),
                                                           MakeUnit(1, 40, {4, 8})};
  arrow::ProxyMemoryPool pool(arrow::default_memory_pool());
  auto specs = Specs({4, 8});
  auto g = WindowGather::Make(specs, units, Index(units, Shuffled(sizes, 5)), &pool, {20, 40, 60, 80})
               .ValueOrDie();
  ASSERT_TRUE(g->Run().ok());
  EXPECT_EQ(pool.bytes_allocated(), g->bytes());
  const int64_t chunk = g->bytes() / 4;
  auto first = WindowBatch(specs, {g}, {0}, 0, 20, &pool).ValueOrDie();
  auto last = WindowBatch(specs, {g}, {0}, 60, 80, &pool).ValueOrDie();
  EXPECT_EQ(first->owned_bytes + last->owned_bytes, 0);
  g.reset();  // the window's other batches are done: chunks 1 and 2 go
  EXPECT_EQ(pool.bytes_allocated(), 2 * chunk);
  first.reset();
  EXPECT_EQ(pool.bytes_allocated(), chunk);
  EXPECT_FALSE(WindowGather::Make(specs, units, Index(units, Shuffled(sizes, 5)), &pool, {50, 40, 80}).ok());
  EXPECT_FALSE(WindowGather::Make(specs, units, Index(units, Shuffled(sizes, 5)), &pool, {20, 79}).ok());
}

TEST(WindowGather, RefusesRaggedAndReshapedColumns) {
  auto a = MakeUnit(0, 4, {4});
  auto b = MakeUnit(1, 4, {8});
  auto r = WindowGather::Make(Specs({4}), {a, b}, Index({a, b}, {{0, 0}, {1, 0}}), arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("different shapes"), std::string::npos);

  auto ragged = std::make_shared<DecodedUnit>(*MakeUnit(0, 3, {4}));
  const int64_t off[] = {0, 4, 4, 12};
  ragged->columns[0].offsets =
      arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(off), sizeof(off)));
  auto rr = WindowGather::Make(Specs({4}), {ragged}, Index({ragged}, {{0, 0}}), arrow::default_memory_pool());
  ASSERT_FALSE(rr.ok());
  EXPECT_NE(rr.status().message().find("rows of different lengths"), std::string::npos);
}

TEST(WindowGather, ColumnsOfFourAndEightBytesGatheredInGroupsEqualTheRowsOneByOne) {
  // 14 columns of 4 bytes and 7 of 8 among others: a group of 8 and one of 4, the rest
  // one by one; units of uneven sizes (tails of the 8- and 4-row blocks), the output in
  // chunks; then every column of every position compared with AssembleBatch of the same
  // rows. Again with the middle unit's columns not read yet (a cache hit's): those are
  // read straight into the per-column scratch, so nothing is grouped.
  std::vector<int64_t> widths;
  for (int i = 0; i < 21; ++i) widths.push_back(i % 3 == 2 ? 8 : 4);
  widths.insert(widths.begin() + 5, {1, 16});
  const std::vector<int64_t> sizes = {37, 50, 13};
  std::vector<std::shared_ptr<const DecodedUnit>> mem, mixed;
  for (int u = 0; u < 3; ++u) {
    mem.push_back(MakeUnit(u, sizes[u], widths));
    mixed.push_back(u == 1 ? Deferred(*mem.back()) : mem.back());
  }
  const std::vector<RowRef> rows = Shuffled(sizes, 9);
  const auto specs = Specs(widths);
  auto want = AssembleBatch(specs, mem, 0, rows, {}, arrow::default_memory_pool()).ValueOrDie();
  for (const auto& [units, tasks] : {std::pair{mem, 13u}, std::pair{mixed, 23u}}) {
    auto g = WindowGather::Make(specs, units, Index(units, rows), arrow::default_memory_pool(),
                                {32, 64, 100}).ValueOrDie();
    // 23 columns: in memory, a group of 8 of the 4-byte ones and one of 4 of the 8-byte ones.
    if (__builtin_cpu_supports("avx2")) {
      EXPECT_EQ(g->num_tasks(), tasks);
    }
    arrow::Status a, b;
    std::thread t([&] { a = g->Run(); });
    b = g->Run();
    t.join();
    ASSERT_TRUE(a.ok() && b.ok()) << a.ToString() << b.ToString();
    for (size_t c = 0; c < widths.size(); ++c) {
      std::string got(100 * widths[c], '\0');
      g->CopyRows(c, 0, 100, reinterpret_cast<uint8_t*>(got.data()));
      EXPECT_EQ(got, want->columns[c].data->ToString()) << "column " << c;
    }
  }
}

// The group gather prefetches kGatherPrefetch positions ahead (on into positions past
// its own when the caller has them) and streams its stores, a cache line of each column
// at a time, when every column is misaligned from 64 bytes alike (copying the first
// positions one by one up to the alignment): aligned, misaligned alike (a mixture's rows
// start anywhere in a batch) and unlike (also alike from 32 bytes but not from 64), both
// widths, past the prefetch distance, with a tail of fewer than 64 / W positions, and a
// piece of a few positions: each equals a scalar gather.
template <int W>
void CheckGroupGather(const std::vector<int64_t>& misalign, int64_t n) {
  constexpr int64_t K = kGroupBytes / W;
  const int64_t rows = 3000, indexed = n + 200;
  std::vector<uint8_t> staging(rows * kGroupBytes);
  std::mt19937 rng(W + n);
  for (auto& b : staging) b = static_cast<uint8_t>(rng());
  std::vector<int32_t> index(indexed);
  for (auto& i : index) i = static_cast<int32_t>(rng() % rows);
  std::vector<std::vector<uint8_t>> out(K, std::vector<uint8_t>(n * W + 128));
  std::vector<uint8_t*> cols(K);
  for (int64_t j = 0; j < K; ++j) {
    auto p = reinterpret_cast<uintptr_t>(out[j].data());
    cols[j] = out[j].data() + ((64 - p % 64) % 64) + misalign[j % misalign.size()];
  }
  GatherGroupRows<W>(staging.data(), index.data(), n, cols.data(), indexed);
  StreamFence();
  for (int64_t j = 0; j < K; ++j) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(cols[j] + i * W, staging.data() + index[i] * kGroupBytes + j * W, W), 0)
          << "width " << W << ", column " << j << ", position " << i << " of " << n
          << ", misaligned by " << misalign[j % misalign.size()];
    }
  }
}

TEST(WindowGather, GroupGatherStreamedOrNotEqualsAScalarGather) {
  if (!HasAvx2()) GTEST_SKIP() << "the group gather is AVX2 only";
  const std::vector<std::vector<int64_t>> misaligns = {{0},    {4},     {8},     {24},
                                                       {32},   {56},    {0, 8},  {4, 12},
                                                       {0, 32}, {8, 40}};
  for (int64_t n : {kGatherPrefetch * 8 + 3, kGatherPrefetch * 8 + 15, int64_t{21}, int64_t{5},
                    int64_t{1}}) {
    for (const auto& m : misaligns) {
      CheckGroupGather<4>(m, n);
      CheckGroupGather<8>(m, n);
    }
  }
}

TEST(WindowGather, RefusesAnIndexPastItsUnitsRows) {
  auto a = MakeUnit(0, 4, {4});
  auto b = MakeUnit(1, 4, {4});
  for (int32_t bad : {8, -1}) {
    std::vector<int32_t> ix = {0, 7, bad};
    auto index = arrow::Buffer::FromString(
        std::string(reinterpret_cast<const char*>(ix.data()), ix.size() * sizeof(int32_t)));
    auto r = WindowGather::Make(Specs({4}), {a, b}, index, arrow::default_memory_pool());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("out of its 8 rows"), std::string::npos)
        << r.status().ToString();
  }
  EXPECT_FALSE(WindowGather::Make(Specs({4}), {a, b}, arrow::Buffer::FromString("abc"),
                                  arrow::default_memory_pool()).ok());
}

TEST(WindowStore, MakesEachWindowOnceSharesItAndWakesWaitersOnCancel) {
  auto unit = MakeUnit(0, 64, kWidths);
  auto specs = Specs(kWidths);
  std::vector<RowRef> rows = Shuffled({64}, 5);
  std::atomic<int> made{0};
  auto make = [&]() -> arrow::Result<std::shared_ptr<WindowGather>> {
    ++made;
    return WindowGather::Make(specs, {unit}, Index({unit}, rows), arrow::default_memory_pool());
  };
  WindowStore store(std::map<int64_t, int64_t>{{0, 3}});
  // The batch that has the units makes it; two others wait for it.
  std::vector<std::shared_ptr<WindowGather>> got(3);
  std::vector<std::thread> threads;
  for (int i = 1; i < 3; ++i) {
    threads.emplace_back([&, i] { got[i] = store.Get(0, nullptr).ValueOrDie(); });
  }
  got[0] = store.Get(0, make).ValueOrDie();
  for (auto& t : threads) t.join();
  EXPECT_EQ(made.load(), 1);
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
  // The store lets go of the window with its last batch (its memory is a whole window).
  std::weak_ptr<WindowGather> window = got[0];
  got.clear();
  for (int i = 0; i < 2; ++i) store.Release(0);
  EXPECT_FALSE(window.expired());  // one batch still to read it
  store.Release(0);
  EXPECT_TRUE(window.expired());

  // A batch waiting for a window whose maker never comes is woken by Cancel().
  WindowStore stopped(std::map<int64_t, int64_t>{{1, 1}});
  arrow::Status waited;
  std::thread waiter([&] { waited = stopped.Get(1, nullptr).status(); });
  stopped.Cancel();
  waiter.join();
  EXPECT_TRUE(waited.IsCancelled()) << waited.ToString();
}

TEST(WindowStore, AFailedMakeIsEveryBatchsError) {
  WindowStore store(std::map<int64_t, int64_t>{{0, 2}});
  auto fail = []() -> arrow::Result<std::shared_ptr<WindowGather>> {
    return arrow::Status::Invalid("no");
  };
  EXPECT_EQ(store.Get(0, fail).status().message(), "no");
  EXPECT_EQ(store.Get(0, nullptr).status().message(), "no");
}

}  // namespace pqloader
