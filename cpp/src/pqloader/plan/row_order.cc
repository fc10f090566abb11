#include "pqloader/plan/row_order.h"

#include <algorithm>
#include <string>
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

std::shared_ptr<const std::vector<uint32_t>> PlanOrder::Permutation(int64_t w) const {
  {
    MutexLock lock(mu_);
    auto it = perms_.find(w);
    if (it != perms_.end()) return it->second;
  }
  auto perm = std::make_shared<const std::vector<uint32_t>>(plan_->WindowPermutation(w));
  MutexLock lock(mu_);
  // Batches are made in about increasing order: windows far behind are not needed again.
  perms_.erase(perms_.begin(), perms_.lower_bound(w - 2));
  return perms_.emplace(w, std::move(perm)).first->second;
}

void PlanOrder::Resolve(int64_t first, int64_t last, std::vector<RowRef>* out) const {
  static const std::vector<uint32_t> kIdentity;
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> held;
  plan_->ResolveRows(first, last, [&](int64_t w) -> const std::vector<uint32_t>& {
    if (!plan_->options().shuffle) return kIdentity;
    held.push_back(Permutation(w));
    return *held.back();
  }, out);
}

namespace {

// Positions [first, last) of `child`, placed at [start, start + last - first) of this
// order, reading child units [lo, hi) as this order's units [unit_offset, ...).
struct Segment {
  std::shared_ptr<const RowOrder> child;
  int64_t first, last, start;
  int64_t lo, hi, unit_offset;
};

class RemainderOrder : public RowOrder {
 public:
  void Add(std::shared_ptr<const RowOrder> child, int64_t first, int64_t last) {
    if (first >= last) return;
    Segment s{std::move(child), first, last, num_rows_, 0, 0, static_cast<int64_t>(units_.size())};
    std::tie(s.lo, s.hi) = s.child->PositionUnitRange(first, last);
    units_.insert(units_.end(), s.child->units().begin() + s.lo, s.child->units().begin() + s.hi);
    num_rows_ += last - first;
    segments_.push_back(std::move(s));
  }

  int64_t num_rows() const override { return num_rows_; }
  const std::vector<Unit>& units() const override { return units_; }

  void Resolve(int64_t first, int64_t last, std::vector<RowRef>* out) const override {
    std::vector<RowRef> part;
    for (const Segment& s : segments_) {
      const int64_t a = std::max(first, s.start), b = std::min(last, s.start + s.last - s.first);
      if (a >= b) continue;
      part.clear();
      s.child->Resolve(s.first + (a - s.start), s.first + (b - s.start), &part);
      for (RowRef r : part) out->push_back(RowRef{s.unit_offset + (r.unit - s.lo), r.row});
    }
  }

  std::pair<int64_t, int64_t> PositionUnitRange(int64_t first, int64_t last) const override {
    const auto n = static_cast<int64_t>(units_.size());
    int64_t lo = n, hi = n;
    bool found = false;
    for (const Segment& s : segments_) {
      const int64_t a = std::max(first, s.start), b = std::min(last, s.start + s.last - s.first);
      if (a >= b) continue;
      const auto [clo, chi] = s.child->PositionUnitRange(s.first + (a - s.start), s.first + (b - s.start));
      if (!found) lo = s.unit_offset + (clo - s.lo);
      hi = s.unit_offset + (chi - s.lo);
      found = true;
    }
    return {lo, hi};
  }

 private:
  std::vector<Segment> segments_;
  std::vector<Unit> units_;
  int64_t num_rows_ = 0;
};

// The options of old rank `r` of the world `base` describes.
PlanOptions OldRank(const PlanOptions& options, const ElasticBase& base, int64_t r) {
  PlanOptions old = options;
  old.rank = r;
  old.world_size = base.world_size;
  old.batch_size = base.batch_size;
  return old;
}

// Rank options.rank's contiguous share of `all`, equalised as rows are (EpochPlan):
// kDrop drops the last position of the larger shares, kPad repeats the first one of the
// smaller.
std::shared_ptr<const RowOrder> ShareOf(const std::shared_ptr<const RowOrder>& all,
                                        const PlanOptions& options) {
  const int64_t total = all->num_rows(), world = options.world_size;
  const int64_t each = total / world, rem = total % world;
  const int64_t begin = options.rank * each + std::min(options.rank, rem);
  const int64_t count = each + (options.rank < rem ? 1 : 0);
  auto mine = std::make_shared<RemainderOrder>();
  if (options.shard_policy == ShardPolicy::kDrop) {
    mine->Add(all, begin, begin + each);
  } else {
    const int64_t target = each + (rem > 0 ? 1 : 0);
    mine->Add(all, begin, begin + count);
    if (count < target && total > 0) {
      const int64_t from = count > 0 ? begin : options.rank % total;
      mine->Add(all, from, from + (target - count));
    }
  }
  return mine;
}

// Every old rank's order in the world `base` describes, made from the epoch's `order`
// (shared: each rank's plan costs its own units, not the epoch's splits) and, for a
// base that is itself a remainder, from that level's rest made once (each old rank's
// was a whole remainder made anew: old world x its old world x splits, and memory).
class OldRanks {
 public:
  OldRanks(std::shared_ptr<const EpochOrder> order, const PlanOptions& options, int64_t epoch,
           const ElasticBase& base)
      : order_(std::move(order)), options_(options), epoch_(epoch), base_(base) {
    if (base.base != nullptr) inner_ = RestOf(order_, OldRank(options, base, 0), epoch, *base.base);
  }

