// Values below structs, and null masks.
//
// ExtractPath takes one field of a struct column (or of the structs in a list or map
// column) as a column of its own; ValidityColumn makes a "<name>_valid" column from a
// column's nulls. Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <arrow/array.h>
#include <arrow/chunked_array.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

/// Return the values of `path` below `array`, one step per name: a struct's field (a
/// null struct makes the field null there), or the field of each struct of a list or
/// map (a list of that field with the list's offsets and nulls).
arrow::Result<std::shared_ptr<arrow::Array>> ExtractPath(std::shared_ptr<arrow::Array> array,
                                                         const std::vector<std::string>& path,
                                                         arrow::MemoryPool* pool);

/// Return a bool column with one byte per row of `array`: 1 where the row is not null.
arrow::Result<ColumnData> ValidityColumn(const arrow::ChunkedArray& array,
                                         arrow::MemoryPool* pool);

/// Return a bool column of `rows` rows, all `valid`.
arrow::Result<ColumnData> ConstantValidity(int64_t rows, bool valid, arrow::MemoryPool* pool);

}  // namespace pqloader
