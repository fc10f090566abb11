#include "pqloader/decode/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <arrow/array.h>
#include <arrow/buffer_builder.h>
#include <arrow/util/bit_util.h>
#include <arrow/util/decimal.h>
#include <arrow/util/float16.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

// The value of row `i` of a string or binary array of any layout.
std::string_view ViewOf(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::LARGE_STRING: case arrow::Type::LARGE_BINARY:
      return static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
    case arrow::Type::FIXED_SIZE_BINARY:
      return static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i);
    case arrow::Type::STRING_VIEW: case arrow::Type::BINARY_VIEW:
      return static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
    default:
      return static_cast<const arrow::BinaryArray&>(a).GetView(i);
  }
}

template <typename Out>
void StoreAs(DType dtype, Out v, uint8_t* p) {
  switch (dtype) {
    case DType::kBool: { uint8_t x = v != 0; std::memcpy(p, &x, 1); break; }
    case DType::kInt8: { auto x = static_cast<int8_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kInt16: { auto x = static_cast<int16_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kInt32: { auto x = static_cast<int32_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kInt64: { auto x = static_cast<int64_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kUInt8: { auto x = static_cast<uint8_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kUInt16: { auto x = static_cast<uint16_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kUInt32: { auto x = static_cast<uint32_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kUInt64: { auto x = static_cast<uint64_t>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kFloat16: {
      const uint16_t x = arrow::util::Float16::FromDouble(static_cast<double>(v)).bits();
      std::memcpy(p, &x, sizeof(x));
      break;
    }
    case DType::kFloat32: { auto x = static_cast<float>(v); std::memcpy(p, &x, sizeof(x)); break; }
    case DType::kFloat64: { auto x = static_cast<double>(v); std::memcpy(p, &x, sizeof(x)); break; }
  }
}

template <typename In>
void ConvertLoop(const In* in, int64_t n, DType dst, uint8_t* out) {
  const int64_t width = DTypeSize(dst);
  for (int64_t r = 0; r < n; ++r) StoreAs(dst, in[r], out + r * width);
}

// Integers converted to a float type (declared by schema=) must convert exactly: a float
// holds every integer up to 2^(its mantissa's bits), and beyond only some. The values of
// `arr` (non-null slots) are checked against that bound at once, and one by one only past it.
template <typename In>
arrow::Status CheckExactAsFloat(const In* in, const arrow::Array& arr, DType dst,
                                const std::string& column) {
  if constexpr (!std::is_integral_v<In>) {
    return arrow::Status::OK();
  } else {
    const int bits = dst == DType::kFloat16 ? 11 : dst == DType::kFloat32 ? 24
                     : dst == DType::kFloat64 ? 53 : 0;
    if (bits == 0 || std::numeric_limits<In>::digits <= bits) return arrow::Status::OK();
    const int64_t n = arr.length();
    const auto limit = static_cast<In>(uint64_t{1} << bits);
    In lo = 0, hi = 0;
    for (int64_t r = 0; r < n; ++r) {  // null slots too: checked again below if past
      lo = std::min(lo, in[r]);
      hi = std::max(hi, in[r]);
    }
    bool within = hi <= limit;
    if constexpr (std::is_signed_v<In>) within = within && lo >= -limit;
    if (within) return arrow::Status::OK();
    for (int64_t r = 0; r < n; ++r) {
      const In v = in[r];
      if (v <= limit && (!std::is_signed_v<In> || v >= -limit)) continue;
      if (arr.IsNull(r)) continue;
      const double d = static_cast<double>(v);
      double back = d;
      if (dst == DType::kFloat32) back = static_cast<double>(static_cast<float>(v));
      if (dst == DType::kFloat16) back = arrow::util::Float16::FromDouble(d).ToDouble();
      // 2^digits is the first double past In's range: exact values stay below it (and
      // the conversion back is defined only there).
      const double end = std::ldexp(1.0, std::numeric_limits<In>::digits);
      if (back >= -end && back < end && static_cast<In>(back) == v) continue;
      return MakeError(ErrorKind::kSchemaMismatch, "column '", column, "': value ",
                       std::to_string(v), " (", arr.type()->ToString(),
                       ") does not convert to the declared ", DTypeName(dst),
                       " without loss (it holds every integer only up to 2^", bits,
                       "); declare an integer type, or a wider float where one holds them");
    }
    return arrow::Status::OK();
  }
}

// `v` (of scale `scale`) as a double at the column's scale `to_scale` (>= scale): rescaled
// exactly first, as pyarrow casts a file's decimals to the column's type before float64
// (converted at its own scale, -47.01 of a decimal(5, 2) file and of a decimal(10, 4) one
// became two doubles a unit in the last place apart).
template <typename DecimalT>
arrow::Result<double> DecimalToDouble(const DecimalT& v, int32_t scale, int32_t to_scale) {
  if (to_scale <= scale) return v.ToDouble(scale);
  if constexpr (std::is_same_v<DecimalT, arrow::Decimal256>) {
    ARROW_ASSIGN_OR_RAISE(auto wide, v.Rescale(scale, to_scale));
    return wide.ToDouble(to_scale);
  } else {
    arrow::Decimal128 narrow;
    if constexpr (std::is_same_v<DecimalT, arrow::Decimal128>) {
      narrow = v;
    } else {
      narrow = arrow::Decimal128(static_cast<int64_t>(v.value()));
    }
    // Decimal128::Rescale misses most overflows (it compares the wrapped product with the
    // value): rescale in 128 bits only where the result has at most 38 digits, and at a
    // scale a Decimal128 has (a decimal256 column's may be up to 76: Decimal128::ToDouble
    // at scale 39 gave 0 for 0.005).
    const int32_t delta = to_scale - scale;
    if (to_scale <= 38 && delta < 38 && narrow.FitsInPrecision(38 - delta)) {
      ARROW_ASSIGN_OR_RAISE(auto rescaled, narrow.Rescale(scale, to_scale));
      return rescaled.ToDouble(to_scale);
    }
    // Past 38 digits at the column's scale: the column is a decimal256 (the type that
    // holds both files' values), which pyarrow casts the value to before float64.
    ARROW_ASSIGN_OR_RAISE(auto wide, arrow::Decimal256(narrow).Rescale(scale, to_scale));
    return wide.ToDouble(to_scale);
  }
}

template <typename DecimalT>
arrow::Status ConvertDecimals(const arrow::Array& arr, DType dst, const std::string& column,
                              uint8_t* out, int32_t to_scale) {
  const auto& type = static_cast<const arrow::DecimalType&>(*arr.type());
  const int32_t scale = type.scale();
  const auto& fixed = static_cast<const arrow::FixedSizeBinaryArray&>(arr);
  const int64_t width = DTypeSize(dst);
  for (int64_t r = 0; r < arr.length(); ++r) {
    if (arr.IsNull(r)) continue;  // filled by the caller
    const DecimalT v(fixed.GetValue(r));
    if (dst == DType::kFloat64) {
      auto d = DecimalToDouble(v, scale, to_scale);
      if (!d.ok()) {
        return MakeError(ErrorKind::kInvalidData, "column '", column, "': decimal value ",
                         v.ToString(scale), " cannot be rescaled to scale ", to_scale, ": ",
                         d.status().message());
      }
      std::memcpy(out + r * width, &*d, sizeof(double));
    } else {
      int64_t as_int;
      bool fits = true;
      if constexpr (std::is_same_v<DecimalT, arrow::Decimal256> ||
                    std::is_same_v<DecimalT, arrow::Decimal128>) {
        as_int = static_cast<int64_t>(v.little_endian_array()[0]);
        fits = DecimalT(as_int) == v;
      } else {
        as_int = static_cast<int64_t>(v.value());
      }
      if (!fits) {
        return MakeError(ErrorKind::kInvalidData, "column '", column, "': decimal value ",
                         v.ToString(scale), " does not fit in int64 as an unscaled integer");
      }
      std::memcpy(out + r * width, &as_int, sizeof(as_int));
    }
  }
  return arrow::Status::OK();
}

// Convert the n values of primitive or decimal `arr` to `dst` (a widening or a decimal
// conversion the dataset allowed: see ConvertsTo). Null slots are left for the fill.
// `decimal_scale`: the column's (ColumnSpec::decimal_scale), for decimals to float64.
arrow::Status ConvertElements(const arrow::Array& arr, DType dst, const std::string& column,
                              uint8_t* out, int32_t decimal_scale) {
  const int64_t n = arr.length();
  const uint8_t* raw = arr.data()->buffers.size() > 1 && arr.data()->buffers[1] != nullptr
                           ? arr.data()->buffers[1]->data()
                           : nullptr;
  auto values = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return reinterpret_cast<const T*>(raw) + arr.offset();
  };
  auto integers = [&](auto* tag) {
    const auto* in = values(tag);
    ARROW_RETURN_NOT_OK(CheckExactAsFloat(in, arr, dst, column));
    ConvertLoop(in, n, dst, out);
    return arrow::Status::OK();
  };
  switch (arr.type_id()) {
    case arrow::Type::INT8: return integers((int8_t*)nullptr);
    case arrow::Type::INT16: return integers((int16_t*)nullptr);
    case arrow::Type::INT32: return integers((int32_t*)nullptr);
    case arrow::Type::INT64: return integers((int64_t*)nullptr);
    case arrow::Type::UINT8: return integers((uint8_t*)nullptr);
    case arrow::Type::UINT16: return integers((uint16_t*)nullptr);
    case arrow::Type::UINT32: return integers((uint32_t*)nullptr);
    case arrow::Type::UINT64: return integers((uint64_t*)nullptr);
    case arrow::Type::FLOAT: ConvertLoop(values((float*)nullptr), n, dst, out); break;
    case arrow::Type::DOUBLE: ConvertLoop(values((double*)nullptr), n, dst, out); break;
    case arrow::Type::HALF_FLOAT: {
      const uint16_t* bits = values((uint16_t*)nullptr);
      const int64_t width = DTypeSize(dst);
      if (dst == DType::kFloat32) {  // (through a double, a signalling NaN was quieted)
        for (int64_t r = 0; r < n; ++r) {
          const float f = arrow::util::Float16::FromBits(bits[r]).ToFloat();
          std::memcpy(out + r * width, &f, sizeof(f));
        }
        break;
      }
      for (int64_t r = 0; r < n; ++r) {
        StoreAs(dst, arrow::util::Float16::FromBits(bits[r]).ToDouble(), out + r * width);
      }
      break;
    }
    case arrow::Type::DECIMAL32: return ConvertDecimals<arrow::Decimal32>(arr, dst, column, out, decimal_scale);
    case arrow::Type::DECIMAL64: return ConvertDecimals<arrow::Decimal64>(arr, dst, column, out, decimal_scale);
    case arrow::Type::DECIMAL128: return ConvertDecimals<arrow::Decimal128>(arr, dst, column, out, decimal_scale);
    case arrow::Type::DECIMAL256: return ConvertDecimals<arrow::Decimal256>(arr, dst, column, out, decimal_scale);
    default:
      return MakeError(ErrorKind::kUnsupportedType, "column '", column, "': cannot convert ",
                       arr.type()->ToString(), " values to ", DTypeName(dst));
  }
  return arrow::Status::OK();
}

// Write `fill` as one element of `dtype` at `out`.
void WriteFill(const NullFill& fill, DType dtype, uint8_t* out) {
  const double f = fill.is_float ? fill.float_value : static_cast<double>(fill.int_value);
  // (A double of 2^63 and above is no int64: its cast is undefined, and x86 gave 2^63
  // for a uint64 column's fill of 1.8e19; the fit checks made it whole and in range.)
  const bool int64_holds =
      !fill.is_float || (fill.float_value >= -0x1p63 && fill.float_value < 0x1p63);
  const int64_t i = !fill.is_float ? fill.int_value
                    : int64_holds  ? static_cast<int64_t>(fill.float_value)
                                   : 0;
  auto put = [out](auto v) { std::memcpy(out, &v, sizeof(v)); };
  switch (dtype) {
    case DType::kBool: put(static_cast<uint8_t>(i != 0 || f != 0)); break;
    case DType::kInt8: put(static_cast<int8_t>(i)); break;
    case DType::kInt16: put(static_cast<int16_t>(i)); break;
    case DType::kInt32: put(static_cast<int32_t>(i)); break;
    case DType::kInt64: put(i); break;
    case DType::kUInt8: put(static_cast<uint8_t>(i)); break;
    case DType::kUInt16: put(static_cast<uint16_t>(i)); break;
    case DType::kUInt32: put(static_cast<uint32_t>(i)); break;
    case DType::kUInt64:
      put(fill.is_float && !int64_holds ? static_cast<uint64_t>(fill.float_value)
                                        : static_cast<uint64_t>(i));
      break;
    case DType::kFloat16: put(arrow::util::Float16::FromDouble(f).bits()); break;
    case DType::kFloat32: put(static_cast<float>(f)); break;
    case DType::kFloat64: put(f); break;
  }
}

// A null inside a row (a list's element) where only whole rows may be null.
arrow::Status ElementNullError(const ColumnSpec& spec, int64_t row) {
  return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "' (", spec.arrow_type,
                   ") has a null inside a list (row ", row,
                   "); null_mask flags null rows only: pass fill_null={'", spec.name, "': ",
                   spec.kind == ColumnKind::kTensor ? "0" : "''",
                   "} to replace the nulls inside lists too (the mask still flags null "
                   "rows), or select other columns");
}

// The values array of a list-like array (list, large list, fixed-size list), and the
// span of row i in it.
const arrow::Array* ListValues(const arrow::Array& a) {
  switch (a.type_id()) {
    case arrow::Type::LIST: return static_cast<const arrow::ListArray&>(a).values().get();
    case arrow::Type::LARGE_LIST:
      return static_cast<const arrow::LargeListArray&>(a).values().get();
    case arrow::Type::FIXED_SIZE_LIST:
      return static_cast<const arrow::FixedSizeListArray&>(a).values().get();
    default: return nullptr;
  }
}
std::pair<int64_t, int64_t> ListSpan(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::LIST: {
      const auto& l = static_cast<const arrow::ListArray&>(a);
      return {l.value_offset(i), l.value_length(i)};
    }
    case arrow::Type::LARGE_LIST: {
      const auto& l = static_cast<const arrow::LargeListArray&>(a);
      return {l.value_offset(i), l.value_length(i)};
    }
    default: {
      const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
      return {l.value_offset(i), l.value_length(i)};
    }
  }
}

// Whether no element of `a`, at any depth, is null (a quick check of null counts).
bool NullFreeBelow(const arrow::Array& a) {
  if (a.null_count() != 0) return false;
  if (a.type_id() == arrow::Type::DICTIONARY) {
    return static_cast<const arrow::DictionaryArray&>(a).dictionary()->null_count() == 0;
  }
  const arrow::Array* values = ListValues(a);
  return values == nullptr || NullFreeBelow(*values);
}

// Whether elements [begin, begin + count) of `a` hold a null at any depth.
bool AnyNullIn(const arrow::Array& a, int64_t begin, int64_t count) {
  if (count <= 0) return false;
  if (const arrow::Array* values = ListValues(a)) {
    for (int64_t i = begin; i < begin + count; ++i) {
      if (a.IsNull(i)) return true;
      const auto [first, len] = ListSpan(a, i);
      if (AnyNullIn(*values, first, len)) return true;
    }
    return false;
  }
  if (a.type_id() == arrow::Type::DICTIONARY) {
    const auto& d = static_cast<const arrow::DictionaryArray&>(a);
    for (int64_t i = begin; i < begin + count; ++i) {
      if (d.IsNull(i)) return true;
      const int64_t idx = d.GetValueIndex(i);
      if (idx >= 0 && idx < d.dictionary()->length() && d.dictionary()->IsNull(idx)) return true;
    }
    return false;
  }
  if (a.null_count() == 0) return false;
  for (int64_t i = begin; i < begin + count; ++i) {
    if (a.IsNull(i)) return true;
  }
  return false;
}

// With a fill for whole rows only: an error naming the first row (see RowNumbering) of
// a list column that holds a null inside its list.
arrow::Status CheckNoNullsInsideRows(const ColumnSpec& spec, const arrow::ChunkedArray& array,
                                     const NullFill& fill, const RowNumbering& rows) {
  if (!fill.rows_only) return arrow::Status::OK();
  int64_t first_row = 0;
  for (const auto& chunk : array.chunks()) {
    const arrow::Array* values = ListValues(*chunk);
    if (values != nullptr && !NullFreeBelow(*values)) {
      for (int64_t r = 0; r < chunk->length(); ++r) {
        if (chunk->IsNull(r)) continue;
        const auto [first, len] = ListSpan(*chunk, r);
        if (AnyNullIn(*values, first, len)) return ElementNullError(spec, rows(first_row + r));
      }
    }
    first_row += chunk->length();
  }
  return arrow::Status::OK();
}

// `nulls`: how many the failing chunk holds, or -1 where the conversion stopped at its
// first (a list's or a dictionary's): then no count is given (it said "1", of 12).
arrow::Status NullError(const ColumnSpec& spec, int64_t nulls) {
  return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "' (", spec.arrow_type,
                   ") has ", nulls >= 0 ? std::to_string(nulls) + " " : std::string(),
                   "null value(s); pass fill_null= to replace nulls, or select other columns");
}

// Converts the chunks of one tensor column, appending elements to `out_`.
class TensorWriter {
 public:
  TensorWriter(const ColumnSpec& spec, const NullFill& fill, arrow::MemoryPool* pool)
      : spec_(spec), fill_(fill), pool_(pool), out_(pool), elem_(DTypeSize(spec.dtype)) {}

  // Append all rows of `arr`, whose rows have dims shape_[level...].
  arrow::Status Append(const arrow::Array& arr, size_t level) {
    const int64_t n = arr.length();
    switch (arr.type_id()) {
      case arrow::Type::FIXED_SIZE_LIST: {
        const auto& list = static_cast<const arrow::FixedSizeListArray&>(arr);
        const int64_t size = list.list_type()->list_size();
        // A fixed-size list read for a list column (files that differ: the spec's level is
        // a list): its rows have `size` elements, checked or counted as a list's would be.
        if (ragged_ && level == 0) {
          row_elements_.insert(row_elements_.end(), static_cast<size_t>(n), size);
        } else if (n > 0) {
          ARROW_RETURN_NOT_OK(CheckLength(level, size));
        }
        auto child = list.values()->Slice(list.value_offset(0), n * size);
        const int64_t start = out_.length();
        ARROW_RETURN_NOT_OK(Append(*child, level + 1));
        if (arr.null_count() > 0) {
          if (!fill_.enabled) return NullError(spec_, arr.null_count());
          const int64_t row_elems = (out_.length() - start) / elem_ / std::max<int64_t>(n, 1);
          for (int64_t r = 0; r < n; ++r) {
            if (!arr.IsNull(r)) continue;
            for (int64_t e = 0; e < row_elems; ++e) {
              WriteFill(fill_, spec_.dtype, out_.mutable_data() + start + (r * row_elems + e) * elem_);
            }
          }
        }
        return arrow::Status::OK();
      }
      case arrow::Type::LIST:
        return AppendList<arrow::ListArray>(arr, level);
      case arrow::Type::LARGE_LIST:
        return AppendList<arrow::LargeListArray>(arr, level);
      case arrow::Type::DICTIONARY:
        return AppendDictionary(static_cast<const arrow::DictionaryArray&>(arr), level);
      default:
        return AppendPrimitive(arr);
    }
  }

  arrow::Result<ColumnData> Finish(int64_t num_rows) {
    if (ragged_) return FinishRagged(num_rows);
    ColumnData data;
    data.row_shape = shape_;
    int64_t row_elems = 1;
    for (int64_t d : shape_) {
      if (d < 0) d = 0;  // a list column with no rows
      row_elems *= d;
    }
    data.row_bytes = row_elems * elem_;
    for (auto& d : data.row_shape) d = d < 0 ? 0 : d;
    if (zero_copy_ != nullptr && out_.length() == 0) {
      data.data = zero_copy_;
    } else {
      ARROW_ASSIGN_OR_RAISE(data.data, out_.Finish());
    }
    if (data.data->size() != num_rows * data.row_bytes) {
      return arrow::Status::Invalid("column '", spec_.name, "': decoded ", data.data->size(),
                                    " bytes for ", num_rows, " rows of ", data.row_bytes);
    }
    return data;
  }

  // Reserve the output bytes of all chunks of `array` at once, so that appending them
  // neither regrows the buffer (a new block and a copy of everything so far, each time)
  // nor shrinks it at Finish (one more of each). Layouts whose size is not known
  // beforehand (dictionaries) are left to grow.
  arrow::Status ReserveFor(const arrow::ChunkedArray& array) {
    int64_t elements = 0;
    for (const auto& chunk : array.chunks()) {
      const int64_t n = LeafElements(*chunk);
      if (n < 0) return arrow::Status::OK();
      elements += n;
    }
    return out_.Reserve(elements * elem_);
  }

  // Use `buffer` as the whole output if it is the only chunk and needs no conversion.
  bool TryZeroCopy(const arrow::ChunkedArray& array) {
    if (array.num_chunks() != 1 || spec_.dtype == DType::kBool) return false;
    const arrow::Array* a = array.chunk(0).get();
    int64_t begin = 0, count = a->length();
    if (a->null_count() != 0) return false;
    // Descend through fixed-size lists with no nulls to the primitive values. A level the
    // spec has as a list (files that differ) takes the fixed size; a ragged one, or one
    // of another length, is left to Append (which counts or refuses it).
    size_t level = 0;
    while (a->type_id() == arrow::Type::FIXED_SIZE_LIST) {
      const auto& list = static_cast<const arrow::FixedSizeListArray&>(*a);
      const int64_t size = list.list_type()->list_size();
      if (level >= shape_.size() || (ragged_ && level == 0)) return false;
      if (shape_[level] >= 0 && shape_[level] != size) return false;
      if (shape_[level] < 0 && count > 0) shape_[level] = size;
      ++level;
      begin = (list.offset() + begin) * size;
      count *= size;
      a = list.values().get();
      if (a->null_count() != 0) return false;
    }
    DType t;
    if (!ElementType(*a->type(), &t) || t != spec_.dtype) return false;
    const auto& values = a->data()->buffers[1];
    if (values == nullptr) return false;
    zero_copy_ = arrow::SliceBuffer(values, (a->offset() + begin) * elem_, count * elem_);
    return true;
  }

 private:
  arrow::Result<ColumnData> FinishRagged(int64_t num_rows) {
    ColumnData data;
    data.row_shape = shape_;
    int64_t inner = elem_;
    for (size_t i = 1; i < shape_.size(); ++i) inner *= shape_[i] < 0 ? 0 : shape_[i];
    if (static_cast<int64_t>(row_elements_.size()) != num_rows) {
      return arrow::Status::Invalid("column '", spec_.name, "': ", row_elements_.size(),
                                    " list lengths for ", num_rows, " rows");
    }
    ARROW_ASSIGN_OR_RAISE(auto offsets,
                          arrow::AllocateBuffer((num_rows + 1) * sizeof(int64_t), pool_));
    auto* off = reinterpret_cast<int64_t*>(offsets->mutable_data());
    off[0] = 0;
    for (int64_t r = 0; r < num_rows; ++r) off[r + 1] = off[r] + row_elements_[r] * inner;
    data.offsets = std::move(offsets);
    ARROW_ASSIGN_OR_RAISE(data.data, out_.Finish());
    return data;
  }

  // The elements Append writes for `arr`, or -1 when that is not known from its layout.
  static int64_t LeafElements(const arrow::Array& arr) {
    const int64_t n = arr.length();
    switch (arr.type_id()) {
      case arrow::Type::FIXED_SIZE_LIST: {
        const auto& list = static_cast<const arrow::FixedSizeListArray&>(arr);
        const int64_t size = list.list_type()->list_size();
        return n == 0 ? 0 : LeafElements(*list.values()->Slice(list.value_offset(0), n * size));
      }
      case arrow::Type::LIST:
        return ListLeafElements<arrow::ListArray>(arr);
      case arrow::Type::LARGE_LIST:
        return ListLeafElements<arrow::LargeListArray>(arr);
      case arrow::Type::DICTIONARY:
        return -1;
      default:
        return n;
    }
  }

  template <typename ListT>
  static int64_t ListLeafElements(const arrow::Array& arr) {
    const auto& list = static_cast<const ListT&>(arr);
    const int64_t n = list.length();
    if (n == 0) return 0;
    const int64_t begin = list.value_offset(0);
    return LeafElements(*list.values()->Slice(begin, list.value_offset(n) - begin));
  }

  template <typename ListT>
  arrow::Status AppendList(const arrow::Array& arr, size_t level) {
    const auto& list = static_cast<const ListT&>(arr);
    const int64_t n = arr.length();
    if (arr.null_count() > 0) return AppendListWithNulls(list, level);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t len = list.value_length(r);
      if (ragged_ && level == 0) {
        row_elements_.push_back(len);
        continue;
      }
      ARROW_RETURN_NOT_OK(CheckLength(level, len));
    }
    if (n == 0) return arrow::Status::OK();
    const int64_t begin = list.value_offset(0);
    auto child = list.values()->Slice(begin, list.value_offset(n) - begin);
    return Append(*child, level + 1);
  }

  arrow::Status CheckLength(size_t level, int64_t len) {
    if (shape_[level] < 0) {
      shape_[level] = len;
    } else if (shape_[level] != len) {
      return MakeError(ErrorKind::kInvalidData, "column '", spec_.name, "' (",
                       spec_.arrow_type, "): rows have different lengths (", shape_[level],
                       " and ", len,
                       "); a list column becomes a tensor only if every row has one length: pass "
                       "lists={'", spec_.name, "': 'ragged'} or pqloader.Pad(...) to batch it");
    }
    return arrow::Status::OK();
  }

  // A list array with null lists (rows): with a fill, a null list is an empty list when
  // rows may differ in length (ragged), else a list of fill values as long as the
  // other rows. Row by row: only chunks with nulls pay for it.
  template <typename ListT>
  arrow::Status AppendListWithNulls(const ListT& list, size_t level) {
    const int64_t n = list.length();
    if (!fill_.enabled) {
      return MakeError(ErrorKind::kInvalidData, "column '", spec_.name, "' (", spec_.arrow_type,
                       ") has ", list.null_count(),
                       " null list(s); pass fill_null= or null_mask= to load them (a null list "
                       "becomes fill values), or select other columns");
    }
    const bool ragged_rows = ragged_ && level == 0;
    if (!ragged_rows) {
      for (int64_t r = 0; r < n; ++r) {
        if (!list.IsNull(r)) ARROW_RETURN_NOT_OK(CheckLength(level, list.value_length(r)));
      }
      // No row of this unit tells the length: the footers' one (rows of 0 beside rows of
      // 2 came out of a unit of null lists only, or one a filter left so), or the row
      // group's (ReadUnit). Where none tells, a length of 0 would be a guess (it was,
      // silently, for files without level histograms): refused.
      if (shape_[level] < 0 && level == 0 && fill_.list_length < 0) {
        return MakeError(ErrorKind::kInvalidData, "column '", spec_.name, "' (", spec_.arrow_type,
                         "): its rows here are all null lists, and neither another row of "
                         "the row group nor the footers tell how long a null list's fill "
                         "must be (a file without definition-level histograms, as Polars "
                         "writes it, tells only where a row group has no null); pass lists={'",
                         spec_.name, "': 'ragged'} (a null list is empty) or lists={'",
                         spec_.name, "': pqloader.Pad(...)}, or drop the null rows with a filter "
                         "(is_valid)");
      }
      if (shape_[level] < 0) shape_[level] = level == 0 ? fill_.list_length : 0;
    }
    int64_t inner = 1;  // elements below this level per list element
    for (size_t i = level + 1; i < shape_.size(); ++i) inner *= std::max<int64_t>(shape_[i], 0);
    for (int64_t r = 0; r < n; ++r) {
      if (list.IsNull(r)) {
        if (ragged_rows) {
          row_elements_.push_back(0);
          continue;
        }
        const int64_t elems = shape_[level] * inner;
        ARROW_RETURN_NOT_OK(out_.Reserve(elems * elem_));
        for (int64_t e = 0; e < elems; ++e) {
          WriteFill(fill_, spec_.dtype, out_.mutable_data() + out_.length());
          out_.UnsafeAdvance(elem_);
        }
        continue;
      }
      if (ragged_rows) row_elements_.push_back(list.value_length(r));
      auto child = list.values()->Slice(list.value_offset(r), list.value_length(r));
      ARROW_RETURN_NOT_OK(Append(*child, level + 1));
    }
    return arrow::Status::OK();
  }

  arrow::Status AppendDictionary(const arrow::DictionaryArray& arr, size_t level) {
    // Convert the dictionary once, then copy one entry per row.
    TensorWriter dict_writer(spec_, fill_, pool_);
    dict_writer.shape_.assign(shape_.begin() + level, shape_.end());
    ARROW_RETURN_NOT_OK(dict_writer.Append(*arr.dictionary(), 0));
    ARROW_ASSIGN_OR_RAISE(auto dict, dict_writer.Finish(arr.dictionary()->length()));
    const int64_t entry = dict.row_bytes;
    if (arr.null_count() > 0 && !fill_.enabled) return NullError(spec_, arr.null_count());
    ARROW_RETURN_NOT_OK(out_.Reserve(arr.length() * entry));
    for (int64_t r = 0; r < arr.length(); ++r) {
      uint8_t* dst = out_.mutable_data() + out_.length();
      if (arr.IsNull(r)) {
        for (int64_t e = 0; e < entry / elem_; ++e) WriteFill(fill_, spec_.dtype, dst + e * elem_);
      } else {
        const int64_t idx = arr.GetValueIndex(r);
        if (idx < 0 || idx >= arr.dictionary()->length()) {
          return MakeError(ErrorKind::kInvalidData, "column '", spec_.name,
                           "': dictionary index ", idx, " out of range");
        }
        std::memcpy(dst, dict.data->data() + idx * entry, entry);
      }
      out_.UnsafeAdvance(entry);
    }
    return arrow::Status::OK();
  }

  arrow::Status AppendPrimitive(const arrow::Array& arr) {
    DType t;
    const bool same = ElementType(*arr.type(), &t) && t == spec_.dtype;
    if (!same && arr.type_id() == arrow::Type::BOOL) {
      return MakeError(ErrorKind::kUnsupportedType, "column '", spec_.name, "': unexpected ",
                       arr.type()->ToString(), " values for ", spec_.arrow_type);
    }
    const int64_t n = arr.length();
    if (n == 0) return arrow::Status::OK();
    if (arr.null_count() > 0 && !fill_.enabled) return NullError(spec_, arr.null_count());
    ARROW_RETURN_NOT_OK(out_.Reserve(n * elem_));
    uint8_t* dst = out_.mutable_data() + out_.length();
    if (!same) {  // a wider type than this file's, or a decimal
      t = spec_.dtype;
      ARROW_RETURN_NOT_OK(ConvertElements(arr, t, spec_.name, dst, spec_.decimal_scale));
    } else if (t == DType::kBool) {
      const uint8_t* bits = arr.data()->buffers[1]->data();
      for (int64_t r = 0; r < n; ++r) {
        dst[r] = arrow::bit_util::GetBit(bits, arr.offset() + r) ? 1 : 0;
      }
    } else {
      std::memcpy(dst, arr.data()->buffers[1]->data() + arr.offset() * elem_, n * elem_);
    }
    if (arr.null_count() > 0) {
      for (int64_t r = 0; r < n; ++r) {
        if (arr.IsNull(r)) WriteFill(fill_, t, dst + r * elem_);
      }
    }
    out_.UnsafeAdvance(n * elem_);
    return arrow::Status::OK();
  }

  const ColumnSpec& spec_;
  const NullFill& fill_;
  arrow::MemoryPool* pool_;
  arrow::BufferBuilder out_;
  const int64_t elem_;
  std::shared_ptr<arrow::Buffer> zero_copy_;
  std::vector<int64_t> row_elements_;  // ragged: elements per row

 public:
  std::vector<int64_t> shape_;
  bool ragged_ = false;
};

template <typename ArrayT>
void AppendVarRows(const ArrayT& a, const NullFill& fill, arrow::BufferBuilder* data,
                   std::vector<int64_t>* offsets) {
  for (int64_t r = 0; r < a.length(); ++r) {
    if (a.IsNull(r)) {
      (void)data->Append(fill.bytes_value.data(), fill.bytes_value.size());
    } else {
      auto v = a.GetView(r);
      (void)data->Append(v.data(), v.size());
    }
    offsets->push_back(data->length());
  }
}

arrow::Result<ColumnData> ConvertVarBinary(const ColumnSpec& spec,
                                           const arrow::ChunkedArray& array,
                                           const NullFill& fill, arrow::MemoryPool* pool) {
  ColumnData out;
  // Fast path: one chunk of string/binary without nulls keeps its value bytes.
  if (array.num_chunks() == 1 && array.null_count() == 0) {
    const arrow::Array& a = *array.chunk(0);
    if (a.type_id() == arrow::Type::STRING || a.type_id() == arrow::Type::BINARY) {
      const auto& b = static_cast<const arrow::BinaryArray&>(a);
      ARROW_ASSIGN_OR_RAISE(auto offsets,
                            arrow::AllocateBuffer((a.length() + 1) * sizeof(int64_t), pool));
      auto* dst = reinterpret_cast<int64_t*>(offsets->mutable_data());
      const int32_t* src = b.raw_value_offsets();
      for (int64_t i = 0; i <= a.length(); ++i) dst[i] = src[i];
      out.offsets = std::move(offsets);
      out.data = b.value_data() ? b.value_data() : std::make_shared<arrow::Buffer>(nullptr, 0);
      return out;
    }
  }
  if (array.null_count() > 0 && !fill.enabled) return NullError(spec, array.null_count());
  arrow::BufferBuilder data(pool);
  std::vector<int64_t> offsets{0};
  offsets.reserve(array.length() + 1);
  for (const auto& chunk : array.chunks()) {
    const arrow::Array* a = chunk.get();
    std::shared_ptr<arrow::Array> decoded;
    if (a->type_id() == arrow::Type::DICTIONARY) {
      const auto& dict = static_cast<const arrow::DictionaryArray&>(*a);
      // Expand through the dictionary row by row.
      const arrow::Array& values = *dict.dictionary();
      for (int64_t r = 0; r < dict.length(); ++r) {
        std::string_view v;
        if (dict.IsNull(r)) {
          v = fill.bytes_value;
        } else {
          const int64_t idx = dict.GetValueIndex(r);
          if (idx < 0 || idx >= values.length()) {
            return MakeError(ErrorKind::kInvalidData, "column '", spec.name,
                             "': dictionary index ", idx, " out of range");
          }
          if (values.IsNull(idx)) {
            if (!fill.enabled) return NullError(spec, -1);
            v = fill.bytes_value;
          } else {
            v = ViewOf(values, idx);
          }
        }
        ARROW_RETURN_NOT_OK(data.Append(v.data(), v.size()));
        offsets.push_back(data.length());
      }
      continue;
    }
    switch (a->type_id()) {
      case arrow::Type::STRING: case arrow::Type::BINARY:
        AppendVarRows(static_cast<const arrow::BinaryArray&>(*a), fill, &data, &offsets);
        break;
      case arrow::Type::LARGE_STRING: case arrow::Type::LARGE_BINARY:
        AppendVarRows(static_cast<const arrow::LargeBinaryArray&>(*a), fill, &data, &offsets);
        break;
      case arrow::Type::FIXED_SIZE_BINARY:
        AppendVarRows(static_cast<const arrow::FixedSizeBinaryArray&>(*a), fill, &data,
                      &offsets);
        break;
      case arrow::Type::STRING_VIEW: case arrow::Type::BINARY_VIEW:
        AppendVarRows(static_cast<const arrow::BinaryViewArray&>(*a), fill, &data, &offsets);
        break;
      default:
        return MakeError(ErrorKind::kUnsupportedType, "column '", spec.name, "': unexpected ",
                         a->type()->ToString(), " values");
    }
  }
  ARROW_ASSIGN_OR_RAISE(out.data, data.Finish());
  ARROW_ASSIGN_OR_RAISE(auto off, arrow::AllocateBuffer(offsets.size() * sizeof(int64_t), pool));
  std::memcpy(off->mutable_data(), offsets.data(), offsets.size() * sizeof(int64_t));
  out.offsets = std::move(off);
  return out;
}

// Check that every value of a string column is valid UTF-8 (Python str needs it; a
// bare UnicodeDecodeError at the consumer would name nothing). One pass over the value
// bytes, then one look at each value's first byte: a concatenation of values is valid
// and every value starts on a character boundary iff every value is valid.
arrow::Status ValidateStrings(const ColumnSpec& spec, const ColumnData& c, int64_t rows,
                              const RowNumbering& row_of) {
  if (rows == 0) return arrow::Status::OK();
  const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
  const char* data = reinterpret_cast<const char*>(c.data->data());
  const int64_t begin = off[0], end = off[rows];
  bool ok = IsValidUtf8(std::string_view(data + begin, end - begin));
  for (int64_t r = 1; ok && r < rows; ++r) {
    ok = off[r] >= end || (static_cast<unsigned char>(data[off[r]]) & 0xC0) != 0x80;
  }
  if (ok) return arrow::Status::OK();
  for (int64_t r = 0; r < rows; ++r) {
    const std::string_view v(data + off[r], off[r + 1] - off[r]);
    if (!IsValidUtf8(v)) {
      return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "', row ",
                       row_of(r), ": a string value is not valid UTF-8 (b'", Printable(v),
                       "'); to read the column's values as bytes, pass strings=\"bytes\"");
    }
  }
  return arrow::Status::OK();
}

// Append the values [begin, begin + count) of string/binary array `values` (any layout,
// or a dictionary of one) as one kStringList row: row `row` of the column. The values
// of a kStringList (not kBytesList) column must be valid UTF-8, as ValidateStrings.
arrow::Status AppendStringListRow(const ColumnSpec& spec, const arrow::Array& values,
                                  int64_t begin, int64_t count, const NullFill& fill,
                                  int64_t row, arrow::BufferBuilder* data) {
  const arrow::Array* dict_values = nullptr;
  const arrow::DictionaryArray* dict = nullptr;
  if (values.type_id() == arrow::Type::DICTIONARY) {
    dict = static_cast<const arrow::DictionaryArray*>(&values);
    dict_values = dict->dictionary().get();
  }
  auto item = [&](int64_t i, std::string_view* v) -> arrow::Status {
    if (values.IsNull(i)) {
      if (!fill.enabled) return NullError(spec, -1);
      *v = fill.bytes_value;
      return arrow::Status::OK();
    }
    if (dict == nullptr) {
      *v = ViewOf(values, i);
      return arrow::Status::OK();
    }
    const int64_t idx = dict->GetValueIndex(i);
    if (idx < 0 || idx >= dict_values->length()) {
      return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "': dictionary index ",
                       idx, " out of range");
    }
    if (dict_values->IsNull(idx)) {
      if (!fill.enabled) return NullError(spec, -1);
      *v = fill.bytes_value;
    } else {
      *v = ViewOf(*dict_values, idx);
    }
    return arrow::Status::OK();
  };
  if (count > std::numeric_limits<uint32_t>::max()) {
    return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "': a row of ", count,
                     " strings");
  }
  const auto n = static_cast<uint32_t>(count);
  ARROW_RETURN_NOT_OK(data->Append(&n, sizeof(n)));
  std::string_view v;
  for (int64_t i = 0; i < count; ++i) {
    ARROW_RETURN_NOT_OK(item(begin + i, &v));
    if (v.size() > std::numeric_limits<uint32_t>::max()) {
      return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "': a value of ",
                       v.size(), " bytes");
    }
    const auto len = static_cast<uint32_t>(v.size());
    ARROW_RETURN_NOT_OK(data->Append(&len, sizeof(len)));
  }
  const bool check_utf8 = spec.kind == ColumnKind::kStringList;
  for (int64_t i = 0; i < count; ++i) {
    ARROW_RETURN_NOT_OK(item(begin + i, &v));
    if (check_utf8 && !IsValidUtf8(v)) {
      return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "', row ", row,
                       ", list item ", i, ": a string value is not valid UTF-8 (b'",
                       Printable(v), "'); to read the column's values as bytes, pass "
                       "strings=\"bytes\"");
    }
    ARROW_RETURN_NOT_OK(data->Append(v.data(), v.size()));
  }
  return arrow::Status::OK();
}

