// Conversion of Arrow columns to tensor columns.
//
// SpecForField decides, from the Arrow type alone, what a column becomes; ConvertColumn
// turns the decoded values of one unit into a ColumnData in that layout, zero-copy
// when the Arrow layout already matches. Neither knows about files or threads; callers
// add the file and row group to error messages. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include <arrow/chunked_array.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>
#include <arrow/type.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

/// What replaces null values of a column.
struct NullFill {
  /// Whether nulls are replaced (otherwise they are an error). Default: false.
  bool enabled = false;
  /// Whether the numeric fill is `float_value` (else `int_value`).
  bool is_float = false;
  int64_t int_value = 0;
  double float_value = 0;
  /// Fill of string and binary columns.
  std::string bytes_value;
};

/// Return how a column of type `field` becomes a batch column, or a kUnsupportedType
/// error naming the column and its type.
arrow::Result<ColumnSpec> SpecForField(const arrow::Field& field);

/// Convert every row of `array` to the layout of `spec`. With `allow_ragged`, list rows
/// may differ in length (the result then has per-row byte offsets; transforms such as
/// PadOrTruncate make them uniform). String columns (ColumnKind::kString) must hold
/// valid UTF-8: an invalid value is a kInvalidData error naming the column and its row
/// (`row_offset` + its index in `array`).
arrow::Result<ColumnData> ConvertColumn(const ColumnSpec& spec, const arrow::ChunkedArray& array,
                                        const NullFill& fill, arrow::MemoryPool* pool,
                                        bool allow_ragged = false, int64_t row_offset = 0);

}  // namespace pqloader
