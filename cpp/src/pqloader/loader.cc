#include "pqloader/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <arrow/util/thread_pool.h>

#include "pqloader/cache/entry_format.h"
#include "pqloader/error.h"

namespace pqloader {

namespace {

// Columns with rows of at most this many bytes are gathered row-major when shuffling
// (see WithRowMajor); larger rows are gathered well column by column.
constexpr int64_t kRowMajorMaxRowBytes = 64;

// The share of max_inflight_bytes that fetched, not yet decoded bytes may hold; the
// rest is for decoded units and batches.
int64_t ReadAheadBudget(int64_t max_inflight_bytes) { return max_inflight_bytes / 4; }
int64_t PipelineBudget(int64_t max_inflight_bytes) {
  return max_inflight_bytes - ReadAheadBudget(max_inflight_bytes);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
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

// Window permutations, computed once per window by whichever worker needs one first.
class Loader::PermutationCache {
 public:
  explicit PermutationCache(std::shared_ptr<const EpochPlan> plan) : plan_(std::move(plan)) {}

  std::shared_ptr<const std::vector<uint32_t>> Get(int64_t w) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = perms_.find(w);
      if (it != perms_.end()) return it->second;
    }
    auto perm = std::make_shared<const std::vector<uint32_t>>(plan_->WindowPermutation(w));
    std::lock_guard<std::mutex> lock(mu_);
    // Batches are claimed in order, so windows far behind are no longer needed.
    perms_.erase(perms_.begin(), perms_.lower_bound(w - 2));
    return perms_.emplace(w, std::move(perm)).first->second;
  }

