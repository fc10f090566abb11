// Loader: streams batches of tensors from Parquet, in an order fixed by the EpochPlan.
//
// Wires the stages together: Dataset (files, schema, splits) → EpochPlan (order) →
// OrderedPipeline workers that ReadUnit (fetch + decode + convert) and AssembleBatch
// (gather rows into pooled buffers) → the consumer, in sequence order. The batches are
// a pure function of (data, options, seed, epoch, rank, world_size); see
// docs/determinism.md. Thread-safety: every method may be called from any thread;
// Next() is for one consumer at a time, and Stop() from another thread wakes it (it then
// returns Cancelled).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/cache/split_cache.h"
#include "pqloader/dataset/dataset.h"
#include "pqloader/decode/convert.h"
#include "pqloader/decode/read_unit.h"
#include "pqloader/exec/ordered_pipeline.h"
#include "pqloader/exec/readahead.h"
#include "pqloader/filter/row_filter.h"
#include "pqloader/io/filesystem.h"
#include "pqloader/pack/document_lengths.h"
#include "pqloader/pack/pack_plan.h"
#include "pqloader/pack/packer.h"
#include "pqloader/plan/epoch_plan.h"
#include "pqloader/plan/row_order.h"
#include "pqloader/tensor/batch.h"
#include "pqloader/tensor/buffer_pool.h"
#include "pqloader/tensor/stack.h"
#include "pqloader/tensor/window_gather.h"
#include "pqloader/transform/pipeline.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

struct LoaderOptions {
  /// Which columns to read. See DatasetOptions.
  DatasetOptions dataset;
  /// Which rows: a filter expression and/or predicate, pushed down to partitions,
  /// row-group statistics and row masks before the plan is made (filter/row_filter.h).
  /// The selection is kept in cache.dir when there is one (threads and store_dir are
  /// set by the loader). Default: none (every row).
  FilterOptions filter;
  /// Set (from another thread) to make Make() stop early and return Cancelled: reading
  /// footers, a filter's mask pass, documents' lengths, waits for other processes' locks
  /// (util/cancel.h). Make passes it on to dataset and filter (when unset, the flag
  /// of dataset.cancel or filter.cancel, if given, is the one). Default: none.
  CancelFlag cancel;
  /// Order, batching and sharding. See PlanOptions.
  PlanOptions plan;
  /// Null replacement for every column not in `fills`. Default: nulls are an error.
  NullFill default_fill;
  /// Null replacement per column name.
  std::map<std::string, NullFill> fills;
  /// Verify Parquet page checksums where present. Default: false.
  bool verify_checksums = false;
  /// Worker threads, at most 1024 (as io_threads). Default: 0, meaning one per CPU the
  /// process may use: its affinity mask, at most its cgroup's CPU quota
  /// (AvailableCpus, util/container_limits.h).
  int num_workers = 0;
  /// Bound on the bytes held ahead of the consumer: a quarter for fetched column chunks
  /// not yet decoded (read-ahead), the rest for decoded row groups and assembled
  /// batches, which are decoded ahead while their estimated size fits. The floor (held
  /// whatever the bound) is the row groups of the batch the consumer waits for plus one
  /// batch per worker; see exec/ordered_pipeline.h. Default: 0, meaning 256 MiB, at
  /// most an eighth of the process's cgroup memory limit (a container's), at least
  /// 16 MiB (DefaultInflightBytes, util/container_limits.h; options() gives the value).
  int64_t max_inflight_bytes = 0;
  /// Batches assembled ahead of the consumer. Default: 0, meaning 2 per worker. (A
  /// shuffled loader that gathers whole windows gathers the next one further ahead
  /// while its copy fits max_inflight_bytes.)
  int64_t prefetch_batches = 0;
  /// Threads that read from storage (so, requests in flight), apart from the workers.
  /// Default: 16.
  int io_threads = 16;
  /// Row groups whose column chunks are requested ahead of decoding, in plan order, at
  /// most; their compressed bytes stay within max_inflight_bytes. Default: 0, meaning
  /// io_threads.
  int64_t readahead = 0;
  /// Test hook: random sleep of up to this many µs before each task. Default: 0.
  int64_t debug_max_delay_us = 0;
  /// Per-column transform ops, applied in order (see transform/op.h). Default: none.
  std::map<std::string, std::vector<std::shared_ptr<const Op>>> transforms;
  /// How list columns whose rows differ in length are batched, by column name:
  /// ragged (values + "<name>_offsets") or padded (+ "<name>_length"); see
  /// ColumnCollate. Default: none (every row of a batch must have one length).
  std::map<std::string, ColumnCollate> lists;
  /// Pack the documents (rows) of this list column into blocks of tokens
  /// (pack/pack_plan.h); the other selected columns must be numbers, copied per token.
  /// Default: empty, no packing.
  std::string pack_column;
  /// How to pack (seq_len, separator, truncation); `column` is set from pack_column.
  PackOptions pack;
  /// Output columns stacked into one, [n, k, row shape...] (tensor/stack.h): numbers
  /// of one dtype and row shape known before any data (after transforms and list
  /// padding); the members leave the batch. Not with pack_column, nor in a mixture's
  /// sources. Default: none.
  std::vector<StackSpec> stack;
  /// What a failing transform does. Default: kRaise.
  DecodeErrorPolicy on_decode_error = DecodeErrorPolicy::kRaise;
  /// Cache of decoded + deterministically transformed splits; off when cache.dir is
  /// empty. Default: off.
  CacheOptions cache;
  /// Leave CheckBeforeFirstBatch to the caller (who checks its arguments first).
  /// Default: false (Make runs it).
  bool defer_checks = false;
};

