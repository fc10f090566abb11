#include "pqloader/dataset/column_types.h"

#include <arrow/array.h>
#include <arrow/compute/cast.h>
#include <arrow/extension/fixed_shape_tensor.h>
#include <arrow/extension_type.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

const arrow::extension::FixedShapeTensorType* PlainTensor(const arrow::DataType& type) {
  if (type.id() != arrow::Type::EXTENSION) return nullptr;
  const auto& ext = static_cast<const arrow::ExtensionType&>(type);
  if (ext.extension_name() != "arrow.fixed_shape_tensor") return nullptr;
  const auto* tensor = dynamic_cast<const arrow::extension::FixedShapeTensorType*>(&type);
  if (tensor == nullptr || tensor->shape().empty()) return nullptr;
  const auto& perm = tensor->permutation();
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return nullptr;  // another layout: not a row
  }
  return tensor;
}

}  // namespace

std::shared_ptr<arrow::DataType> TypeWithoutExtension(const std::shared_ptr<arrow::DataType>& type) {
  if (type == nullptr || type->id() != arrow::Type::EXTENSION) return type;
  const auto& ext = static_cast<const arrow::ExtensionType&>(*type);
  if (const auto* tensor = PlainTensor(*type)) {
    std::shared_ptr<arrow::DataType> out = tensor->value_type();
    const auto& shape = tensor->shape();
    for (size_t d = shape.size(); d-- > 0;) {
      out = arrow::fixed_size_list(out, static_cast<int32_t>(shape[d]));
    }
    return out;
  }
  if (ext.extension_name() == "arrow.fixed_shape_tensor") return type;  // permuted: refused
  if (ext.extension_name() == "arrow.bool8") return arrow::boolean();
  return ext.storage_type();
}

std::shared_ptr<arrow::Schema> SchemaWithoutExtensions(const std::shared_ptr<arrow::Schema>& schema) {
  bool any = false;
  arrow::FieldVector fields;
  for (const auto& f : schema->fields()) {
    auto type = TypeWithoutExtension(f->type());
    any = any || type != f->type();
    fields.push_back(type == f->type() ? f : f->WithType(type));
  }
  return any ? arrow::schema(std::move(fields), schema->metadata()) : schema;
}

arrow::Result<std::shared_ptr<arrow::ChunkedArray>> WithoutExtension(
    const std::shared_ptr<arrow::ChunkedArray>& column, arrow::MemoryPool* pool) {
  const auto& type = column->type();
  auto plain = TypeWithoutExtension(type);
  if (plain == type) return column;
  arrow::ArrayVector chunks;
  for (const auto& chunk : column->chunks()) {
    std::shared_ptr<arrow::Array> storage = static_cast<const arrow::ExtensionArray&>(*chunk).storage();
    if (plain->id() == arrow::Type::BOOL && storage->type()->id() != arrow::Type::BOOL) {
      arrow::compute::ExecContext ctx(pool);
      ARROW_ASSIGN_OR_RAISE(auto cast, arrow::compute::Cast(*storage, arrow::boolean(),
                                                            arrow::compute::CastOptions::Safe(), &ctx));
      chunks.push_back(std::move(cast));
    } else if (const auto* tensor = PlainTensor(*type)) {
      // Storage: a fixed-size list of product(shape) values; rows of `shape` nest them
      // (the inner lists over all of the storage's values, the outer one keeping its
      // offset and validity).
      const auto& shape = tensor->shape();
      std::shared_ptr<arrow::Array> values = static_cast<const arrow::FixedSizeListArray&>(*storage).values();
      for (size_t d = shape.size(); d-- > 1;) {
        ARROW_ASSIGN_OR_RAISE(values, arrow::FixedSizeListArray::FromArrays(
                                          values, static_cast<int32_t>(shape[d])));
      }
      const auto& data = storage->data();
      values = arrow::MakeArray(arrow::ArrayData::Make(plain, data->length, {data->buffers[0]},
                                                       {values->data()}, data->null_count,
                                                       data->offset));
      chunks.push_back(std::move(values));
    } else {
      chunks.push_back(std::move(storage));
    }
  }
  return arrow::ChunkedArray::Make(std::move(chunks), plain);
}

