// Loader: made here from its options (dataset, filter, cache, transforms, packing), and
// wired: each epoch's run laid out and started (its read-ahead, its pipeline, the next
// epoch's started early), batches served to the consumer, stats. The pipeline's tasks
// are in loader_units.cc (a unit) and loader_batches.cc (a batch); the options' checks in
// loader_options.cc, the cache's identity and view in loader_cache.cc, packing's set-up
// in loader_pack.cc.
#include "pqloader/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <unordered_map>

#include <arrow/util/thread_pool.h>

#include "pqloader/cache/entry_format.h"
#include "pqloader/dataset/footer_checks.h"
#include "pqloader/error.h"
#include "pqloader/loader_internal.h"
#include "pqloader/plan/split_uses.h"
#include "pqloader/util/container_limits.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace {

// The share of max_inflight_bytes that fetched, not yet decoded bytes may hold; the
// rest is for decoded units and batches.
int64_t ReadAheadBudget(int64_t max_inflight_bytes) { return max_inflight_bytes / 4; }
int64_t PipelineBudget(int64_t max_inflight_bytes) {
  return max_inflight_bytes - ReadAheadBudget(max_inflight_bytes);
}

// Add one epoch's pipeline counters to `stats`.
void AddCounters(const PipelineCounters& c, LoaderStats* stats) {
  stats->unit_seconds += c.unit_ns * 1e-9;
  stats->batches_by_consumer += c.batches_by_consumer;
  stats->wait_seconds += c.wait_ns * 1e-9;
  stats->units_read += c.units_done;
  stats->peak_inflight_bytes = std::max(stats->peak_inflight_bytes, c.peak_inflight_bytes);
}

}  // namespace