/// Counters since the loader was made, over all epochs.
struct LoaderStats {
  int64_t rows = 0;               ///< Rows handed to the consumer.
  int64_t batches = 0;            ///< Batches handed to the consumer.
  int64_t units_read = 0;         ///< Row-group slices read and decoded.
  int64_t bytes_read = 0;         ///< Compressed Parquet bytes of the chunks read.
  /// Compressed bytes of the row groups whose chunks were requested from storage, by
  /// this loader since it was made, whether they were decoded or not (read ahead for an
  /// epoch that was dropped, or found in the cache meanwhile): what it cost the storage.
  int64_t bytes_fetched = 0;
  int64_t bytes_decoded = 0;      ///< Bytes of decoded tensor columns produced.
  // Time per stage, summed over all threads (workers and the consumer):
  double read_seconds = 0;       ///< Waiting for storage bytes (fetches not done ahead).
  double decode_seconds = 0;     ///< Parquet decoding and conversion to tensor columns.
  double transform_seconds = 0;  ///< Transforms, per unit and per sample.
  double assemble_seconds = 0;   ///< Gathering rows into batches.
  double unit_seconds = 0;       ///< Producing units: reading, decoding, caching, transforms.
  int64_t batches_by_consumer = 0;  ///< Batches Next() assembled on the caller's thread.
  int64_t epochs_started_ahead = 0;  ///< Epochs begun while the previous one ended.
  /// Units an epoch started ahead had produced when it was dropped unused (the next
  /// StartEpoch was another epoch, or none came). Work of an epoch started ahead counts
  /// in the other counters only once the consumer starts that epoch.
  int64_t units_dropped_ahead = 0;
  double wait_seconds = 0;        ///< Consumer time blocked in Next().
  double time_to_first_batch_seconds = -1;  ///< From the first StartEpoch.
  int64_t peak_inflight_bytes = 0;
  int64_t skipped_rows = 0;       ///< Rows dropped by on_decode_error = kSkip.
  /// Of this loader's cache (zeros without one): hits and misses of this loader's
  /// epochs; the rest (inserts, evictions, ...) of the cache object, this process.
  CacheCounters cache;
  int64_t cache_bytes_saved = 0;  ///< Compressed Parquet bytes not read thanks to hits.
  /// The process-wide buffer pool (all loaders): allocations of recyclable size, how
  /// many of them reused a freed block, and the free bytes it keeps now.
  int64_t pool_allocations = 0;
  int64_t pool_recycled = 0;
  int64_t pool_cached_bytes = 0;
  int64_t pool_fresh_bytes = 0;  ///< Bytes of new blocks the pool had to allocate.
};

