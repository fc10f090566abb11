#include "pqloader/mix/mix_stream.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include <arrow/buffer.h>

#include "pqloader/error.h"
#include "pqloader/loader.h"
#include "pqloader/mix/mix_draws.h"
#include "pqloader/pack/pack_plan.h"
#include "pqloader/plan/epoch_plan.h"
#include "pqloader/tensor/window_gather.h"
#include "pqloader/util/exact_text.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

using FixedRows = TransformPlan::FixedRows;

namespace {

// "mixture source 'web'", or "mixture source 1" for one without a name.
std::string SourceName(const MixSource& source, size_t i) {
  return source.name.empty() ? "mixture source " + std::to_string(i)
                             : "mixture source '" + source.name + "'";
}

}  // namespace

// The blocks of an epoch's batches written in place, and where each source's rows of
// each batch go (see mix_stream.h). Made once before the sources start; the blocks are
// made by the first source writing rows of a batch and taken by the stream.
class MixStream::InPlace {
 public:
  // starts[s][b]: source s's rows in batches before b (b in [0, num_batches]).
  // The epoch it writes, as a stream's options name it (for the next stream to adopt it).
  struct Epoch {
    uint64_t seed = 0;
    std::vector<double> cumulative;
    int64_t epoch = 0, batch_size = 1, samples = 0, num_batches = 0;
    bool operator==(const Epoch& o) const {
      return seed == o.seed && cumulative == o.cumulative && epoch == o.epoch &&
             batch_size == o.batch_size && samples == o.samples && num_batches == o.num_batches;
    }
  };
  InPlace(Epoch epoch, std::vector<std::vector<int64_t>> starts, std::vector<FixedRows> columns,
          arrow::MemoryPool* pool)
      : epoch_(std::move(epoch)), batch_size_(epoch_.batch_size), samples_(epoch_.samples),
        starts_(std::move(starts)), columns_(std::move(columns)), pool_(pool) {
    for (const FixedRows& c : columns_) row_bytes_.push_back(c.bytes());
  }
  // Each column's dtype and row shape.
  const std::vector<FixedRows>& columns() const { return columns_; }
  const Epoch& epoch() const { return epoch_; }

  // A source's sink: its loader's window gathers or batch assemblies write through it.
  class Sink : public WindowSink {
   public:
    Sink(std::shared_ptr<InPlace> state, size_t source) : state_(std::move(state)), source_(source) {}
    arrow::Result<std::vector<WindowGather::Chunk>> Chunks(
        int64_t first, int64_t last, const std::vector<int64_t>& row_bytes) override {
      return state_->Chunks(source_, first, last, row_bytes);
    }

    const std::shared_ptr<InPlace>& state() const { return state_; }
    size_t source() const { return source_; }

   private:
    std::shared_ptr<InPlace> state_;
    size_t source_;
  };

  // Chunks for source s's positions [first, last) of the epoch: a piece of each batch's
  // block where its rows of that batch go (after the rows of sources before it), then,
  // for positions past the epoch's batches, a block of their own (gathered, unused).
  arrow::Result<std::vector<WindowGather::Chunk>> Chunks(size_t s, int64_t first, int64_t last,
                                                         const std::vector<int64_t>& row_bytes) {
    if (row_bytes != row_bytes_) {
      return arrow::Status::Invalid("a mixture source's rows are not as wide as the mixture's columns");
    }
    const std::vector<int64_t>& st = starts_[s];
    const auto num_batches = static_cast<int64_t>(st.size()) - 1;
    int64_t all = 0;
    for (int64_t w : row_bytes_) all += w;
    std::vector<WindowGather::Chunk> out;
    int64_t p = first;
    int64_t b = std::upper_bound(st.begin(), st.end(), p) - st.begin() - 1;  // st[b] <= p
    for (; p < last && b < num_batches; ++b) {
      const int64_t end = std::min(last, st[b + 1]);
      if (end <= p) continue;
      WindowGather::Chunk chunk;
      chunk.first = p - first;
      chunk.last = end - first;
      int64_t row = p - st[b];
      for (size_t o = 0; o < s; ++o) row += starts_[o][b + 1] - starts_[o][b];
      {
        MutexLock lock(mu_);
        auto it = blocks_.find(b);
        if (it == blocks_.end()) {
          ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> block,
                                arrow::AllocateBuffer(std::max<int64_t>(1, BlockBytes(Count(b))), 64, pool_));
          it = blocks_.emplace(b, std::move(block)).first;
        }
        chunk.block = it->second;
      }
      const std::vector<int64_t> at = ColumnAt(Count(b));
      for (size_t c = 0; c < row_bytes_.size(); ++c) chunk.column_offset.push_back(at[c] + row * row_bytes_[c]);
      chunk.bytes = (end - p) * all;
      out.push_back(std::move(chunk));
      p = end;
    }
    if (p < last) {
      WindowGather::Chunk chunk;
      chunk.first = p - first;
      chunk.last = last - first;
      chunk.column_offset = ColumnAt(last - p);
      ARROW_ASSIGN_OR_RAISE(chunk.block, arrow::AllocateBuffer(std::max<int64_t>(1, BlockBytes(last - p)), 64, pool_));
      out.push_back(std::move(chunk));
    }
    return out;
  }

  // Batch b's block (every source has gathered its rows of it), and where each
  // column's rows start in it.
  arrow::Result<std::shared_ptr<arrow::Buffer>> Take(int64_t b, std::vector<int64_t>* column_at) {
    MutexLock lock(mu_);
    auto it = blocks_.find(b);
    if (it == blocks_.end()) return arrow::Status::UnknownError("mixture batch ", b, " was not gathered");
    std::shared_ptr<arrow::Buffer> block = std::move(it->second);
    blocks_.erase(it);
    *column_at = ColumnAt(Count(b));
    return block;
  }

  int64_t Count(int64_t b) const { return std::min(batch_size_, samples_ - b * batch_size_); }
  const std::vector<int64_t>& row_bytes() const { return row_bytes_; }

 private:
  static int64_t Aligned(int64_t n) { return (n + 63) / 64 * 64; }
  std::vector<int64_t> ColumnAt(int64_t rows) const {
    std::vector<int64_t> at;
    int64_t bytes = 0;
    for (int64_t w : row_bytes_) {
      at.push_back(bytes);
      bytes += Aligned(rows * w);
    }
    return at;
  }
  int64_t BlockBytes(int64_t rows) const {
    int64_t bytes = 0;
    for (int64_t w : row_bytes_) bytes += Aligned(rows * w);
    return bytes;
  }

  const Epoch epoch_;
  const int64_t batch_size_, samples_;
  const std::vector<std::vector<int64_t>> starts_;
  const std::vector<FixedRows> columns_;
  std::vector<int64_t> row_bytes_;  // of each column's row
  arrow::MemoryPool* pool_;
  Mutex mu_;
  std::map<int64_t, std::shared_ptr<arrow::Buffer>> blocks_ PQ_GUARDED_BY(mu_);
};

