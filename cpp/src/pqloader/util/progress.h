// Progress of a long operation (reading many footers), read from another thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace pqloader {

/// Counts one operation updates and another thread reads (the CLI's progress line):
/// items done of `total` (-1 while the total is not known yet).
struct Progress {
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> total{-1};
};

}  // namespace pqloader
