// Conversion of Arrow columns to tensor columns.
//
// ConvertColumn turns the decoded values of one unit into a ColumnData in the layout
// SpecForField (dataset/column_types.h) chose, zero-copy when the Arrow layout already
// matches. It knows nothing of files or threads; callers add the file and row group to
// error messages. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <arrow/chunked_array.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>
#include <arrow/type.h>

#include "pqloader/dataset/column_types.h"
#include "pqloader/tensor/batch.h"

namespace pqloader {

/// Encode rows of strings as ColumnKind::kStringList rows: per row, a uint32 count,
/// `count` uint32 byte lengths, then the bytes one after another (host byte order).
/// DecodeStringList reads one row back (for tests and the bindings).
std::vector<std::string> DecodeStringList(const uint8_t* row, int64_t size);

/// How rows of a converted array are numbered in error messages: row i of the array is
/// row `first + i` of its row group, or, where a filter kept some of its rows (packed
/// together in the array), row `(*kept)[first + i]`.
struct RowNumbering {
  RowNumbering(int64_t first = 0, const std::vector<int32_t>* kept = nullptr)  // NOLINT
      : first(first), kept(kept) {}
  int64_t operator()(int64_t i) const {
    const int64_t at = first + i;
    if (kept == nullptr || at < 0 || at >= static_cast<int64_t>(kept->size())) return at;
    return (*kept)[at];
  }
  int64_t first;
  const std::vector<int32_t>* kept;
};

/// Convert every row of `array` to the layout of `spec`. With `allow_ragged`, list rows
/// may differ in length (the result then has per-row byte offsets; transforms such as
/// PadOrTruncate make them uniform). String columns (ColumnKind::kString) and the values
/// of string lists (kStringList) must be valid UTF-8: an invalid value is a kInvalidData
/// error naming the column and its row (see RowNumbering), as is a null inside a list
/// where `fill` is for whole rows only (NullFill::rows_only).
arrow::Result<ColumnData> ConvertColumn(const ColumnSpec& spec, const arrow::ChunkedArray& array,
                                        const NullFill& fill, arrow::MemoryPool* pool,
                                        bool allow_ragged = false, const RowNumbering& rows = {});

}  // namespace pqloader