// Reads of a source's epoch in a row that may give no row before the source counts as
// empty (see Fill).
constexpr int64_t kMaxEmptyWraps = 64;

uint64_t WrapSeed(uint64_t seed, int64_t wrap) {
  if (wrap == 0) return seed;
  uint64_t z = seed + static_cast<uint64_t>(wrap) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

arrow::Result<std::unique_ptr<MixStream>> MixStream::Make(std::vector<MixSource> sources,
                                                          MixStreamOptions options,
                                                          arrow::MemoryPool* pool) {
  if (sources.empty()) return arrow::Status::Invalid("a mixture needs at least one source");
  if (options.cumulative.size() != sources.size()) {
    return arrow::Status::Invalid("a mixture needs one weight per source");
  }
  if (options.batch_size < 1) return arrow::Status::Invalid("batch_size must be positive");
  // What the Python front checks, for a C++ caller: a batch outside the epoch gave extra
  // batches of other rows (first_batch < 0) or none, silently; weights that do not rise
  // from 0 to 1 (NaN from weights of sum 0) or one Loader given twice failed at the first
  // batch as "started or stopped by another caller".
  constexpr int64_t kMaxSamples = int64_t{1} << 62;
  if (options.samples < 0 || options.samples > kMaxSamples || options.num_batches < 0 ||
      options.num_batches > (options.samples + options.batch_size - 1) / options.batch_size) {
    return arrow::Status::Invalid("a mixture's epoch of ", options.samples, " samples (at most 2^62) "
                                  "in batches of ", options.batch_size, " cannot have ",
                                  options.num_batches, " batches");
  }
  if (options.first_batch < 0 || options.first_batch > options.num_batches) {
    return arrow::Status::Invalid("batch ", options.first_batch, " is outside the mixture's epoch ",
                                  options.epoch, ", which has ", options.num_batches, " batches");
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].loader == nullptr) {
      return arrow::Status::Invalid(SourceName(sources[i], i), " has no loader");
    }
    for (size_t j = 0; j < i; ++j) {
      if (sources[j].loader == sources[i].loader) {
        return arrow::Status::Invalid(SourceName(sources[i], i), " is the Loader of ",
                                      SourceName(sources[j], j), ": each source needs its own Loader");
      }
    }
    const double before = i > 0 ? options.cumulative[i - 1] : 0.0;
    const double at = options.cumulative[i];
    if (!(at >= before && at <= 1.0) || (i + 1 == sources.size() && at != 1.0)) {
      return arrow::Status::Invalid("a mixture's cumulative weights must rise from 0 to 1 "
                                    "(CumulativeWeights of finite weights >= 0, not all 0), got ",
                                    ExactText(at), " at source ", i);
    }
  }
  std::unique_ptr<MixStream> stream(new MixStream());
  stream->options_ = std::move(options);
  stream->pool_ = pool;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].loader->stacks()) {
      return arrow::Status::Invalid(SourceName(sources[i], i),
                                    " stacks columns (stack=): a mixture's sources may not");
    }
  }
  stream->specs_ = sources[0].loader->specs();
  for (size_t i = 1; i < sources.size(); ++i) {
    const auto& specs = sources[i].loader->specs();
    bool same = specs.size() == stream->specs_.size();
    for (size_t c = 0; same && c < specs.size(); ++c) {
      same = specs[c].name == stream->specs_[c].name && specs[c].kind == stream->specs_[c].kind;
    }
    if (!same) {
      return arrow::Status::Invalid(SourceName(sources[i], i), " gives other columns (names or kinds) than ",
                                    SourceName(sources[0], 0));
    }
  }
  ARROW_RETURN_NOT_OK(stream->FindListColumns(sources));
  ARROW_RETURN_NOT_OK(stream->FindPackedColumns(sources));
  const MixStreamOptions& o = stream->options_;
  stream->next_batch_ = o.first_batch;
  std::vector<int64_t> counts(sources.size(), 0);
  if (o.first_batch > 0) {
    counts = stream->CountSources(0, std::min(o.first_batch * o.batch_size, o.samples));
  }
  // The stream is complete before any source starts: Stop() (and so the destructor)
  // gives every source back its seed even if one fails to start.
  for (auto& source : sources) {
    SourceState s;
    s.source = source;
    s.source_batch_size = std::max<int64_t>(1, source.loader->options().plan.batch_size);
    stream->sources_.push_back(std::move(s));
  }
  // Each source at its own workers and max_inflight_bytes (see mix_stream.h): a shuffle
  // window is as large in a source of small weight as in a large one, and a share of
  // one budget below two windows left a source decoding its next window only once the
  // last was consumed (padded token rows: 0.62 -> 0.75 M rows/s mixed); workers split
  // by weight (one each of two, here) left a core idle whenever the source of weight
  // 0.5 fell behind (images: 0.80-0.88x of one loader against 0.96-1.06x).
  if (o.write_in_place && o.first_batch == 0) {
    // The sources' runs of this epoch, started early by the stream before, may write it
    // in place already: adopted if every source's sink is one state of this epoch.
    InPlace::Epoch mine{o.seed, o.cumulative, o.epoch, o.batch_size, o.samples, o.num_batches};
    std::shared_ptr<InPlace> adopted;
    for (size_t i = 0; i < stream->sources_.size(); ++i) {
      auto* sink = dynamic_cast<InPlace::Sink*>(stream->sources_[i].source.loader->window_sink().get());
      if (sink == nullptr || sink->source() != i || !(sink->state()->epoch() == mine) ||
          (i > 0 && sink->state() != adopted)) {
        adopted = nullptr;
        break;
      }
      adopted = sink->state();
    }
    stream->in_place_ = adopted;
  }
  if (stream->in_place_ == nullptr) {
    if (o.first_batch == 0) {  // a resumed epoch is copied
      ARROW_ASSIGN_OR_RAISE(stream->in_place_,
                            stream->MakeInPlace(o.epoch, o.samples, o.num_batches, o.kept_draws.get()));
    }
    stream->SetSinks(stream->in_place_);
  }
  int64_t inflight = 1;
  for (const SourceState& s : stream->sources_) {
    inflight = std::max(inflight, s.source.loader->options().max_inflight_bytes);
  }
  stream->hold_bytes_ = inflight / 4;
  for (size_t i = 0; i < stream->sources_.size(); ++i) {
    SourceState& s = stream->sources_[i];
    const double share = o.cumulative[i] - (i > 0 ? o.cumulative[i - 1] : 0.0);
    if (!(share > 0)) continue;  // never drawn: never started
    s.started = true;
    // Where the source is after counts[i] rows: its epoch read again (wraps) as often
    // as those rows span. A packed source's blocks may differ from wrap to wrap (their
    // seeds differ) when there are several ranks, so each wrap's rows are its own.
    auto rows_of = [&](int64_t wrap) {
      return s.source.loader->batch_rows(o.epoch, WrapSeed(s.source.seed, wrap));
    };
    // (A wrap with no whole batch, possible for a packed source with drop_last on
    // several ranks, is passed over as Fill passes over it.)
    int64_t wrap = 0, row = counts[i];
    for (int64_t empty = 0;;) {
      const int64_t rows = rows_of(wrap);
      if (rows > 0 ? row < rows : (row == 0 || ++empty > kMaxEmptyWraps)) break;
      if (rows > 0) empty = 0;
      row -= rows;
      ++wrap;
    }
    ARROW_RETURN_NOT_OK(stream->Open(s, wrap, row / s.source_batch_size));
    s.skip = row % s.source_batch_size;
  }
  return stream;
}