arrow::Result<std::unique_ptr<Loader>> Loader::Make(const std::vector<std::string>& sources,
                                                    const LoaderOptions& options) {
  ARROW_RETURN_NOT_OK(ValidateLoaderOptions(options));
  std::unique_ptr<Loader> loader(new Loader());
  loader->options_ = options;
  // One flag for every stage: the caller's, wherever it was given.
  const CancelFlag cancel = options.cancel           ? options.cancel
                            : options.dataset.cancel ? options.dataset.cancel
                                                     : options.filter.cancel;
  loader->options_.cancel = cancel;
  if (loader->options_.num_workers <= 0) {
    loader->options_.num_workers = AvailableCpus();
  }
  if (loader->options_.max_inflight_bytes <= 0) {
    loader->options_.max_inflight_bytes = DefaultInflightBytes(CgroupMemoryLimit());
  }
  if (loader->options_.prefetch_batches <= 0) {
    loader->options_.prefetch_batches = std::max(2, 2 * loader->options_.num_workers);
  }
  if (loader->options_.readahead <= 0) loader->options_.readahead = options.io_threads;
  ARROW_ASSIGN_OR_RAISE(loader->io_pool_, StorageExecutor::Make(options.io_threads));
  // Freed blocks are kept for reuse (see buffer_pool.h): without them, fresh pages cost
  // a quarter of the CPU of a shuffled epoch. Twice the in-flight budget: a shuffled
  // run's live blocks swing further than the budget (a window's units and its gathered
  // copy side by side, the next units decoding, their chunks fetched), and with one
  // budget 160-340 MiB came fresh every epoch; the process's peak memory did not grow
  // (the cache holds blocks the swing had live).
  {
    MutexLock lock(loader->mu_);  // (not shared yet: for the analysis)
    loader->pool_reservation_ =
        std::make_unique<PoolCacheReservation>(2 * loader->options_.max_inflight_bytes);
  }
  DatasetOptions dataset_options = options.dataset;
  dataset_options.cancel = cancel;
  if (!options.cache.dir.empty() && options.cache.dir != ":memory:") {
    dataset_options.footer_cache_dir = options.cache.dir;  // footers kept across runs too
  }
  ARROW_ASSIGN_OR_RAISE(loader->dataset_, Dataset::Open(sources, dataset_options));
  // Every row group's split, before a filter restricts them: a filled null list takes its
  // length from these footers (NullFill::list_length below), so the same row loads alike
  // whatever the filter keeps (one keeping only row groups of null lists gave rows of 0).
  std::vector<Split> before_filter;
  if (options.filter.enabled()) {
    before_filter = loader->dataset_->splits();
    FilterOptions filter = options.filter;
    filter.threads = loader->options_.num_workers;
    filter.cancel = cancel;
    filter.verify_checksums = options.verify_checksums;
    if (options.cache.dir != ":memory:") filter.store_dir = options.cache.dir;
    ARROW_ASSIGN_OR_RAISE(auto selection, EvaluateFilter(*loader->dataset_, filter));
    ApplySelection(selection, loader->dataset_.get());
    loader->filter_stats_ = selection.stats;
  }
  ARROW_RETURN_NOT_OK(SetUpFills(*loader->dataset_, options.default_fill, options.fills,
                                 &loader->read_options_));
  loader->read_options_.verify_checksums = options.verify_checksums;
  loader->read_options_.filtered = options.filter.enabled();
  ARROW_ASSIGN_OR_RAISE(loader->transforms_,
                        TransformPlan::Make(loader->dataset_->specs(), options.transforms,
                                            options.on_decode_error,
                                            /*cache_point=*/!options.cache.dir.empty(),
                                            options.lists));
  for (size_t c = 0; c < loader->dataset_->specs().size(); ++c) {
    loader->read_options_.allow_ragged.push_back(
        loader->transforms_.transforms_column(static_cast<int>(c)));
  }
  for (size_t c = 0; c < loader->dataset_->specs().size(); ++c) {
    // A filled null list is as long as the others: where no other row of its unit says
    // how long, the footers do (NullFill::list_length).
    NullFill& fill = loader->read_options_.fills[c];
    if (fill.enabled && !loader->read_options_.allow_ragged[c]) {
      fill.list_length = ListLengthFromFooters(
          *loader->dataset_, options.filter.enabled() ? before_filter : loader->dataset_->splits(),
          static_cast<int>(c));
    }
  }
  if (!options.pack_column.empty()) {
    // Packing equalises blocks, not rows: each rank's documents once (the row policy
    // dropped or repeated whole documents), then the blocks by the user's policy.
    loader->block_policy_ = options.plan.shard_policy;
    loader->options_.plan.shard_policy = ShardPolicy::kNone;
  }
  loader->first_plan_ = EpochPlan::Make(loader->dataset_->SplitRows(), loader->options_.plan, 0);
  if (!options.pack_column.empty()) ARROW_RETURN_NOT_OK(loader->SetUpPacking());
  loader->window_gather_ = options.plan.shuffle && loader->transforms_.empty() &&
                           options.lists.empty() && loader->lengths_ == nullptr;
  for (const auto& spec : loader->dataset_->specs()) {
    loader->window_gather_ = loader->window_gather_ && spec.kind == ColumnKind::kTensor;
  }
  const auto& fixed = loader->transforms_.fixed_outputs();
  loader->batches_in_place_ = loader->lengths_ == nullptr &&
                              loader->transforms_.policy() == DecodeErrorPolicy::kRaise &&
                              fixed.size() == loader->transforms_.output_specs().size() &&
                              std::all_of(fixed.begin(), fixed.end(),
                                          [](const auto& f) { return f.has_value(); });
  if (!options.stack.empty()) {
    if (loader->lengths_ != nullptr) {
      return arrow::Status::Invalid("stack cannot be combined with pack (a packed batch's "
                                    "columns are blocks of tokens)");
    }
    ARROW_ASSIGN_OR_RAISE(loader->stack_,
                          StackPlan::Make(loader->transforms_.output_specs(),
                                          loader->transforms_.fixed_outputs(), options.stack));
  }
  if (!options.defer_checks) ARROW_RETURN_NOT_OK(loader->CheckBeforeFirstBatch());
  if (!options.cache.dir.empty()) {
    loader->SetUpCache();
  }
  return loader;
}

arrow::Status Loader::CheckBeforeFirstBatch() const {
  ARROW_RETURN_NOT_OK(CheckFills(*dataset_, options_.fills, read_options_));
  // Nulls without a fill or mask, ragged lists without a way to batch them: refused now
  // where the footers tell, not when the row group is reached.
  std::vector<bool> null_policy, ragged_ok, rows_only;
  for (size_t c = 0; c < dataset_->specs().size(); ++c) {
    null_policy.push_back(read_options_.fills[c].enabled);
    rows_only.push_back(read_options_.fills[c].enabled && read_options_.fills[c].rows_only);
    ragged_ok.push_back(read_options_.allow_ragged[c]);
  }
  return CheckColumnsFromFooters(*dataset_, null_policy, ragged_ok, rows_only);
}

Loader::~Loader() {
  // Reads still in flight are not wanted any more: they end after their current
  // attempt instead of retrying for up to the retry budget while the pool joins.
  if (io_pool_ != nullptr) io_pool_->Abandon();
  Stop();
}

