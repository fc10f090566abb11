#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include <arrow/status.h>

#include "pqloader/util/start_threads.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

/// Run fn(i) for every i in [0, n) on up to `threads` threads, the calling one included
/// (fewer where the OS refuses a thread: the caller alone at worst). Indices are claimed
/// in increasing order. For short-lived fan-outs (footers, row groups of a pass over the
/// data), not for the pipeline's workers.
template <typename Fn>
void ParallelFor(int64_t n, int threads, const Fn& fn) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  const int count = static_cast<int>(std::clamp<int64_t>(n, 1, std::max(1, threads)));
  std::vector<std::thread> pool;
  StartThreads(count - 1, work, &pool);
  work();
  for (auto& t : pool) t.join();
}

/// ParallelFor of an fn returning arrow::Status: the error of the lowest failing index,
/// whatever the threads' timing (the first to fail would name either of row groups 0 and
/// 7). Indices are claimed in increasing order, so every index below a failed one was
/// claimed already and runs to its end; those claimed after the failure do not run (those
/// above it that other threads had started run to their end).
template <typename Fn>
arrow::Status ParallelForStatus(int64_t n, int threads, const Fn& fn) {
  std::atomic<int64_t> failed_at{std::numeric_limits<int64_t>::max()};
  Mutex mu;
  arrow::Status first;  // under mu
  ParallelFor(n, threads, [&](int64_t i) {
    if (i > failed_at.load()) return;
    auto st = fn(i);
    if (st.ok()) return;
    MutexLock lock(mu);
    if (i < failed_at.load()) {
      failed_at = i;
      first = std::move(st);
    }
  });
  MutexLock lock(mu);
  return first;
}

}  // namespace pqloader
