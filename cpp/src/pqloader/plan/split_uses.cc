#include "pqloader/plan/split_uses.h"

#include <algorithm>

namespace pqloader {

EpochSplitUses EpochSplitUses::Make(const std::vector<int64_t>& split_rows,
                                    const PlanOptions& options, int64_t epoch) {
  EpochSplitUses out;
  out.epoch_ = epoch;
  const auto num_splits = static_cast<int64_t>(split_rows.size());
  std::vector<std::pair<int64_t, double>> reads;  // (split, time)
  // One order for every rank's plan: O(splits + ranks x log splits), not ranks x splits.
  const auto order = EpochOrder::Make(split_rows, options, epoch);
  for (int64_t r = 0; r < options.world_size; ++r) {
    PlanOptions o = options;
    o.rank = r;
    const EpochPlan plan = EpochPlan::Make(o, epoch, order);
    const auto n = static_cast<double>(plan.units().size());
    for (size_t p = 0; p < plan.units().size(); ++p) {
      reads.emplace_back(plan.units()[p].split, static_cast<double>(epoch) + static_cast<double>(p) / n);
    }
  }
  std::sort(reads.begin(), reads.end());
  out.first_.assign(num_splits + 1, 0);
  for (const auto& [s, t] : reads) ++out.first_[s + 1];
  for (int64_t s = 0; s < num_splits; ++s) out.first_[s + 1] += out.first_[s];
  out.times_.reserve(reads.size());
  for (const auto& [s, t] : reads) out.times_.push_back(t);
  return out;
}

double EpochSplitUses::NextRead(int64_t split, double after) const {
  if (split < 0 || split + 1 >= static_cast<int64_t>(first_.size())) return kNeverRead;
  const auto begin = times_.begin() + first_[split], end = times_.begin() + first_[split + 1];
  const auto it = std::upper_bound(begin, end, after);
  return it == end ? kNeverRead : *it;
}

std::vector<double> EpochSplitUses::Reads(int64_t split) const {
  if (split < 0 || split + 1 >= static_cast<int64_t>(first_.size())) return {};
  return std::vector<double>(times_.begin() + first_[split], times_.begin() + first_[split + 1]);
}

}  // namespace pqloader