class Loader {
 public:
  /// Open `sources` and check options. No data is read until StartEpoch.
  static arrow::Result<std::unique_ptr<Loader>> Make(const std::vector<std::string>& sources,
                                                     const LoaderOptions& options);
  ~Loader();

  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const Dataset& dataset() const { return *dataset_; }
  /// Refuse what the footers show would fail later: fills that do not suit their
  /// columns, nulls without a fill or mask, list columns whose rows differ in length
  /// with no way to batch them, partition keys stored in the files that disagree with
  /// their paths (see dataset/footer_checks.h). Make runs it unless defer_checks.
  arrow::Status CheckBeforeFirstBatch() const;
  /// Output columns, in batch order (transformed columns, then any "_length" columns;
  /// a stacked column where its first member was).
  const std::vector<ColumnSpec>& specs() const;
  /// What each output column's rows are before any data (see SampleSignature): for a
  /// transformed column its ops' output, for another tensor column its spec, unset for
  /// strings, bytes, "_length"/"_offsets" companions and packed batches.
  std::optional<SampleSignature> output_signature(size_t c) const;
  /// The output columns as they would be without LoaderOptions::stack (specs() when
  /// nothing is stacked), and the same for their signatures.
  const std::vector<ColumnSpec>& unstacked_specs() const;
  std::optional<SampleSignature> unstacked_signature(size_t c) const;
  /// Whether LoaderOptions::stack stacks columns.
  bool stacks() const { return stack_.has_value(); }
  const TransformPlan& transforms() const { return transforms_; }
  /// What the filter pruned and read (zeros without a filter).
  const FilterStats& filter_stats() const { return filter_stats_; }
  /// The documents' lengths packing read (null without pack).
  const DocumentLengths* document_lengths() const { return lengths_.get(); }
  const LoaderOptions& options() const { return options_; }
  /// Plan of epoch 0 (the counts are the same in every epoch).
  const EpochPlan& first_plan() const { return first_plan_; }
  int64_t num_batches() const { return num_batches(0); }
  /// Batches of `epoch` (with packing, the count may differ between epochs when there
  /// are several ranks: it is the equalised number of blocks over the batch size).
  int64_t num_batches(int64_t epoch) const;
  /// The same under `seed` rather than the current one (a mixture reads a packed source
  /// under other seeds while its owner may ask for its own count).
  int64_t num_batches_under_seed(int64_t epoch, uint64_t seed) const;
  /// Batches of the rest of `epoch` after what an earlier world consumed (see
  /// StartEpoch); an error if `elastic` does not fit the dataset and options.
  arrow::Result<int64_t> num_batches(int64_t epoch, const ElasticBase& elastic) const;
  /// Replace the seed (e.g. with one restored from a checkpoint). Takes effect at the
  /// next StartEpoch.
  void set_seed(uint64_t seed) {
    MutexLock lock(mu_);
    options_.plan.seed = seed;
  }
  /// Whether shuffled epochs gather their shuffle windows whole (tensor/window_gather.h):
  /// shuffled, fixed-width columns, no transforms, lists or packing.
  bool gathers_windows() const { return window_gather_; }
  /// Whether its batches can be written into a mixture's (set_window_sink): it gathers
  /// windows, or every output column has fixed rows (fixed_outputs) and no row is ever
  /// dropped from its batch (no packing, no transforms that skip rows).
  bool writes_in_place() const { return window_gather_ || batches_in_place_; }
  /// The most decoded bytes one shuffle window holds, in any epoch and on any rank: the
  /// shuffle_window largest row groups (as selected and filtered), each its rows x the
  /// output columns' row bytes where the loader gathers windows (fixed-width columns, no
  /// transforms: exact), else the footer's uncompressed size of its selected column
  /// chunks (an estimate: strings, lists; a deterministic transform such as an image's
  /// decoding makes more). 0 when not shuffled. Known from the footers before any read;
  /// max_inflight_bytes does not bound it (the window the consumer reads is held whole).
  int64_t MaxWindowBytes() const;
  /// Each output column's fixed dtype and row shape, where known before any data
  /// (TransformPlan::fixed_outputs). Not for a packing loader.
  const std::vector<std::optional<TransformPlan::FixedRows>>& fixed_outputs() const {
    return transforms_.fixed_outputs();
  }
  /// With a sink, the runs started from now on write their rows into the sink's chunks
  /// (a mixture's batches: mix/mix_stream.h) — their window gathers, or each batch's
  /// assembly (AssembleInto) — and deliver batches without columns (their rows counted
  /// only); nullptr: the loader's own batches again. Only for a loader that
  /// writes_in_place(). Takes effect at the next StartEpoch; a run
  /// started under a sink is kept by StartEpoch only under the same sink. Whoever
  /// iterates the loader by itself clears it first (a mixture may leave its next
  /// epoch's runs and sinks: the Python Loader does so).
  void set_window_sink(std::shared_ptr<WindowSink> sink) {
    MutexLock lock(mu_);
    sink_ = std::move(sink);
  }
  std::shared_ptr<WindowSink> window_sink() {
    MutexLock lock(mu_);
    return sink_;
  }
  int64_t num_rows() const { return first_plan_.num_rows(); }
  /// Rows the batches of `epoch` hold for this rank under `seed` (after drop_last): the
  /// plan's rows, or with packing its blocks (their count may differ between epochs and
  /// seeds when there are several ranks). A mixture's count of a source's rows.
  int64_t batch_rows(int64_t epoch, uint64_t seed) const;

