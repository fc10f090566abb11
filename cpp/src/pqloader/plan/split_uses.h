// EpochSplitUses: when each split is read during one epoch, by every rank, in the
// lockstep estimate of the cache's kPlan policy (cache/split_cache.h).
//
// Ranks that share a cache read in parallel; with no clock to go by, the estimate is that
// they advance together: unit p of a rank's N units in epoch e is read at time
// e + p / N, whatever the rank. So a split a rank reads last in epoch e (time just under
// e + 1) is needed before a split another rank reads first in epoch e + 1. Like
// EpochPlan, a pure function of (rows per split, options, epoch). Thread-safety:
// immutable after Make(); const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "pqloader/plan/epoch_plan.h"

namespace pqloader {

/// A time no read happens at: after every other.
constexpr double kNeverRead = std::numeric_limits<double>::infinity();

class EpochSplitUses {
 public:
  /// Compute the reads of `epoch` by ranks 0 .. options.world_size - 1 (options.rank is
  /// ignored) of a dataset whose split i has split_rows[i] rows. `options` must be valid.
  static EpochSplitUses Make(const std::vector<int64_t>& split_rows, const PlanOptions& options,
                             int64_t epoch);

  int64_t epoch() const { return epoch_; }
  /// Return the earliest time strictly after `after` at which some rank reads `split`
  /// in this epoch, or kNeverRead.
  double NextRead(int64_t split, double after) const;
  /// Return every time `split` is read in this epoch, in increasing order.
  std::vector<double> Reads(int64_t split) const;

 private:
  EpochSplitUses() = default;
  int64_t epoch_ = 0;
  std::vector<int64_t> first_;  // reads of split s: times_[first_[s] .. first_[s + 1])
  std::vector<double> times_;
};

}  // namespace pqloader