// Rows of a list<string|binary> column as kStringList rows (see EncodeStringList). A
// null row is an empty list when there is a fill, else an error; a null value inside
// a list is the fill. Rows are numbered by `rows` in error messages.
arrow::Result<ColumnData> ConvertStringList(const ColumnSpec& spec,
                                            const arrow::ChunkedArray& array,
                                            const NullFill& fill, arrow::MemoryPool* pool,
                                            const RowNumbering& rows) {
  arrow::BufferBuilder data(pool);
  std::vector<int64_t> offsets{0};
  offsets.reserve(array.length() + 1);
  int64_t chunk_first_row = 0;
  for (const auto& chunk : array.chunks()) {
    const arrow::Array& a = *chunk;
    for (int64_t r = 0; r < a.length(); ++r) {
      if (a.IsNull(r)) {
        if (!fill.enabled) {
          return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "' (",
                           spec.arrow_type, ") has null list(s); pass fill_null= or "
                           "null_mask= to load them (a null list becomes an empty list)");
        }
        const uint32_t zero = 0;
        ARROW_RETURN_NOT_OK(data.Append(&zero, sizeof(zero)));
      } else {
        int64_t begin = 0, count = 0;
        const arrow::Array* values = nullptr;
        switch (a.type_id()) {
          case arrow::Type::LIST: {
            const auto& l = static_cast<const arrow::ListArray&>(a);
            begin = l.value_offset(r), count = l.value_length(r), values = l.values().get();
            break;
          }
          case arrow::Type::LARGE_LIST: {
            const auto& l = static_cast<const arrow::LargeListArray&>(a);
            begin = l.value_offset(r), count = l.value_length(r), values = l.values().get();
            break;
          }
          case arrow::Type::FIXED_SIZE_LIST: {
            const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
            begin = l.value_offset(r), count = l.value_length(r), values = l.values().get();
            break;
          }
          default:
            return MakeError(ErrorKind::kUnsupportedType, "column '", spec.name,
                             "': unexpected ", a.type()->ToString(), " values");
        }
        ARROW_RETURN_NOT_OK(AppendStringListRow(spec, *values, begin, count, fill,
                                                rows(chunk_first_row + r), &data));
      }
      offsets.push_back(data.length());
    }
    chunk_first_row += a.length();
  }
  ColumnData out;
  ARROW_ASSIGN_OR_RAISE(out.data, data.Finish());
  ARROW_ASSIGN_OR_RAISE(auto off, arrow::AllocateBuffer(offsets.size() * sizeof(int64_t), pool));
  std::memcpy(off->mutable_data(), offsets.data(), offsets.size() * sizeof(int64_t));
  out.offsets = std::move(off);
  return out;
}