  /// Start delivering batches first_batch, first_batch + 1, ... of `epoch`. Units
  /// read only by earlier batches are never read. Stops any epoch in progress. With
  /// `then_next_epoch`, the caller will read epoch + 1 from its first batch next: its
  /// first row groups are read and decoded while this epoch ends (with half the memory
  /// bound until it starts), so the boundary costs about one batch, not a fill.
  /// With `elastic` (resuming a checkpoint of another world size or batch size), the
  /// epoch is the rest of `epoch` after what that world consumed (see
  /// MakeRemainderOrder), and first_batch counts batches of that rest. Not with packing.
  /// If the current run is already this epoch from its first batch under the current
  /// seed, and no batch of it was read yet (a mixture starts its sources' next epoch
  /// while it ends: mix/mix_stream.h), it is kept as it is.
  /// `*run_id` (if given) names the run started, for Next. `epoch` must be in
  /// [0, 2^32): 32 bits of it key the shuffle.
  arrow::Status StartEpoch(int64_t epoch, int64_t first_batch = 0, bool then_next_epoch = false,
                           std::shared_ptr<const ElasticBase> elastic = nullptr,
                           int64_t* run_id = nullptr);
  /// Return the next batch of the current epoch, or nullptr after its last batch.
  /// Invalid before the first StartEpoch (an epoch never started is not an empty one);
  /// after a StartEpoch that failed, its error (until the next StartEpoch or Stop).
  /// After an error, iteration of this epoch is over: the same error is returned again.
  /// With a `timeout`, return nullptr and set *timed_out if no batch came in time (so
  /// a caller can check for signals and call again); a timeout without timed_out is
  /// Invalid. Cancelled if Stop() ran meanwhile.
  /// With a `run` (a StartEpoch's run_id), Cancelled, taking nothing, if another run is
  /// current: an iterator that another thread's newer iteration replaced never takes a
  /// batch of the newer one's run; nullptr (the end) if none is (stopped, e.g. at the
  /// interpreter's exit, or the epoch over).
  arrow::Result<std::shared_ptr<Batch>> Next(
      std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max(),
      bool* timed_out = nullptr, int64_t run = -1);
  /// Stop the epoch in progress, if any, and join its workers.
  void Stop();
  /// Stop(), then let go of what a stopped loader keeps idle: its storage threads and its
  /// share of the buffer pool's cache of freed blocks (2 x max_inflight_bytes: a closed
  /// loader of a large file kept ~0.5 GB resident, and ~10 threads). The loader stays
  /// usable: the next StartEpoch takes them again.
  void Close();
  /// In a forked child only, where this loader is abandoned (never destroyed: its
  /// threads do not exist there and its mutexes may be held): give back its share of
  /// the buffer pool's cache, which the destructor would have. Takes no lock of the
  /// loader's.
  void GiveBackPoolShareAfterFork();
  /// How many times StartEpoch or Stop was called: whoever started a run can tell
  /// whether someone else has started or stopped one since (a mixture's source used
  /// by itself meanwhile: mix/mix_stream.h).
  int64_t run_calls() const { return run_calls_.load(); }

  LoaderStats stats() const;
  /// Return (and forget) a warning for the user (e.g. the cache stopped working), or "".
  std::string TakeWarning();

