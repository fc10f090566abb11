// A request to stop long work early: opening a dataset (its footers), a filter's mask
// pass, reading documents' lengths, waiting for another process's lock. The Python
// binding sets it on Ctrl-C while a Loader is being built; the work then returns
// Cancelled at its next file, row group or poll.
#pragma once

#include <atomic>
#include <memory>

#include <arrow/status.h>

namespace pqloader {

/// Shared, so that options holding it never outlive it. Null: never set.
using CancelFlag = std::shared_ptr<const std::atomic<bool>>;

/// A CancelFlag for an atomic owned elsewhere (e.g. a worker's stop flag) that
/// outlives every use of the returned flag. Null stays null.
inline CancelFlag BorrowedCancelFlag(const std::atomic<bool>* flag) {
  return CancelFlag(std::shared_ptr<void>(), flag);
}

inline bool IsCancelled(const CancelFlag& flag) {
  return flag != nullptr && flag->load(std::memory_order_relaxed);
}

inline arrow::Status CancelledStatus() { return arrow::Status::Cancelled("interrupted"); }

/// While alive, failed object-store requests made on this thread are not retried once
/// `flag` is set (io/'s S3 retry strategy asks Stopped()): a storage executor's tasks
/// hold its abandoned flag; work that polls a CancelFlag between requests of its own
/// (footers, a filter's mask pass, documents' lengths while a Loader is built) holds that
/// flag, so that Ctrl-C ends a read against a stalled store after the attempt in flight
/// (at most the request timeout, after the retry delay it may be sleeping) instead of
/// after its retry budget. Scopes nest; the innermost flag counts. (Arrow's own I/O pool
/// holds no scope: such work reads on its own threads.)
class RetryStopScope {
 public:
  /// A null `flag` keeps the outer scope's.
  explicit RetryStopScope(const std::atomic<bool>* flag) : outer_(current_) {
    if (flag != nullptr) current_ = flag;
  }
  explicit RetryStopScope(const CancelFlag& flag) : RetryStopScope(flag.get()) {}
  ~RetryStopScope() { current_ = outer_; }
  RetryStopScope(const RetryStopScope&) = delete;
  RetryStopScope& operator=(const RetryStopScope&) = delete;

  /// Whether the flag of this thread's innermost scope is set.
  static bool Stopped() { return current_ != nullptr && current_->load(); }

 private:
  static inline thread_local const std::atomic<bool>* current_ = nullptr;
  const std::atomic<bool>* outer_;
};

/// Wait until `future` (an arrow::Future) is done, checking `cancel` every `poll_seconds`:
/// false once it is set (the future is left running), true when done.
template <typename Future>
bool WaitUnlessCancelled(const Future& future, const CancelFlag& cancel,
                         double poll_seconds = 0.05) {
  while (!future.Wait(poll_seconds)) {
    if (IsCancelled(cancel)) return false;
  }
  return true;
}

}  // namespace pqloader