bool ElementType(const arrow::DataType& type, DType* out) {
  switch (type.id()) {
    case arrow::Type::BOOL: *out = DType::kBool; return true;
    case arrow::Type::INT8: *out = DType::kInt8; return true;
    case arrow::Type::INT16: *out = DType::kInt16; return true;
    case arrow::Type::INT32: case arrow::Type::DATE32: case arrow::Type::TIME32:
      *out = DType::kInt32; return true;
    case arrow::Type::INT64: case arrow::Type::DATE64: case arrow::Type::TIME64:
    case arrow::Type::TIMESTAMP: case arrow::Type::DURATION:
      *out = DType::kInt64; return true;
    case arrow::Type::UINT8: *out = DType::kUInt8; return true;
    case arrow::Type::UINT16: *out = DType::kUInt16; return true;
    case arrow::Type::UINT32: *out = DType::kUInt32; return true;
    case arrow::Type::UINT64: *out = DType::kUInt64; return true;
    case arrow::Type::HALF_FLOAT: *out = DType::kFloat16; return true;
    case arrow::Type::FLOAT: *out = DType::kFloat32; return true;
    case arrow::Type::DOUBLE: *out = DType::kFloat64; return true;
    default: return false;
  }
}

bool IsVarBinary(arrow::Type::type id, ColumnKind* kind) {
  switch (id) {
    case arrow::Type::STRING: case arrow::Type::LARGE_STRING: case arrow::Type::STRING_VIEW:
      *kind = ColumnKind::kString; return true;
    case arrow::Type::BINARY: case arrow::Type::LARGE_BINARY: case arrow::Type::FIXED_SIZE_BINARY:
    case arrow::Type::BINARY_VIEW:
      *kind = ColumnKind::kBytes; return true;
    default: return false;
  }
}

bool IsDecimal(arrow::Type::type id) {
  return id == arrow::Type::DECIMAL32 || id == arrow::Type::DECIMAL64 ||
         id == arrow::Type::DECIMAL128 || id == arrow::Type::DECIMAL256;
}

bool IsListLike(arrow::Type::type id) {
  return id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST ||
         id == arrow::Type::FIXED_SIZE_LIST;
}

const arrow::DataType& ValueType(const arrow::DataType& t) {
  if (t.id() == arrow::Type::DICTIONARY) {
    return *static_cast<const arrow::DictionaryType&>(t).value_type();
  }
  return t;
}

arrow::Result<ColumnSpec> SpecForField(const arrow::Field& field, const SpecOptions& options) {
  ColumnSpec spec;
  spec.name = field.name();
  spec.arrow_type = field.type()->ToString();
  const arrow::DataType* t = &ValueType(*field.type());
  auto refuse = [&](const std::string& why) {
    return MakeError(ErrorKind::kUnsupportedType, "column '", spec.name, "' has type ",
                     spec.arrow_type, ", which is not supported: ", why);
  };
  if (t->id() == arrow::Type::NA) {
    return refuse("every value is null in every file (pandas and pyarrow write an all-None "
                  "column so), so there is nothing to load; leave it out with columns=[...]");
  }
  if (IsVarBinary(t->id(), &spec.kind)) {
    spec.text = spec.kind == ColumnKind::kString;
    if (options.strings_as_bytes) spec.kind = ColumnKind::kBytes;
    return spec;
  }
  if (IsListLike(t->id())) {
    const auto& value = ValueType(*static_cast<const arrow::BaseListType*>(t)->value_type());
    ColumnKind kind;
    if (IsVarBinary(value.id(), &kind)) {
      spec.text = kind == ColumnKind::kString;
      spec.kind = kind == ColumnKind::kString && !options.strings_as_bytes
                      ? ColumnKind::kStringList
                      : ColumnKind::kBytesList;
      return spec;
    }
  }
  spec.kind = ColumnKind::kTensor;
  while (true) {
    if (t->id() == arrow::Type::FIXED_SIZE_LIST) {
      const auto* list = static_cast<const arrow::FixedSizeListType*>(t);
      spec.row_shape.push_back(list->list_size());
      t = list->value_type().get();
    } else if ((t->id() == arrow::Type::LIST || t->id() == arrow::Type::LARGE_LIST)) {
      spec.row_shape.push_back(-1);
      t = static_cast<const arrow::BaseListType*>(t)->value_type().get();
    } else {
      break;
    }
  }
  // A list of variable-length lists cannot be a tensor: only the outermost dim may vary.
  for (size_t i = 1; i < spec.row_shape.size(); ++i) {
    if (spec.row_shape[i] < 0) {
      return refuse("only the outermost list may have variable length (a list of lists "
                    "needs one length per inner list: write it as fixed_size_list); select "
                    "other columns with columns=[...]");
    }
  }
  if (IsDecimal(t->id())) {
    const auto& dec = static_cast<const arrow::DecimalType&>(*t);
    if (options.decimals_as_int64 && dec.precision() > 18) {
      return refuse("decimals='int64' needs a precision of at most 18 (an unscaled value "
                    "fits in int64); load it as float64 (decimals='float64'), or select "
                    "other columns");
    }
    spec.dtype = options.decimals_as_int64 ? DType::kInt64 : DType::kFloat64;
    spec.decimal_scale = dec.scale();
    return spec;
  }
  if (t->id() == arrow::Type::STRUCT || t->id() == arrow::Type::MAP) {
    // The paths themselves (a placeholder 'ls.field' was named).
    std::string paths;
    if (t->id() == arrow::Type::STRUCT) {
      for (const auto& f : static_cast<const arrow::StructType&>(*t).fields()) {
        paths += (paths.empty() ? "'" : ", '") + spec.name + "." + f->name() + "'";
      }
    } else {
      paths = "'" + spec.name + ".key', '" + spec.name + ".value'";
    }
    return refuse("a list of structs or a map has no tensor layout; select its fields by dotted "
                  "path (" + paths + "): each gives a list per row");
  }
  if (!ElementType(*t, &spec.dtype)) {
    return refuse("numeric, bool, temporal, decimal, string, binary, lists of strings, and "
                  "fixed-size or uniform lists of numbers are; select other columns with "
                  "columns=[...]");
  }
  return spec;
}

