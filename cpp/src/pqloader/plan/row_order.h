// RowOrder: one rank's samples of one epoch, in order, and the units they come from.
//
// An EpochPlan is one (PlanOrder). After a change of world size in the middle of an
// epoch (elastic resume), the rest of the epoch is another (RemainderOrder): the samples
// no rank had consumed, in the order each old rank would have read them, dealt to the
// new ranks in equal contiguous shares. Both are pure functions of (row counts, options,
// seed, epoch, and for a remainder what each old rank had consumed).
// Thread-safety: immutable after Make(); Resolve may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "pqloader/plan/epoch_plan.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

class RowOrder {
 public:
  virtual ~RowOrder() = default;
  /// Samples this rank reads in the epoch (after the shard policy).
  virtual int64_t num_rows() const = 0;
  /// The units to read, in order.
  virtual const std::vector<Unit>& units() const = 0;
  /// Append the sources of positions [first, last) to `out`.
  virtual void Resolve(int64_t first, int64_t last, std::vector<RowRef>* out) const = 0;
  /// Return [lo, hi): the units that must be decoded to resolve positions [first, last);
  /// non-decreasing in both bounds; (units().size(), units().size()) when empty.
  virtual std::pair<int64_t, int64_t> PositionUnitRange(int64_t first, int64_t last) const = 0;
};

/// The order of an EpochPlan; window permutations are computed once and kept for the
/// most recent windows.
class PlanOrder : public RowOrder {
 public:
  explicit PlanOrder(std::shared_ptr<const EpochPlan> plan) : plan_(std::move(plan)) {}
  const EpochPlan& plan() const { return *plan_; }
  int64_t num_rows() const override { return plan_->num_rows(); }
  const std::vector<Unit>& units() const override { return plan_->units(); }
  void Resolve(int64_t first, int64_t last, std::vector<RowRef>* out) const override;
  std::pair<int64_t, int64_t> PositionUnitRange(int64_t first, int64_t last) const override {
    return plan_->PositionUnitRange(first, last);
  }

 private:
  std::shared_ptr<const std::vector<uint32_t>> Permutation(int64_t w) const;

  std::shared_ptr<const EpochPlan> plan_;
  mutable Mutex mu_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<uint32_t>>> perms_ PQ_GUARDED_BY(mu_);
};

/// What the ranks of an earlier world had consumed of an epoch when it was stopped.
struct ElasticBase {
  int64_t world_size = 1;
  int64_t batch_size = 1;
  /// Batches each of its ranks had consumed (size world_size).
  std::vector<int64_t> batches;
  /// When that world was itself resuming an earlier one in the same epoch.
  std::shared_ptr<const ElasticBase> base;
};

/// Return "" if `base` can describe `epoch` of `split_rows` under `options` (whose rank,
/// world size and batch size are replaced by the base's), else why not: counts and
/// sizes must be positive, and no old rank can have consumed more batches than it had.
std::string ValidateElasticBase(const ElasticBase& base, const std::vector<int64_t>& split_rows,
                                const PlanOptions& options, int64_t epoch);

/// The rest of `epoch` after `base`, for the rank and world of `options` (whose
/// batch size may differ from the old one): the samples the old ranks had not
/// consumed (nor dropped with drop_last), old rank after old rank, each in its own
/// order, dealt in contiguous shares equalised by options.shard_policy.
std::shared_ptr<const RowOrder> MakeRemainderOrder(const std::vector<int64_t>& split_rows,
                                                   const PlanOptions& options, int64_t epoch,
                                                   const ElasticBase& base);

}  // namespace pqloader
