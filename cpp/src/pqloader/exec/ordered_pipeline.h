// OrderedPipeline: work-claiming worker threads whose results reach the consumer in
// sequence order.
//
// The work is two kinds of numbered task: units (e.g. read and decode a row-group
// slice) and batches (assemble batch b from units [lo_b, hi_b)). Workers claim the
// next unclaimed task (batches first, since the consumer waits on them), run it
// without holding the lock, and deposit the result in a slot keyed by its number.
// The consumer takes batches strictly in order, so the output never depends on the
// number of threads or on timing. A unit is freed once every batch that reads it is
// assembled. Memory is bounded: units are decoded only up to the units needed by
// `max_prefetch_batches` batches ahead of the consumer, and beyond the units the
// consumer needs right now only while the in-flight bytes stay under
// `max_inflight_bytes`.
//
// A failed unit fails exactly the batches that read it; the consumer sees the error
// when it reaches the first such batch, and the pipeline stops (no hang).
//
// Thread-safety: Next() is called by one consumer thread; everything else is internal.
// This header knows nothing of Parquet.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <arrow/result.h>
#include <arrow/status.h>

namespace pqloader {

struct PipelineOptions {
  /// Worker threads. Default: 1.
  int num_threads = 1;
  /// Soft bound on decoded-but-unconsumed bytes (units plus assembled batches).
  /// The units the consumer needs next are always allowed. Default: 256 MiB.
  int64_t max_inflight_bytes = int64_t{256} << 20;
  /// Batches assembled ahead of the consumer, at most. Default: 4.
  int64_t max_prefetch_batches = 4;
  /// Test hook: before each task a worker sleeps a random time in [0, this] µs,
  /// drawn from a nondeterministic source on purpose. Default: 0 (off).
  int64_t debug_max_delay_us = 0;
};

/// Nanoseconds spent per stage; totals over all workers.
struct PipelineCounters {
  int64_t unit_ns = 0;
  int64_t batch_ns = 0;
  int64_t wait_ns = 0;  ///< Consumer time blocked in Next().
  int64_t units_done = 0;
  int64_t batches_done = 0;
  int64_t peak_inflight_bytes = 0;
};

template <typename UnitT, typename BatchT>
class OrderedPipeline {
 public:
  using UnitPtr = std::shared_ptr<const UnitT>;
  using BatchPtr = std::shared_ptr<BatchT>;

  struct Work {
    int64_t num_batches = 0;
    /// [lo, hi) units read by batch b; non-decreasing in b.
    std::function<std::pair<int64_t, int64_t>(int64_t)> batch_units;
    /// Produce unit u and its size in bytes.
    std::function<arrow::Result<UnitPtr>(int64_t, int64_t*)> run_unit;
    /// Assemble batch b from units [lo, hi) (units[i] is unit lo + i) and report its size.
    std::function<arrow::Result<BatchPtr>(int64_t, const std::vector<UnitPtr>&, int64_t*)>
        run_batch;
  };

  /// Start workers that produce batches first_batch, first_batch + 1, ... of `work`.
  OrderedPipeline(Work work, const PipelineOptions& options, int64_t first_batch)
      : work_(std::move(work)), options_(options), next_batch_(first_batch),
        consumed_(first_batch) {
    if (options_.max_prefetch_batches < 1) options_.max_prefetch_batches = 1;
    if (first_batch < work_.num_batches) {
      next_unit_ = work_.batch_units(first_batch).first;
      end_unit_ = work_.batch_units(work_.num_batches - 1).second;
      refs_.assign(end_unit_ - next_unit_, 0);
      for (int64_t b = first_batch; b < work_.num_batches; ++b) {
        auto [lo, hi] = work_.batch_units(b);
        for (int64_t u = lo; u < hi; ++u) ++refs_[u - next_unit_];
      }
      unit_base_ = next_unit_;
    }
    const int n = std::max(1, options_.num_threads);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  }

  ~OrderedPipeline() { Shutdown(); }

  /// Stop claiming work and join the workers (tasks already running finish first).
  /// Idempotent. Next() must not be called afterwards.
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  OrderedPipeline(const OrderedPipeline&) = delete;
  OrderedPipeline& operator=(const OrderedPipeline&) = delete;

