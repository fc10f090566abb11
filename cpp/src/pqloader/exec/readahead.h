// ReadAhead: starts work on numbered items ahead of the ones being taken, in order.
//
// Items are numbered [begin, end) and taken once each, in about increasing order, by
// any number of threads (e.g. pipeline workers that claim units in order). Take(i)
// starts every item up to i not started yet, hands over item i's started work, then
// starts the next items while fewer than `window` started items wait to be taken and
// their cost stays within `max_cost`. Starting must be cheap and must not block (e.g.
// issue asynchronous reads); what it returns is held until taken. An item whose start
// failed hands its error to whoever takes it, so errors surface in order.
//
// Thread-safety: Take may be called concurrently. This header knows nothing of Parquet.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include <arrow/result.h>
#include <arrow/status.h>
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

struct ReadAheadOptions {
  /// Started items that wait to be taken, at most. Default: 1.
  int64_t window = 1;
  /// Total cost of started items waiting to be taken, at most (one item is always
  /// allowed). Default: no bound.
  int64_t max_cost = INT64_MAX;
};

template <typename T>
class ReadAhead {
 public:
  using StartFn = std::function<arrow::Result<T>(int64_t)>;
  using CostFn = std::function<int64_t(int64_t)>;

  ReadAhead(int64_t begin, int64_t end, StartFn start, CostFn cost, ReadAheadOptions options)
      : next_(begin), end_(end), start_(std::move(start)), cost_(std::move(cost)),
        options_(options) {}

  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  /// Return item i's started work (starting it now if needed), and start more ahead.
  arrow::Result<T> Take(int64_t i) {
    MutexLock lock(mu_);
    while (next_ <= i && next_ < end_) StartNext();
    auto it = held_.find(i);
    if (it == held_.end()) {
      return arrow::Status::Invalid("read-ahead item ", i, " taken twice or out of range");
    }
    arrow::Result<T> out = std::move(it->second.first);
    held_cost_ -= it->second.second;
    held_.erase(it);
    while (next_ < end_ && static_cast<int64_t>(held_.size()) < options_.window &&
           (held_.empty() || held_cost_ + cost_(next_) <= options_.max_cost)) {
      StartNext();
    }
    return out;
  }

  /// Start items from the first not started while the window and cost bounds allow
  /// (at least one), without taking any.
  void Prime() {
    MutexLock lock(mu_);
    while (next_ < end_ && static_cast<int64_t>(held_.size()) < options_.window &&
           (held_.empty() || held_cost_ + cost_(next_) <= options_.max_cost)) {
      StartNext();
    }
  }

  /// Whether every item has been started.
  bool all_started() const {
    MutexLock lock(mu_);
    return next_ >= end_;
  }

  /// Items started so far (taken or not).
  int64_t started() const {
    MutexLock lock(mu_);
    return started_;
  }

 private:
  void StartNext() PQ_REQUIRES(mu_) {
    const int64_t i = next_++;
    const int64_t c = cost_(i);
    held_cost_ += c;
    ++started_;
    held_.emplace(i, std::make_pair(start_(i), c));
  }

  mutable Mutex mu_;
  int64_t next_ PQ_GUARDED_BY(mu_);
  const int64_t end_;
  StartFn start_;
  CostFn cost_;
  const ReadAheadOptions options_;
  int64_t held_cost_ PQ_GUARDED_BY(mu_) = 0;
  int64_t started_ PQ_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::pair<arrow::Result<T>, int64_t>> held_ PQ_GUARDED_BY(mu_);
};

}  // namespace pqloader