void Loader::DetachLocked(std::vector<EpochRun>* runs) {
  if (cache_ != nullptr) {
    // Hits and misses of the epochs that ran, as stats() gives them: the cache object's
    // also count the reads of an epoch started ahead and dropped unbegun (one epoch over
    // a fresh cache recorded as many hits as misses). Its writes count as they are.
    CacheCounters now = cache_->counters();
    {
      MutexLock lock(stats_mu_);
      now.hits = stats_.cache.hits;
      now.misses = stats_.cache.misses;
    }
    if (current_.pipeline != nullptr && current_.adopted) {
      now.hits += current_.work->cache_hits.load();
      now.misses += current_.work->cache_misses.load();
    }
    const CacheCounters delta = CountersSince(now, recorded_);
    // Not written (a full disk, the lock not taken): kept for the next time.
    if (!delta.any() || RecordCacheCounters(options_.cache.dir, delta)) recorded_ = now;
  }
  // Requests still in flight finish on io_pool_, unread.
  if (current_.pipeline != nullptr) runs->push_back(std::move(current_));
  if (next_.active()) runs->push_back(std::move(next_));
  current_ = EpochRun{};
  next_ = EpochRun{};
}

void Loader::Work::AddTo(LoaderStats* stats) const {
  stats->read_seconds += read_ns.load() * 1e-9;
  stats->decode_seconds += decode_ns.load() * 1e-9;
  stats->transform_seconds += transform_ns.load() * 1e-9;
  stats->assemble_seconds += gather_ns.load() * 1e-9;
  stats->bytes_read += bytes_read.load();
  stats->bytes_decoded += bytes_decoded.load();
  stats->skipped_rows += skipped_rows.load();
  stats->cache.hits += cache_hits.load();
  stats->cache.misses += cache_misses.load();
  stats->cache_bytes_saved += cache_bytes_saved.load();
}

int64_t Loader::EpochRun::PipelineShare(int64_t budget) const {
  return reads_ahead ? PipelineBudget(budget) : budget;
}

void Loader::NoteCacheUse(const Work& work) {
  if (cache_ == nullptr) return;
  last_run_all_hits_ = work.cache_misses.load() == 0 && work.cache_hits.load() > 0;
}

void Loader::EpochRun::StartPipeline(int64_t budget) {
  if (pending == nullptr) {
    if (pipeline != nullptr) pipeline->set_max_inflight_bytes(budget);
    return;
  }
  pending->options.max_inflight_bytes = budget;
  pipeline = std::make_shared<Pipeline>(std::move(pending->work), pending->options,
                                        pending->first_batch);
  pending.reset();
}

void Loader::ShutDown(std::vector<EpochRun> runs) {
  for (EpochRun& run : runs) {
    if (run.work != nullptr) run.work->stopping = true;  // ends waits for other processes
  }
  for (EpochRun& run : runs) {
    if (run.pipeline == nullptr) continue;  // it only read ahead; reads finish unread
    if (run.windows != nullptr) run.windows->Cancel();  // wakes workers waiting on a window
    run.pipeline->Shutdown();  // wakes a Next() waiting on it in another thread
    MutexLock lock(stats_mu_);
    if (run.adopted) {
      AddCounters(run.pipeline->counters(), &stats_);
      run.work->AddTo(&stats_);
    } else {
      stats_.units_dropped_ahead += run.pipeline->counters().units_done;
    }
  }
}

void Loader::Stop() {
  ++run_calls_;
  std::vector<EpochRun> runs;
  {
    MutexLock lock(mu_);
    start_error_ = arrow::Status::OK();  // after a Stop, the end
    DetachLocked(&runs);
  }
  ShutDown(std::move(runs));
}

void Loader::Close() {
  Stop();
  MutexLock lock(mu_);
  // An epoch another thread started since Stop() keeps them: the loader is in use again.
  if (closed_ || current_.pipeline != nullptr || next_.active()) return;
  closed_ = true;
  // Requests still in flight (unread now) end after their current attempt: a failing
  // object store's were retried for up to the retry budget after close() returned.
  io_pool_->AbandonSpawned();
  io_pool_->Park();
  pool_reservation_.reset();  // the pool trims its cache to the other loaders' shares
}

// mu_ is not taken: a thread of the parent may have held it at the fork. (A Close() or
// a reopen running in the parent at that instant is the one case read half-done, as
// everything else of the abandoned loader.)
void Loader::GiveBackPoolShareAfterFork() PQ_NO_THREAD_SAFETY_ANALYSIS {
  if (pool_reservation_ != nullptr) pool_reservation_->GiveBack();
}

void Loader::ReopenLocked() {
  if (!closed_) return;
  closed_ = false;
  io_pool_->Resume(options_.io_threads);
  pool_reservation_ = std::make_unique<PoolCacheReservation>(2 * options_.max_inflight_bytes);
}

