#include "pqloader/tensor/batch.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "pqloader/error.h"

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

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
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

int64_t Batch::ByteSize() const {
  int64_t n = 0;
  for (const auto& c : columns) {
    if (c.data) n += c.data->size();
    if (c.offsets) n += c.offsets->size();
  }
  return n;
}

namespace {

constexpr int64_t kColumnAlignment = 64;

int64_t AlignUp(int64_t x) { return (x + kColumnAlignment - 1) / kColumnAlignment * kColumnAlignment; }

// Where the rows of a batch come from, one entry per row (structure of arrays), and the
// maximal runs of consecutive rows of one unit.
struct RowSources {
  std::vector<uint32_t> unit;  // local unit index (RowRef::unit - unit_base)
  std::vector<int64_t> row;
  struct Run {
    uint32_t unit;
    int64_t row, count;
  };
  std::vector<Run> runs;
  std::vector<uint32_t> used_units;  // distinct local units, in first-use order

  RowSources(const std::vector<RowRef>& rows, int64_t unit_base, size_t num_units) {
    const size_t n = rows.size();
    unit.resize(n);
    row.resize(n);
    std::vector<bool> seen(num_units, false);
    for (size_t i = 0; i < n; ++i) {
      const auto u = static_cast<uint32_t>(rows[i].unit - unit_base);
      unit[i] = u;
      row[i] = rows[i].row;
      if (!runs.empty() && runs.back().unit == u &&
          runs.back().row + runs.back().count == rows[i].row) {
        ++runs.back().count;
      } else {
        runs.push_back({u, rows[i].row, 1});
      }
      if (!seen[u]) {
        seen[u] = true;
        used_units.push_back(u);
      }
    }
  }
  // Whether runs are long enough that a memcpy per run beats a typed gather.
  bool Sequential() const { return runs.size() * 8 <= unit.size(); }
};

template <typename T>
void GatherTyped(const std::vector<const uint8_t*>& bases, const RowSources& src, uint8_t* out) {
  T* dst = reinterpret_cast<T*>(out);
  const uint32_t* unit = src.unit.data();
  const int64_t* row = src.row.data();
  const size_t n = src.unit.size();
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(&dst[i], bases[unit[i]] + row[i] * static_cast<int64_t>(sizeof(T)), sizeof(T));
  }
}

struct Bytes16 {
  uint64_t lo, hi;
};

// Copy fixed-size rows: a memcpy per run when rows come in runs (natural order), else
// a typed load/store per row for the common widths.
void GatherFixed(const std::vector<const uint8_t*>& bases, const RowSources& src,
                 int64_t row_bytes, uint8_t* out) {
  if (row_bytes == 0 || src.unit.empty()) return;
  if (src.Sequential() || row_bytes > 16) {
    if (!src.Sequential()) {
      for (size_t i = 0; i < src.unit.size(); ++i) {
        std::memcpy(out + i * row_bytes, bases[src.unit[i]] + src.row[i] * row_bytes, row_bytes);
      }
      return;
    }
    for (const auto& r : src.runs) {
      std::memcpy(out, bases[r.unit] + r.row * row_bytes, r.count * row_bytes);
      out += r.count * row_bytes;
    }
    return;
  }
  switch (row_bytes) {
    case 1: return GatherTyped<uint8_t>(bases, src, out);
    case 2: return GatherTyped<uint16_t>(bases, src, out);
    case 4: return GatherTyped<uint32_t>(bases, src, out);
    case 8: return GatherTyped<uint64_t>(bases, src, out);
    case 16: return GatherTyped<Bytes16>(bases, src, out);
    default:
      for (size_t i = 0; i < src.unit.size(); ++i) {
        std::memcpy(out + i * row_bytes, bases[src.unit[i]] + src.row[i] * row_bytes, row_bytes);
      }
  }
}

// Rows per tile of a row-major gather: a tile of rows is copied to a buffer that stays
// in L1, then read column by column.
constexpr int64_t kTileBytes = 16 << 10;
// Rows per tile when a unit is made row-major: long enough runs of each column for the
// hardware prefetchers, while the tile being written stays in L2.
constexpr int64_t kTransposeTileBytes = 256 << 10;

template <typename T>
void CopyStrided(const uint8_t* src, int64_t src_stride, int64_t n, uint8_t* dst,
                 int64_t dst_stride) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * dst_stride, src + i * src_stride, sizeof(T));
  }
}