  /// Return the next batch in order, nullptr after the last one, or the error of a
  /// failed task (then again on every later call).
  arrow::Result<BatchPtr> Next() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!sticky_error_.ok()) return sticky_error_;
    if (consumed_ >= work_.num_batches) return BatchPtr{};
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return batches_.count(consumed_) > 0; });
    counters_.wait_ns += Nanos(t0);
    auto node = batches_.extract(consumed_);
    ++consumed_;
    inflight_bytes_ -= node.mapped().bytes;
    cv_.notify_all();
    if (!node.mapped().result.ok()) {
      sticky_error_ = node.mapped().result.status();
      stop_ = true;
      return sticky_error_;
    }
    return std::move(node.mapped().result).ValueUnsafe();
  }

  PipelineCounters counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 private:
  struct UnitSlot {
    bool done = false;
    arrow::Status status;
    UnitPtr value;
    int64_t bytes = 0;
  };
  struct BatchSlot {
    arrow::Result<BatchPtr> result;
    int64_t bytes = 0;
  };

  static int64_t Nanos(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - t0).count();
  }

  // Requires mu_. True when every unit of [lo, hi) is done, or one of them failed
  // (later units are then never claimed, and the batch fails at once).
  bool InputsReady(int64_t lo, int64_t hi) const {
    bool all_done = true;
    for (int64_t u = lo; u < hi; ++u) {
      auto it = units_.find(u);
      if (it == units_.end() || !it->second.done) {
        all_done = false;
      } else if (!it->second.status.ok()) {
        return true;
      }
    }
    return all_done;
  }

  bool CanClaimBatch() const {
    if (next_batch_ >= work_.num_batches) return false;
    if (next_batch_ >= consumed_ + options_.max_prefetch_batches) return false;
    auto [lo, hi] = work_.batch_units(next_batch_);
    return InputsReady(lo, hi);
  }

  bool CanClaimUnit() const {
    if (next_unit_ >= end_unit_ || unit_failed_) return false;
    if (consumed_ >= work_.num_batches) return false;
    if (next_unit_ < work_.batch_units(consumed_).second) return true;  // needed now
    const int64_t horizon =
        std::min(consumed_ + options_.max_prefetch_batches, work_.num_batches) - 1;
    return next_unit_ < work_.batch_units(horizon).second &&
           inflight_bytes_ < options_.max_inflight_bytes;
  }

  // Run fn, turning any C++ exception that escapes it into an error status.
  template <typename Fn>
  static auto Guard(Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return arrow::Status::UnknownError("unexpected exception in worker: ", e.what());
    } catch (...) {
      return arrow::Status::UnknownError("unexpected exception in worker");
    }
  }

  void MaybeDelay() {
    if (options_.debug_max_delay_us <= 0) return;
    thread_local std::mt19937_64 gen{std::random_device{}()};
    std::uniform_int_distribution<int64_t> dist(0, options_.debug_max_delay_us);
    std::this_thread::sleep_for(std::chrono::microseconds(dist(gen)));
  }

  void AddInflight(int64_t bytes) {
    inflight_bytes_ += bytes;
    counters_.peak_inflight_bytes = std::max(counters_.peak_inflight_bytes, inflight_bytes_);
  }

  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || CanClaimBatch() || CanClaimUnit(); });
      if (stop_) return;
      if (CanClaimBatch()) {
        const int64_t b = next_batch_++;
        auto [lo, hi] = work_.batch_units(b);
        std::vector<UnitPtr> inputs;
        arrow::Status failed;
        for (int64_t u = lo; u < hi; ++u) {
          auto it = units_.find(u);
          if (it == units_.end() || !it->second.done) continue;  // after a failed unit
          if (!it->second.status.ok() && failed.ok()) failed = it->second.status;
          inputs.push_back(it->second.value);
        }
        lock.unlock();
        BatchSlot out;
        int64_t ns = 0;
        if (!failed.ok()) {
          out.result = failed;
        } else {
          MaybeDelay();
          const auto t0 = std::chrono::steady_clock::now();
          out.result = Guard([&] { return work_.run_batch(b, inputs, &out.bytes); });
          ns = Nanos(t0);
        }
        inputs.clear();
        lock.lock();
        counters_.batch_ns += ns;
        ++counters_.batches_done;
        AddInflight(out.bytes);
        batches_.emplace(b, std::move(out));
        for (int64_t u = lo; u < hi; ++u) {
          if (--refs_[u - unit_base_] == 0) {
            auto it = units_.find(u);
            if (it != units_.end()) {
              inflight_bytes_ -= it->second.bytes;
              units_.erase(it);
            }
          }
        }
        cv_.notify_all();
      } else {
        const int64_t u = next_unit_++;
        lock.unlock();
        MaybeDelay();
        UnitSlot slot;
        const auto t0 = std::chrono::steady_clock::now();
        auto result = Guard([&] { return work_.run_unit(u, &slot.bytes); });
        const int64_t ns = Nanos(t0);
        if (result.ok()) {
          slot.value = std::move(result).ValueUnsafe();
        } else {
          slot.status = result.status();
          slot.bytes = 0;
        }
        slot.done = true;
        lock.lock();
        counters_.unit_ns += ns;
        ++counters_.units_done;
        if (!slot.status.ok()) unit_failed_ = true;
        AddInflight(slot.bytes);
        units_[u] = std::move(slot);
        cv_.notify_all();
      }
    }
  }

  Work work_;
  PipelineOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                 // GUARDED_BY(mu_)
  bool unit_failed_ = false;          // GUARDED_BY(mu_)
  int64_t next_unit_ = 0;             // GUARDED_BY(mu_)
  int64_t end_unit_ = 0;              // GUARDED_BY(mu_)
  int64_t unit_base_ = 0;             // GUARDED_BY(mu_)
  int64_t next_batch_ = 0;            // GUARDED_BY(mu_)
  int64_t consumed_ = 0;              // GUARDED_BY(mu_)
  int64_t inflight_bytes_ = 0;        // GUARDED_BY(mu_)
  std::vector<int32_t> refs_;         // GUARDED_BY(mu_); batches still to read unit u
  std::map<int64_t, UnitSlot> units_;    // GUARDED_BY(mu_)
  std::map<int64_t, BatchSlot> batches_;  // GUARDED_BY(mu_)
  arrow::Status sticky_error_;        // GUARDED_BY(mu_)
  PipelineCounters counters_;         // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace pqloader