arrow::Status Loader::StartEpoch(int64_t epoch, int64_t first_batch, bool then_next_epoch,
                                 std::shared_ptr<const ElasticBase> elastic, int64_t* run_id) {
  // The shuffle's random streams are keyed by 32 bits of the epoch: epoch 2^32 would
  // repeat epoch 0's order.
  constexpr int64_t kEpochs = int64_t{1} << 32;
  ++run_calls_;  // (a refused one too: it stops the run, which its owner must tell)
  if (epoch < 0 || epoch >= kEpochs) {
    const arrow::Status refused =
        epoch < 0 ? arrow::Status::Invalid("epoch must be >= 0, got ", epoch)
                  : arrow::Status::Invalid("epoch must be below 2^32, got ", epoch);
    // As any failed StartEpoch: the current run ends, and Next() returns the error (the
    // old epoch's batches went on coming).
    std::vector<EpochRun> old;
    {
      MutexLock lock(mu_);
      start_error_ = refused;
      DetachLocked(&old);
    }
    ShutDown(std::move(old));
    return refused;
  }
  then_next_epoch = then_next_epoch && epoch + 1 < kEpochs;  // the last epoch has no next
  std::vector<EpochRun> old;
  arrow::Status st;
  {
    MutexLock lock(mu_);
    ReopenLocked();
    started_ = true;
    if (start_ns_ < 0) start_ns_ = NowNs();
    if (current_.pipeline != nullptr && !current_.delivered && !current_.elastic &&
        current_.epoch == epoch && current_.first_batch == 0 && first_batch == 0 &&
        elastic == nullptr && current_.seed == options_.plan.seed && current_.sink == sink_) {
      // This very epoch, started early and not read from yet (a mixture's source): it
      // goes on, with the budget of now.
      then_next_epoch_ = then_next_epoch;
      start_error_ = arrow::Status::OK();
      current_.StartPipeline(current_.PipelineShare(options_.max_inflight_bytes));
      current_.id = ++run_ids_;
      if (run_id != nullptr) *run_id = current_.id;
      ++epochs_started_ahead_;
      return arrow::Status::OK();
    }
    EpochRun ahead = std::move(next_);
    next_ = EpochRun{};
    DetachLocked(&old);
    then_next_epoch_ = then_next_epoch;
    if (ahead.active() && ahead.seed == options_.plan.seed && ahead.epoch == epoch &&
        first_batch == 0 && elastic == nullptr && ahead.sink == sink_) {
      // Started while the previous epoch ended: it now gets the whole budget.
      ahead.StartPipeline(ahead.PipelineShare(options_.max_inflight_bytes));
      ahead.adopted = true;
      current_ = std::move(ahead);
      ++epochs_started_ahead_;
    } else {
      if (ahead.active()) old.push_back(std::move(ahead));
      auto run = MakeRun(epoch, first_batch, options_.max_inflight_bytes, std::move(elastic));
      if (run.ok()) {
        current_ = std::move(run).ValueUnsafe();
      } else {
        st = run.status();
      }
    }
    // A run that could not be made ends nothing quietly: Next() returns its error (an
    // empty epoch in its place let a caller that went on train on nothing).
    start_error_ = st;
    current_.id = ++run_ids_;
    if (run_id != nullptr) *run_id = current_.id;
  }
  ShutDown(std::move(old));
  return st;
}

arrow::Result<std::shared_ptr<const RowOrder>> Loader::OrderOf(
    const PlanOptions& plan, int64_t epoch, const ElasticBase* elastic) const {
  if (elastic == nullptr) {
    return std::make_shared<PlanOrder>(
        std::make_shared<const EpochPlan>(EpochPlan::Make(dataset_->SplitRows(), plan, epoch)));
  }
  if (lengths_ != nullptr) {
    return arrow::Status::NotImplemented(
        "resuming a packed loader (pack=...) with another world size or batch size");
  }
  const std::string invalid = ValidateElasticBase(*elastic, dataset_->SplitRows(), plan, epoch);
  if (!invalid.empty()) return arrow::Status::Invalid("elastic resume: ", invalid);
  return MakeRemainderOrder(dataset_->SplitRows(), plan, epoch, *elastic);
}

