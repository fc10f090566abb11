// EpochPlan: the order in which one rank reads samples in one epoch.
//
// The plan is a pure function of (rows per split, PlanOptions, epoch): no I/O, no
// clocks, no thread ids. It is the single source of truth for order, sharding and
// resume. Thread-safety: immutable after Make(); all const methods may be called
// concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pqloader {

/// How ranks are made equal in size when the row count does not divide evenly.
enum class ShardPolicy {
  kDrop,  ///< Ranks with one row more than others drop their last row.
  kPad,   ///< Ranks with one row fewer than others repeat their first row.
  /// Each rank reads its own share once, shares differing by one row: a packing loader's
  /// rows, whose blocks are equalised instead (PackPlan::EqualBlocks). Set by the Loader
  /// itself; Loader::Make refuses it from callers.
  kNone,
};

/// Options that decide the order of samples. Every field affects the output.
struct PlanOptions {
  /// Rows per batch. Default: 256.
  int64_t batch_size = 256;
  /// Whether to drop the last, incomplete batch of the epoch. Default: false.
  bool drop_last = false;
  /// Whether to shuffle splits and rows. Default: false (natural order).
  bool shuffle = false;
  /// Seed of every random choice. Default: 0.
  uint64_t seed = 0;
  /// Number of consecutive units whose rows are permuted together when shuffling.
  /// Memory grows with it (a whole window is decoded before its first batch).
  /// Default: 4.
  int64_t shuffle_window = 4;
  /// This process's rank, in [0, world_size). Default: 0.
  int64_t rank = 0;
  /// Number of ranks that share the dataset. Default: 1.
  int64_t world_size = 1;
  /// How ranks are equalised. Default: kDrop.
  ShardPolicy shard_policy = ShardPolicy::kDrop;
};

/// Return an empty string if `options` are valid, else what is wrong.
std::string ValidatePlanOptions(const PlanOptions& options);

/// A contiguous row range of one split, read as one piece of work.
struct Unit {
  int64_t split = 0;
  int64_t row_begin = 0;  ///< First row, relative to the split.
  int64_t row_end = 0;    ///< One past the last row, relative to the split.
  int64_t num_rows() const { return row_end - row_begin; }
  bool operator==(const Unit&) const = default;
};

/// Where one sample of a batch comes from: row `row` (relative to the unit) of unit
/// `unit` (an index into EpochPlan::units()).
struct RowRef {
  int64_t unit;
  int64_t row;
};

/// The epoch's global order of splits, shared by the plans of every rank: it depends on
/// (split rows, seed, shuffle, epoch) only. Immutable once made.
struct EpochOrder {
  /// Splits in the order the epoch's row stream visits them.
  std::vector<int64_t> split_order;
  /// stream_start[i]: the stream position of split_order[i]'s first row; size splits + 1
  /// (empty in the order a single plan makes for itself: it walks the order instead).
  std::vector<int64_t> stream_start;

  /// The order with stream_start, for plans of many ranks to share.
  static std::shared_ptr<const EpochOrder> Make(const std::vector<int64_t>& split_rows,
                                                const PlanOptions& options, int64_t epoch);
};

class EpochPlan {
 public:
  /// Build the plan of `epoch` for a dataset whose split i has split_rows[i] rows.
  /// `options` must be valid (see ValidatePlanOptions).
  static EpochPlan Make(const std::vector<int64_t>& split_rows, const PlanOptions& options,
                        int64_t epoch);
  /// The same, with the epoch's order already made (EpochOrder::Make with the same
  /// split rows, options and epoch): what plans of many ranks share. O(log splits + the
  /// rank's units) instead of O(splits).
  static EpochPlan Make(const PlanOptions& options, int64_t epoch,
                        std::shared_ptr<const EpochOrder> order);

