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
  /// does the work itself, or stops), or when the file cannot be created.
  static std::unique_ptr<NodeLock> Acquire(const std::string& path,
                                           std::chrono::milliseconds timeout,
                                           const CancelFlag& cancel = nullptr);
  /// Wait for the lock as long as it takes (a signal does not end the wait); null when
  /// the file cannot be opened. Does not create directories.
  static std::unique_ptr<NodeLock> AcquireBlocking(const std::string& path);
  ~NodeLock();
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

 private:
  explicit NodeLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace pqloader
