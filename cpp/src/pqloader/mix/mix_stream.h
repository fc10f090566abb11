// MixStream: the batches of one mixture epoch (pqloader.mix), drawn from several
// Loaders by weight and assembled in C++.
//
// Position p of mixture epoch e takes the next row of source DrawSource(seed, e, p)
// (mix_draws.h). Each source is a Loader read through its own epoch e; when it runs out
// within the epoch it reads epoch e again under WrapSeed(its seed, 1), then 2, ...
// Batches of the mixture are built from the sources' batches by one typed gather per
// column (fixed-width columns) or a copy of each row's bytes (strings, bytes, lists of
// them) into buffers from the pool, so a mixture costs the draws and one copy of the
// rows, all off the GIL. List columns batched ragged or padded to each batch's longest
// row (Loader `lists`) are collated again over the mixed batch's rows, as one Loader
// would collate them: the sources must collate them alike. The output is a pure function of (sources, weights, seed,
// epoch, first batch).
//
// Each source runs its own num_workers and max_inflight_bytes: a mixture runs up to the
// sum of its sources' workers and holds up to the sum of their bounds. A source ahead
// of the mixture waits on its bound, so the cores go to the sources behind it (its
// workers split by weight left the cores idle while the largest source fell behind).
//
// Within a batch, rows are grouped by source (source 0's first), each source's in its
// own order: the batch holds the rows its positions draw, and only their place inside
// the batch differs from drawn order (docs/determinism.md, "Mixtures"). That lets the
// sources write a batch in place: when every source can (Loader::writes_in_place: it
// gathers its shuffle windows whole, or assembles batches whose every column has fixed
// rows), all agree on each column's dtype and row shape, the epoch starts at its first
// batch and no source wraps, each source's window gathers or batch assemblies write
// its rows of every batch straight into that batch's block (a Loader's WindowSink),
// and the stream only waits until the sources have delivered a batch's rows: no copy.
// A source of small weight whose shuffle window (or the batches its pipeline holds
// ready) would span more of the mixture's batches than its max_inflight_bytes holds is
// copied instead. Otherwise too batches are copied from the sources' batches; both
// give the same bytes. The next epoch started early (then_next_epoch) is written in place
// when the caller gave its length (SetNextEpoch) and the next stream adopts it.
//
// Thread-safety: one consumer thread calls Next(); the sources must not be iterated by
// anyone else while the stream is open (it starts, reads and stops their epochs). If
// one is (started or stopped by another caller: Loader::run_calls), Next() returns
// Cancelled instead of reading it, and Stop() leaves that source to its new user.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/mix/mix_draws.h"
#include "pqloader/tensor/batch.h"

namespace pqloader {

class Loader;

/// The seed of a source's `wrap`-th rerun of an epoch (wrap 0: its own seed):
/// SplitMix64 of seed + wrap * 0x9E3779B97F4A7C15.
uint64_t WrapSeed(uint64_t seed, int64_t wrap);

/// One source of a mixture: a Loader (not owned) and its own seed. The rows an epoch of
/// it yields are its Loader::batch_rows (a packed source's differ between epochs).
struct MixSource {
  Loader* loader = nullptr;
  uint64_t seed = 0;
  /// How messages name it (the mixture's name for it); empty: by its index.
  std::string name;
};

/// What one epoch of a mixture reads.
struct MixStreamOptions {
  uint64_t seed = 0;
  /// Cumulative weights (CumulativeWeights), one per source.
  std::vector<double> cumulative;
  int64_t batch_size = 1;
  int64_t epoch = 0;
  /// The first batch to deliver (a resumed epoch starts later).
  int64_t first_batch = 0;
  /// Samples of this epoch for this rank, and its batches (after drop_last).
  int64_t samples = 0;
  int64_t num_batches = 0;
  /// The caller will read epoch + 1 from its first batch next (in a new stream): once
  /// the rows this epoch still needs fit in a quarter of the budget, they are taken
  /// from the sources, which then start epoch + 1 (Loader::StartEpoch keeps such a run
  /// for the next stream), so the boundary does not wait for every source's first
  /// shuffle window. The batches are the same either way.
  bool then_next_epoch = false;
  /// The sources of the epoch's positions [0, size()), a byte each, if the caller kept
  /// them (EpochLengthUntilExhausted's `kept`): read instead of drawn again. They must
  /// be this epoch's draws under `seed` and `cumulative`.
  std::shared_ptr<const std::vector<uint8_t>> kept_draws;
  /// Let the sources' window gathers write the batches in place when they can (see
  /// MixStream); false: always copy from the sources' batches (the same batches).
  bool write_in_place = true;
};

class MixStream {
 public:
  /// Start the sources where `options.first_batch` needs them. Fails if the sources
  /// disagree on their output columns' kinds and dtypes.
  static arrow::Result<std::unique_ptr<MixStream>> Make(std::vector<MixSource> sources,
                                                        MixStreamOptions options,
                                                        arrow::MemoryPool* pool);
  ~MixStream();