 private:
  using Pipeline = OrderedPipeline<DecodedUnit, Batch>;
  // Work done for one epoch run, counted in stats() once the run is adopted (the
  // consumer started its epoch), so that a run started ahead never changes them early.
  struct Work {
    std::atomic<int64_t> read_ns{0}, decode_ns{0}, transform_ns{0}, gather_ns{0};
    std::atomic<int64_t> bytes_read{0}, bytes_decoded{0}, skipped_rows{0};
    std::atomic<int64_t> cache_hits{0}, cache_misses{0}, cache_bytes_saved{0};
    /// Raised when the run is shut down: ends waits for other processes' fetches.
    std::atomic<bool> stopping{false};
    void AddTo(LoaderStats* stats) const;
  };
  // The pipeline of one epoch, its read-ahead and its work. A run started ahead may
  // only read at first: its pipeline (decoding) starts once the current epoch has
  // produced every unit, from `pending`.
  struct EpochRun {
    int64_t epoch = 0;
    int64_t id = 0;  // set by StartEpoch (see its run_id)
    std::shared_ptr<Pipeline> pipeline;
    std::shared_ptr<ReadAhead<std::shared_ptr<FetchedUnit>>> readahead;
    std::shared_ptr<Work> work;
    std::shared_ptr<WindowStore> windows;  // shuffled windows gathered whole, if so
    bool adopted = true;  // false while started ahead and not yet begun by the consumer
    // False for a run after one that read every unit from the cache: it reads nothing
    // ahead (a unit the cache lost meanwhile is fetched when needed) and its pipeline
    // has the read-ahead's share of the budget too.
    bool reads_ahead = true;
    // The pipeline's share of a budget of `budget` bytes.
    int64_t PipelineShare(int64_t budget) const;
    struct Pending {
      Pipeline::Work work;
      PipelineOptions options;
      int64_t first_batch = 0;
    };
    std::shared_ptr<Pending> pending;
    uint64_t seed = 0;        // the plan's seed when the run was made
    std::shared_ptr<WindowSink> sink;  // the sink when the run was made (set_window_sink)
    int64_t first_batch = 0;  // the run's first batch
    bool elastic = false;     // the rest of an epoch after another world's checkpoint
    bool delivered = false;   // Next() has returned a batch of it
    bool active() const { return pipeline != nullptr || readahead != nullptr; }
    // Start the pipeline (if pending) with `budget` bytes for it.
    void StartPipeline(int64_t budget);
  };
  // Make the run of batches first_batch... of `epoch` (the rest after `elastic`, if
  // given), holding at most `budget` bytes.
  // With `read_only`, the pipeline is left pending (see EpochRun) and the read-ahead
  // primed.
  arrow::Result<EpochRun> MakeRun(int64_t epoch, int64_t first_batch, int64_t budget,
                                  std::shared_ptr<const ElasticBase> elastic = nullptr,
                                  bool read_only = false);
  // MakeRun's steps: which positions and units each batch of the run reads; the
  // read-ahead of its units; batch b from its units.
  struct RunLayout;
  arrow::Result<std::shared_ptr<const RunLayout>> LayOutRun(int64_t epoch, int64_t first_batch,
                                                            const ElasticBase* elastic) const;
  std::shared_ptr<ReadAhead<std::shared_ptr<FetchedUnit>>> MakeReadAhead(
      const RunLayout& layout, int64_t budget, bool reads_ahead, std::shared_ptr<Work> work);
  // Remember whether `work`'s run read every unit from the cache (see
  // EpochRun::reads_ahead).
  void NoteCacheUse(const Work& work);
  arrow::Result<std::shared_ptr<Batch>> MakeBatch(
      const RunLayout& layout, int64_t b,
      const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t* bytes, Work* work);
  // The order of `epoch` under `plan` (the rest after `elastic`, if given).
  arrow::Result<std::shared_ptr<const RowOrder>> OrderOf(const PlanOptions& plan, int64_t epoch,
                                                         const ElasticBase* elastic) const;
  // Move the runs in progress to `runs`, for ShutDown outside the lock.
  void DetachLocked(std::vector<EpochRun>* runs) PQ_REQUIRES(mu_);
  // Take again what Close() let go of, if it did.
  void ReopenLocked() PQ_REQUIRES(mu_);
  // Shut `runs` down and add their counters to the stats.
  void ShutDown(std::vector<EpochRun> runs);
  // After Next() returned a batch of `pipeline`: mark the current run read from, and
  // start the next epoch's run once it has produced all units (with then_next_epoch).
  void MaybeStartNextEpoch(const Pipeline& pipeline);