MixStream::~MixStream() { Stop(); }

void MixStream::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // Sources already on the next epoch keep it if this epoch was read to its end.
  const bool keep = next_started_ && next_batch_ >= options_.num_batches;
  for (SourceState& s : sources_) {
    s.held.clear();
    s.buffered = 0;
    // A source someone else started or stopped since is theirs now: left alone.
    if (s.run_calls >= 0 && s.source.loader->run_calls() != s.run_calls) continue;
    if (!keep) s.source.loader->Stop();
    // The next epoch's runs, kept, keep the sinks they were started with.
    if (!keep) s.source.loader->set_window_sink(nullptr);
    s.source.loader->set_seed(s.source.seed);  // the loader as it was made
  }
}

arrow::Result<std::shared_ptr<MixStream::InPlace>> MixStream::MakeInPlace(
    int64_t epoch, int64_t samples, int64_t num_batches, const std::vector<uint8_t>* kept) const {
  const MixStreamOptions& o = options_;
  std::shared_ptr<InPlace> none;
  if (!o.write_in_place || num_batches <= 0) return none;
  for (size_t c = 0; c < specs_.size(); ++c) {
    if (lists_[c].kind != ListColumn::Kind::kNone) return none;
  }
  // Every column of fixed rows, of one dtype and row shape in every source (the copy
  // checks each batch; written in place, bytes would be taken as they are).
  std::vector<FixedRows> fixed;
  for (size_t i = 0; i < sources_.size(); ++i) {
    Loader* loader = sources_[i].source.loader;
    if (!(o.cumulative[i] - (i > 0 ? o.cumulative[i - 1] : 0.0) > 0)) continue;  // never read
    if (!loader->writes_in_place()) return none;
    const auto& theirs = loader->fixed_outputs();
    if (theirs.size() != specs_.size()) return none;
    const bool first = fixed.empty();
    for (size_t c = 0; c < specs_.size(); ++c) {
      if (!theirs[c].has_value()) return none;
      if (first) {
        fixed.push_back(*theirs[c]);
      } else if (theirs[c]->dtype != fixed[c].dtype || theirs[c]->shape != fixed[c].shape) {
        return none;
      }
    }
  }
  if (fixed.size() != specs_.size()) return none;
  std::vector<int64_t> row_bytes;
  int64_t all_row_bytes = 0;
  for (const FixedRows& f : fixed) {
    row_bytes.push_back(f.bytes());
    all_row_bytes += row_bytes.back();
  }
  for (size_t i = 0; i < sources_.size(); ++i) {
    Loader* loader = sources_[i].source.loader;
    // A source's shuffle window (or, without windows, the batches its pipeline holds
    // ready: prefetch_batches) spans about its rows / its share of the mixture's
    // positions, whose batches' blocks its gather or assembly makes whole: within its
    // own bound, or copied (a source of small weight would make far more than it holds).
    const double share = o.cumulative[i] - (i > 0 ? o.cumulative[i - 1] : 0.0);
    if (!(share > 0)) continue;
    // (In double: batch_size x prefetch_batches, each up to 2^62, overflowed.)
    double window = loader->gathers_windows()
                        ? 0
                        : static_cast<double>(loader->options().plan.batch_size) *
                              static_cast<double>(loader->options().prefetch_batches);
    if (loader->gathers_windows()) {
      const EpochPlan& plan = loader->first_plan();
      for (int64_t w = 0; w < plan.num_windows(); ++w) {
        const auto [a, z] = plan.WindowRowRange(w);
        window = std::max(window, static_cast<double>(z - a));
      }
    }
    if (window / share * static_cast<double>(all_row_bytes) >
        static_cast<double>(loader->options().max_inflight_bytes)) {
      return none;
    }
  }
  // More positions than the sources drawn hold rows make one of them run out, whatever
  // the draws: not written in place, known before counting each batch's draws (an
  // epoch of samples_per_epoch=2**62 allocated a count per batch and source and raised
  // std::bad_alloc before its first batch; 10**9 samples drew every one first, ~10 s).
  const int64_t drawn = num_batches > samples / o.batch_size ? samples : num_batches * o.batch_size;
  int64_t held = 0;  // (below 2 * drawn: no overflow)
  for (size_t i = 0; i < sources_.size() && held < drawn; ++i) {
    if (!(o.cumulative[i] - (i > 0 ? o.cumulative[i - 1] : 0.0) > 0)) continue;  // never read
    const MixSource& source = sources_[i].source;
    held += std::min(source.loader->batch_rows(epoch, source.seed), drawn);
  }
  if (drawn > held) return none;
  // Each source's rows before each batch; a source that would run out (and so read its
  // epoch again) is not written in place.
  const auto n = static_cast<size_t>(num_batches);
  std::vector<std::vector<int64_t>> starts(sources_.size(), std::vector<int64_t>(n + 1, 0));
  for (size_t b = 0; b < n; ++b) {
    const auto first = static_cast<int64_t>(b) * o.batch_size;
    const std::vector<int64_t> counts =
        CountSources(first, std::min(first + o.batch_size, samples), epoch, kept);
    for (size_t i = 0; i < sources_.size(); ++i) starts[i][b + 1] = starts[i][b] + counts[i];
  }
  for (size_t i = 0; i < sources_.size(); ++i) {
    const MixSource& source = sources_[i].source;
    if (starts[i][n] > source.loader->batch_rows(epoch, source.seed)) return none;
  }
  return std::make_shared<InPlace>(
      InPlace::Epoch{o.seed, o.cumulative, epoch, o.batch_size, samples, num_batches},
      std::move(starts), std::move(fixed), pool_);
}