arrow::Result<std::shared_ptr<const Loader::RunLayout>> Loader::LayOutRun(
    int64_t epoch, int64_t first_batch, const ElasticBase* elastic) const {
  auto layout = std::make_shared<RunLayout>();
  ARROW_ASSIGN_OR_RAISE(layout->order, OrderOf(options_.plan, epoch, elastic));
  layout->epoch = epoch;
  layout->first_batch = first_batch;
  layout->seed = options_.plan.seed;
  layout->batch_size = options_.plan.batch_size;
  layout->num_rows = layout->order->num_rows();
  const int64_t batch_size = layout->batch_size, num_rows = layout->num_rows;
  layout->num_batches = options_.plan.drop_last ? num_rows / batch_size
                                                : (num_rows + batch_size - 1) / batch_size;
  if (lengths_ != nullptr) {
    const auto& plan = static_cast<const PlanOrder&>(*layout->order).plan();
    layout->pack = std::make_shared<const PackPlan>(
        PackPlan::Make(plan, *lengths_, options_.pack, options_.plan.drop_last));
    layout->num_blocks = EqualBlocks(epoch, options_.plan.seed);
    layout->num_batches = BatchesOfBlocks(layout->num_blocks);
  }
  const int64_t num_batches = layout->num_batches;
  if (first_batch < 0 || first_batch > num_batches) {
    return arrow::Status::Invalid("batch ", first_batch, " is outside epoch ", epoch,
                                  ", which has ", num_batches, " batches");
  }
  const auto* plan_order = dynamic_cast<const PlanOrder*>(layout->order.get());
  if (window_gather_ && plan_order != nullptr && layout->pack == nullptr &&
      first_batch < num_batches) {
    const EpochPlan* plan = &plan_order->plan();
    std::map<int64_t, int64_t> uses;  // batches of the run reading each window
    for (int64_t b = first_batch; b < num_batches; ++b) {
      const auto [first, last] = layout->Positions(b);
      for (int64_t w = plan->WindowOfRow(first); w <= plan->WindowOfRow(last - 1); ++w) ++uses[w];
    }
    layout->plan = plan;
    layout->windows = std::make_shared<WindowStore>(std::move(uses));
    layout->sink = sink_;
  } else if (batches_in_place_ && layout->pack == nullptr) {
    layout->sink = sink_;  // each batch assembled into it
  }
  return layout;
}

std::shared_ptr<ReadAhead<std::shared_ptr<FetchedUnit>>> Loader::MakeReadAhead(
    const RunLayout& layout, int64_t budget, bool reads_ahead, std::shared_ptr<Work> work) {
  arrow::io::IOContext io(pool_, io_pool_.get());
  std::shared_ptr<const RowOrder> order = layout.order;
  // The run's stop flag: ends a claim's wait for a shard's lock, and its release's.
  CancelFlag stop(work, &work->stopping);
  return std::make_shared<ReadAhead<std::shared_ptr<FetchedUnit>>>(
      layout.UnitsOf(layout.first_batch).first, layout.UnitsOf(layout.num_batches - 1).second,
      [this, order, io, stop](int64_t u) -> arrow::Result<std::shared_ptr<FetchedUnit>> {
        const Unit& unit = order->units()[u];
        std::shared_ptr<FetchClaim> claim;
        // (An object modified just before it was listed is never cached: DataFile::settled.
        // No claim either: others would wait for an entry that never comes.)
        if (cache_ != nullptr && dataset_->files()[dataset_->splits()[unit.split].file].settled) {
          const std::string key = CacheKeyOf(unit.split);
          // A split the cache holds needs no I/O (if it is evicted meanwhile, it is
          // fetched when needed), nor does one another process is fetching (claimed:
          // ProduceUnit waits for its entry). Claims are taken in plan order, so the
          // process that claims a split first is the one that reads it first.
          if (cache_->Contains(key)) return nullptr;
          claim = cache_->TryClaim(key, stop);
          if (claim == nullptr) return nullptr;
        }
        ARROW_ASSIGN_OR_RAISE(auto f, FetchUnit(*dataset_, unit, read_options_, pool_, io));
        bytes_fetched_ += dataset_->splits()[unit.split].compressed_bytes;
        f->hold = std::move(claim);  // released once the entry is published (or dropped)
        return f;
      },
      [this, order](int64_t u) {
        return dataset_->splits()[order->units()[u].split].compressed_bytes;
      },
      reads_ahead ? ReadAheadOptions{options_.readahead, ReadAheadBudget(budget)}
                  : ReadAheadOptions{0, 0});
}