// Copy n values of `width` bytes from src (every src_stride bytes) to dst (every
// dst_stride bytes).
void CopyStridedAny(int64_t width, const uint8_t* src, int64_t src_stride, int64_t n,
                    uint8_t* dst, int64_t dst_stride) {
  switch (width) {
    case 1: return CopyStrided<uint8_t>(src, src_stride, n, dst, dst_stride);
    case 2: return CopyStrided<uint16_t>(src, src_stride, n, dst, dst_stride);
    case 4: return CopyStrided<uint32_t>(src, src_stride, n, dst, dst_stride);
    case 8: return CopyStrided<uint64_t>(src, src_stride, n, dst, dst_stride);
    case 16: return CopyStrided<Bytes16>(src, src_stride, n, dst, dst_stride);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * dst_stride, src + i * src_stride, width);
  }
}

// How one output column is made.
enum class Plan { kSamples, kZeroCopy, kFixed, kRowMajor, kVar };

}  // namespace

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
    const std::vector<int64_t>& want = specs[c].row_shape;
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
    bool same_shape = d.row_shape.size() == want.size();
    for (size_t i = 0; same_shape && i < want.size(); ++i) {
      same_shape = want[i] < 0 || want[i] == d.row_shape[i];
    }
    if (!same_shape) {
      return arrow::Status::Invalid("column '", specs[c].name, "': rows of shape ",
                                    ShapeToString(d.row_shape), " for a column of shape ",
                                    ShapeToString(want));
    }
    int64_t bytes = DTypeSize(specs[c].dtype);
    for (int64_t dim : d.row_shape) {
      if (dim < 0 || (dim > 0 && bytes > (int64_t{1} << 40) / dim)) {
        return arrow::Status::Invalid("column '", specs[c].name, "': bad row shape");
      }
      bytes *= dim;
    }
    const bool in_block = unit.row_major != nullptr && unit.row_major->offset[c] >= 0;
    const int64_t have = in_block ? unit.num_rows * bytes
                                  : (d.data != nullptr ? d.data->size() : 0);
    if (bytes != d.row_bytes || have != unit.num_rows * bytes) {
      return arrow::Status::Invalid("column '", specs[c].name, "': ", d.row_bytes,
                                    "-byte rows do not match the column's type and shape");
    }
  }
  return arrow::Status::OK();
}

arrow::Result<std::shared_ptr<const DecodedUnit>> WithRowMajor(
    const std::shared_ptr<const DecodedUnit>& unit, int64_t max_row_bytes,
    arrow::MemoryPool* pool) {
  if (unit->row_major != nullptr || unit->num_rows == 0) return unit;
  std::vector<int> cols;
  for (size_t c = 0; c < unit->columns.size(); ++c) {
    const ColumnData& d = unit->columns[c];
    if (d.samples.empty() && d.offsets == nullptr && d.data != nullptr && d.row_bytes > 0 &&
        d.row_bytes <= max_row_bytes && d.data->size() == unit->num_rows * d.row_bytes) {
      cols.push_back(static_cast<int>(c));
    }
  }
  if (cols.size() < 2) return unit;
  // Widest columns first, so that 8-byte values stay 8-byte aligned in a row.
  std::stable_sort(cols.begin(), cols.end(), [&](int a, int b) {
    return unit->columns[a].row_bytes > unit->columns[b].row_bytes;
  });
  auto block = std::make_shared<RowMajorBlock>();
  block->offset.assign(unit->columns.size(), -1);
  for (int c : cols) {
    block->offset[c] = block->stride;
    block->stride += unit->columns[c].row_bytes;
  }
  block->stride = (block->stride + 7) / 8 * 8;
  const int64_t rows = unit->num_rows;
  ARROW_ASSIGN_OR_RAISE(block->data, arrow::AllocateBuffer(rows * block->stride, pool));
  uint8_t* dst = block->data->mutable_data();
  // Tiles of rows, so that the rows being written stay in L1 while each column's
  // values stream in.
  const int64_t tile = std::clamp<int64_t>(kTransposeTileBytes / block->stride, 8, 4096);
  for (int64_t r0 = 0; r0 < rows; r0 += tile) {
    const int64_t n = std::min(tile, rows - r0);
    for (int c : cols) {
      const ColumnData& d = unit->columns[c];
      CopyStridedAny(d.row_bytes, d.data->data() + r0 * d.row_bytes, d.row_bytes, n,
                     dst + r0 * block->stride + block->offset[c], block->stride);
    }
  }
  auto out = std::make_shared<DecodedUnit>(*unit);
  for (int c : cols) out->columns[c].data.reset();
  out->row_major = std::move(block);
  return out;
}