 private:
  std::shared_ptr<const EpochPlan> plan_;
  std::mutex mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<uint32_t>>> perms_;  // GUARDED_BY(mu_)
};

arrow::Result<std::unique_ptr<Loader>> Loader::Make(const std::vector<std::string>& sources,
                                                    const LoaderOptions& options) {
  const std::string invalid = ValidatePlanOptions(options.plan);
  if (!invalid.empty()) return arrow::Status::Invalid(invalid);
  if (options.max_inflight_bytes <= 0) {
    return arrow::Status::Invalid("max_inflight_bytes must be positive");
  }
  if (options.io_threads <= 0) return arrow::Status::Invalid("io_threads must be positive");
  std::unique_ptr<Loader> loader(new Loader());
  loader->options_ = options;
  if (loader->options_.num_workers <= 0) {
    loader->options_.num_workers =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (loader->options_.prefetch_batches <= 0) {
    loader->options_.prefetch_batches = std::max(2, 2 * loader->options_.num_workers);
  }
  if (loader->options_.readahead <= 0) loader->options_.readahead = options.io_threads;
  ARROW_ASSIGN_OR_RAISE(loader->io_pool_, arrow::internal::ThreadPool::Make(options.io_threads));
  // Freed blocks are kept for reuse up to the in-flight budget (see buffer_pool.h):
  // without them, fresh pages cost a quarter of the CPU of a shuffled epoch.
  loader->pool_reservation_ =
      std::make_unique<PoolCacheReservation>(options.max_inflight_bytes);
  DatasetOptions dataset_options = options.dataset;
  if (!options.cache.dir.empty() && options.cache.dir != ":memory:") {
    dataset_options.footer_cache_dir = options.cache.dir;  // footers kept across runs too
  }
  ARROW_ASSIGN_OR_RAISE(loader->dataset_, Dataset::Open(sources, dataset_options));
  for (const auto& [name, fill] : options.fills) {
    bool found = false;
    for (const auto& spec : loader->dataset_->specs()) found = found || spec.name == name;
    if (!found) {
      return MakeError(ErrorKind::kColumnNotFound, "fill_null names column '", name,
                       "', which is not among the selected columns");
    }
  }
  for (const auto& spec : loader->dataset_->specs()) {
    auto it = options.fills.find(spec.name);
    loader->read_options_.fills.push_back(it != options.fills.end() ? it->second
                                                                     : options.default_fill);
  }
  loader->read_options_.verify_checksums = options.verify_checksums;
  ARROW_ASSIGN_OR_RAISE(loader->transforms_,
                        TransformPlan::Make(loader->dataset_->specs(), options.transforms,
                                            options.on_decode_error,
                                            /*cache_point=*/!options.cache.dir.empty()));
  for (size_t c = 0; c < loader->dataset_->specs().size(); ++c) {
    loader->read_options_.allow_ragged.push_back(
        loader->transforms_.transforms_column(static_cast<int>(c)));
  }
  loader->first_plan_ = EpochPlan::Make(loader->dataset_->SplitRows(), options.plan, 0);
  if (!options.cache.dir.empty()) {
    loader->cache_ = SplitCache::Open(options.cache);
    // Everything that changes a cached split's content is part of its key.
    std::string id = "pqloader-cache-v" + std::to_string(kCacheFormatVersion);
    for (size_t c = 0; c < loader->dataset_->specs().size(); ++c) {
      const ColumnSpec& spec = loader->dataset_->specs()[c];
      const NullFill& f = loader->read_options_.fills[c];
      id += "|col=" + spec.name + ":" + spec.arrow_type + ":fill=" +
            (f.enabled ? std::to_string(f.is_float) + "," + std::to_string(f.int_value) + "," +
                             std::to_string(f.float_value) + "," + f.bytes_value
                       : "none") +
            ":ragged=" + std::to_string(loader->read_options_.allow_ragged[c]);
    }
    id += "|prefix=" + loader->transforms_.PrefixFingerprint();
    id += "|skip=" + std::to_string(options.on_decode_error == DecodeErrorPolicy::kSkip);
    // Strings read as bytes are not UTF-8 checked: their entries must not serve str reads.
    if (options.dataset.strings_as_bytes) id += "|strings=bytes";
    loader->cache_identity_ = id;
  }
  return loader;
}

Loader::~Loader() { Stop(); }

void Loader::DetachLocked(std::vector<EpochRun>* runs) {
  if (cache_ != nullptr) {
    const CacheCounters now = cache_->counters();
    CacheCounters delta;
    delta.hits = now.hits - recorded_.hits;
    delta.misses = now.misses - recorded_.misses;
    delta.inserts = now.inserts - recorded_.inserts;
    delta.evictions = now.evictions - recorded_.evictions;
    delta.corrupt = now.corrupt - recorded_.corrupt;
    delta.write_errors = now.write_errors - recorded_.write_errors;
    if (delta.hits || delta.misses || delta.inserts || delta.corrupt || delta.write_errors) {
      RecordCacheCounters(options_.cache.dir, delta);
    }
    recorded_ = now;
  }
  // Requests still in flight finish on io_pool_, unread.
  if (current_.pipeline != nullptr) runs->push_back(std::move(current_));
  if (next_.pipeline != nullptr) runs->push_back(std::move(next_));
  current_ = EpochRun{};
  next_ = EpochRun{};
}

void Loader::ShutDown(std::vector<EpochRun> runs) {
  for (EpochRun& run : runs) {
    run.pipeline->Shutdown();  // wakes a Next() waiting on it in another thread
    std::lock_guard<std::mutex> lock(stats_mu_);
    AddCounters(run.pipeline->counters(), &stats_);
  }
}

void Loader::Stop() {
  std::vector<EpochRun> runs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DetachLocked(&runs);
  }
  ShutDown(std::move(runs));
}

arrow::Status Loader::StartEpoch(int64_t epoch, int64_t first_batch, bool then_next_epoch) {
  if (epoch < 0) return arrow::Status::Invalid("epoch must be >= 0, got ", epoch);
  std::vector<EpochRun> old;
  arrow::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (start_ns_ < 0) start_ns_ = NowNs();
    EpochRun ahead = std::move(next_);
    next_ = EpochRun{};
    DetachLocked(&old);
    then_next_epoch_ = then_next_epoch;
    if (ahead.pipeline != nullptr && ahead.epoch == epoch && first_batch == 0) {
      // Started while the previous epoch ended: it now gets the whole budget.
      ahead.pipeline->set_max_inflight_bytes(PipelineBudget(options_.max_inflight_bytes));
      current_ = std::move(ahead);
      ++epochs_started_ahead_;
    } else {
      if (ahead.pipeline != nullptr) old.push_back(std::move(ahead));
      auto run = MakeRun(epoch, first_batch, options_.max_inflight_bytes);
      if (run.ok()) {
        current_ = std::move(run).ValueUnsafe();
      } else {
        st = run.status();
      }
    }
  }
  ShutDown(std::move(old));
  return st;
}