  /// The next batch of the epoch, or nullptr after its last one. `sources`, if given,
  /// receives each row's source index (int64, one per row, from the pool). With a
  /// `timeout`, returns nullptr and sets *timed_out if a source gave no batch in time;
  /// calling again goes on where it stopped (a timeout without timed_out is Invalid).
  arrow::Result<std::shared_ptr<Batch>> Next(
      std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max(),
      bool* timed_out = nullptr, std::shared_ptr<arrow::Buffer>* sources = nullptr);

  /// Stop the sources' epochs and give them back their own seeds and budgets (not
  /// those someone else has started or stopped since). Idempotent.
  void Stop();

  /// Whether this epoch's batches are written in place by the sources.
  bool in_place() const { return in_place_ != nullptr; }
  /// The next epoch's samples and batches (and its kept draws, if any), as the caller
  /// will read it from its first batch in a new stream. With then_next_epoch, the
  /// sources' next epoch, started early, then writes that epoch in place where it can,
  /// and the next stream adopts it; without, it is copied (the next stream restarts the
  /// sources' runs to write in place). Call before the epoch's last batches.
  void SetNextEpoch(int64_t samples, int64_t num_batches,
                    std::shared_ptr<const std::vector<uint8_t>> kept_draws);

  MixStream(const MixStream&) = delete;
  MixStream& operator=(const MixStream&) = delete;

