// OrderedPipeline: work-claiming worker threads whose results reach the consumer in
// sequence order.
//
// The work is two kinds of numbered task: units (e.g. read and decode a row-group
// slice) and batches (assemble batch b from units [lo_b, hi_b)). Workers claim the
// next unclaimed task (batches first, since the consumer waits on them), run it
// without holding the lock, and deposit the result in a slot keyed by its number.
// The consumer takes batches strictly in order, so the output never depends on the
// number of threads or on timing. A unit is freed once every batch that reads it is
// assembled.
//
// Look-ahead is counted in bytes, not batches: a unit is claimed as soon as its
// estimated size (Work::unit_bytes, scaled by the largest actual/estimate ratio seen
// so far) fits, with everything decoded and not yet consumed, within
// `max_inflight_bytes`. So with large row groups the next ones are decoded while the
// current one is consumed, by as many workers as there are. The floor: the units of
// the batch the consumer waits for are always claimed, whatever the budget, and
// `max_prefetch_batches` batches may be assembled ahead of it; where the work says
// what a batch allocates (Work::batch_bytes), batches further ahead are assembled too
// while that fits the budget.
//
// The consumer helps: when the batch it waits for has its inputs ready but no worker
// has claimed it (all are decoding ahead), Next() assembles it on the calling thread
// instead of waiting for a worker to finish a long decode.
//
// A failed unit fails exactly the batches that read it; the consumer sees the error
// when it reaches the first such batch, and the pipeline stops (no hang).
//
// Thread-safety: Next() may be called by one consumer thread at a time; Shutdown() may
// be called from any thread, also while Next() waits (Next() then returns Cancelled).
// This header knows nothing of Parquet.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
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

#include "pqloader/util/start_threads.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

struct PipelineOptions {
  /// Worker threads. Default: 1.
  int num_workers = 1;
  /// Bound on decoded-but-unconsumed bytes (units plus assembled batches), apart from
  /// the floor (see the header comment). Default: 256 MiB.
  int64_t max_inflight_bytes = int64_t{256} << 20;
  /// Batches assembled ahead of the consumer, at most. Default: 4.
  int64_t max_prefetch_batches = 4;
  /// Test hook: before each task a worker sleeps a random time in [0, this] µs,
  /// drawn from a nondeterministic source on purpose. Default: 0 (off).
  int64_t debug_max_delay_us = 0;
};