void MixStream::SetSinks(const std::shared_ptr<InPlace>& state) {
  for (size_t i = 0; i < sources_.size(); ++i) {
    sources_[i].source.loader->set_window_sink(
        state != nullptr ? std::make_shared<InPlace::Sink>(state, i) : nullptr);
  }
}

void MixStream::SetNextEpoch(int64_t samples, int64_t num_batches,
                             std::shared_ptr<const std::vector<uint8_t>> kept_draws) {
  next_samples_ = samples;
  next_num_batches_ = num_batches;
  next_kept_ = std::move(kept_draws);
}

arrow::Status MixStream::Open(SourceState& s, int64_t wrap, int64_t first_batch) {
  // Rows still held from the previous wrap stay: they come first.
  s.wrap = wrap;
  s.skip = 0;
  return StartSource(s, WrapSeed(s.source.seed, wrap), options_.epoch, first_batch);
}

arrow::Status MixStream::StartSource(SourceState& s, uint64_t seed, int64_t epoch,
                                     int64_t first_batch) {
  s.source.loader->set_seed(seed);
  arrow::Status st = s.source.loader->StartEpoch(epoch, first_batch, false, nullptr);
  s.run_calls = s.source.loader->run_calls();
  return st;
}

arrow::Status MixStream::CheckOwned(size_t i) const {
  const SourceState& s = sources_[i];
  if (s.source.loader->run_calls() == s.run_calls) return arrow::Status::OK();
  return arrow::Status::Cancelled(
      SourceName(sources_[i].source, i), " was started or stopped by another caller while the mixture "
      "read it (iterated by itself, set_epoch, load_state_dict or close(), or another "
      "mixture): this mixture iterator stopped; iterate the mixture again");
}

arrow::Status MixStream::Fill(size_t i, int64_t need, std::chrono::nanoseconds timeout,
                              bool* timed_out) {
  SourceState& s = sources_[i];
  // Wraps opened here in a row that gave no batch; whether the run now read gave one (the
  // run this call found is taken to have).
  int64_t empty = 0;
  bool gave = true;
  if (next_started_ && s.buffered < need) {  // its loader reads the next epoch now
    return arrow::Status::Invalid(SourceName(sources_[i].source, i), " holds ", s.buffered,
                                  " rows where the rest of the epoch draws ", need);
  }
  while (s.buffered < need) {
    ARROW_RETURN_NOT_OK(s.failed);  // taken ahead, its run failed after the rows held
    ARROW_RETURN_NOT_OK(CheckOwned(i));
    bool late = false;
    auto next = s.source.loader->Next(timeout, &late);
    ARROW_RETURN_NOT_OK(CheckOwned(i));  // stopped by another caller meanwhile
    ARROW_ASSIGN_OR_RAISE(auto batch, std::move(next));
    if (late) {
      if (timed_out != nullptr) *timed_out = true;
      return arrow::Status::OK();
    }
    if (batch == nullptr) {  // the source's epoch ended: its next wrap
      if (in_place_ != nullptr) {  // MakeInPlace counted every row each source gives
        return arrow::Status::UnknownError(SourceName(sources_[i].source, i), " ran out of rows in an epoch written in place");
      }
      // A packed source's wrap (another seed) may hold no whole batch on this rank
      // while others do; one that gives nothing wrap after wrap has no rows.
      if (!gave && ++empty >= (packed_ ? kMaxEmptyWraps : 1)) {
        return MakeError(ErrorKind::kInvalidData, SourceName(sources_[i].source, i), " has no rows",
                         packed_ ? " (none in " + std::to_string(empty) + " reads of its epoch in a row)" : "");
      }
      ARROW_RETURN_NOT_OK(Open(s, s.wrap + 1, 0));
      gave = false;
      continue;
    }
    gave = true;
    empty = 0;
    const int64_t skip = std::min(s.skip, batch->num_rows);
    s.skip -= skip;
    if (batch->num_rows > skip) {
      s.buffered += batch->num_rows - skip;
      s.held.push_back(Held{std::move(batch), skip});
    }
  }
  return arrow::Status::OK();
}