  const PlanOptions& options() const { return options_; }
  int64_t epoch() const { return epoch_; }
  /// Units this rank reads, in order.
  const std::vector<Unit>& units() const { return units_; }
  /// Order of splits for the whole epoch (all ranks).
  const std::vector<int64_t>& split_order() const { return order_->split_order; }
  /// Rows this rank yields in the epoch (after the shard policy, before drop_last).
  int64_t num_rows() const { return num_rows_; }
  int64_t num_batches() const { return num_batches_; }
  /// Rows dropped (kDrop) or repeated (kPad) this epoch, summed over all ranks.
  int64_t dropped_rows() const { return dropped_rows_; }
  int64_t padded_rows() const { return padded_rows_; }
  /// Rows of this rank discarded by drop_last.
  int64_t drop_last_rows() const;

  /// Return [first, last) positions of batch b in this rank's sample stream.
  std::pair<int64_t, int64_t> BatchRowRange(int64_t b) const;
  /// Return [lo, hi): the units that must be decoded to assemble batch b.
  /// Both bounds are non-decreasing in b.
  std::pair<int64_t, int64_t> BatchUnitRange(int64_t b) const;
  /// Return [lo, hi): the units that must be decoded to resolve stream positions
  /// [first, last) (whole shuffle windows).
  std::pair<int64_t, int64_t> PositionUnitRange(int64_t first, int64_t last) const;

  /// Bytes the plan holds (its vectors' capacities), for the planning-cost benchmark.
  int64_t MemoryBytes() const;

  int64_t num_windows() const { return static_cast<int64_t>(window_first_row_.size()) - 1; }
  /// Return [first, last): the stream positions of window w.
  std::pair<int64_t, int64_t> WindowRowRange(int64_t w) const {
    return {window_first_row_[w], window_first_row_[w + 1]};
  }
  /// Return the row permutation of window w (empty when not shuffling: identity).
  std::vector<uint32_t> WindowPermutation(int64_t w) const;
  /// The same written to out[0, window rows) (the identity when not shuffling). A
  /// window holds whole units, so out[i] is also the row, counted across the window's
  /// units, at its position i.
  void WindowPermutation(int64_t w, uint32_t* out) const;
  /// Return the window holding stream position `pos`.
  int64_t WindowOfRow(int64_t pos) const;

  /// Append the sources of positions [first, last) to `out`. `perm_of_window(w)`
  /// must return WindowPermutation(w) (callers may cache it).
  template <typename PermFn>
  void ResolveRows(int64_t first, int64_t last, PermFn&& perm_of_window,
                   std::vector<RowRef>* out) const;

 private:
  EpochPlan() = default;
  static EpochPlan MakeFrom(const std::vector<int64_t>* split_rows, const PlanOptions& options,
                            int64_t epoch, std::shared_ptr<const EpochOrder> order);
  // Append units covering positions [begin, end) of the epoch's row stream: a binary
  // search in the order's stream_start, or (without it) a walk of the order from the
  // start, summing `split_rows`.
  void AppendStreamRange(const std::vector<int64_t>* split_rows, int64_t begin, int64_t end);
  int64_t UnitOfWindowOffset(int64_t w, int64_t offset) const;

  PlanOptions options_;
  int64_t epoch_ = 0;
  std::shared_ptr<const EpochOrder> order_;
  std::vector<Unit> units_;
  std::vector<int64_t> unit_first_row_;    // prefix sums of unit rows; size units+1
  std::vector<int64_t> window_first_row_;  // prefix sums of window rows; size windows+1
  int64_t window_units_ = 1;               // units per window (the last may have fewer)
  int64_t num_rows_ = 0;
  int64_t num_batches_ = 0;
  int64_t dropped_rows_ = 0;
  int64_t padded_rows_ = 0;
};

template <typename PermFn>
void EpochPlan::ResolveRows(int64_t first, int64_t last, PermFn&& perm_of_window,
                            std::vector<RowRef>* out) const {
  int64_t pos = first;
  while (pos < last) {
    const int64_t w = WindowOfRow(pos);
    const int64_t w_begin = window_first_row_[w];
    const int64_t w_end = std::min(window_first_row_[w + 1], last);
    const auto& perm = perm_of_window(w);
    for (; pos < w_end; ++pos) {
      int64_t offset = pos - w_begin;
      if (!perm.empty()) offset = perm[offset];
      const int64_t u = UnitOfWindowOffset(w, offset);
      out->push_back(RowRef{u, w_begin + offset - unit_first_row_[u]});
    }
  }
}

}  // namespace pqloader