  Loader() = default;
  // Run the per-sample transforms (after the cache point) of a batch's rows; drop rows
  // that failed under DecodeErrorPolicy::kSkip. Columns without such transforms get
  // no samples: the gather reads their units directly. With `into` (the batch's chunks
  // of a mixture's blocks, BatchIntoSink), samples of a size known ahead are written
  // at their rows' places there.
  arrow::Status TransformRows(const RowOrder& order, uint64_t seed, int64_t epoch,
                              const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                              int64_t unit_base, std::vector<RowRef>* rows,
                              std::vector<std::vector<SampleTensor>>* samples, Work* work,
                              const std::vector<WindowGather::Chunk>* into = nullptr);
  // Each output column's fixed row bytes (for a loader that writes_in_place()).
  std::vector<int64_t> FixedOutputRowBytes() const;
  // Decode `unit` (from its fetched bytes, or from the cache), with its deterministic
  // transforms; `now` is when the plan reads it (the cache's clock, see CacheView).
  // `deferred`: the unit goes to a whole-window gather, so a cache hit may leave its
  // columns unread (SplitCache::GetDeferred).
  // `st`, a failure to read split `split_index`, saying so where its file changed since
  // it was listed (a file rewritten under the loader reads as corrupt); a file deleted
  // since makes it kNotFound.
  arrow::Status NoteIfChanged(const arrow::Status& st, int64_t split_index) const;
  arrow::Result<std::shared_ptr<const DecodedUnit>> ProduceUnit(
      const Unit& unit, arrow::Result<std::shared_ptr<FetchedUnit>> fetched, int64_t* bytes,
      const std::shared_ptr<Work>& work, double now, bool deferred);
  // `hit`, rows `unit` of a cache hit that the window gather reads, with its columns left
  // in the entry file (GetDeferred) read from the source when the entry cannot be read
  // (see SourceFallback in loader_units.cc); `hit` itself if it has no such column.
  std::shared_ptr<const DecodedUnit> WithSourceFallback(std::shared_ptr<const DecodedUnit> hit,
                                                        const Unit& unit,
                                                        const std::shared_ptr<Work>& work);
  // Read `unit`'s rows from `fetched` (fetching now if null) and run the deterministic
  // transforms.
  arrow::Result<std::shared_ptr<DecodedUnit>> DecodeRows(
      const Unit& unit, arrow::Result<std::shared_ptr<FetchedUnit>> fetched, Work* work);
  // Check the packing options, read the documents' lengths, make the output specs
  // (loader_pack.cc).
  arrow::Status SetUpPacking();
  // Open the cache, with this loader's entry identity and its view (loader_cache.cc).
  void SetUpCache();
  // Tell the cache's view the plan options of the epochs now read (their seed may change).
  void CacheFollowsPlan();
  // Blocks every rank gets in `epoch` under `seed` (cached), and the batches they make.
  int64_t EqualBlocks(int64_t epoch, uint64_t seed) const;
  // A packing loader's shard policy for blocks (options_.plan's is kNone then).
  ShardPolicy block_policy_ = ShardPolicy::kDrop;
  int64_t BatchesOfBlocks(int64_t blocks) const;
  // `unit` with its small fixed-size columns row-major (see WithRowMajor).
  arrow::Result<std::shared_ptr<const DecodedUnit>> RowMajor(
      std::shared_ptr<const DecodedUnit> unit, Work* work);
  // The cache key of a split (loader_cache.cc).
  std::string CacheKeyOf(int64_t split) const;
  // Batch rows [first, last) of a shuffled epoch from whole-window gathers: those of the
  // windows [made.first, made.second] are made here from `units` (units[i] is unit
  // unit_base + i of the plan), the others are taken from `windows`.
  // With a `sink`, the windows' rows go to its chunks and the batch has no columns.
  arrow::Result<std::shared_ptr<Batch>> WindowedBatch(
      const EpochPlan& plan, WindowStore& windows, std::pair<int64_t, int64_t> made,
      int64_t first, int64_t last, const std::vector<std::shared_ptr<const DecodedUnit>>& units,
      int64_t unit_base, WindowSink* sink);
  // A batch's `rows` (after the transforms: `samples`) assembled into `chunks`, a
  // sink's for its positions; the batch has no columns.
  arrow::Result<std::shared_ptr<Batch>> BatchIntoSink(
      const std::vector<WindowGather::Chunk>& chunks,
      const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
      const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples);
  // Where a split's rows come from (stored in its cache entry).
  SourceIdentity SourceOf(int64_t split) const;
  // Whether the file of a split has changed since the loader opened it (local files).
  bool SourceChanged(int64_t split) const;
  // How split's file differs from its listing (kGone, "changed since ..."), or "" (also
  // when it cannot tell); an object store is asked only with `ask_remote`.
  std::string HowChanged(int64_t split, bool ask_remote) const;
  static constexpr const char* kGone = "is gone";
  static constexpr const char* kNowDirectory = "is a directory now";
  class CacheView;
  // Put a batch's columns in output order, the lengths of padded columns and the
  // offsets of ragged ones in columns of their own ("<name>_length", "<name>_offsets").
  arrow::Result<std::shared_ptr<Batch>> SplitParts(std::shared_ptr<Batch> batch);