  std::shared_ptr<const RowOrder> Of(int64_t r) const {
    const PlanOptions old = OldRank(options_, base_, r);
    if (inner_ != nullptr) return ShareOf(inner_, old);
    return std::make_shared<PlanOrder>(std::make_shared<const EpochPlan>(EpochPlan::Make(old, epoch_, order_)));
  }

  // What each old rank of `base` had left, old rank after old rank: its positions from its
  // consumed batches on, up to its end (or, with drop_last, the end of its last full
  // batch). Independent of options' rank and world.
  static std::shared_ptr<const RowOrder> RestOf(const std::shared_ptr<const EpochOrder>& order,
                                                const PlanOptions& options, int64_t epoch,
                                                const ElasticBase& base) {
    const OldRanks ranks(order, options, epoch, base);
    auto all = std::make_shared<RemainderOrder>();
    for (int64_t r = 0; r < base.world_size; ++r) {
      auto child = ranks.Of(r);
      const int64_t n = child->num_rows();
      const int64_t end = options.drop_last ? n / base.batch_size * base.batch_size : n;
      const int64_t from = std::min(end, base.batches[r] * base.batch_size);
      all->Add(child, from, end);
    }
    return all;
  }

 private:
  std::shared_ptr<const EpochOrder> order_;
  const PlanOptions& options_;
  int64_t epoch_;
  const ElasticBase& base_;
  std::shared_ptr<const RowOrder> inner_;  // the inner level's rest (base.base)
};

std::string ValidateLevel(const ElasticBase& base, const std::shared_ptr<const EpochOrder>& order,
                          const PlanOptions& options, int64_t epoch) {
  if (base.world_size <= 0 || base.batch_size <= 0) {
    return "world_size and batch_size must be positive";
  }
  // At most 2^62, as PlanOptions' (ValidatePlanOptions): (n + batch_size - 1) below
  // overflowed, and a batch size of 2^63 - 1 "had 0 batches" for 1,000 rows.
  constexpr int64_t kMax = int64_t{1} << 62;
  if (base.world_size > kMax || base.batch_size > kMax) {
    return "world_size and batch_size must be at most 2^62, got " + std::to_string(base.world_size) +
           " and " + std::to_string(base.batch_size);
  }
  if (static_cast<int64_t>(base.batches.size()) != base.world_size) {
    return "one consumed batch count per old rank is needed (" + std::to_string(base.world_size) +
           "), got " + std::to_string(base.batches.size());
  }
  if (base.base != nullptr) {
    std::string inner = ValidateLevel(*base.base, order, OldRank(options, base, 0), epoch);
    if (!inner.empty()) return inner;
  }
  const OldRanks ranks(order, options, epoch, base);
  for (int64_t r = 0; r < base.world_size; ++r) {
    const int64_t n = ranks.Of(r)->num_rows();
    const int64_t batches = options.drop_last ? n / base.batch_size
                                              : (n + base.batch_size - 1) / base.batch_size;
    if (base.batches[r] < 0 || base.batches[r] > batches) {
      return "rank " + std::to_string(r) + " of " + std::to_string(base.world_size) +
             " consumed " + std::to_string(base.batches[r]) + " batches of epoch " +
             std::to_string(epoch) + ", which has " + std::to_string(batches) + " for it";
    }
  }
  return "";
}

}  // namespace

std::string ValidateElasticBase(const ElasticBase& base, const std::vector<int64_t>& split_rows,
                                const PlanOptions& options, int64_t epoch) {
  return ValidateLevel(base, EpochOrder::Make(split_rows, options, epoch), options, epoch);
}

std::shared_ptr<const RowOrder> MakeRemainderOrder(const std::vector<int64_t>& split_rows,
                                                   const PlanOptions& options, int64_t epoch,
                                                   const ElasticBase& base) {
  return ShareOf(OldRanks::RestOf(EpochOrder::Make(split_rows, options, epoch), options, epoch, base),
                 options);
}

}  // namespace pqloader
