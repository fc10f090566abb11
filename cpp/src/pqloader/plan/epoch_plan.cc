#include "pqloader/plan/epoch_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "pqloader/random/philox.h"

namespace pqloader {

namespace {

// Fisher-Yates shuffle driven by a counter-based stream: the result depends only on
// (seed, purpose, ids, n). The stream is CounterRng's, computed in bulk.
template <typename T>
void Shuffle(T* v, int64_t n, BulkCounterRng rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(i) + 1));
    std::swap(v[i], v[j]);
  }
}
template <typename T>
void Shuffle(std::vector<T>* v, BulkCounterRng rng) {
  Shuffle(v->data(), static_cast<int64_t>(v->size()), rng);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string ValidatePlanOptions(const PlanOptions& o) {
  // At most 2^62 (as the Python Loader checks): counts such as ceil(rows / batch_size)
  // are computed as (rows + batch_size - 1) / batch_size, which must not overflow.
  constexpr int64_t kMax = int64_t{1} << 62;
  for (const auto& [name, v] : {std::make_pair("batch_size", o.batch_size),
                                std::make_pair("shuffle_window", o.shuffle_window),
                                std::make_pair("world_size", o.world_size)}) {
    if (v > kMax) return std::string(name) + " must be at most 2^62, got " + std::to_string(v);
  }
  if (o.batch_size <= 0) return "batch_size must be positive, got " + std::to_string(o.batch_size);
  if (o.shuffle_window <= 0) {
    return "shuffle_window must be positive, got " + std::to_string(o.shuffle_window);
  }
  if (o.world_size <= 0) return "world_size must be positive, got " + std::to_string(o.world_size);
  if (o.rank < 0 || o.rank >= o.world_size) {
    return "rank must be in [0, world_size=" + std::to_string(o.world_size) + "), got " +
           std::to_string(o.rank);
  }
  return "";
}

namespace {

std::shared_ptr<EpochOrder> SplitOrder(int64_t num_splits, const PlanOptions& options,
                                       int64_t epoch) {
  auto order = std::make_shared<EpochOrder>();
  order->split_order.resize(num_splits);
  std::iota(order->split_order.begin(), order->split_order.end(), 0);
  if (options.shuffle) {
    Shuffle(&order->split_order, BulkCounterRng(CounterRng(options.seed, RngPurpose::kSplitOrder,
                                                           static_cast<uint32_t>(epoch), 0)));
  }
  return order;
}

}  // namespace

std::shared_ptr<const EpochOrder> EpochOrder::Make(const std::vector<int64_t>& split_rows,
                                                   const PlanOptions& options, int64_t epoch) {
  auto order = SplitOrder(static_cast<int64_t>(split_rows.size()), options, epoch);
  order->stream_start.reserve(split_rows.size() + 1);
  order->stream_start.push_back(0);
  for (int64_t s : order->split_order) {
    order->stream_start.push_back(order->stream_start.back() + split_rows[s]);
  }
  return order;
}

EpochPlan EpochPlan::Make(const std::vector<int64_t>& split_rows, const PlanOptions& options,
                          int64_t epoch) {
  return MakeFrom(&split_rows, options, epoch,
                  SplitOrder(static_cast<int64_t>(split_rows.size()), options, epoch));
}

EpochPlan EpochPlan::Make(const PlanOptions& options, int64_t epoch,
                          std::shared_ptr<const EpochOrder> order) {
  return MakeFrom(nullptr, options, epoch, std::move(order));
}

EpochPlan EpochPlan::MakeFrom(const std::vector<int64_t>* split_rows, const PlanOptions& options,
                              int64_t epoch, std::shared_ptr<const EpochOrder> order) {
  EpochPlan plan;
  plan.options_ = options;
  plan.epoch_ = epoch;

  // 1. The epoch's global order of splits (shared by every rank).
  plan.order_ = std::move(order);
  const int64_t total =
      split_rows != nullptr ? std::accumulate(split_rows->begin(), split_rows->end(), int64_t{0})
                            : plan.order_->stream_start.back();

  // 2. Contiguous shares of the epoch's row stream whose sizes differ by at most one;
  // then the policy equalises them: kDrop drops the last row of the larger shares,
  // kPad repeats the first row of the smaller ones (a rank never reads another's rows,
  // except when ranks outnumber rows and an empty share borrows row rank % total).
  const int64_t world = options.world_size;
  const int64_t base = total / world;
  const int64_t rem = total % world;
  const int64_t begin = options.rank * base + std::min(options.rank, rem);
  const int64_t count = base + (options.rank < rem ? 1 : 0);
  if (options.shard_policy == ShardPolicy::kNone) {
    plan.num_rows_ = count;
    plan.AppendStreamRange(split_rows, begin, begin + count);
  } else if (options.shard_policy == ShardPolicy::kDrop) {
    plan.num_rows_ = base;
    plan.dropped_rows_ = rem;
    plan.AppendStreamRange(split_rows, begin, begin + base);
  } else {
    const int64_t target = base + (rem > 0 ? 1 : 0);
    plan.num_rows_ = target;
    plan.padded_rows_ = target * world - total;
    plan.AppendStreamRange(split_rows, begin, begin + count);
    if (count < target) {
      const int64_t from = count > 0 ? begin : options.rank % total;
      plan.AppendStreamRange(split_rows, from, from + (target - count));
    }
  }

  plan.unit_first_row_.assign(1, 0);
  for (const Unit& u : plan.units_) {
    plan.unit_first_row_.push_back(plan.unit_first_row_.back() + u.num_rows());
  }

  // 4. Shuffle windows of `shuffle_window` consecutive units. Without shuffling, every
  // unit is its own window so a batch waits only for the units it reads.
  const int64_t window = options.shuffle ? options.shuffle_window : 1;
  plan.window_units_ = window;
  const auto num_units = static_cast<int64_t>(plan.units_.size());
  plan.window_first_row_.assign(1, 0);
  for (int64_t u = 0; u < num_units; u += window) {
    plan.window_first_row_.push_back(plan.unit_first_row_[std::min(u + window, num_units)]);
  }

  plan.num_batches_ = options.drop_last ? plan.num_rows_ / options.batch_size
                                        : CeilDiv(plan.num_rows_, options.batch_size);
  return plan;
}

void EpochPlan::AppendStreamRange(const std::vector<int64_t>* split_rows, int64_t begin,
                                  int64_t end) {
  const std::vector<int64_t>& order = order_->split_order;
  const std::vector<int64_t>& start = order_->stream_start;
  if (start.empty()) {  // walk the order from the start
    int64_t split_start = 0;
    for (int64_t s : order) {
      if (split_start >= end) break;
      const int64_t split_end = split_start + (*split_rows)[s];
      const int64_t lo = std::max(begin, split_start);
      const int64_t hi = std::min(end, split_end);
      if (lo < hi) units_.push_back(Unit{s, lo - split_start, hi - split_start});
      split_start = split_end;
    }
    return;
  }
  // The last split that starts at or before `begin`; then every split until `end`.
  auto i = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), begin) - start.begin());
  i = i == 0 ? 0 : i - 1;
  for (; i < order.size() && start[i] < end; ++i) {
    const int64_t lo = std::max(begin, start[i]);
    const int64_t hi = std::min(end, start[i + 1]);
    if (lo < hi) units_.push_back(Unit{order[i], lo - start[i], hi - start[i]});
  }
}