arrow::Result<Loader::EpochRun> Loader::MakeRun(int64_t epoch, int64_t first_batch,
                                                int64_t budget) {
  auto plan = std::make_shared<const EpochPlan>(
      EpochPlan::Make(dataset_->SplitRows(), options_.plan, epoch));
  if (first_batch < 0 || first_batch > plan->num_batches()) {
    return arrow::Status::Invalid("batch ", first_batch, " is outside epoch ", epoch, ", which has ",
                                  plan->num_batches(), " batches");
  }
  EpochRun run;
  run.epoch = epoch;
  auto perms = std::make_shared<PermutationCache>(plan);
  if (first_batch < plan->num_batches()) {
    arrow::io::IOContext io(pool_, io_pool_.get());
    run.readahead = std::make_shared<ReadAhead<std::shared_ptr<FetchedUnit>>>(
        plan->BatchUnitRange(first_batch).first,
        plan->BatchUnitRange(plan->num_batches() - 1).second,
        [this, plan, io](int64_t u) -> arrow::Result<std::shared_ptr<FetchedUnit>> {
          const Unit& unit = plan->units()[u];
          // A split the cache holds needs no I/O (if it is evicted meanwhile, it is
          // fetched when needed).
          if (cache_ != nullptr && cache_->Contains(CacheKeyOf(unit.split))) return nullptr;
          return FetchUnit(*dataset_, unit, read_options_, pool_, io);
        },
        [this, plan](int64_t u) {
          return dataset_->splits()[plan->units()[u].split].compressed_bytes;
        },
        ReadAheadOptions{options_.readahead, ReadAheadBudget(budget)});
  }

  Pipeline::Work work;
  work.num_batches = plan->num_batches();
  work.batch_units = [plan](int64_t b) { return plan->BatchUnitRange(b); };
  work.unit_bytes = [this, plan](int64_t u) {
    // The footer's uncompressed size of the selected chunks, pro rata; the pipeline
    // scales it by what decoding actually produced so far.
    const Unit& unit = plan->units()[u];
    const Split& split = dataset_->splits()[unit.split];
    if (split.num_rows <= 0) return int64_t{0};
    return static_cast<int64_t>(static_cast<double>(split.uncompressed_bytes) *
                                static_cast<double>(unit.num_rows()) /
                                static_cast<double>(split.num_rows));
  };
  work.run_unit = [this, plan, readahead = run.readahead](int64_t u, int64_t* bytes) {
    return ProduceUnit(plan->units()[u], readahead->Take(u), bytes);
  };
  work.run_batch = [this, plan, perms, epoch](
                       int64_t b, const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                       int64_t* bytes) -> arrow::Result<std::shared_ptr<Batch>> {
    const auto [first, last] = plan->BatchRowRange(b);
    const int64_t lo = plan->BatchUnitRange(b).first;
    std::vector<std::shared_ptr<const std::vector<uint32_t>>> held;
    static const std::vector<uint32_t> kIdentity;
    std::vector<RowRef> rows;
    rows.reserve(last - first);
    plan->ResolveRows(first, last, [&](int64_t w) -> const std::vector<uint32_t>& {
      if (!plan->options().shuffle) return kIdentity;
      held.push_back(perms->Get(w));
      return *held.back();
    }, &rows);
    std::vector<std::vector<SampleTensor>> samples;
    std::vector<std::vector<int64_t>> lengths;
    int64_t t0 = NowNs();
    if (!transforms_.empty()) {
      auto st = TransformRows(*plan, units, lo, &rows, &samples);
      const int64_t t1 = NowNs();
      transform_ns_ += t1 - t0;
      t0 = t1;
      ARROW_RETURN_NOT_OK(st);
    }
    auto batch = AssembleBatch(dataset_->specs(), units, lo, rows, samples, pool_,
                               transforms_.collate(), &lengths);
    gather_ns_ += NowNs() - t0;
    if (batch.ok() && !transforms_.empty()) batch = AddLengthColumns(std::move(*batch), lengths);
    if (!batch.ok()) {
      std::string files;
      for (size_t i = 0; i < units.size(); ++i) {
        const Split& s = dataset_->splits()[plan->units()[lo + i].split];
        files += (i ? ", '" : "'") + dataset_->files()[s.file].display + "' row group " +
                 std::to_string(s.row_group);
      }
      return WithContext(batch.status(), "batch " + std::to_string(b) + " of epoch " +
                                             std::to_string(epoch) + " (from " + files + ")");
    }
    (*batch)->epoch = epoch;
    (*batch)->index = b;
    *bytes = (*batch)->owned_bytes;
    return batch;
  };

  PipelineOptions popts;
  popts.num_threads = options_.num_workers;
  popts.max_inflight_bytes = budget - ReadAheadBudget(budget);
  popts.max_prefetch_batches = options_.prefetch_batches;
  popts.debug_max_delay_us = options_.debug_max_delay_us;
  run.pipeline = std::make_shared<Pipeline>(std::move(work), popts, first_batch);
  return run;
}