arrow::Result<std::shared_ptr<Batch>> MixStream::Next(std::chrono::nanoseconds timeout,
                                                      bool* timed_out,
                                                      std::shared_ptr<arrow::Buffer>* sources) {
  if (timed_out != nullptr) *timed_out = false;
  if (timed_out == nullptr && timeout != std::chrono::nanoseconds::max()) {
    // A timeout returns nullptr, as the epoch's end does (see Loader::Next).
    return arrow::Status::Invalid("Next() with a timeout needs timed_out (a timeout and the "
                                  "epoch's end both return nullptr)");
  }
  if (stopped_) return arrow::Status::Invalid("this mixture stream was stopped");
  const MixStreamOptions& o = options_;
  if (next_batch_ >= o.num_batches) return nullptr;
  const int64_t start = next_batch_ * o.batch_size;
  const int64_t count = std::min(o.batch_size, o.samples - start);
  if (count <= 0) return nullptr;
  {
    bool late = false;
    ARROW_RETURN_NOT_OK(MaybeStartNextEpoch(start, timeout, &late));
    if (late) {
      if (timed_out != nullptr) *timed_out = true;
      return nullptr;
    }
  }
  if (!drawn_) {
    draws_.resize(static_cast<size_t>(count));
    const std::vector<uint8_t>* kept = o.kept_draws.get();
    if (kept != nullptr && start + count <= static_cast<int64_t>(kept->size())) {
      for (int64_t i = 0; i < count; ++i) draws_[i] = (*kept)[start + i];
    } else {
      DrawSources(o.seed, o.epoch, start, count, o.cumulative, draws_.data());
    }
    need_.assign(sources_.size(), 0);
    for (int32_t d : draws_) ++need_[d];
    // The batch's rows grouped by source (see mix_stream.h).
    size_t r = 0;
    for (size_t i = 0; i < sources_.size(); ++i) {
      for (int64_t k = 0; k < need_[i]; ++k) draws_[r++] = static_cast<int32_t>(i);
    }
    drawn_ = true;
  }
  for (size_t i = 0; i < sources_.size(); ++i) {
    bool late = false;
    ARROW_RETURN_NOT_OK(Fill(i, need_[i], timeout, &late));
    if (late) {
      if (timed_out != nullptr) *timed_out = true;
      return nullptr;
    }
  }
  ARROW_ASSIGN_OR_RAISE(auto batch, Assemble(count));
  row_bytes_seen_ = std::max(row_bytes_seen_, (batch->owned_bytes + count - 1) / count);
  if (sources != nullptr) {
    ARROW_ASSIGN_OR_RAISE(auto buffer, arrow::AllocateBuffer(count * 8, pool_));
    auto* out = reinterpret_cast<int64_t*>(buffer->mutable_data());
    for (int64_t r = 0; r < count; ++r) out[r] = draws_[r];
    *sources = std::move(buffer);
  }
  // The rows placed leave the sources' buffers.
  for (size_t i = 0; i < sources_.size(); ++i) {
    SourceState& s = sources_[i];
    int64_t left = need_[i];
    s.buffered -= left;
    while (left > 0) {
      Held& h = s.held.front();
      const int64_t take = std::min(left, h.batch->num_rows - h.used);
      h.used += take;
      left -= take;
      if (h.used == h.batch->num_rows) s.held.pop_front();
    }
  }
  drawn_ = false;
  ++next_batch_;
  return batch;
}

std::vector<int64_t> MixStream::CountSources(int64_t start, int64_t end, int64_t epoch,
                                             const std::vector<uint8_t>* kept) const {
  const MixStreamOptions& o = options_;
  if (kept == nullptr || end > static_cast<int64_t>(kept->size())) {
    return CountDraws(o.seed, epoch, start, end, o.cumulative);
  }
  std::vector<int64_t> counts(o.cumulative.size(), 0);
  for (int64_t p = start; p < end; ++p) ++counts[(*kept)[p]];
  return counts;
}

arrow::Status MixStream::MaybeStartNextEpoch(int64_t start, std::chrono::nanoseconds timeout,
                                             bool* timed_out) {
  const MixStreamOptions& o = options_;
  if (!o.then_next_epoch || next_started_ || next_start_failed_ || row_bytes_seen_ == 0 ||
      (o.samples - start) > hold_bytes_ / row_bytes_seen_) {  // (a product overflowed at 2^62 samples)
    return arrow::Status::OK();
  }
  // Whether the next epoch can be written in place is known once the caller has given
  // its length (SetNextEpoch, half way through): until the last batch, wait for it.
  if (o.write_in_place && next_samples_ < 0 && next_batch_ + 1 < o.num_batches) {
    return arrow::Status::OK();
  }
  // Every row the rest of the epoch draws, held now (in the sources' batches).
  // (Not the positions after the last batch that drop_last leaves out: no source reads
  // them, and one may have no rows for them.)
  if (rest_.empty()) rest_ = CountSources(start, std::min(o.samples, o.num_batches * o.batch_size));
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (!sources_[i].started) continue;
    arrow::Status filled = Fill(i, rest_[i], timeout, timed_out);
    if (!filled.ok() && !filled.IsCancelled()) {
      // The error belongs to the batch that draws the failing rows (the batches before it
      // are delivered, as without the early start): kept, and no early start.
      sources_[i].failed = std::move(filled);
      next_start_failed_ = true;
      return arrow::Status::OK();
    }
    ARROW_RETURN_NOT_OK(filled);  // taken over or stopped
    if (timed_out != nullptr && *timed_out) return arrow::Status::OK();  // goes on later
  }
  // The sources' epoch e + 1 from its first batch, under their own seeds, as the next
  // stream starts them (wrap 0), written in place if it can be (SetNextEpoch); their
  // held rows stay.
  std::shared_ptr<InPlace> next;
  if (next_samples_ >= 0) {
    ARROW_ASSIGN_OR_RAISE(next, MakeInPlace(o.epoch + 1, next_samples_, next_num_batches_, next_kept_.get()));
  }
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].started) ARROW_RETURN_NOT_OK(CheckOwned(i));
  }
  SetSinks(next);
  for (SourceState& s : sources_) {
    if (!s.started) continue;
    ARROW_RETURN_NOT_OK(StartSource(s, s.source.seed, o.epoch + 1, 0));
  }
  next_started_ = true;
  return arrow::Status::OK();
}