int64_t EpochPlan::MemoryBytes() const {
  // The epoch's order is shared by every rank's plan (counted here in full).
  return static_cast<int64_t>((order_->split_order.capacity() + order_->stream_start.capacity()) *
                                  sizeof(int64_t) +
                              units_.capacity() * sizeof(Unit) +
                              unit_first_row_.capacity() * sizeof(int64_t) +
                              window_first_row_.capacity() * sizeof(int64_t));
}

int64_t EpochPlan::drop_last_rows() const {
  return num_rows_ - std::min(num_rows_, num_batches_ * options_.batch_size);
}

std::pair<int64_t, int64_t> EpochPlan::BatchRowRange(int64_t b) const {
  const int64_t first = b * options_.batch_size;
  return {first, std::min(first + options_.batch_size, num_rows_)};
}

int64_t EpochPlan::WindowOfRow(int64_t pos) const {
  auto it = std::upper_bound(window_first_row_.begin(), window_first_row_.end(), pos);
  return static_cast<int64_t>(it - window_first_row_.begin()) - 1;
}

std::pair<int64_t, int64_t> EpochPlan::BatchUnitRange(int64_t b) const {
  const auto [first, last] = BatchRowRange(b);
  return PositionUnitRange(first, last);
}

std::pair<int64_t, int64_t> EpochPlan::PositionUnitRange(int64_t first, int64_t last) const {
  const int64_t window = options_.shuffle ? options_.shuffle_window : 1;
  const auto num_units = static_cast<int64_t>(units_.size());
  if (first >= last) return {num_units, num_units};  // nothing to read (e.g. padding at the end)
  const int64_t lo = WindowOfRow(first) * window;
  const int64_t hi = std::min((WindowOfRow(last - 1) + 1) * window, num_units);
  return {lo, hi};
}

std::vector<uint32_t> EpochPlan::WindowPermutation(int64_t w) const {
  if (!options_.shuffle) return {};
  std::vector<uint32_t> perm(window_first_row_[w + 1] - window_first_row_[w]);
  WindowPermutation(w, perm.data());
  return perm;
}

void EpochPlan::WindowPermutation(int64_t w, uint32_t* out) const {
  const int64_t n = window_first_row_[w + 1] - window_first_row_[w];
  std::iota(out, out + n, 0u);
  if (!options_.shuffle) return;
  Shuffle(out, n, BulkCounterRng(CounterRng::ForWindow(options_.seed, epoch_, w, options_.rank)));
}

int64_t EpochPlan::UnitOfWindowOffset(int64_t w, int64_t offset) const {
  // Among the window's own units only (it is called for every row of a shuffled epoch:
  // a binary search over all the epoch's units was 3-4 % of its CPU); a few units are
  // counted without branches, which a random offset would mispredict.
  const int64_t pos = window_first_row_[w] + offset;
  const int64_t first = w * window_units_;
  const int64_t last = std::min(first + window_units_, static_cast<int64_t>(units_.size()));
  if (last - first <= 8) {
    int64_t u = first;
    for (int64_t k = first + 1; k < last; ++k) u += unit_first_row_[k] <= pos ? 1 : 0;
    return u;
  }
  auto it = std::upper_bound(unit_first_row_.begin() + first + 1, unit_first_row_.begin() + last, pos);
  return static_cast<int64_t>(it - unit_first_row_.begin()) - 1;
}

}  // namespace pqloader