arrow::Result<std::shared_ptr<Batch>> Loader::Next(std::chrono::nanoseconds timeout,
                                                   bool* timed_out) {
  if (timed_out != nullptr) *timed_out = false;
  std::shared_ptr<Pipeline> pipeline;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::shared_ptr<Pipeline> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_.pipeline != pipeline) return batch;  // already stopped (or replaced)
      done = std::move(current_.pipeline);
      current_ = EpochRun{};
    }
    ShutDown({EpochRun{0, std::move(done), nullptr}});
    return batch;
  }
  MaybeStartNextEpoch(*pipeline);
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (stats_.time_to_first_batch_seconds < 0) {
    stats_.time_to_first_batch_seconds = (NowNs() - start_ns_) * 1e-9;
  }
  stats_.rows += batch->num_rows;
  stats_.batches += 1;
  return batch;
}

void Loader::MaybeStartNextEpoch(const Pipeline& pipeline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!then_next_epoch_ || next_.pipeline != nullptr || current_.pipeline.get() != &pipeline ||
      !pipeline.all_units_done()) {
    return;
  }
  // Every unit of this epoch is produced (and in the cache, if there is one, so the next
  // epoch does not decode a split again): what is left is its last batches. The next epoch starts reading and decoding with half the budget (it gets
  // all of it when StartEpoch adopts it), so the boundary costs about one batch.
  auto run = MakeRun(current_.epoch + 1, 0, options_.max_inflight_bytes / 2);
  if (run.ok()) next_ = std::move(run).ValueUnsafe();
}

arrow::Result<std::shared_ptr<DecodedUnit>> Loader::DecodeRows(
    const Unit& unit, arrow::Result<std::shared_ptr<FetchedUnit>> fetched) {
  ARROW_ASSIGN_OR_RAISE(auto f, std::move(fetched));
  if (f == nullptr) {  // not fetched ahead: fetch now
    ARROW_ASSIGN_OR_RAISE(f, FetchUnit(*dataset_, unit, read_options_, pool_,
                                       arrow::io::IOContext(pool_, io_pool_.get())));
  }
  const int64_t t0 = NowNs();
  ARROW_RETURN_NOT_OK(WaitForBytes(*dataset_, unit, f.get()));
  const int64_t t1 = NowNs();
  read_ns_ += t1 - t0;
  ARROW_ASSIGN_OR_RAISE(auto decoded, ReadUnit(*dataset_, unit, read_options_, pool_, f.get()));
  const int64_t t2 = NowNs();
  decode_ns_ += t2 - t1;
  bytes_read_ += dataset_->splits()[unit.split].compressed_bytes;
  if (!transforms_.empty()) {
    struct AddOnExit {
      std::atomic<int64_t>* to;
      int64_t since;
      ~AddOnExit() { *to += NowNs() - since; }
    } timer{&transform_ns_, t2};
    const Split& split = dataset_->splits()[unit.split];
    ARROW_RETURN_NOT_OK(transforms_.ApplyPrefix(
        decoded.get(), dataset_->specs(), [&](int64_t r) {
          return "'" + dataset_->files()[split.file].display + "', row group " +
                 std::to_string(split.row_group) + ", row " + std::to_string(unit.row_begin + r);
        }));
  }
  return decoded;
}