// A ragged list column whose Arrow buffers can be used as they are (one chunk, no
// nulls, numeric values): its values buffer, and byte offsets computed from the list
// offsets. Returns false when the layout does not allow it.
template <typename ListT>
bool RaggedAsIs(const ColumnSpec& spec, const arrow::Array& arr, arrow::MemoryPool* pool,
                ColumnData* out) {
  const auto& list = static_cast<const ListT&>(arr);
  const int64_t n = list.length();
  if (list.null_count() != 0) return false;
  const int64_t first = n > 0 ? list.value_offset(0) : 0;
  const int64_t last = n > 0 ? list.value_offset(n) : 0;
  const arrow::Array* child = list.values().get();
  int64_t begin = first, count = last - first, inner = 1;
  while (child->type_id() == arrow::Type::FIXED_SIZE_LIST) {
    if (child->null_count() != 0) return false;
    const auto& fsl = static_cast<const arrow::FixedSizeListArray&>(*child);
    const int64_t size = fsl.list_type()->list_size();
    begin = (fsl.offset() + begin) * size;
    count *= size;
    inner *= size;
    child = fsl.values().get();
  }
  DType t;
  if (child->null_count() != 0 || !ElementType(*child->type(), &t) || t != spec.dtype ||
      t == DType::kBool || child->data()->buffers.size() < 2 || child->data()->buffers[1] == nullptr) {
    return false;
  }
  const int64_t elem = DTypeSize(t);
  auto offsets = arrow::AllocateBuffer((n + 1) * static_cast<int64_t>(sizeof(int64_t)), pool);
  if (!offsets.ok()) return false;
  auto* off = reinterpret_cast<int64_t*>((*offsets)->mutable_data());
  for (int64_t i = 0; i <= n; ++i) off[i] = (list.value_offset(i) - first) * inner * elem;
  out->row_shape = spec.row_shape;
  out->row_bytes = 0;
  out->data = arrow::SliceBuffer(child->data()->buffers[1], (child->offset() + begin) * elem,
                                 count * elem);
  out->offsets = std::move(offsets).ValueUnsafe();
  return true;
}

}  // namespace