 private:
  struct Held {
    std::shared_ptr<Batch> batch;
    int64_t used = 0;  // rows already placed
  };
  // How output column c is made when it is (part of) a list column collated per batch.
  struct ListColumn {
    enum class Kind : uint8_t { kNone, kPadded, kRaggedValues, kRaggedOffsets } kind = Kind::kNone;
    size_t companion = 0;  // kPadded: its "_length" column; kRagged*: its "_offsets" column
    ColumnCollate collate;
  };
  struct SourceState {
    MixSource source;
    bool started = false;  // drawn with a positive weight: its epoch runs
    int64_t source_batch_size = 1;
    int64_t wrap = 0;
    int64_t skip = 0;  // rows of the next batch that an earlier position consumed
    std::deque<Held> held;
    int64_t buffered = 0;  // rows held and not yet placed
    int64_t run_calls = -1;  // the loader's run_calls() after this stream last started it
    // An error this source's run gave while MaybeStartNextEpoch took the rest of the
    // epoch ahead: the rows before it stay held; Fill returns it when a batch needs more.
    arrow::Status failed;
  };
  MixStream() = default;
  class InPlace;  // the batches' blocks, shared with the sources' window sinks
  // The in-place writing of epoch `epoch` (samples, batches, kept draws) from its first
  // batch if every condition holds (see above), else null.
  arrow::Result<std::shared_ptr<InPlace>> MakeInPlace(int64_t epoch, int64_t samples,
                                                      int64_t num_batches,
                                                      const std::vector<uint8_t>* kept) const;
  // Point every source's window sink at `state` (null: none).
  void SetSinks(const std::shared_ptr<InPlace>& state);
  arrow::Status Open(SourceState& s, int64_t wrap, int64_t first_batch);
  // Start `epoch` of the source from its first batch under `seed`, and own that run.
  arrow::Status StartSource(SourceState& s, uint64_t seed, int64_t epoch, int64_t first_batch);
  // Cancelled if someone else started or stopped source i's epoch since this stream did.
  arrow::Status CheckOwned(size_t i) const;
  // Pull batches of source `i` until it holds `need` rows.
  arrow::Status Fill(size_t i, int64_t need, std::chrono::nanoseconds timeout, bool* timed_out);
  arrow::Result<std::shared_ptr<Batch>> Assemble(int64_t count);
  // The sources' list columns collated per batch (padded to the batch's longest row, or
  // ragged), which Assemble collates again; an error if the sources collate them apart.
  arrow::Status FindListColumns(const std::vector<MixSource>& sources);
  // Sources that pack documents (Loader pack): all or none, blocks of one length. Their
  // cu_seqlens (the segments' boundaries over a batch) is a batch's, not a row's: each
  // mixed batch's is made again from its document_ids (SegmentBoundaries).
  arrow::Status FindPackedColumns(const std::vector<MixSource>& sources);
  arrow::Status SegmentBoundaries(Batch* batch);
  // Column c of the mixed batch made of its rows one by one (a ListColumn's kind).
  void FillListColumn(size_t c, int64_t count, uint8_t* out, int64_t length, uint8_t* offsets_out);
  // With then_next_epoch, near the end: take the rest of the epoch's rows from the
  // sources and start their next epoch (see MixStreamOptions::then_next_epoch).
  // Draws of each source among positions [start, end) of this epoch (or of `epoch`,
  // whose kept draws are `kept`): counted in the kept draws where they cover them, else
  // drawn.
  std::vector<int64_t> CountSources(int64_t start, int64_t end) const {
    return CountSources(start, end, options_.epoch, options_.kept_draws.get());
  }
  std::vector<int64_t> CountSources(int64_t start, int64_t end, int64_t epoch,
                                    const std::vector<uint8_t>* kept) const;
  arrow::Status MaybeStartNextEpoch(int64_t start, std::chrono::nanoseconds timeout,
                                    bool* timed_out);

  std::vector<SourceState> sources_;
  MixStreamOptions options_;
  arrow::MemoryPool* pool_ = nullptr;
  std::vector<ColumnSpec> specs_;
  std::vector<ListColumn> lists_;  // per output column
  int64_t next_batch_ = 0;
  bool drawn_ = false;  // draws_ hold the draws of batch next_batch_
  std::vector<int32_t> draws_;
  std::vector<int64_t> need_;
  // Assemble()'s working memory, kept between batches: a batch allocates only its output.
  std::vector<int64_t> piece_rows_, piece_first_;
  std::vector<int32_t> piece_sources_;
  std::vector<const Batch*> piece_batch_;
  InterleavePlan plan_;
  std::vector<InterleaveColumn> fixed_;
  std::vector<int64_t> row_bytes_, at_, extent_;
  bool packed_ = false;
  size_t cu_column_ = 0, segment_column_ = 0;
  int64_t seq_len_ = 0;
  std::vector<int32_t> boundaries_;
  bool stopped_ = false;
  std::shared_ptr<InPlace> in_place_;
  int64_t next_samples_ = -1, next_num_batches_ = 0;  // SetNextEpoch's
  std::shared_ptr<const std::vector<uint8_t>> next_kept_;
  // The next epoch's start (then_next_epoch): the bytes the rest of the epoch may hold
  // (a quarter of the shared budget), the bytes of a mixed row seen so far, the draws
  // of each source over the rest (once computed), and whether the sources have started.
  int64_t hold_bytes_ = 0;
  int64_t row_bytes_seen_ = 0;
  std::vector<int64_t> rest_;
  bool next_started_ = false;
  bool next_start_failed_ = false;  // a source failed while taking the rest ahead
};

}  // namespace pqloader