arrow::Result<Loader::EpochRun> Loader::MakeRun(int64_t epoch, int64_t first_batch,
                                                int64_t budget,
                                                std::shared_ptr<const ElasticBase> elastic,
                                                bool read_only) {
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<const RunLayout> layout,
                        LayOutRun(epoch, first_batch, elastic.get()));
  CacheFollowsPlan();
  EpochRun run;
  run.epoch = epoch;
  run.seed = options_.plan.seed;
  run.sink = layout->sink;
  run.first_batch = first_batch;
  run.elastic = elastic != nullptr;
  run.work = std::make_shared<Work>();
  run.windows = layout->windows;
  run.reads_ahead = cache_ == nullptr || !last_run_all_hits_.load();
  if (first_batch < layout->num_batches) {
    run.readahead = MakeReadAhead(*layout, budget, run.reads_ahead, run.work);
  }

  Pipeline::Work work;
  work.num_batches = layout->num_batches;
  work.batch_units = [layout](int64_t b) { return layout->UnitsOf(b); };
  work.unit_bytes = [this, order = layout->order](int64_t u) {
    // The footer's uncompressed size of the selected chunks, pro rata; the pipeline
    // scales it by what decoding actually produced so far.
    const Unit& unit = order->units()[u];
    const Split& split = dataset_->splits()[unit.split];
    if (split.num_rows <= 0) return int64_t{0};
    return static_cast<int64_t>(static_cast<double>(split.uncompressed_bytes) *
                                static_cast<double>(unit.num_rows()) /
                                static_cast<double>(split.num_rows));
  };
  work.run_unit = [this, order = layout->order, epoch, readahead = run.readahead,
                   counters = run.work, deferred = layout->windows != nullptr](
                      int64_t u, int64_t* bytes) -> arrow::Result<std::shared_ptr<const DecodedUnit>> {
    // When the plan reads this unit, on the cache schedule's clock (see CacheView).
    const double now = static_cast<double>(epoch) +
                       static_cast<double>(u) / static_cast<double>(order->units().size());
    auto unit = ProduceUnit(order->units()[u], readahead->Take(u), bytes, counters, now,
                            deferred);
    if (!unit.ok()) return NoteIfChanged(unit.status(), order->units()[u].split);
    return unit;
  };
  work.run_batch = [this, layout, counters = run.work](
                       int64_t b, const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                       int64_t* bytes) { return MakeBatch(*layout, b, units, bytes, counters.get()); };
  if (layout->windows != nullptr) {
    // Whole-window gathers: a batch that gathers windows allocates their shuffled copy,
    // the other batches are slices of it. So the next window is gathered as soon as its
    // units are decoded and its copy fits the budget, not only when the consumer is
    // within prefetch_batches of it (the consumer would wait for every window's gather,
    // and the workers idle while it takes a window's batches). Rows of unknown width:
    // never beyond prefetch_batches.
    const int64_t row_bytes = FixedRowBytes(dataset_->specs());
    work.batch_bytes = [layout, row_bytes](int64_t b) {
      if (row_bytes < 0) return std::numeric_limits<int64_t>::max() / 2;
      const auto [wa, wb] = layout->WindowsMadeBy(b);
      int64_t rows = 0;
      for (int64_t w = wa; w <= wb; ++w) {
        const auto [first, last] = layout->plan->WindowRowRange(w);
        rows += last - first;
      }
      return rows * row_bytes;
    };
  }

  PipelineOptions popts;
  popts.num_workers = options_.num_workers;
  popts.max_inflight_bytes = run.PipelineShare(budget);
  popts.max_prefetch_batches = options_.prefetch_batches;
  popts.debug_max_delay_us = options_.debug_max_delay_us;
  run.pending = std::make_shared<EpochRun::Pending>(
      EpochRun::Pending{std::move(work), popts, first_batch});
  if (read_only) {
    if (run.readahead != nullptr) run.readahead->Prime();
  } else {
    run.StartPipeline(popts.max_inflight_bytes);
  }
  return run;
}

arrow::Result<std::shared_ptr<Batch>> Loader::Next(std::chrono::nanoseconds timeout,
                                                   bool* timed_out, int64_t run) {
  if (timed_out != nullptr) *timed_out = false;
  if (timed_out == nullptr && timeout != std::chrono::nanoseconds::max()) {
    // A timeout returns nullptr, as the epoch's end does: without timed_out, the rest of
    // the epoch after a slow batch would be dropped quietly.
    return arrow::Status::Invalid("Next() with a timeout needs timed_out (a timeout and the "
                                  "epoch's end both return nullptr)");
  }
  std::shared_ptr<Pipeline> pipeline;
  {
    MutexLock lock(mu_);
    if (!started_) {
      // Without this, a caller that forgot StartEpoch would read an empty epoch.
      return arrow::Status::Invalid("Next() before StartEpoch(): start an epoch first");
    }
    if (run >= 0 && current_.id != run) {
      // Stopped (Stop(), close(), the interpreter's exit), no run since: the epoch ends
      // here, as for a caller without a run id. Another run current: nothing of it.
      if (current_.id == 0) return std::shared_ptr<Batch>();
      return arrow::Status::Cancelled("the run was replaced by a newer one");
    }
    if (!start_error_.ok()) return start_error_;  // the last StartEpoch failed
    pipeline = current_.pipeline;
  }
  if (pipeline == nullptr) return std::shared_ptr<Batch>();
  bool waited_out = false;
  ARROW_ASSIGN_OR_RAISE(auto batch, pipeline->Next(timeout, &waited_out));
  if (waited_out) {
    if (timed_out != nullptr) *timed_out = true;
    return batch;
  }
  if (batch == nullptr) {
    // The epoch is over; a run started ahead for the next one stays for StartEpoch.
    EpochRun done;
    {
      MutexLock lock(mu_);
      if (current_.pipeline != pipeline) return batch;  // already stopped (or replaced)
      done = std::move(current_);
      current_ = EpochRun{};
    }
    NoteCacheUse(*done.work);
    std::vector<EpochRun> runs;
    runs.push_back(std::move(done));
    ShutDown(std::move(runs));
    return batch;
  }
  MaybeStartNextEpoch(*pipeline);
  MutexLock lock(stats_mu_);
  if (stats_.time_to_first_batch_seconds < 0) {
    stats_.time_to_first_batch_seconds = (NowNs() - start_ns_) * 1e-9;
  }
  stats_.rows += batch->num_rows;
  stats_.batches += 1;
  return batch;
}