namespace {

int IntegerBits(arrow::Type::type id, bool* is_signed) {
  switch (id) {
    case arrow::Type::INT8: *is_signed = true; return 8;
    case arrow::Type::INT16: *is_signed = true; return 16;
    case arrow::Type::INT32: *is_signed = true; return 32;
    case arrow::Type::INT64: *is_signed = true; return 64;
    case arrow::Type::UINT8: *is_signed = false; return 8;
    case arrow::Type::UINT16: *is_signed = false; return 16;
    case arrow::Type::UINT32: *is_signed = false; return 32;
    case arrow::Type::UINT64: *is_signed = false; return 64;
    default: return 0;
  }
}

int FloatBits(arrow::Type::type id) {
  switch (id) {
    case arrow::Type::HALF_FLOAT: return 16;
    case arrow::Type::FLOAT: return 32;
    case arrow::Type::DOUBLE: return 64;
    default: return 0;
  }
}

}  // namespace

bool ConvertsTo(const arrow::DataType& from_type, const arrow::DataType& to_type, bool declared) {
  const arrow::DataType& from = ValueType(from_type);
  const arrow::DataType& to = ValueType(to_type);
  if (from.id() == arrow::Type::NA) return true;
  if (from.Equals(to)) return true;
  ColumnKind a, b;
  if (IsVarBinary(from.id(), &a) && IsVarBinary(to.id(), &b)) {
    // Text declared as bytes: its UTF-8 bytes, without loss (as pyarrow casts it; the
    // message for a string file beside a binary one says to declare the type).
    if (a != b) return declared && a == ColumnKind::kString && b == ColumnKind::kBytes &&
                       to.id() != arrow::Type::FIXED_SIZE_BINARY;
    // A fixed-size binary converts to variable-length binary, not to another size.
    return to.id() != arrow::Type::FIXED_SIZE_BINARY;
  }
  bool from_signed = false, to_signed = false;
  const int from_int = IntegerBits(from.id(), &from_signed);
  const int to_int = IntegerBits(to.id(), &to_signed);
  const int to_float = FloatBits(to.id());
  if (from_int > 0 && to_int > 0) {
    if (from_signed == to_signed) return to_int >= from_int;
    return !from_signed && to_signed && to_int > from_int;
  }
  // Integers become floats only when declared: a column that is an integer in one file
  // and a float in another is usually a sign of something else (pandas' NaN for null).
  if (from_int > 0 && to_float > 0) return declared;
  if (FloatBits(from.id()) > 0 && to_float > 0) return to_float >= FloatBits(from.id());
  if (IsDecimal(from.id()) && IsDecimal(to.id())) {
    const auto& f = static_cast<const arrow::DecimalType&>(from);
    const auto& t = static_cast<const arrow::DecimalType&>(to);
    return t.scale() >= f.scale() && t.precision() - t.scale() >= f.precision() - f.scale();
  }
  if (IsDecimal(from.id()) && to_float == 64) return declared;
  if (IsListLike(from.id()) && IsListLike(to.id())) {
    if (to.id() == arrow::Type::FIXED_SIZE_LIST &&
        (from.id() != arrow::Type::FIXED_SIZE_LIST ||
         static_cast<const arrow::FixedSizeListType&>(from).list_size() !=
             static_cast<const arrow::FixedSizeListType&>(to).list_size())) {
      return false;
    }
    return ConvertsTo(*static_cast<const arrow::BaseListType&>(from).value_type(),
                      *static_cast<const arrow::BaseListType&>(to).value_type(), declared);
  }
  return false;
}

