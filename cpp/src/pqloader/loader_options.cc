// LoaderOptions checked before anything is opened: the checks the Python Loader makes by
// name, for a C++ caller (whose value would otherwise be taken for a default, clamped, or
// overflow the arithmetic on it).
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "pqloader/loader.h"
#include "pqloader/loader_internal.h"

namespace pqloader {

arrow::Status ValidateLoaderOptions(const LoaderOptions& options) {
  const std::string invalid = ValidatePlanOptions(options.plan);
  if (!invalid.empty()) return arrow::Status::Invalid(invalid);
  if (options.io_threads <= 0) return arrow::Status::Invalid("io_threads must be positive");
  if (options.plan.shard_policy != ShardPolicy::kDrop &&
      options.plan.shard_policy != ShardPolicy::kPad) {
    return arrow::Status::Invalid("shard_policy must be kDrop or kPad (kNone is a packing "
                                  "loader's own rows), got ",
                                  static_cast<int>(options.plan.shard_policy));
  }
  // The checks the Python Loader makes by name (a C++ caller's value is otherwise taken
  // for a default, or clamped).
  for (const auto& [name, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"num_workers", options.num_workers},
           {"max_inflight_bytes", options.max_inflight_bytes},
           {"prefetch_batches", options.prefetch_batches},
           {"readahead", options.readahead},
           {"debug_max_delay_us", options.debug_max_delay_us},
           {"dataset.metadata_threads", options.dataset.metadata_threads},
           {"cache.size_limit", options.cache.size_limit},
           {"cache.wait_timeout_ms", options.cache.wait_timeout_ms},
           {"cache.lock_timeout_ms", options.cache.lock_timeout_ms}}) {
    if (value < 0) return arrow::Status::Invalid(name, " must be >= 0, got ", value);
  }
  // Upper bounds (the Python Loader's, or where arithmetic on them would overflow: a
  // timeout past ~9.2e12 ms in nanoseconds wrapped to "do not wait", a delay's deadline
  // wrapped to a hang, twice the budget reserved for the buffer pool wrapped negative).
  constexpr int64_t kWeekMs = int64_t{7} * 24 * 3600 * 1000;
  for (const auto& [name, value, limit] :
       std::initializer_list<std::tuple<const char*, int64_t, int64_t>>{
           {"cache.wait_timeout_ms", options.cache.wait_timeout_ms, kWeekMs},
           {"cache.lock_timeout_ms", options.cache.lock_timeout_ms, kWeekMs},
           {"debug_max_delay_us", options.debug_max_delay_us, int64_t{3'600'000'000}},
           {"max_inflight_bytes", options.max_inflight_bytes, int64_t{1} << 61}}) {
    if (value > limit) return arrow::Status::Invalid(name, " must be at most ", limit, ", got ", value);
  }
  if (!options.cache.dir.empty() &&
      (options.cache.shards < 1 || options.cache.shards > kMaxCacheShards)) {
    return arrow::Status::Invalid("cache.shards must be in [1, ", kMaxCacheShards, "], got ",
                                  options.cache.shards);
  }
  if (options.cache.policy != CachePolicy::kKeep && options.cache.policy != CachePolicy::kLru &&
      options.cache.policy != CachePolicy::kPlan) {
    return arrow::Status::Invalid("cache.policy must be kKeep, kLru or kPlan, got ",
                                  static_cast<int>(options.cache.policy));
  }
  if (options.on_decode_error != DecodeErrorPolicy::kRaise &&
      options.on_decode_error != DecodeErrorPolicy::kSkip) {
    return arrow::Status::Invalid("on_decode_error must be kRaise or kSkip, got ",
                                  static_cast<int>(options.on_decode_error));
  }
  // As the Python Loader checks: a thread each, and thousands would fail to start.
  constexpr int kMaxThreads = 1024;
  if (options.num_workers > kMaxThreads || options.io_threads > kMaxThreads) {
    return arrow::Status::Invalid("num_workers and io_threads must be at most ", kMaxThreads,
                                  ", got ", options.num_workers, " and ", options.io_threads);
  }
  return arrow::Status::OK();
}

}  // namespace pqloader