void Loader::MaybeStartNextEpoch(const Pipeline& pipeline) {
  MutexLock lock(mu_);
  if (current_.pipeline.get() != &pipeline) return;
  current_.delivered = true;  // a batch of it was read: StartEpoch no longer keeps it
  if (!then_next_epoch_) return;
  // The two epochs share the memory bound: the next one may decode into what this one
  // does not hold (its last units wait for their batches), until StartEpoch adopts it
  // and gives it all; so the boundary costs about one batch, not a fill.
  const int64_t half = options_.max_inflight_bytes / 2;
  const int64_t left = std::max<int64_t>(
      0, current_.PipelineShare(options_.max_inflight_bytes) - pipeline.counters().inflight_bytes);
  if (next_.pipeline != nullptr) {
    next_.pipeline->set_max_inflight_bytes(left);
    return;
  }
  if (pipeline.all_units_done()) {
    // What is left of this epoch is batches: the next one starts decoding.
    if (!next_.active()) {
      NoteCacheUse(*current_.work);  // every unit of this epoch is produced
      auto run = MakeRun(current_.epoch + 1, 0, half);
      if (!run.ok()) return;  // its error surfaces when the epoch starts
      next_ = std::move(run).ValueUnsafe();
      next_.adopted = false;
    }
    next_.StartPipeline(left);
    return;
  }
  // Every read of this epoch has started: the next epoch's first reads keep the link
  // busy (decoding waits for the line above). With a cache, not before every unit is
  // produced and in it, so the next epoch does not fetch a split being fetched now.
  if (next_.active() || cache_ != nullptr || current_.readahead == nullptr ||
      !current_.readahead->all_started()) {
    return;
  }
  auto run = MakeRun(current_.epoch + 1, 0, half, nullptr, /*read_only=*/true);
  if (!run.ok()) return;
  next_ = std::move(run).ValueUnsafe();
  next_.adopted = false;
}

int64_t Loader::EqualBlocks(int64_t epoch, uint64_t seed) const {
  MutexLock lock(blocks_mu_);
  auto it = blocks_by_epoch_.find({seed, epoch});
  if (it != blocks_by_epoch_.end()) return it->second;
  PlanOptions plan = options_.plan;
  plan.seed = seed;
  const int64_t blocks =
      PackPlan::EqualBlocks(dataset_->SplitRows(), plan, epoch, *lengths_, options_.pack,
                            block_policy_);
  if (blocks_by_epoch_.size() > 16) blocks_by_epoch_.clear();
  blocks_by_epoch_[{seed, epoch}] = blocks;
  return blocks;
}

int64_t Loader::MaxWindowBytes() const {
  if (!options_.plan.shuffle) return 0;
  double row_bytes = 0;  // of every output column, where the loader gathers windows
  bool exact = window_gather_;
  for (const auto& f : transforms_.fixed_outputs()) {
    exact = exact && f.has_value();
    if (f.has_value()) row_bytes += static_cast<double>(f->bytes());
  }
  std::vector<double> bytes;
  bytes.reserve(dataset_->splits().size());
  for (const Split& split : dataset_->splits()) {
    bytes.push_back(exact ? static_cast<double>(split.num_rows) * row_bytes
                          : static_cast<double>(split.uncompressed_bytes));
  }
  const auto k = static_cast<std::ptrdiff_t>(
      std::min<int64_t>(options_.plan.shuffle_window, static_cast<int64_t>(bytes.size())));
  std::partial_sort(bytes.begin(), bytes.begin() + k, bytes.end(), std::greater<double>());
  double window = 0;
  for (auto it = bytes.begin(); it != bytes.begin() + k; ++it) window += *it;
  // (in double: a hostile footer's counts; 2^63 itself is not an int64)
  constexpr double kMax = 9.2e18;
  return window >= kMax ? static_cast<int64_t>(kMax) : static_cast<int64_t>(window);
}