std::vector<std::string> DecodeStringList(const uint8_t* row, int64_t size) {
  std::vector<std::string> out;
  if (size < 4) return out;
  uint32_t n = 0;
  std::memcpy(&n, row, 4);
  int64_t at = 4 + 4 * static_cast<int64_t>(n);
  for (uint32_t i = 0; i < n && at <= size; ++i) {
    uint32_t len = 0;
    std::memcpy(&len, row + 4 + 4 * i, 4);
    if (at + len > size) break;
    out.emplace_back(reinterpret_cast<const char*>(row + at), len);
    at += len;
  }
  return out;
}

arrow::Result<ColumnData> ConvertColumn(const ColumnSpec& spec, const arrow::ChunkedArray& array,
                                        const NullFill& fill, arrow::MemoryPool* pool,
                                        bool allow_ragged, const RowNumbering& rows) {
  ARROW_RETURN_NOT_OK(CheckNoNullsInsideRows(spec, array, fill, rows));
  if (IsStringList(spec.kind)) return ConvertStringList(spec, array, fill, pool, rows);
  if (spec.kind != ColumnKind::kTensor) {
    ARROW_ASSIGN_OR_RAISE(auto out, ConvertVarBinary(spec, array, fill, pool));
    if (spec.kind == ColumnKind::kString) {
      ARROW_RETURN_NOT_OK(ValidateStrings(spec, out, array.length(), rows));
    }
    return out;
  }
  TensorWriter writer(spec, fill, pool);
  writer.shape_ = spec.row_shape;
  writer.ragged_ = allow_ragged && !spec.row_shape.empty() && spec.row_shape[0] < 0;
  if (writer.ragged_ && array.num_chunks() == 1) {
    ColumnData out;
    const arrow::Array& a = *array.chunk(0);
    if ((a.type_id() == arrow::Type::LIST && RaggedAsIs<arrow::ListArray>(spec, a, pool, &out)) ||
        (a.type_id() == arrow::Type::LARGE_LIST &&
         RaggedAsIs<arrow::LargeListArray>(spec, a, pool, &out))) {
      return out;
    }
  }
  if (writer.ragged_ || !writer.TryZeroCopy(array)) {
    ARROW_RETURN_NOT_OK(writer.ReserveFor(array));
    for (const auto& chunk : array.chunks()) ARROW_RETURN_NOT_OK(writer.Append(*chunk, 0));
  }
  return writer.Finish(array.length());
}

}  // namespace pqloader