arrow::Status MixStream::FindListColumns(const std::vector<MixSource>& sources) {
  using Part = TransformPlan::Part;
  using Kind = ListColumn::Kind;
  lists_.assign(specs_.size(), ListColumn{});
  // Output column j's list role in source i (kNone unless collated per batch).
  auto roles = [&](size_t i) {
    std::vector<ListColumn> out(specs_.size());
    const TransformPlan& plan = sources[i].loader->transforms();
    const auto& parts = plan.output_sources();
    if (parts.size() != specs_.size()) return out;  // no companions: nothing collated
    for (size_t j = 0; j < parts.size(); ++j) {
      const auto [src, part] = parts[j];
      if (part == Part::kValues || static_cast<size_t>(src) >= plan.collate().size()) continue;
      const ColumnCollate& c = plan.collate()[static_cast<size_t>(src)];
      size_t values = 0;  // the companion's values column
      while (values < parts.size() && !(parts[values].first == src && parts[values].second == Part::kValues)) {
        ++values;
      }
      if (values == parts.size()) continue;
      if (part == Part::kLength && c.mode == ColumnCollate::Mode::kPad && c.length <= 0) {
        out[values] = {Kind::kPadded, j, c};
      } else if (part == Part::kOffsets && c.mode == ColumnCollate::Mode::kRagged) {
        out[values] = {Kind::kRaggedValues, j, c};
        out[j] = {Kind::kRaggedOffsets, values, c};
      }
    }
    return out;
  };
  lists_ = roles(0);
  for (size_t i = 1; i < sources.size(); ++i) {
    const std::vector<ListColumn> other = roles(i);
    for (size_t j = 0; j < specs_.size(); ++j) {
      const ListColumn &a = lists_[j], &b = other[j];
      const bool same = a.kind == b.kind && (a.kind == Kind::kNone || (a.companion == b.companion &&
                                                                      a.collate.ToString() == b.collate.ToString()));
      if (!same) {
        auto describe = [](const ListColumn& l) {
          return l.kind == Kind::kNone ? std::string("as it is (or to a fixed length)") : l.collate.ToString();
        };
        return arrow::Status::Invalid("mixture column '", specs_[j].name, "': ",
                                      SourceName(sources[i], i), " batches it ", describe(b), ", ",
                                      SourceName(sources[0], 0), " ", describe(a),
                                      "; give the sources the same lists= for it");
      }
    }
  }
  return arrow::Status::OK();
}

void MixStream::FillListColumn(size_t c, int64_t count, uint8_t* out, int64_t length,
                               uint8_t* offsets_out) {
  const ListColumn& list = lists_[c];
  const InterleavePlan& plan = plan_;
  const BatchColumn& first = piece_batch_[0]->columns[c];
  int64_t element = DTypeSize(first.dtype);  // bytes of one element of a row's first dimension
  for (size_t d = list.kind == ListColumn::Kind::kPadded ? 2 : 1; d < first.shape.size(); ++d) {
    element *= first.shape[d];
  }
  if (list.kind == ListColumn::Kind::kPadded) {
    // Each row's valid values (after the source's truncation), padded to `length` on the
    // collate's side; the source batch's own padding is not copied.
    std::vector<uint8_t> padding(static_cast<size_t>(length * element), 0);
    if (list.collate.pad_value != 0) {
      const int64_t elem = DTypeSize(first.dtype);
      for (int64_t k = 0; k < length * element / elem; ++k) {
        StoreScalar(first.dtype, list.collate.pad_value, padding.data() + k * elem);
      }
    }
    const int64_t out_row = length * element;
    for (int64_t r = 0; r < count; ++r, out += out_row) {
      const auto k = static_cast<size_t>(plan.piece[r]);
      const BatchColumn& in = piece_batch_[k]->columns[c];
      const int64_t row = piece_first_[k] + plan.row(r);
      const int64_t in_length = in.shape.size() > 1 ? in.shape[1] : 0;
      const int64_t valid = piece_batch_[k]->columns[list.companion].data->data_as<int64_t>()[row];
      const int64_t kept_bytes = valid * element, pad_bytes = out_row - kept_bytes;
      const uint8_t* from = in.data->data() + (row * in_length + (list.collate.pad_left ? in_length - valid : 0)) * element;
      if (kept_bytes > 0) std::memcpy(out + (list.collate.pad_left ? pad_bytes : 0), from, kept_bytes);
      if (pad_bytes > 0) std::memcpy(list.collate.pad_left ? out : out + kept_bytes, padding.data(), pad_bytes);
    }
    return;
  }
  // Ragged: each row's values one after another, and their offsets (from 0).
  auto* off = reinterpret_cast<int64_t*>(offsets_out);
  off[0] = 0;
  for (int64_t r = 0; r < count; ++r) {
    const auto k = static_cast<size_t>(plan.piece[r]);
    const int64_t row = piece_first_[k] + plan.row(r);
    const int64_t* in_off = piece_batch_[k]->columns[list.companion].data->data_as<int64_t>();
    const int64_t bytes = (in_off[row + 1] - in_off[row]) * element;
    if (bytes > 0) {
      std::memcpy(out + off[r] * element, piece_batch_[k]->columns[c].data->data() + in_off[row] * element,
                  static_cast<size_t>(bytes));
    }
    off[r + 1] = off[r] + in_off[row + 1] - in_off[row];
  }
}

