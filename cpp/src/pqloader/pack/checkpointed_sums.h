// CheckpointedSums: a sequence of non-negative counts (tokens of documents) and their
// running sums, with the sums kept only every kStride values: 8 bytes per 64 values
// beside the values, where a full prefix-sum array takes 8 bytes a value. Packing holds
// one of these per document of the dataset (DocumentLengths) and per document of the
// rank and epoch (PackPlan), so at 10^9 documents this is gigabytes a rank.
//
// Before(i) adds at most kStride - 1 values to a checkpoint; the searches binary-search
// the checkpoints, then scan at most kStride values.
// Thread-safety: const methods are safe to call concurrently; Assign is not.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pqloader {

template <typename T>
class CheckpointedSums {
 public:
  static constexpr int64_t kStride = 64;

  CheckpointedSums() { checkpoints_.push_back(0); }

  /// Take `values` (each >= 0) as the sequence.
  void Assign(std::vector<T> values) {
    values_ = std::move(values);
    checkpoints_.assign(1, 0);
    checkpoints_.reserve(static_cast<size_t>(size() / kStride + 1));
    total_ = 0;
    for (int64_t i = 0; i < size(); ++i) {
      total_ += static_cast<int64_t>(values_[static_cast<size_t>(i)]);
      if ((i + 1) % kStride == 0) checkpoints_.push_back(total_);
    }
  }

  int64_t size() const { return static_cast<int64_t>(values_.size()); }
  /// The sum of every value.
  int64_t total() const { return total_; }
  T operator[](int64_t i) const { return values_[static_cast<size_t>(i)]; }
  const std::vector<T>& values() const { return values_; }

  /// The sum of values [0, i), for i in [0, size()].
  int64_t Before(int64_t i) const {
    const int64_t k = i / kStride;
    int64_t sum = checkpoints_[static_cast<size_t>(k)];
    for (int64_t j = k * kStride; j < i; ++j) sum += static_cast<int64_t>(values_[static_cast<size_t>(j)]);
    return sum;
  }
  /// The sum of values [begin, end).
  int64_t Sum(int64_t begin, int64_t end) const { return Before(end) - Before(begin); }

  /// The last i in [0, size()] with Before(i) <= t (t >= 0): std::upper_bound over the
  /// prefix sums, minus one.
  int64_t LastAtOrBelow(int64_t t) const {
    // The last checkpoint at or below t (the first, 0, always is).
    const auto k = static_cast<int64_t>(
        std::upper_bound(checkpoints_.begin(), checkpoints_.end(), t) - checkpoints_.begin() - 1);
    int64_t i = k * kStride;
    int64_t sum = checkpoints_[static_cast<size_t>(k)];
    while (i < size() && sum + static_cast<int64_t>(values_[static_cast<size_t>(i)]) <= t) {
      sum += static_cast<int64_t>(values_[static_cast<size_t>(i)]);
      ++i;
    }
    return i;
  }
  /// The first i in [0, size()] with Before(i) >= t, or size() + 1 if none:
  /// std::lower_bound over the prefix sums.
  int64_t FirstAtOrAbove(int64_t t) const {
    if (t <= 0) return 0;
    if (t > total_) return size() + 1;
    // The first checkpoint at or above t; the answer lies after the one before it.
    const auto k = static_cast<int64_t>(
        std::lower_bound(checkpoints_.begin(), checkpoints_.end(), t) - checkpoints_.begin());
    int64_t i = (k - 1) * kStride;
    int64_t sum = checkpoints_[static_cast<size_t>(k - 1)];
    while (sum < t) {  // ends by size(): Before(size()) = total_ >= t
      sum += static_cast<int64_t>(values_[static_cast<size_t>(i)]);
      ++i;
    }
    return i;
  }

 private:
  std::vector<T> values_;
  std::vector<int64_t> checkpoints_;  // [k]: the sum of values [0, k * kStride)
  int64_t total_ = 0;
};

}  // namespace pqloader
