// Reading one unit (a row range of one row group) into tensor columns.
//
// Thread-safety: ReadUnit may be called concurrently; each call opens its own reader
// over the dataset's immutable metadata.
#pragma once

#include <memory>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/dataset/dataset.h"
#include "pqloader/decode/convert.h"
#include "pqloader/plan/epoch_plan.h"

namespace pqloader {

struct ReadOptions {
  /// Per output column (specs order): what replaces nulls.
  std::vector<NullFill> fills;
  /// Verify page CRC checksums where the writer stored them. Default: false.
  bool verify_checksums = false;
  /// Per output column: whether list rows may differ in length (transforms follow).
  std::vector<bool> allow_ragged;
};

/// Read rows [unit.row_begin, unit.row_end) of split `unit.split` and convert them.
/// Errors name the file, the row group and, where known, the column.
arrow::Result<std::shared_ptr<DecodedUnit>> ReadUnit(const Dataset& dataset,
                                                           const Unit& unit,
                                                           const ReadOptions& options,
                                                           arrow::MemoryPool* pool);

}  // namespace pqloader