int64_t Loader::batch_rows(int64_t epoch, uint64_t seed) const {
  if (options_.plan.drop_last) return num_batches_under_seed(epoch, seed) * options_.plan.batch_size;
  return lengths_ == nullptr ? first_plan_.num_rows() : EqualBlocks(epoch, seed);
}

int64_t Loader::BatchesOfBlocks(int64_t blocks) const {
  const int64_t b = options_.plan.batch_size;
  return options_.plan.drop_last ? blocks / b : (blocks + b - 1) / b;
}

arrow::Result<int64_t> Loader::num_batches(int64_t epoch, const ElasticBase& elastic) const {
  PlanOptions plan;
  {
    MutexLock lock(mu_);
    plan = options_.plan;
  }
  ARROW_ASSIGN_OR_RAISE(auto order, OrderOf(plan, epoch, &elastic));
  const int64_t n = order->num_rows(), b = plan.batch_size;
  return plan.drop_last ? n / b : (n + b - 1) / b;
}

int64_t Loader::num_batches(int64_t epoch) const {
  uint64_t seed;
  {
    MutexLock lock(mu_);
    seed = options_.plan.seed;
  }
  return num_batches_under_seed(epoch, seed);
}

int64_t Loader::num_batches_under_seed(int64_t epoch, uint64_t seed) const {
  if (lengths_ == nullptr) return first_plan_.num_batches();
  return BatchesOfBlocks(EqualBlocks(epoch, seed));
}

const std::vector<ColumnSpec>& Loader::specs() const {
  return stack_.has_value() ? stack_->specs() : unstacked_specs();
}

const std::vector<ColumnSpec>& Loader::unstacked_specs() const {
  return lengths_ != nullptr ? packed_specs_ : transforms_.output_specs();
}

std::optional<SampleSignature> Loader::output_signature(size_t c) const {
  if (!stack_.has_value()) return unstacked_signature(c);
  if (c >= specs().size()) return std::nullopt;
  const int before = stack_->sources()[c];
  if (before >= 0) return unstacked_signature(static_cast<size_t>(before));
  const ColumnSpec& spec = stack_->specs()[c];  // stacked: numbers of a known dtype and shape
  SampleSignature sig;
  sig.dtype = spec.dtype;
  sig.shape = spec.row_shape;
  return sig;
}

std::optional<SampleSignature> Loader::unstacked_signature(size_t c) const {
  if (lengths_ != nullptr || c >= unstacked_specs().size()) return std::nullopt;
  const auto& [input, part] = transforms_.output_sources()[c];
  if (part != TransformPlan::Part::kValues) return std::nullopt;
  std::optional<SampleSignature> sig = transforms_.signatures()[input];
  // The signature is the ops' before the column's collate step: a final PadOrTruncate
  // (or lists=Pad) fixes the first dimension, as the batches have it (column_info gave
  // -1 for [Cast, PadOrTruncate(n)] where the batches are (B, n)).
  const ColumnCollate& collate = transforms_.collate()[static_cast<size_t>(input)];
  if (sig.has_value() && sig->shape.has_value() && !sig->shape->empty() &&
      collate.mode == ColumnCollate::Mode::kPad) {
    (*sig->shape)[0] = collate.length > 0 ? collate.length : -1;
  }
  return sig;
}

std::string Loader::TakeWarning() { return cache_ ? cache_->TakeWarning() : std::string(); }

LoaderStats Loader::stats() const {
  LoaderStats s;
  {
    MutexLock lock(stats_mu_);
    s = stats_;
  }
  // The epoch in progress counts; one started ahead only once the consumer begins it.
  std::shared_ptr<Pipeline> pipeline;
  std::shared_ptr<Work> work;
  {
    MutexLock lock(mu_);
    pipeline = current_.pipeline;
    work = current_.work;
  }
  if (pipeline != nullptr) {
    AddCounters(pipeline->counters(), &s);
    work->AddTo(&s);
  }
  s.epochs_started_ahead = epochs_started_ahead_.load();
  s.bytes_fetched = bytes_fetched_.load();
  if (cache_ != nullptr) {
    const CacheCounters c = cache_->counters();
    const int64_t hits = s.cache.hits, misses = s.cache.misses;
    s.cache = c;
    s.cache.hits = hits;
    s.cache.misses = misses;
  }
  s.pool_allocations = pool_->recyclable_allocations();
  s.pool_recycled = pool_->recycled_allocations();
  s.pool_cached_bytes = pool_->cached_bytes();
  s.pool_fresh_bytes = pool_->fresh_bytes();
  return s;
}

}  // namespace pqloader
