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
  /// Whether the fill was given as str/bytes (else as a number): a string column needs
  /// one, a numeric column the other.
  bool is_bytes = false;
};

/// How column types map to batch columns where there is a choice.
struct SpecOptions {
  /// Decimals become the exact unscaled integer (value x 10^scale) as int64, for
  /// precision <= 18; else float64 (the nearest double, as pyarrow's cast). Default: false.
  bool decimals_as_int64 = false;
  /// String columns become bytes columns (kString -> kBytes, kStringList -> kBytesList):
  /// no UTF-8 check, values come out as bytes objects. Default: false (strings are
  /// checked and come out as str).
  bool strings_as_bytes = false;
};

/// Return how a column of type `field` becomes a batch column, or a kUnsupportedType
/// error naming the column and its type.
arrow::Result<ColumnSpec> SpecForField(const arrow::Field& field, const SpecOptions& options = {});

/// Return whether values of type `from` convert exactly to the batch column of type `to`
/// (the same type, or a safe widening: a wider integer of the same sign or a wider
/// signed one for unsigned, a wider float, string/large_string/string_view among
/// themselves and so binary; list/large_list/fixed_size_list of convertible values
/// where sizes agree; dictionaries by their values; null to anything). Decimals
/// convert to decimals (see SpecOptions). With `declared`, integers also convert to
/// floats (the type was asked for).
bool ConvertsTo(const arrow::DataType& from, const arrow::DataType& to, bool declared = false);

/// Return the type both `a` and `b` convert to (ConvertsTo), or null if none: the
/// wider of two numbers, large_string over string, and so on.
std::shared_ptr<arrow::DataType> CommonType(const std::shared_ptr<arrow::DataType>& a,
                                            const std::shared_ptr<arrow::DataType>& b);

/// Encode rows of strings as ColumnKind::kStringList rows: per row, a uint32 count,
/// `count` uint32 byte lengths, then the bytes one after another (host byte order).
/// DecodeStringList reads one row back (for tests and the bindings).
std::vector<std::string> DecodeStringList(const uint8_t* row, int64_t size);

/// Convert every row of `array` to the layout of `spec`. With `allow_ragged`, list rows
/// may differ in length (the result then has per-row byte offsets; transforms such as
/// PadOrTruncate make them uniform). String columns (ColumnKind::kString) and the values
/// of string lists (kStringList) must be valid UTF-8: an invalid value is a kInvalidData
/// error naming the column and its row (`row_offset` + its index in `array`).
arrow::Result<ColumnData> ConvertColumn(const ColumnSpec& spec, const arrow::ChunkedArray& array,
                                        const NullFill& fill, arrow::MemoryPool* pool,
                                        bool allow_ragged = false, int64_t row_offset = 0);

}  // namespace pqloader
