#include "pqloader/loader.h"

#include <chrono>
#include <thread>

#include <arrow/util/thread_pool.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
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
  ARROW_ASSIGN_OR_RAISE(loader->dataset_, Dataset::Open(sources, options.dataset));
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
  loader->first_plan_ = EpochPlan::Make(loader->dataset_->SplitRows(), options.plan, 0);
  return loader;
}

Loader::~Loader() { Stop(); }

void Loader::Stop() {
  if (pipeline_ == nullptr) return;
  pipeline_->Shutdown();
  readahead_.reset();  // requests still in flight finish on io_pool_, unread
  const PipelineCounters c = pipeline_->counters();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.read_seconds += c.unit_ns * 1e-9;
    stats_.assemble_seconds += c.batch_ns * 1e-9;
    stats_.wait_seconds += c.wait_ns * 1e-9;
    stats_.units_read += c.units_done;
    stats_.peak_inflight_bytes = std::max(stats_.peak_inflight_bytes, c.peak_inflight_bytes);
  }
  pipeline_.reset();
}

arrow::Status Loader::StartEpoch(int64_t epoch, int64_t first_batch) {
  Stop();
  if (epoch < 0) return arrow::Status::Invalid("epoch must be >= 0, got ", epoch);
  auto plan = std::make_shared<const EpochPlan>(
      EpochPlan::Make(dataset_->SplitRows(), options_.plan, epoch));
  if (first_batch < 0 || first_batch > plan->num_batches()) {
    return arrow::Status::Invalid("batch ", first_batch, " is outside epoch ", epoch, ", which has ",
                                  plan->num_batches(), " batches");
  }
  if (start_ns_ < 0) start_ns_ = NowNs();
  plan_ = plan;
  perms_ = std::make_shared<PermutationCache>(plan);
  if (first_batch < plan->num_batches()) {
    arrow::io::IOContext io(pool_, io_pool_.get());
    readahead_ = std::make_shared<ReadAhead<std::shared_ptr<FetchedUnit>>>(
        plan->BatchUnitRange(first_batch).first,
        plan->BatchUnitRange(plan->num_batches() - 1).second,
        [this, plan, io](int64_t u) {
          return FetchUnit(*dataset_, plan->units()[u], read_options_, pool_, io);
        },
        [this, plan](int64_t u) {
          return dataset_->splits()[plan->units()[u].split].compressed_bytes;
        },
        ReadAheadOptions{options_.readahead, options_.max_inflight_bytes});
  }

  Pipeline::Work work;
  work.num_batches = plan->num_batches();
  work.batch_units = [plan](int64_t b) { return plan->BatchUnitRange(b); };
  work.run_unit = [this, plan, readahead = readahead_](int64_t u, int64_t* bytes)
      -> arrow::Result<std::shared_ptr<const DecodedUnit>> {
    const Unit& unit = plan->units()[u];
    ARROW_ASSIGN_OR_RAISE(auto fetched, readahead->Take(u));
    ARROW_ASSIGN_OR_RAISE(auto decoded,
                          ReadUnit(*dataset_, unit, read_options_, pool_, fetched.get()));
    *bytes = decoded->ByteSize();
    bytes_read_ += dataset_->splits()[unit.split].compressed_bytes;
    bytes_decoded_ += *bytes;
    return decoded;
  };
  auto perms = perms_;
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
    auto batch = AssembleBatch(specs(), units, lo, rows, pool_);
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
    *bytes = (*batch)->ByteSize();
    return batch;
  };

  PipelineOptions popts;
  popts.num_threads = options_.num_workers;
  popts.max_inflight_bytes = options_.max_inflight_bytes;
  popts.max_prefetch_batches = options_.prefetch_batches;
  popts.debug_max_delay_us = options_.debug_max_delay_us;
  pipeline_ = std::make_unique<Pipeline>(std::move(work), popts, first_batch);
  return arrow::Status::OK();
}

arrow::Result<std::shared_ptr<Batch>> Loader::Next() {
  if (pipeline_ == nullptr) return std::shared_ptr<Batch>();
  ARROW_ASSIGN_OR_RAISE(auto batch, pipeline_->Next());
  if (batch == nullptr) {
    Stop();
    return batch;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (stats_.time_to_first_batch_seconds < 0) {
    stats_.time_to_first_batch_seconds = (NowNs() - start_ns_) * 1e-9;
  }
  stats_.rows += batch->num_rows;
  stats_.batches += 1;
  return batch;
}

LoaderStats Loader::stats() const {
  LoaderStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  if (pipeline_ != nullptr) {
    const PipelineCounters c = pipeline_->counters();
    s.read_seconds += c.unit_ns * 1e-9;
    s.assemble_seconds += c.batch_ns * 1e-9;
    s.wait_seconds += c.wait_ns * 1e-9;
    s.units_read += c.units_done;
    s.peak_inflight_bytes = std::max(s.peak_inflight_bytes, c.peak_inflight_bytes);
  }
  s.bytes_read = bytes_read_.load();
  s.bytes_decoded = bytes_decoded_.load();
  return s;
}

}  // namespace pqloader
