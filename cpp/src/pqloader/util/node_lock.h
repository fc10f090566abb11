// A lock the processes of one node take on a file of their shared cache directory: so
// that one rank does a piece of start-up work (fetch the footers, compute a filter's
// selection) while the others wait and then use its result, and so that writers and
// deleters of a cache shard take turns (cache/split_cache.cc).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "pqloader/util/cancel.h"

namespace pqloader {

/// An flock(2) on `path` (created, with its directory), held until destroyed or until
/// its process dies (the kernel releases it). Works between processes and between
/// threads of one process (each Acquire opens its own file description).
class NodeLock {
 public:
  /// Wait for the lock at most `timeout`, or until `cancel` is set; null then (the caller
  /// does the work itself, or stops), or when the file cannot be created. Creates the
  /// file's directory. The wait polls, 0.1 ms apart at first, doubling up to 20 ms (a
  /// signal does not end it).
  static std::unique_ptr<NodeLock> Acquire(const std::string& path,
                                           std::chrono::milliseconds timeout,
                                           const CancelFlag& cancel = nullptr);
  /// As Acquire, for the one rank of a node that does a piece of work and stores its
  /// result in the lock's directory: null at once, without waiting, when this process
  /// cannot create files there (a read-only disk, another user's directory). Such a
  /// process does the work for itself: holding the lock, it kept the node's others
  /// waiting (up to `timeout`, 30 minutes) for a result it never stored.
  static std::unique_ptr<NodeLock> AcquireToStore(const std::string& path,
                                                  std::chrono::milliseconds timeout,
                                                  const CancelFlag& cancel = nullptr);
  /// As Acquire, without creating directories (null when the file cannot be opened), for
  /// locks held for a few file operations (a cache shard's): so that a holder that stops
  /// (a process suspended or stuck in a debugger) costs a waiter `timeout`, not its run.
  /// `*timed_out`, if given, tells a wait that ran out from a file that cannot be opened.
  static std::unique_ptr<NodeLock> AcquireExisting(const std::string& path,
                                                   std::chrono::milliseconds timeout,
                                                   const CancelFlag& cancel = nullptr,
                                                   bool* timed_out = nullptr);
  ~NodeLock();
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

 private:
  explicit NodeLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace pqloader