std::string Loader::CacheKeyOf(int64_t split_index) const {
  const Split& split = dataset_->splits()[split_index];
  const DataFile& file = dataset_->files()[split.file];
  return CacheKey(cache_identity_ + "|file=" + file.display + "|size=" + std::to_string(file.size) +
                  "|mtime=" + std::to_string(file.mtime_ns) + "|footer=" + file.footer_hash +
                  "|row_group=" + std::to_string(split.row_group));
}

namespace {

// Rows [begin, end) of `full`, sharing its buffers.
std::shared_ptr<const DecodedUnit> SliceRows(const std::shared_ptr<const DecodedUnit>& full,
                                             int64_t begin, int64_t end) {
  if (begin == 0 && end == full->num_rows) return full;
  auto out = std::make_shared<DecodedUnit>();
  out->num_rows = end - begin;
  if (!full->row_ok.empty()) {
    out->row_ok.assign(full->row_ok.begin() + begin, full->row_ok.begin() + end);
    out->skipped_rows = std::count(out->row_ok.begin(), out->row_ok.end(), 0);
  }
  if (full->row_major != nullptr) {
    auto rm = std::make_shared<RowMajorBlock>(*full->row_major);
    rm->data = arrow::SliceBuffer(rm->data, begin * rm->stride, (end - begin) * rm->stride);
    out->row_major = std::move(rm);
  }
  for (const ColumnData& c : full->columns) {
    ColumnData s;
    s.row_shape = c.row_shape;
    s.row_bytes = c.row_bytes;
    if (!c.samples.empty()) {
      s.samples.assign(c.samples.begin() + begin, c.samples.begin() + end);
    } else if (c.offsets != nullptr) {
      s.data = c.data;  // offsets index into it
      s.offsets = arrow::SliceBuffer(c.offsets, begin * 8, (end - begin + 1) * 8);
    } else if (c.data != nullptr) {
      s.data = arrow::SliceBuffer(c.data, begin * c.row_bytes, (end - begin) * c.row_bytes);
    }
    out->columns.push_back(std::move(s));
  }
  return out;
}

}  // namespace

arrow::Result<std::shared_ptr<const DecodedUnit>> Loader::ProduceUnit(
    const Unit& unit, arrow::Result<std::shared_ptr<FetchedUnit>> fetched, int64_t* bytes) {
  std::shared_ptr<const DecodedUnit> decoded;
  if (cache_ == nullptr) {
    ARROW_ASSIGN_OR_RAISE(decoded, DecodeRows(unit, std::move(fetched)));
  } else {
    // The cache holds whole splits, so every rank and every epoch shares one entry.
    const Split& split = dataset_->splits()[unit.split];
    const std::string key = CacheKeyOf(unit.split);
    const int64_t t0 = NowNs();
    std::shared_ptr<const DecodedUnit> full = cache_->Get(key);
    read_ns_ += NowNs() - t0;
    if (full != nullptr && full->num_rows == split.num_rows &&
        CheckUnitLayout(*full, dataset_->specs()).ok()) {
      cache_bytes_saved_ += split.compressed_bytes;
    } else {
      ARROW_ASSIGN_OR_RAISE(full, DecodeRows(Unit{unit.split, 0, split.num_rows},
                                             std::move(fetched)));
      // Shuffled loaders keep entries row-major: hits are then gathered as they are.
      if (options_.plan.shuffle) {
        ARROW_ASSIGN_OR_RAISE(full, RowMajor(std::move(full)));
      }
      cache_->Put(key, full);
    }
    decoded = SliceRows(full, unit.row_begin, unit.row_end);
  }
  if (options_.plan.shuffle) {
    ARROW_ASSIGN_OR_RAISE(decoded, RowMajor(std::move(decoded)));
  }
  skipped_rows_ += decoded->skipped_rows;
  *bytes = decoded->ByteSize();
  bytes_decoded_ += *bytes;
  return decoded;
}

arrow::Result<std::shared_ptr<const DecodedUnit>> Loader::RowMajor(
    std::shared_ptr<const DecodedUnit> unit) {
  if (unit->row_major != nullptr) return unit;
  const int64_t t0 = NowNs();
  auto out = WithRowMajor(unit, kRowMajorMaxRowBytes, pool_);
  gather_ns_ += NowNs() - t0;
  return out;
}

std::string Loader::TakeWarning() { return cache_ ? cache_->TakeWarning() : std::string(); }