arrow::Result<std::shared_ptr<Batch>> AssembleBatch(
    const std::vector<ColumnSpec>& specs,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
    arrow::MemoryPool* pool) {
  auto batch = std::make_shared<Batch>();
  const auto n = static_cast<int64_t>(rows.size());
  batch->num_rows = n;
  const RowSources src(rows, unit_base, units.size());
  const bool one_run = src.runs.size() == 1;

  // 1. Decide each column's layout and its bytes in the batch's one block of memory;
  // shapes are checked once per unit (or per sample for transformed columns).
  const size_t num_columns = specs.size();
  std::vector<Plan> plans(num_columns);
  std::vector<int64_t> data_bytes(num_columns, 0), row_bytes(num_columns, 0);
  batch->columns.resize(num_columns);
  for (size_t col = 0; col < num_columns; ++col) {
    BatchColumn& out = batch->columns[col];
    out.kind = specs[col].kind;
    out.dtype = specs[col].dtype;
    out.shape = {n};
    if (col < samples.size() && !samples[col].empty()) {
      // Transformed samples: one dtype and shape for the whole batch, or an error.
      const SampleTensor& first = samples[col][0];
      for (const SampleTensor& s : samples[col]) {
        if (s.shape != first.shape || s.dtype != first.dtype) {
          return MakeError(ErrorKind::kInvalidData, "column '", specs[col].name,
                           "': transformed samples of one batch differ, ", DTypeName(first.dtype),
                           ShapeToString(first.shape), " and ", DTypeName(s.dtype),
                           ShapeToString(s.shape),
                           "; add Resize/CenterCrop, RandomResizedCrop or PadOrTruncate so every "
                           "sample has one shape");
        }
      }
      plans[col] = Plan::kSamples;
      out.kind = ColumnKind::kTensor;
      out.dtype = first.dtype;
      out.shape.insert(out.shape.end(), first.shape.begin(), first.shape.end());
      row_bytes[col] = first.num_elements() * DTypeSize(first.dtype);
      data_bytes[col] = n * row_bytes[col];
      continue;
    }
    if (specs[col].kind == ColumnKind::kTensor) {
      const std::vector<int64_t>* shape = nullptr;
      for (uint32_t u : src.used_units) {
        const ColumnData& c = units[u]->columns[col];
        if (c.offsets != nullptr) {  // ragged rows reach a batch only through transforms
          return MakeError(ErrorKind::kInvalidData, "column '", specs[col].name,
                           "': rows of different lengths; a list column must have one length "
                           "in every row");
        }
        if (shape == nullptr) {
          shape = &c.row_shape;
          row_bytes[col] = c.row_bytes;
        } else if (c.row_shape != *shape) {
          return MakeError(ErrorKind::kInvalidData, "column '", specs[col].name,
                           "': rows of one batch have different shapes, ", ShapeToString(*shape),
                           " and ", ShapeToString(c.row_shape),
                           "; a list column must have one length in every row");
        }
      }
      if (shape != nullptr) {
        out.shape.insert(out.shape.end(), shape->begin(), shape->end());
      } else {
        for (int64_t d : specs[col].row_shape) out.shape.push_back(d < 0 ? 0 : d);
      }
      const auto& first_unit = *units[src.used_units.empty() ? 0 : src.used_units[0]];
      const bool row_major = !src.used_units.empty() && first_unit.row_major != nullptr &&
                             first_unit.row_major->offset[col] >= 0;
      for (uint32_t u : src.used_units) {
        const auto& rm = units[u]->row_major;
        const bool same = row_major ? rm != nullptr && rm->stride == first_unit.row_major->stride &&
                                          rm->offset[col] == first_unit.row_major->offset[col]
                                    : rm == nullptr || rm->offset[col] < 0;
        if (!same) {
          return arrow::Status::Invalid("column '", specs[col].name,
                                        "': units of one batch have different layouts");
        }
      }
      plans[col] = row_major ? Plan::kRowMajor : one_run ? Plan::kZeroCopy : Plan::kFixed;
      if (plans[col] != Plan::kZeroCopy) data_bytes[col] = n * row_bytes[col];
      continue;
    }
    plans[col] = Plan::kVar;
    int64_t total = 0;
    for (const auto& r : src.runs) {
      const auto* off = reinterpret_cast<const int64_t*>(units[r.unit]->columns[col].offsets->data());
      total += off[r.row + r.count] - off[r.row];
    }
    data_bytes[col] = total;
  }

  // 2. One allocation holds every copied column (and the offsets of variable-length ones).
  std::vector<int64_t> data_at(num_columns, 0), offsets_at(num_columns, 0);
  int64_t block_bytes = 0;
  for (size_t col = 0; col < num_columns; ++col) {
    if (plans[col] == Plan::kZeroCopy) continue;
    data_at[col] = block_bytes;
    block_bytes = AlignUp(block_bytes + data_bytes[col]);
    if (plans[col] == Plan::kVar) {
      offsets_at[col] = block_bytes;
      block_bytes = AlignUp(block_bytes + (n + 1) * static_cast<int64_t>(sizeof(int64_t)));
    }
  }
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> block,
                        arrow::AllocateBuffer(block_bytes, pool));
  batch->owned_bytes = block_bytes;
  uint8_t* base = block->mutable_data();

  // 3. Fill the columns. Row-major columns: a tile of rows at a time is copied into a
  // buffer that stays in L1, then each column takes its values from it.
  std::vector<size_t> rm_cols;
  for (size_t col = 0; col < num_columns; ++col) {
    if (plans[col] == Plan::kRowMajor) rm_cols.push_back(col);
  }
  if (!rm_cols.empty()) {
    const RowMajorBlock& layout = *units[src.used_units[0]]->row_major;
    const int64_t stride = layout.stride;
    const int64_t tile = std::clamp<int64_t>(kTileBytes / stride, 8, 256);
    std::vector<uint8_t> rows_buf(static_cast<size_t>(tile * stride));
    std::vector<const uint8_t*> rm_bases(units.size(), nullptr);
    for (uint32_t u : src.used_units) rm_bases[u] = units[u]->row_major->data->data();
    for (int64_t i0 = 0; i0 < n; i0 += tile) {
      const int64_t m = std::min(tile, n - i0);
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(rows_buf.data() + i * stride,
                    rm_bases[src.unit[i0 + i]] + src.row[i0 + i] * stride, stride);
      }
      for (size_t col : rm_cols) {
        const int64_t w = row_bytes[col];
        CopyStridedAny(w, rows_buf.data() + layout.offset[col], stride, m,
                       base + data_at[col] + i0 * w, w);
      }
    }
    for (size_t col : rm_cols) {
      batch->columns[col].data = arrow::SliceBuffer(block, data_at[col], data_bytes[col]);
    }
  }
  std::vector<const uint8_t*> bases(units.size(), nullptr);
  for (size_t col = 0; col < num_columns; ++col) {
    BatchColumn& out = batch->columns[col];
    switch (plans[col]) {
      case Plan::kSamples: {
        uint8_t* dst = base + data_at[col];
        const int64_t bytes = row_bytes[col];
        for (int64_t i = 0; i < n && bytes > 0; ++i) {
          std::memcpy(dst + i * bytes, samples[col][i].data->data(), bytes);
        }
        out.data = arrow::SliceBuffer(block, data_at[col], data_bytes[col]);
        break;
      }
      case Plan::kRowMajor:
        break;  // filled above
      case Plan::kZeroCopy: {
        const auto& r = src.runs[0];
        const ColumnData& c = units[r.unit]->columns[col];
        out.data = c.data != nullptr
                       ? arrow::SliceBuffer(c.data, r.row * row_bytes[col], n * row_bytes[col])
                       : arrow::SliceBuffer(block, 0, 0);
        break;
      }
      case Plan::kFixed: {
        for (uint32_t u : src.used_units) {
          const ColumnData& c = units[u]->columns[col];
          bases[u] = c.data ? c.data->data() : nullptr;
        }
        GatherFixed(bases, src, row_bytes[col], base + data_at[col]);
        out.data = arrow::SliceBuffer(block, data_at[col], data_bytes[col]);
        break;
      }
      case Plan::kVar: {
        auto* off = reinterpret_cast<int64_t*>(base + offsets_at[col]);
        uint8_t* dst = base + data_at[col];
        off[0] = 0;
        int64_t i = 0;
        for (const auto& r : src.runs) {
          const ColumnData& c = units[r.unit]->columns[col];
          const auto* s = reinterpret_cast<const int64_t*>(c.offsets->data());
          const int64_t begin = s[r.row], end = s[r.row + r.count];
          if (end > begin) std::memcpy(dst + off[i], c.data->data() + begin, end - begin);
          for (int64_t k = 0; k < r.count; ++k, ++i) off[i + 1] = off[i] + (s[r.row + k + 1] - s[r.row + k]);
        }
        out.data = arrow::SliceBuffer(block, data_at[col], data_bytes[col]);
        out.offsets = arrow::SliceBuffer(block, offsets_at[col], (n + 1) * static_cast<int64_t>(sizeof(int64_t)));
        break;
      }
    }
  }
  return batch;
}

}  // namespace pqloader