arrow::Result<std::shared_ptr<Batch>> MixStream::Assemble(int64_t count) {
  if (in_place_ != nullptr) {  // the sources wrote the batch: its columns are its block's
    std::vector<int64_t> at;
    ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> block, in_place_->Take(next_batch_, &at));
    auto batch = std::make_shared<Batch>();
    batch->epoch = options_.epoch;
    batch->index = next_batch_;
    batch->num_rows = count;
    batch->owned_bytes = block->size();
    for (size_t c = 0; c < specs_.size(); ++c) {
      const FixedRows& rows = in_place_->columns()[c];
      BatchColumn out;
      out.kind = ColumnKind::kTensor;
      out.dtype = rows.dtype;
      out.shape = {count};
      out.shape.insert(out.shape.end(), rows.shape.begin(), rows.shape.end());
      out.data = arrow::SliceBuffer(block, at[c], count * in_place_->row_bytes()[c]);
      batch->columns.push_back(std::move(out));
    }
    return batch;
  }
  // Pieces: the held batches that give rows to this batch, in order per source.
  std::vector<int64_t>& piece_rows = piece_rows_;
  std::vector<int32_t>& piece_sources = piece_sources_;
  std::vector<const Batch*>& piece_batch = piece_batch_;
  std::vector<int64_t>& piece_first = piece_first_;
  piece_rows.clear();
  piece_sources.clear();
  piece_batch.clear();
  piece_first.clear();
  for (size_t i = 0; i < sources_.size(); ++i) {
    int64_t left = need_[i];
    for (const Held& h : sources_[i].held) {
      if (left <= 0) break;
      const int64_t take = std::min(left, h.batch->num_rows - h.used);
      piece_rows.push_back(take);
      piece_sources.push_back(static_cast<int32_t>(i));
      piece_batch.push_back(h.batch.get());
      piece_first.push_back(h.used);
      left -= take;
    }
  }
  plan_.Reset(piece_rows, piece_sources, draws_.data(), count);
  const InterleavePlan& plan = plan_;
  auto batch = std::make_shared<Batch>();
  batch->epoch = options_.epoch;
  batch->index = next_batch_;
  batch->num_rows = count;
  // Fixed-width columns share one block from the pool (64-byte aligned slices): one
  // allocation per batch, of a size the pool recycles.
  constexpr int64_t kAlign = 64;
  std::vector<int64_t>& row_bytes = row_bytes_;
  std::vector<int64_t>& at = at_;
  row_bytes.assign(specs_.size(), 0);
  at.assign(specs_.size(), 0);
  extent_.assign(specs_.size(), 0);
  int64_t block_bytes = 0;
  for (size_t c = 0; c < specs_.size(); ++c) {
    if (packed_ && c == cu_column_) continue;  // made from the mixed batch's document_ids
    const BatchColumn& first = piece_batch[0]->columns[c];
    for (size_t k = 0; k < piece_batch.size(); ++k) {
      const BatchColumn& in = piece_batch[k]->columns[c];
      // Rows padded per batch differ in length between source batches: their inner
      // dimensions must agree.
      const size_t from = lists_[c].kind == ListColumn::Kind::kPadded ? 2 : 1;
      const bool same = in.kind == first.kind &&
                        (in.kind != ColumnKind::kTensor ||
                         (in.dtype == first.dtype && in.offsets == nullptr && first.offsets == nullptr &&
                          in.shape.size() == first.shape.size() &&
                          std::equal(in.shape.begin() + std::min(from, in.shape.size()), in.shape.end(),
                                     first.shape.begin() + std::min(from, first.shape.size()))));
      if (!same) {
        return MakeError(ErrorKind::kInvalidData, "mixture column '", specs_[c].name,
                         "': a batch of ", SourceName(sources_[piece_sources[k]].source, piece_sources[k]),
                         " has ", in.kind == ColumnKind::kTensor ? DTypeName(in.dtype) : "bytes",
                         " rows of shape ", ShapeToString({in.shape.begin() + 1, in.shape.end()}),
                         " where ", SourceName(sources_[piece_sources[0]].source, piece_sources[0]),
                         " has ", DTypeName(first.dtype), " ",
                         ShapeToString({first.shape.begin() + 1, first.shape.end()}),
                         " (ragged rows cannot be mixed; pad them to one length)");
      }
    }
    if (first.kind != ColumnKind::kTensor) continue;
    const ListColumn& list = lists_[c];
    const size_t inner = list.kind == ListColumn::Kind::kPadded ? 2 : 1;
    row_bytes[c] = DTypeSize(first.dtype);
    for (size_t d = inner; d < first.shape.size(); ++d) row_bytes[c] *= first.shape[d];
    int64_t bytes = count * row_bytes[c];
    if (list.kind != ListColumn::Kind::kNone) {
      // extent: the padded length, the ragged values' total, or the offsets' count.
      int64_t& extent = extent_[c];
      extent = 0;
      const bool padded = list.kind == ListColumn::Kind::kPadded;
      if (list.kind == ListColumn::Kind::kRaggedOffsets) {
        extent = count + 1;
      } else {
        for (int64_t r = 0; r < count; ++r) {
          const auto k = static_cast<size_t>(plan.piece[r]);
          const int64_t row = piece_first[k] + plan.row(r);
          const int64_t* v = piece_batch[k]->columns[list.companion].data->data_as<int64_t>() + row;
          extent = padded ? std::max(extent, v[0]) : extent + (v[1] - v[0]);
        }
      }
      if (padded) {  // as one Loader pads a batch of these rows (tensor/assemble.cc)
        if (list.collate.max_length > 0) extent = std::min(extent, list.collate.max_length);
        const int64_t m = std::max<int64_t>(1, list.collate.multiple_of);
        extent = (extent + m - 1) / m * m;
        bytes = count * extent * row_bytes[c];
      } else {
        bytes = extent * row_bytes[c];
      }
    }
    at[c] = block_bytes;
    block_bytes += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> block,
                        arrow::AllocateBuffer(std::max<int64_t>(block_bytes, 1), kAlign, pool_));
  batch->owned_bytes += block->size();
  // The fixed-width columns' interleave, in fixed_[0, num_fixed) (their piece vectors
  // reused).
  size_t num_fixed = 0;
  batch->columns.reserve(specs_.size());
  for (size_t c = 0; c < specs_.size(); ++c) {
    BatchColumn out;
    const BatchColumn& first = piece_batch[0]->columns[c];
    out.kind = first.kind;
    out.dtype = first.dtype;
    if (packed_ && c == cu_column_) {
      batch->columns.push_back(std::move(out));  // after the interleave, below
      continue;
    }
    if (out.kind == ColumnKind::kTensor && lists_[c].kind != ListColumn::Kind::kNone) {
      const ListColumn& list = lists_[c];
      uint8_t* data = block->mutable_data() + at[c];
      out.shape = first.shape;
      int64_t bytes = 0;
      switch (list.kind) {
        case ListColumn::Kind::kPadded:
          out.shape[0] = count;
          out.shape[1] = extent_[c];
          bytes = count * extent_[c] * row_bytes[c];
          FillListColumn(c, count, data, extent_[c], nullptr);
          break;
        case ListColumn::Kind::kRaggedValues:
          out.shape[0] = extent_[c];
          bytes = extent_[c] * row_bytes[c];
          FillListColumn(c, count, data, 0, block->mutable_data() + at[list.companion]);
          break;
        default:  // kRaggedOffsets, written with their values column
          out.shape[0] = count + 1;
          bytes = (count + 1) * row_bytes[c];
      }
      out.data = arrow::SliceBuffer(block, at[c], bytes);
    } else if (out.kind == ColumnKind::kTensor) {
      out.shape = first.shape;
      out.shape[0] = count;
      if (fixed_.size() == num_fixed) fixed_.emplace_back();
      InterleaveColumn& col = fixed_[num_fixed++];
      col.out = block->mutable_data() + at[c];
      col.row_bytes = row_bytes[c];
      col.pieces.clear();
      for (size_t k = 0; k < piece_batch.size(); ++k) {
        col.pieces.push_back(piece_batch[k]->columns[c].data->data() + piece_first[k] * row_bytes[c]);
      }
      out.data = arrow::SliceBuffer(block, at[c], count * row_bytes[c]);
    } else {
      // Variable-length rows: offsets, then each row's bytes.
      ARROW_ASSIGN_OR_RAISE(auto offsets, arrow::AllocateBuffer((count + 1) * 8, pool_));
      auto* off = reinterpret_cast<int64_t*>(offsets->mutable_data());
      off[0] = 0;
      for (int64_t r = 0; r < count; ++r) {
        const size_t k = static_cast<size_t>(plan.piece[r]);
        const auto* in = reinterpret_cast<const int64_t*>(piece_batch[k]->columns[c].offsets->data());
        const int64_t row = piece_first[k] + plan.row(r);
        off[r + 1] = off[r] + (in[row + 1] - in[row]);
      }
      ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(off[count], pool_));
      for (int64_t r = 0; r < count; ++r) {
        const size_t k = static_cast<size_t>(plan.piece[r]);
        const BatchColumn& in = piece_batch[k]->columns[c];
        const auto* in_off = reinterpret_cast<const int64_t*>(in.offsets->data());
        const int64_t row = piece_first[k] + plan.row(r);
        if (off[r + 1] > off[r]) {
          std::memcpy(data->mutable_data() + off[r], in.data->data() + in_off[row],
                      static_cast<size_t>(off[r + 1] - off[r]));
        }
      }
      out.shape = {count};
      batch->owned_bytes += offsets->size() + data->size();
      out.offsets = std::move(offsets);
      out.data = std::move(data);
    }
    batch->columns.push_back(std::move(out));
  }
  fixed_.resize(num_fixed);
  InterleaveRows(plan, fixed_);
  if (packed_) ARROW_RETURN_NOT_OK(SegmentBoundaries(batch.get()));
  return batch;
}