/// Nanoseconds spent per stage; totals over all workers (and the consumer).
struct PipelineCounters {
  int64_t unit_ns = 0;
  int64_t batch_ns = 0;
  int64_t wait_ns = 0;  ///< Consumer time blocked in Next() (not assembling).
  int64_t units_done = 0;
  int64_t batches_done = 0;
  int64_t batches_by_consumer = 0;  ///< Batches Next() assembled itself.
  int64_t peak_inflight_bytes = 0;
  int64_t inflight_bytes = 0;  ///< Now: reserved or decoded, not yet consumed.
  /// Units the readiness checks looked up (a measure of the scheduler's own work: about
  /// a few per unit, not a batch's units per check).
  int64_t units_checked = 0;
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
    /// Estimated bytes of unit u once produced (reserved when it is claimed). Optional:
    /// without it, units are estimated from the sizes of the units already produced.
    std::function<int64_t(int64_t)> unit_bytes;
    /// Produce unit u and its size in bytes.
    std::function<arrow::Result<UnitPtr>(int64_t, int64_t*)> run_unit;
    /// Assemble batch b from units [lo, hi) (units[i] is unit lo + i) and report the
    /// bytes it holds beyond its units.
    std::function<arrow::Result<BatchPtr>(int64_t, const std::vector<UnitPtr>&, int64_t*)>
        run_batch;
    /// Bytes that assembling batch b allocates beyond its units (e.g. the gather of a
    /// shuffle window whose other batches are slices of it). Optional: with it, batches
    /// beyond max_prefetch_batches are claimed too while that many bytes fit within
    /// max_inflight_bytes (look-ahead in bytes); without it, max_prefetch_batches
    /// bounds the batches ahead.
    std::function<int64_t(int64_t)> batch_bytes;
  };

  /// Start workers that produce batches first_batch, first_batch + 1, ... of `work`.
  OrderedPipeline(Work work, const PipelineOptions& options, int64_t first_batch)
      : work_(std::move(work)),
        max_prefetch_batches_(std::max<int64_t>(1, options.max_prefetch_batches)),
        debug_max_delay_us_(options.debug_max_delay_us),
        max_inflight_bytes_(options.max_inflight_bytes),
        next_batch_(first_batch),
        consumed_(first_batch) {
    if (first_batch < work_.num_batches) {
      next_unit_ = work_.batch_units(first_batch).first;
      end_unit_ = work_.batch_units(work_.num_batches - 1).second;
      refs_.assign(end_unit_ - next_unit_, 0);
      for (int64_t b = first_batch; b < work_.num_batches; ++b) {
        auto [lo, hi] = work_.batch_units(b);
        for (int64_t u = lo; u < hi; ++u) ++refs_[u - next_unit_];
      }
      unit_base_ = next_unit_;
      done_end_ = next_unit_;
      needed_end_ = work_.batch_units(first_batch).second;
    }
    const int n = std::max(1, options.num_workers);
    // Fewer workers than asked (the OS refused more threads) make the same batches; none
    // is an error the first Next() returns.
    int errnum = 0;
    std::vector<std::thread> threads;
    if (StartThreads(n, [this] { WorkerLoop(); }, &threads, &errnum) == 0) {
      MutexLock lock(mu_);
      sticky_error_ = arrow::Status::IOError("cannot start any of the loader's ", n,
                                             " worker threads: ", std::strerror(errnum),
                                             kThreadLimitHint);
    }
    MutexLock lock(mu_);
    threads_ = std::move(threads);
  }

  ~OrderedPipeline() { Shutdown(); }

  /// Stop claiming work, wake a waiting Next(), and join the workers (tasks already
  /// running finish first). Idempotent; may be called from any thread but a worker.
  void Shutdown() {
    std::vector<std::thread> threads;
    {
      MutexLock lock(mu_);
      stop_ = true;
      threads.swap(threads_);
    }
    NotifyAll();
    for (auto& t : threads) t.join();
  }

  OrderedPipeline(const OrderedPipeline&) = delete;
  OrderedPipeline& operator=(const OrderedPipeline&) = delete;

  /// Return the next batch in order, nullptr after the last one, or the error of a
  /// failed task (then again on every later call). Cancelled after Shutdown(). With a
  /// `timeout`, return nullptr and set *timed_out when no batch came in time (the
  /// caller may check for signals and call again).
  arrow::Result<BatchPtr> Next(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max(),
                               bool* timed_out = nullptr) {
    if (timed_out != nullptr) *timed_out = false;
    MutexLock lock(mu_);
    if (!sticky_error_.ok()) return sticky_error_;
    if (consumed_ >= work_.num_batches) return BatchPtr{};
    const auto t0 = std::chrono::steady_clock::now();
    // A timeout past the clock's end is none (t0 + timeout overflowed to a deadline in
    // the past: every call timed out at once).
    const bool bounded = timeout < std::chrono::steady_clock::time_point::max() - t0;
    const auto deadline = bounded ? t0 + timeout : std::chrono::steady_clock::time_point::max();
    int64_t helped_ns = 0;
    while (batches_.count(consumed_) == 0) {
      if (stop_) return arrow::Status::Cancelled("the pipeline was stopped");
      if (next_batch_ == consumed_ && CanClaimBatch()) {
        helped_ns += RunBatch(/*by_consumer=*/true);
        continue;
      }
      if (bounded) {
        if (lock.WaitUntil(consumer_cv_, deadline) == std::cv_status::timeout &&
            batches_.count(consumed_) == 0 && !stop_) {
          counters_.wait_ns += Nanos(t0) - helped_ns;
          if (timed_out != nullptr) *timed_out = true;
          return BatchPtr{};
        }
      } else {
        lock.Wait(consumer_cv_);
      }
    }
    counters_.wait_ns += Nanos(t0) - helped_ns;
    auto node = batches_.extract(consumed_);
    ++consumed_;
    if (consumed_ < work_.num_batches) {
      needed_end_ = std::max(needed_end_, work_.batch_units(consumed_).second);
    }
    inflight_bytes_ -= node.mapped().bytes;
    worker_cv_.notify_one();  // room for one more task; a worker that claims wakes another
    if (!node.mapped().result.ok()) {
      sticky_error_ = node.mapped().result.status();
      stop_ = true;
      NotifyAll();
      return sticky_error_;
    }
    return std::move(node.mapped().result).ValueUnsafe();
  }

  /// Raise (or lower) the in-flight bound, e.g. when a run started ahead becomes the
  /// current one.
  void set_max_inflight_bytes(int64_t bytes) {
    {
      MutexLock lock(mu_);
      max_inflight_bytes_ = bytes;
    }
    NotifyAll();
  }

  /// Whether every unit has been produced (what is left is batches).
  bool all_units_done() const {
    MutexLock lock(mu_);
    return next_unit_ >= end_unit_ && units_running_ == 0;
  }

  PipelineCounters counters() const {
    MutexLock lock(mu_);
    PipelineCounters c = counters_;
    c.inflight_bytes = inflight_bytes_;
    c.units_checked = units_checked_;
    return c;
  }

 private:
  struct UnitSlot {
    bool done = false;
    arrow::Status status;
    UnitPtr value;
    int64_t bytes = 0;  // reserved while running, actual once done
  };
  struct BatchSlot {
    arrow::Result<BatchPtr> result;
    int64_t bytes = 0;
  };

  static int64_t Nanos(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - t0).count();
  }

  // True when every unit of [lo, hi) is done, or one of them failed
  // (later units are then never claimed, and the batch fails at once). Units below
  // done_end_ are done, so a check looks from there to the first unfinished unit: it
  // runs in every worker's wait and after every claim, and looking at each of a batch's
  // units made a shuffle window of 20,000 one-row row groups take 51 s to its first
  // batch (its units' decode: 8 s).
  bool InputsReady(int64_t lo, int64_t hi) const PQ_REQUIRES(mu_) {
    if (unit_failed_) {
      // Rare: the batch fails with its first failed unit in order, once every unit before
      // it is done (it was the first to fail in time: with several failing units, the
      // error changed from run to run). Units are claimed in order, so those before a
      // failed one were claimed and finish; none after it is needed.
      for (int64_t u = lo; u < hi; ++u) {
        auto it = units_.find(u);
        if (it == units_.end() || !it->second.done) return false;
        if (!it->second.status.ok()) return true;
      }
      return true;
    }
    for (int64_t u = std::max(lo, done_end_); u < hi; ++u) {
      ++units_checked_;
      auto it = units_.find(u);
      if (it == units_.end() || !it->second.done) return false;
    }
    return true;
  }

  // Move done_end_ past the units that are done (or done and freed: claimed, no longer
  // in units_). Units are claimed in order, so below next_unit_ a unit missing from
  // units_ was freed.
  void AdvanceDoneEnd() PQ_REQUIRES(mu_) {
    while (done_end_ < next_unit_) {
      auto it = units_.find(done_end_);
      if (it != units_.end() && !it->second.done) break;
      ++done_end_;
    }
  }

  bool CanClaimBatch() const PQ_REQUIRES(mu_) {
    if (stop_ || next_batch_ >= work_.num_batches) return false;
    if (next_batch_ >= consumed_ + max_prefetch_batches_ &&
        (!work_.batch_bytes ||
         inflight_bytes_ + work_.batch_bytes(next_batch_) > max_inflight_bytes_)) {
      return false;
    }
    auto [lo, hi] = work_.batch_units(next_batch_);
    return InputsReady(lo, hi);
  }

  // The estimated bytes of unit u.
  int64_t Estimate(int64_t u) const PQ_REQUIRES(mu_) {
    if (!work_.unit_bytes) return units_done_ > 0 ? max_unit_bytes_ : 0;
    const double e = static_cast<double>(work_.unit_bytes(u)) * std::max(1.0, ratio_);
    return static_cast<int64_t>(e);
  }

  bool CanClaimUnit() const PQ_REQUIRES(mu_) {
    if (stop_ || next_unit_ >= end_unit_ || unit_failed_) return false;
    if (consumed_ >= work_.num_batches) return false;
    if (next_unit_ < needed_end_) return true;  // the consumer needs it now: the floor
    return inflight_bytes_ + Estimate(next_unit_) <= max_inflight_bytes_;
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

  // Test hook: sleep a random time, waking early if the pipeline stops.
  void MaybeDelay() {
    if (debug_max_delay_us_ <= 0) return;
    thread_local std::mt19937_64 gen{std::random_device{}()};
    std::uniform_int_distribution<int64_t> dist(0, debug_max_delay_us_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(dist(gen));
    MutexLock lock(mu_);
    while (!stop_ && lock.WaitUntil(delay_cv_, deadline) == std::cv_status::no_timeout) {
    }
  }

  void AddInflight(int64_t bytes) PQ_REQUIRES(mu_) {
    inflight_bytes_ += bytes;
    counters_.peak_inflight_bytes = std::max(counters_.peak_inflight_bytes, inflight_bytes_);
  }

  // Requires CanClaimBatch(). Claim batch next_batch_, run it without the lock,
  // deposit it. Returns the nanoseconds it took.
  int64_t RunBatch(bool by_consumer) PQ_REQUIRES(mu_) {
    const int64_t b = next_batch_++;
    WakeAnotherIfWork();
    auto [lo, hi] = work_.batch_units(b);
    std::vector<UnitPtr> inputs;
    arrow::Status failed;
    for (int64_t u = lo; u < hi; ++u) {
      auto it = units_.find(u);
      if (it == units_.end() || !it->second.done) continue;  // after a failed unit
      if (!it->second.status.ok() && failed.ok()) failed = it->second.status;
      inputs.push_back(it->second.value);
    }
    mu_.Unlock();  // the caller's MutexLock still owns mu_ once it is retaken
    BatchSlot out;
    int64_t ns = 0;
    if (!failed.ok()) {
      out.result = failed;
    } else {
      if (!by_consumer) MaybeDelay();
      const auto t0 = std::chrono::steady_clock::now();
      out.result = Guard([&] { return work_.run_batch(b, inputs, &out.bytes); });
      ns = Nanos(t0);
    }
    inputs.clear();
    mu_.Lock();
    counters_.batch_ns += ns;
    ++counters_.batches_done;
    if (by_consumer) ++counters_.batches_by_consumer;
    AddInflight(out.bytes);
    batches_.emplace(b, std::move(out));
    for (int64_t u = lo; u < hi; ++u) {
      if (--refs_[u - unit_base_] == 0) {
        auto it = units_.find(u);
        if (it != units_.end() && it->second.done) {  // a running one frees itself
          inflight_bytes_ -= it->second.bytes;
          units_.erase(it);
        }
      }
    }
    consumer_cv_.notify_one();  // the batch it may wait for
    worker_cv_.notify_one();    // units freed: room
    return ns;
  }

  // Requires CanClaimUnit().
  void RunUnit() PQ_REQUIRES(mu_) {
    const int64_t u = next_unit_++;
    const int64_t reserved = Estimate(u);
    const int64_t estimate = work_.unit_bytes ? work_.unit_bytes(u) : 0;
    AddInflight(reserved);
    units_[u].bytes = reserved;
    ++units_running_;
    WakeAnotherIfWork();
    mu_.Unlock();  // the caller's MutexLock still owns mu_ once it is retaken
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
    mu_.Lock();
    counters_.unit_ns += ns;
    ++counters_.units_done;
    ++units_done_;
    --units_running_;
    if (!slot.status.ok()) unit_failed_ = true;
    if (slot.status.ok() && estimate > 0) {
      ratio_ = std::max(ratio_, static_cast<double>(slot.bytes) / static_cast<double>(estimate));
    }
    max_unit_bytes_ = std::max(max_unit_bytes_, slot.bytes);
    inflight_bytes_ -= reserved;
    AddInflight(slot.bytes);
    if (refs_[u - unit_base_] == 0) {  // no batch reads it any more (stopped early)
      inflight_bytes_ -= slot.bytes;
      units_.erase(u);
    } else {
      units_[u] = std::move(slot);
    }
    AdvanceDoneEnd();
    consumer_cv_.notify_one();  // a batch it waits for may be ready to assemble
    worker_cv_.notify_one();    // a batch may be claimable
  }

  // Wake every waiter: the pipeline stopped, failed, or its budget changed.
  void NotifyAll() {
    consumer_cv_.notify_all();
    worker_cv_.notify_all();
    delay_cv_.notify_all();
  }

  // After a claim: wake one more idle worker while there is more to claim.
  void WakeAnotherIfWork() PQ_REQUIRES(mu_) {
    if (CanClaimBatch() || CanClaimUnit()) worker_cv_.notify_one();
  }

  void WorkerLoop() {
    MutexLock lock(mu_);
    while (true) {
      while (!stop_ && !CanClaimBatch() && !CanClaimUnit()) lock.Wait(worker_cv_);
      if (stop_) return;
      if (CanClaimBatch()) {
        RunBatch(/*by_consumer=*/false);
      } else {
        RunUnit();
      }
    }
  }

  Work work_;
  const int64_t max_prefetch_batches_;  // at least 1
  const int64_t debug_max_delay_us_;

  mutable Mutex mu_;
  // Who waits on what: the consumer for its batch (or one it can assemble), idle
  // workers for a task they can claim, MaybeDelay for its deadline. A change that may
  // let a worker claim wakes one, and a worker that claims wakes another while more is
  // claimable (WakeAnotherIfWork): one cv for all woke every worker (16 on a 16-core
  // machine) at each batch the consumer took, to find one task.
  std::condition_variable consumer_cv_;
  std::condition_variable worker_cv_;
  std::condition_variable delay_cv_;
  int64_t max_inflight_bytes_ PQ_GUARDED_BY(mu_);
  bool stop_ PQ_GUARDED_BY(mu_) = false;
  bool unit_failed_ PQ_GUARDED_BY(mu_) = false;
  int64_t next_unit_ PQ_GUARDED_BY(mu_) = 0;
  int64_t end_unit_ PQ_GUARDED_BY(mu_) = 0;
  int64_t unit_base_ PQ_GUARDED_BY(mu_) = 0;
  int64_t done_end_ PQ_GUARDED_BY(mu_) = 0;  // units below it are done (or freed)
  mutable int64_t units_checked_ PQ_GUARDED_BY(mu_) = 0;
  int64_t needed_end_ PQ_GUARDED_BY(mu_) = 0;  // units the consumer needs now
  int64_t next_batch_ PQ_GUARDED_BY(mu_) = 0;
  int64_t consumed_ PQ_GUARDED_BY(mu_) = 0;
  int64_t inflight_bytes_ PQ_GUARDED_BY(mu_) = 0;
  int64_t units_done_ PQ_GUARDED_BY(mu_) = 0;
  int64_t units_running_ PQ_GUARDED_BY(mu_) = 0;
  int64_t max_unit_bytes_ PQ_GUARDED_BY(mu_) = 0;
  double ratio_ PQ_GUARDED_BY(mu_) = 1.0;  // largest actual / estimated bytes
  std::vector<int32_t> refs_ PQ_GUARDED_BY(mu_);  // batches still to read unit u
  std::map<int64_t, UnitSlot> units_ PQ_GUARDED_BY(mu_);
  std::map<int64_t, BatchSlot> batches_ PQ_GUARDED_BY(mu_);
  arrow::Status sticky_error_ PQ_GUARDED_BY(mu_);
  PipelineCounters counters_ PQ_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ PQ_GUARDED_BY(mu_);
};

}  // namespace pqloader