arrow::Status Loader::TransformRows(const EpochPlan& plan,
                                    const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                                    int64_t unit_base, std::vector<RowRef>* rows,
                                    std::vector<std::vector<SampleTensor>>* samples) {
  const auto& specs = dataset_->specs();
  samples->assign(specs.size(), {});
  std::vector<RowRef> kept;
  kept.reserve(rows->size());
  SampleContext ctx;
  ctx.seed = plan.options().seed;
  ctx.epoch = plan.epoch();
  for (const RowRef& r : *rows) {
    const DecodedUnit& unit = *units[r.unit - unit_base];
    if (!unit.row_ok.empty() && !unit.row_ok[r.row]) continue;  // skipped while decoding
    const Unit& u = plan.units()[r.unit];
    ctx.sample_index = dataset_->split_first_row(u.split) + u.row_begin + r.row;
    bool ok = true;
    std::vector<SampleTensor> outs;
    for (size_t c = 0; c < specs.size() && ok; ++c) {
      if (!transforms_.has_suffix(static_cast<int>(c))) continue;
      auto s = transforms_.ApplySuffix(static_cast<int>(c), specs[c], unit, r.row, ctx);
      if (!s.ok()) {
        if (transforms_.policy() == DecodeErrorPolicy::kSkip) {
          ok = false;
          ++skipped_rows_;
          break;
        }
        const Split& split = dataset_->splits()[u.split];
        return arrow::Status(s.status().code(),
                             "'" + dataset_->files()[split.file].display + "', row group " +
                                 std::to_string(split.row_group) + ", row " +
                                 std::to_string(u.row_begin + r.row) + ", column '" +
                                 specs[c].name + "': " + s.status().message(),
                             s.status().detail());
      }
      outs.push_back(std::move(s).ValueUnsafe());
    }
    if (!ok) continue;
    kept.push_back(r);
    size_t k = 0;
    for (size_t c = 0; c < specs.size(); ++c) {
      if (transforms_.has_suffix(static_cast<int>(c))) (*samples)[c].push_back(std::move(outs[k++]));
    }
  }
  *rows = std::move(kept);
  return arrow::Status::OK();
}

arrow::Result<std::shared_ptr<Batch>> Loader::AddLengthColumns(
    std::shared_ptr<Batch> batch, const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<BatchColumn> columns;
  for (const auto& [src, is_length] : transforms_.output_sources()) {
    if (!is_length) {
      columns.push_back(batch->columns[src]);
      continue;
    }
    BatchColumn c;
    c.kind = ColumnKind::kTensor;
    c.dtype = DType::kInt64;
    c.shape = {batch->num_rows};
    ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(batch->num_rows * sizeof(int64_t), pool_));
    if (batch->num_rows > 0) {
      std::memcpy(data->mutable_data(), lengths[src].data(), batch->num_rows * sizeof(int64_t));
    }
    c.data = std::move(data);
    batch->owned_bytes += batch->num_rows * static_cast<int64_t>(sizeof(int64_t));
    columns.push_back(std::move(c));
  }
  batch->columns = std::move(columns);
  return batch;
}

LoaderStats Loader::stats() const {
  LoaderStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  std::vector<std::shared_ptr<Pipeline>> pipelines;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pipelines = {current_.pipeline, next_.pipeline};
  }
  for (const auto& p : pipelines) {
    if (p != nullptr) AddCounters(p->counters(), &s);
  }
  s.epochs_started_ahead = epochs_started_ahead_.load();
  s.read_seconds = read_ns_.load() * 1e-9;
  s.decode_seconds = decode_ns_.load() * 1e-9;
  s.transform_seconds = transform_ns_.load() * 1e-9;
  s.assemble_seconds = gather_ns_.load() * 1e-9;
  s.bytes_read = bytes_read_.load();
  s.bytes_decoded = bytes_decoded_.load();
  s.skipped_rows = skipped_rows_.load();
  if (cache_ != nullptr) s.cache = cache_->counters();
  s.cache_bytes_saved = cache_bytes_saved_.load();
  s.pool_allocations = pool_->recyclable_allocations();
  s.pool_recycled = pool_->recycled_allocations();
  s.pool_cached_bytes = pool_->cached_bytes();
  return s;
}

}  // namespace pqloader
