#include "pqloader/tensor/batch.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include <arrow/util/float16.h>

#include "pqloader/error.h"
#include "pqloader/util/exact_text.h"

namespace pqloader {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool: case DType::kInt8: case DType::kUInt8: return 1;
    case DType::kInt16: case DType::kUInt16: case DType::kFloat16: return 2;
    case DType::kInt32: case DType::kUInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kUInt64: case DType::kFloat64: return 8;
  }
  return 1;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "?";
}

namespace {
template <typename T>
double Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<double>(v);
}

}  // namespace

double LoadScalar(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kBool: case DType::kUInt8: return Load<uint8_t>(p);
    case DType::kInt8: return Load<int8_t>(p);
    case DType::kInt16: return Load<int16_t>(p);
    case DType::kUInt16: return Load<uint16_t>(p);
    case DType::kInt32: return Load<int32_t>(p);
    case DType::kUInt32: return Load<uint32_t>(p);
    case DType::kInt64: return Load<int64_t>(p);
    case DType::kUInt64: return Load<uint64_t>(p);
    case DType::kFloat16: {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      return arrow::util::Float16::FromBits(bits).ToDouble();
    }
    case DType::kFloat32: return Load<float>(p);
    case DType::kFloat64: return Load<double>(p);
  }
  return 0;
}

namespace {

// Float to integer, defined for every double (a C++ cast of NaN, inf or an out-of-range
// value is undefined: x86-64 gave INT_MIN, ARM saturates) as x86-64's cvttsd2si gives it,
// which numpy's scalar astype and torch give too: truncation toward zero; NaN and values
// outside the 32- or 64-bit range the "integer indefinite" (the minimum); narrower types
// keep the low bits of the 32-bit result, uint32 those of the 64-bit one, and uint64
// values from 2^63 are converted less 2^63 with the top bit set. So outputs (and cache
// entries) are those of the x86-64 builds before, on every platform.
int32_t TruncInt32(double v) {
  return v > -2147483649.0 && v < 2147483648.0 ? static_cast<int32_t>(v)
                                               : std::numeric_limits<int32_t>::min();
}
int64_t TruncInt64(double v) {
  return v >= -9223372036854775808.0 && v < 9223372036854775808.0
             ? static_cast<int64_t>(v)
             : std::numeric_limits<int64_t>::min();
}
uint64_t TruncUInt64(double v) {
  constexpr double k2p63 = 9223372036854775808.0;
  if (!(v >= k2p63)) return static_cast<uint64_t>(TruncInt64(v));  // NaN here, as cvttsd2si
  return static_cast<uint64_t>(TruncInt64(v - k2p63)) ^ (uint64_t{1} << 63);
}

}  // namespace

void StoreScalar(DType t, double v, uint8_t* p) {
  auto put = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (t) {
    case DType::kBool: put(static_cast<uint8_t>(v != 0)); break;
    case DType::kUInt8: put(static_cast<uint8_t>(TruncInt32(v))); break;
    case DType::kInt8: put(static_cast<int8_t>(TruncInt32(v))); break;
    case DType::kInt16: put(static_cast<int16_t>(TruncInt32(v))); break;
    case DType::kUInt16: put(static_cast<uint16_t>(TruncInt32(v))); break;
    case DType::kInt32: put(TruncInt32(v)); break;
    case DType::kUInt32: put(static_cast<uint32_t>(TruncInt64(v))); break;
    case DType::kInt64: put(TruncInt64(v)); break;
    case DType::kUInt64: put(TruncUInt64(v)); break;
    case DType::kFloat16: put(arrow::util::Float16::FromDouble(v).bits()); break;
    case DType::kFloat32: put(static_cast<float>(v)); break;
    case DType::kFloat64: put(v); break;
  }
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

arrow::Status ColumnCollate::Validate(const std::string& column) const {
  if (mode != Mode::kPad) return arrow::Status::OK();
  for (const auto& [what, v, low] : {std::make_tuple("length", length, int64_t{0}),
                                     std::make_tuple("max_length", max_length, int64_t{0}),
                                     std::make_tuple("multiple_of", multiple_of, int64_t{1})}) {
    if (v < low || v > kMaxListLength) {
      return arrow::Status::Invalid("column '", column, "': padding ", what, " must be in [",
                                    low, ", 2^40], got ", v);
    }
  }
  return arrow::Status::OK();
}

std::string ColumnCollate::ToString() const {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  switch (mode) {
    case Mode::kAsIs: return "as_is";
    case Mode::kRagged: return "ragged";
    case Mode::kPad:
      out << "pad(length=" << length << ", max_length=" << max_length
          << ", multiple_of=" << multiple_of << ", value=" << CompatibleText(pad_value)
          << ", side=" << (pad_left ? "left" : "right")
          << ", truncation=" << (truncate_left ? "left" : "right") << ")";
      return out.str();
  }
  return "?";
}

int64_t SampleTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t DecodedUnit::ByteSize() const {
  int64_t n = row_major != nullptr ? row_major->data->size() : 0;
  for (const auto& c : columns) {
    if (c.data) n += c.data->size();
    if (c.offsets) n += c.offsets->size();
    for (const auto& s : c.samples) n += s.data ? s.data->size() : 0;
  }
  return n;
}

int64_t FixedRows::bytes() const {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) bytes *= d;
  return bytes;
}