namespace {

// Whether `a` and `b` hold strings (or bytes) of two layouts, at one list depth.
bool TextLayoutsDiffer(const arrow::DataType& a, const arrow::DataType& b) {
  const arrow::DataType& x = ValueType(a);
  const arrow::DataType& y = ValueType(b);
  ColumnKind kx, ky;
  if (IsVarBinary(x.id(), &kx) && IsVarBinary(y.id(), &ky)) return kx == ky && !a.Equals(b);
  if (IsListLike(x.id()) && IsListLike(y.id())) {
    return TextLayoutsDiffer(*static_cast<const arrow::BaseListType&>(x).value_type(),
                             *static_cast<const arrow::BaseListType&>(y).value_type());
  }
  return false;
}

}  // namespace

std::shared_ptr<arrow::DataType> CommonType(const std::shared_ptr<arrow::DataType>& a,
                                            const std::shared_ptr<arrow::DataType>& b) {
  const arrow::DataType& x = ValueType(*a);
  const arrow::DataType& y = ValueType(*b);
  // Strings (or bytes) of two layouts, lists of them too: the large one, whatever the
  // files' order (the first file's layout won where the other converted to it: [string,
  // large_string] was large_string, the other order string, and a dictionary<int8> of
  // 128 values could be the type of a column of 300).
  const bool texts = TextLayoutsDiffer(*a, *b);
  ColumnKind kx;
  if (texts && IsVarBinary(x.id(), &kx)) {
    return kx == ColumnKind::kString ? arrow::large_utf8() : arrow::large_binary();
  }
  if (!texts && ConvertsTo(*a, *b)) return b;
  if (!texts && ConvertsTo(*b, *a)) return a;
  // An unsigned and a signed integer: a signed one wide enough for both; two decimals of
  // one scale: the larger precision.
  bool sx = false, sy = false;
  const int bx = IntegerBits(x.id(), &sx), by = IntegerBits(y.id(), &sy);
  if (bx > 0 && by > 0 && sx != sy) {
    const int unsigned_bits = sx ? by : bx, signed_bits = sx ? bx : by;
    const int bits = std::max(signed_bits, 2 * unsigned_bits);
    if (bits <= 64) {
      return bits == 16 ? arrow::int16() : bits == 32 ? arrow::int32() : arrow::int64();
    }
    return nullptr;
  }
  if (IsDecimal(x.id()) && IsDecimal(y.id())) {
    const auto& dx = static_cast<const arrow::DecimalType&>(x);
    const auto& dy = static_cast<const arrow::DecimalType&>(y);
    const int32_t scale = std::max(dx.scale(), dy.scale());
    const int32_t digits = std::max(dx.precision() - dx.scale(), dy.precision() - dy.scale());
    if (digits + scale <= 38) return arrow::decimal128(digits + scale, scale);
    if (digits + scale <= 76) return arrow::decimal256(digits + scale, scale);
    return nullptr;
  }
  if (IsListLike(x.id()) && IsListLike(y.id())) {
    auto value = CommonType(static_cast<const arrow::BaseListType&>(x).value_type(),
                            static_cast<const arrow::BaseListType&>(y).value_type());
    if (value == nullptr) return nullptr;
    if (x.id() == arrow::Type::FIXED_SIZE_LIST && y.id() == arrow::Type::FIXED_SIZE_LIST) {
      const int32_t n = static_cast<const arrow::FixedSizeListType&>(x).list_size();
      if (n != static_cast<const arrow::FixedSizeListType&>(y).list_size()) return nullptr;
      return arrow::fixed_size_list(value, n);
    }
    if (x.id() == arrow::Type::LARGE_LIST || y.id() == arrow::Type::LARGE_LIST) {
      return arrow::large_list(value);
    }
    return arrow::list(value);
  }
  return nullptr;
}

}  // namespace pqloader
