// Column types: what each Arrow type becomes in a batch, and which types convert to
// which. Decided from the schema alone (a dataset's files and the declared columns),
// before any value is read; decode/convert.h converts the values accordingly.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <arrow/result.h>
#include <arrow/type.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

/// The type pqloader reads for a top-level column of `type`: an Arrow extension type as
/// its storage, except arrow.fixed_shape_tensor (without a permutation), which becomes
/// nested fixed-size lists of its shape (rows of that shape), and arrow.bool8, which
/// becomes bool. Other types, and a tensor with a permutation (refused later as an
/// extension type), are returned as they are.
std::shared_ptr<arrow::DataType> TypeWithoutExtension(const std::shared_ptr<arrow::DataType>& type);

/// `schema` with each top-level field's type as TypeWithoutExtension makes it.
std::shared_ptr<arrow::Schema> SchemaWithoutExtensions(const std::shared_ptr<arrow::Schema>& schema);

/// The values of `column` in the type TypeWithoutExtension gives (a view of the same
/// buffers; bool8 is converted).
arrow::Result<std::shared_ptr<arrow::ChunkedArray>> WithoutExtension(
    const std::shared_ptr<arrow::ChunkedArray>& column, arrow::MemoryPool* pool);

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
  /// Whether only whole rows may be null (a null_mask without fill_null: the mask flags
  /// null rows, and a null inside a row, a list's element, could not be told from a
  /// value): such a null is an error naming the row. Default: false.
  bool rows_only = false;
  /// A list column of one length per row (not ragged): that length where the footers
  /// show it, which a null list takes when no other row of its unit tells (a unit of
  /// null rows only, or one a filter left so). Default: -1, unknown (such a null list is
  /// then empty).
  int64_t list_length = -1;
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

/// The tensor element type stored by a fixed-width Arrow type; false if it has none.
bool ElementType(const arrow::DataType& type, DType* out);
/// Whether `id` is a string or binary type (of any layout), and so which kind.
bool IsVarBinary(arrow::Type::type id, ColumnKind* kind);
bool IsDecimal(arrow::Type::type id);
/// list, large_list or fixed_size_list.
bool IsListLike(arrow::Type::type id);
/// The type of the values: a dictionary's value type, else `t` itself.
const arrow::DataType& ValueType(const arrow::DataType& t);

}  // namespace pqloader