int64_t Batch::ByteSize() const {
  int64_t n = 0;
  for (const auto& c : columns) {
    if (c.data) n += c.data->size();
    if (c.offsets) n += c.offsets->size();
  }
  return n;
}

arrow::Status CheckUnitLayout(const DecodedUnit& unit, const std::vector<ColumnSpec>& specs) {
  if (unit.columns.size() != specs.size()) {
    return arrow::Status::Invalid("unit has ", unit.columns.size(), " columns, expected ",
                                  specs.size());
  }
  if (!unit.row_ok.empty() && static_cast<int64_t>(unit.row_ok.size()) != unit.num_rows) {
    return arrow::Status::Invalid("bad row mask");
  }
  for (size_t c = 0; c < specs.size(); ++c) {
    const ColumnData& d = unit.columns[c];
    if (!d.samples.empty()) {
      if (static_cast<int64_t>(d.samples.size()) != unit.num_rows) {
        return arrow::Status::Invalid("column '", specs[c].name, "': bad sample count");
      }
      continue;
    }
    // The unit's row shape must be the spec's where the spec fixes it (an entry is
    // hostile input; the gathers size their copies from it).
    const std::vector<int64_t>& want = specs[c].row_shape;
    bool same_shape = d.row_shape.size() == want.size();
    for (size_t i = 0; same_shape && i < want.size(); ++i) {
      same_shape = want[i] < 0 || want[i] == d.row_shape[i];
    }
    if (!same_shape && specs[c].kind == ColumnKind::kTensor) {
      return arrow::Status::Invalid("column '", specs[c].name, "': rows of shape ",
                                    ShapeToString(d.row_shape), " for a column of shape ",
                                    ShapeToString(want));
    }
    if (d.offsets != nullptr) {  // offsets were checked against the data when read
      if (specs[c].kind == ColumnKind::kTensor && (want.empty() || want[0] >= 0)) {
        return arrow::Status::Invalid("column '", specs[c].name,
                                      "' has variable-length rows but a fixed shape");
      }
      continue;
    }
    if (specs[c].kind != ColumnKind::kTensor) {
      return arrow::Status::Invalid("column '", specs[c].name, "' has no offsets");
    }
    int64_t bytes = DTypeSize(specs[c].dtype);
    for (int64_t dim : d.row_shape) {
      if (dim < 0 || (dim > 0 && bytes > (int64_t{1} << 40) / dim)) {
        return arrow::Status::Invalid("column '", specs[c].name, "': bad row shape");
      }
      bytes *= dim;
    }
    const bool in_block = unit.row_major != nullptr && unit.row_major->offset[c] >= 0;
    const int64_t have = in_block                ? unit.num_rows * bytes
                         : d.data != nullptr     ? d.data->size()
                         : d.deferred != nullptr ? d.deferred->size()
                                                 : 0;
    if (bytes != d.row_bytes || have != unit.num_rows * bytes) {
      return arrow::Status::Invalid("column '", specs[c].name, "': ", d.row_bytes,
                                    "-byte rows do not match the column's type and shape");
    }
  }
  return arrow::Status::OK();
}

}  // namespace pqloader