arrow::Status MixStream::FindPackedColumns(const std::vector<MixSource>& sources) {
  size_t packed = 0;
  for (const MixSource& s : sources) packed += s.loader->options().pack_column.empty() ? 0 : 1;
  if (packed == 0) return arrow::Status::OK();
  if (packed != sources.size()) {
    return arrow::Status::Invalid("mixture sources must all pack documents (pack=) or none");
  }
  const PackOptions& first = sources[0].loader->options().pack;
  for (size_t i = 1; i < sources.size(); ++i) {
    const PackOptions& p = sources[i].loader->options().pack;
    if (p.seq_len != first.seq_len) {
      return arrow::Status::Invalid(SourceName(sources[i], i), " packs blocks of ", p.seq_len,
                                    " tokens, ", SourceName(sources[0], 0), " of ", first.seq_len,
                                    ": they must agree");
    }
  }
  bool cu = false, segments = false;
  for (size_t c = 0; c < specs_.size(); ++c) {
    if (specs_[c].name == "cu_seqlens") cu_column_ = c, cu = true;
    if (specs_[c].name == "document_ids") segment_column_ = c, segments = true;
  }
  if (!cu || !segments) return arrow::Status::UnknownError("packed sources without their outputs");
  // (the mixture's cu_seqlens are made again over its own batch_size blocks: SegmentBoundaries)
  ARROW_RETURN_NOT_OK(CheckPackedBatchFits(options_.batch_size, first.seq_len, "mix"));
  packed_ = true;
  seq_len_ = first.seq_len;
  return arrow::Status::OK();
}

arrow::Status MixStream::SegmentBoundaries(Batch* batch) {
  // As one packing loader makes them (pack/packer.cc): a segment starts at every block's
  // start and wherever the segment index changes inside a block (padding is -1, its
  // own segment); the boundaries over the flattened batch, from 0 to its tokens.
  const BatchColumn& seg = batch->columns[segment_column_];
  const auto* s = seg.data->data_as<int64_t>();
  const int64_t L = seq_len_, total = batch->num_rows * L;
  std::vector<int32_t>& cu = boundaries_;
  cu.assign(1, 0);
  for (int64_t t = 1; t < total; ++t) {
    if (t % L == 0 || s[t] != s[t - 1]) cu.push_back(static_cast<int32_t>(t));
  }
  if (total > 0) cu.push_back(static_cast<int32_t>(total));
  const auto bytes = static_cast<int64_t>(cu.size() * sizeof(int32_t));
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> buffer, arrow::AllocateBuffer(bytes, pool_));
  std::memcpy(buffer->mutable_data(), cu.data(), static_cast<size_t>(bytes));
  BatchColumn& out = batch->columns[cu_column_];
  out.kind = ColumnKind::kTensor;
  out.dtype = DType::kInt32;
  out.shape = {static_cast<int64_t>(cu.size())};
  out.data = std::move(buffer);
  batch->owned_bytes += bytes;
  return arrow::Status::OK();
}

}  // namespace pqloader
