// What loader.cc and its parts (loader_units.cc, loader_batches.cc, loader_cache.cc,
// loader_pack.cc, loader_options.cc) share: the layout of an epoch run, and helpers.
// Not part of the library's interface.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "pqloader/loader.h"

namespace pqloader {

// The options' values checked before anything is opened (loader_options.cc).
arrow::Status ValidateLoaderOptions(const LoaderOptions& options);

// The bytes of one row of `specs`' columns, or -1 if a dimension is known only once data
// is decoded.
inline int64_t FixedRowBytes(const std::vector<ColumnSpec>& specs) {
  int64_t row_bytes = 0;
  for (const ColumnSpec& spec : specs) {
    int64_t bytes = DTypeSize(spec.dtype);
    for (int64_t d : spec.row_shape) bytes = d < 0 || bytes < 0 ? -1 : bytes * d;
    row_bytes = bytes < 0 || row_bytes < 0 ? -1 : row_bytes + bytes;
  }
  return row_bytes;
}

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// How a run of an epoch is laid out: its order, the stream positions each batch holds
// (rows of the order, or with packing the documents that fill its blocks), and the units
// each batch reads. With shuffled windows gathered whole, the first batch of the run
// that reads a window gathers it (and so reads its units); the window's other batches
// take slices.
struct Loader::RunLayout {
  int64_t epoch = 0;
  int64_t first_batch = 0;
  uint64_t seed = 0;
  std::shared_ptr<const RowOrder> order;
  std::shared_ptr<const PackPlan> pack;  // with packing
  int64_t batch_size = 1, num_rows = 0, num_batches = 0, num_blocks = 0;
  const EpochPlan* plan = nullptr;       // with whole-window gathers: order's plan
  std::shared_ptr<WindowStore> windows;  // with whole-window gathers
  std::shared_ptr<WindowSink> sink;      // a mixture's, if written into it

  std::pair<int64_t, int64_t> Positions(int64_t b) const {
    if (pack == nullptr) return {b * batch_size, std::min((b + 1) * batch_size, num_rows)};
    const auto span =
        pack->BlocksSpan(b * batch_size, std::min((b + 1) * batch_size, num_blocks));
    return {span.first, span.last};
  }
  // The windows [first, second] that batch b gathers (none when first > second).
  std::pair<int64_t, int64_t> WindowsMadeBy(int64_t b) const {
    const auto [first, last] = Positions(b);
    const int64_t wa = plan->WindowOfRow(first), wb = plan->WindowOfRow(last - 1);
    const bool makes_wa = b == first_batch || plan->WindowRowRange(wa).first >= first;
    return {makes_wa ? wa : wa + 1, wb};
  }
  std::pair<int64_t, int64_t> UnitsOf(int64_t b) const {
    if (windows == nullptr) {
      const auto [first, last] = Positions(b);
      return order->PositionUnitRange(first, last);
    }
    const auto [wa, wb] = WindowsMadeBy(b);
    if (wa <= wb) {
      return plan->PositionUnitRange(plan->WindowRowRange(wa).first,
                                     plan->WindowRowRange(wb).second);
    }
    const int64_t end = plan->PositionUnitRange(plan->WindowRowRange(wb).first,
                                                plan->WindowRowRange(wb).second).second;
    return {end, end};  // reads no unit: the window's gather exists
  }
};

}  // namespace pqloader
