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