  // The seed changes under mu_ (set_seed) and is read under it after Make(); the rest
  // is immutable.
  LoaderOptions options_;
  std::shared_ptr<Dataset> dataset_;
  FilterStats filter_stats_;
  ReadOptions read_options_;
  TransformPlan transforms_;
  EpochPlan first_plan_ = EpochPlan::Make({}, PlanOptions{}, 0);
  // Packing (when options_.pack_column is set).
  std::shared_ptr<const DocumentLengths> lengths_;
  std::vector<ColumnSpec> packed_specs_;
  /// LoaderOptions::stack's plan over the output columns, when it stacks any.
  std::optional<StackPlan> stack_;
  std::vector<int> pack_companions_;
  mutable Mutex blocks_mu_;
  // By (seed, epoch): a mixture reads a packed source's epoch again under other seeds.
  mutable std::map<std::pair<uint64_t, int64_t>, int64_t> blocks_by_epoch_ PQ_GUARDED_BY(blocks_mu_);
  // Serialises StartEpoch/Stop and guards the epochs in progress; never held while
  // Next() waits, so Stop() can wake it.
  mutable Mutex mu_;
  EpochRun current_ PQ_GUARDED_BY(mu_);
  EpochRun next_ PQ_GUARDED_BY(mu_);  // started ahead for epoch + 1
  // set_window_sink's; read under mu_ (by MakeRun, as options_ is).
  std::shared_ptr<WindowSink> sink_;
  bool then_next_epoch_ PQ_GUARDED_BY(mu_) = false;
  RecyclingPool* pool_ = RecyclingPool::Global();
  std::unique_ptr<PoolCacheReservation> pool_reservation_ PQ_GUARDED_BY(mu_);
  bool closed_ PQ_GUARDED_BY(mu_) = false;  // Close() let go of the above; StartEpoch takes them
  std::shared_ptr<StorageExecutor> io_pool_;  // storage reads; abandoned by ~Loader

  std::atomic<int64_t> epochs_started_ahead_{0};
  // Shuffled epochs gather each window whole (tensor/window_gather.h): every column is
  // fixed-width and nothing runs per sample.
  bool window_gather_ = false;
  // Batches without windows can be written into a mixture's (writes_in_place).
  bool batches_in_place_ = false;
  // Whether the last run that produced all its units read every one from the cache.
  std::atomic<bool> last_run_all_hits_{false};
  std::atomic<int64_t> run_calls_{0};
  bool started_ PQ_GUARDED_BY(mu_) = false;  ///< StartEpoch was called (Next checks it).
  int64_t run_ids_ PQ_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> bytes_fetched_{0};
  std::shared_ptr<SplitCache> cache_;
  std::shared_ptr<CacheView> cache_view_;  // what cache_ knows of this loader
  std::string cache_identity_;   // what every cache key of this loader shares
  CacheCounters recorded_ PQ_GUARDED_BY(mu_);  // counters already in the dir's records
  mutable Mutex stats_mu_;
  LoaderStats stats_ PQ_GUARDED_BY(stats_mu_);  // adopted runs' counters folded in at their end
  int64_t start_ns_ = -1;
  /// The last StartEpoch's error (its run could not be made), until the next one or Stop:
  /// Next() returns it.
  arrow::Status start_error_ PQ_GUARDED_BY(mu_);
};

}  // namespace pqloader
