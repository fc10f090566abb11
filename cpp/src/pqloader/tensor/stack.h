// Columns of one dtype and row shape stacked into one batch column (LoaderOptions::stack):
// a wide table's features handed out as one [n, k] matrix instead of k arrays, as
// numpy.stack(columns, axis=1) would make it. The copy runs where the batch is
// assembled (a worker thread, or the consumer's with the GIL released); the consumer
// then makes one array (one tensor, one device copy) instead of k, which for a table of
// a hundred columns costs more than the batch's bytes (docs/design.md, "Stacked
// columns"). Thread-safety: a StackPlan is immutable after Make(); Apply may run
// concurrently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

/// One stacked output column: `name` holds `columns` (output columns, in this order)
/// side by side, [n, len(columns), row shape...].
struct StackSpec {
  std::string name;
  std::vector<std::string> columns;
};

class StackPlan {
 public:
  /// Check `stacks` against the output columns `specs` (`fixed[c]`: what every row of
  /// column c is, unset where the data decides: TransformPlan::fixed_outputs()) and return the plan. Each member must be
  /// a column of numbers whose rows all have one dtype and shape, known before any data,
  /// and the members of a stack one dtype and shape; a column belongs to one stack at
  /// most, once; a stack's name is new, or one of its own members'. The stacked column
  /// takes the place of its member that comes first among the output columns; the
  /// members are not output on their own.
  static arrow::Result<StackPlan> Make(const std::vector<ColumnSpec>& specs,
                                       const std::vector<std::optional<FixedRows>>& fixed,
                                       const std::vector<StackSpec>& stacks);

  /// The output columns once stacked.
  const std::vector<ColumnSpec>& specs() const { return specs_; }
  /// For each output column once stacked: the column it is before stacking, or -1 for
  /// a stacked one.
  const std::vector<int>& sources() const { return sources_; }

  /// `batch` (columns as the `specs` given to Make) with each stack's members replaced
  /// by one column of a new block from `pool`. Invalid when a member's column in this
  /// batch is not the promised dtype and shape.
  arrow::Result<std::shared_ptr<Batch>> Apply(std::shared_ptr<Batch> batch,
                                              arrow::MemoryPool* pool) const;

 private:
  struct Stacked {
    std::vector<int> members;
    DType dtype = DType::kUInt8;
    std::vector<int64_t> row_shape;  ///< One member's.
    int64_t row_bytes = 0;           ///< One member's.
  };
  std::vector<ColumnSpec> specs_;
  std::vector<int> sources_;
  std::vector<Stacked> stacked_;  ///< For sources_[c] == -1, in output order.
};

/// Row r of `out` = row r of each of the k columns `cols` (rows of `row_bytes` bytes) in
/// turn, for r in [0, n): numpy.stack(cols, axis=1). Moves bits only.
void StackRows(const uint8_t* const* cols, int64_t k, int64_t n, int64_t row_bytes, uint8_t* out);

}  // namespace pqloader
