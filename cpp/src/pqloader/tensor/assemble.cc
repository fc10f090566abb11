// Batch assembly: gathering a batch's rows from decoded units (AssembleBatch) and the
// row-major layout of units that shuffled gathers read (WithRowMajor). See batch.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "pqloader/error.h"
#include "pqloader/tensor/batch.h"
#include "pqloader/util/exact_text.h"

namespace pqloader {

// Whether padding with `v` keeps it exactly in elements of `t` (integers: whole and in
// range; bool: 0 or 1; floats: not overflowing), as Python checks a pad against a dtype
// known when the Loader is made (_lists.check_values_fit); a dtype known only from the
// data is checked here.
bool PadValueFits(DType t, double v) {
  auto whole_in = [v](double lo, double hi) { return v == std::floor(v) && v >= lo && v <= hi; };
  auto whole_below = [v](double lo, double end) { return v == std::floor(v) && v >= lo && v < end; };
  switch (t) {
    case DType::kBool: return v == 0 || v == 1;
    case DType::kInt8: return whole_in(-128, 127);
    case DType::kUInt8: return whole_in(0, 255);
    case DType::kInt16: return whole_in(-32768, 32767);
    case DType::kUInt16: return whole_in(0, 65535);
    case DType::kInt32: return whole_in(-2147483648.0, 2147483647.0);
    case DType::kUInt32: return whole_in(0, 4294967295.0);
    case DType::kInt64: return whole_below(-9223372036854775808.0, 9223372036854775808.0);
    case DType::kUInt64: return whole_below(0, 18446744073709551616.0);
    // A float fits unless it rounds to inf (as numpy, and the Loader's check when made):
    // from 65520 (float16), from 2^128 - 2^103 (float32), halfway past the largest finite.
    case DType::kFloat16: return !std::isfinite(v) || std::abs(v) < 65520;
    case DType::kFloat32: return !std::isfinite(v) || std::abs(v) < 0x1.ffffffp+127;
    case DType::kFloat64: return true;
  }
  return true;
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

}  // namespace

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
  const int64_t used = block->stride;
  block->stride = (block->stride + 7) / 8 * 8;
  const int64_t rows = unit->num_rows;
  ARROW_ASSIGN_OR_RAISE(block->data, arrow::AllocateBuffer(rows * block->stride, pool));
  uint8_t* dst = block->data->mutable_data();
  const size_t pad = static_cast<size_t>(block->stride - used);
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
    // Each row's padding: zeros, not what the allocator's memory held (the block is
    // written to cache entries as it is: heap bytes of the process went to disk, and two
    // entries of one row group differed byte for byte).
    for (int64_t r = r0; pad > 0 && r < r0 + n; ++r) std::memset(dst + r * block->stride + used, 0, pad);
  }
  auto out = std::make_shared<DecodedUnit>(*unit);
  for (int c : cols) out->columns[c].data.reset();
  out->row_major = std::move(block);
  return out;
}

arrow::Result<std::shared_ptr<const DecodedUnit>> WithoutRowMajor(
    const std::shared_ptr<const DecodedUnit>& unit, arrow::MemoryPool* pool) {
  if (unit->row_major == nullptr) return unit;
  const RowMajorBlock& rm = *unit->row_major;
  const int64_t rows = unit->num_rows;
  auto out = std::make_shared<DecodedUnit>(*unit);
  for (size_t c = 0; c < out->columns.size(); ++c) {
    if (c >= rm.offset.size() || rm.offset[c] < 0) continue;
    ColumnData& d = out->columns[c];
    ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> column,
                          arrow::AllocateBuffer(rows * d.row_bytes, pool));
    CopyStridedAny(d.row_bytes, rm.data->data() + rm.offset[c], rm.stride, rows,
                   column->mutable_data(), d.row_bytes);
    d.data = std::move(column);
  }
  out->row_major.reset();
  out->shared = false;  // its buffers are its own now
  return out;
}

namespace {

// How one output column is made.
enum class Plan {
  kSamples,      // per-row samples of this batch's transforms: one copy per row
  kUnitSamples,  // per-row samples the units carry (transforms before the cache point)
  kZeroCopy,     // fixed-size rows, one run of one unit: a slice of the unit's buffer
  kFixed,        // fixed-size rows gathered column by column
  kRowMajor,     // fixed-size rows gathered from the units' row-major blocks
  kVar,          // variable-length rows: offsets + bytes
  kPad,          // rows padded or truncated to one first dimension (+ lengths)
  kRagged,       // rows of any first dimension one after another (+ row offsets)
};

// Where row i of a padded column is: its bytes and its first dimension.
struct RowSpan {
  const uint8_t* data;
  int64_t length;
};

// One AssembleBatch call: plans every column (layout, shape, bytes), allocates one block
// for all copied columns, then fills each column by its plan.
class Assembler {
 public:
  Assembler(const std::vector<ColumnSpec>& specs,
            const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
            const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
            const std::vector<ColumnCollate>& collate,
            const std::vector<std::optional<SampleSignature>>& signatures)
      : specs_(specs), units_(units), samples_(samples), collate_(collate),
        signatures_(signatures),
        src_(rows, unit_base, units.size()), n_(static_cast<int64_t>(rows.size())),
        plans_(specs.size()), row_bytes_(specs.size(), 0), data_bytes_(specs.size(), 0),
        data_at_(specs.size(), 0), offsets_at_(specs.size(), 0), pad_to_(specs.size(), 0),
        zero_copy_ragged_(specs.size(), false), placed_(specs.size()),
        dst_(specs.size(), nullptr), aux_(specs.size(), nullptr) {}

  // Write into `into` (AssembleInto) instead of a block of the batch's own.
  void set_target(const BatchTarget* into) { into_ = into; }

  arrow::Result<std::shared_ptr<Batch>> Run(arrow::MemoryPool* pool) {
    batch_ = std::make_shared<Batch>();
    batch_->num_rows = n_;
    batch_->columns.resize(specs_.size());
    for (size_t col = 0; col < specs_.size(); ++col) ARROW_RETURN_NOT_OK(PlanColumn(col));
    if (into_ != nullptr) {
      ARROW_RETURN_NOT_OK(Target());
    } else {
      ARROW_RETURN_NOT_OK(Allocate(pool));
    }
    FillRowMajor();
    for (size_t col = 0; col < specs_.size(); ++col) {
      switch (plans_[col]) {
        case Plan::kSamples: case Plan::kUnitSamples: FillSamples(col); break;
        case Plan::kZeroCopy: FillZeroCopy(col); break;
        case Plan::kFixed: FillFixed(col); break;
        case Plan::kRowMajor: break;  // by FillRowMajor, all such columns at once
        case Plan::kVar: FillVar(col); break;
        case Plan::kPad: FillPad(col); break;
        case Plan::kRagged: FillRagged(col); break;
      }
    }
    return batch_;
  }

 private:
  bool HasSamples(size_t col) const { return col < samples_.size() && !samples_[col].empty(); }
  const DecodedUnit& UnitOfRow(int64_t i) const { return *units_[src_.unit[i]]; }
  const SampleTensor& SampleOf(size_t col, int64_t i) const {
    return HasSamples(col) ? samples_[col][i] : UnitOfRow(i).columns[col].samples[src_.row[i]];
  }
  std::shared_ptr<arrow::Buffer> DataSlice(size_t col) const {
    return arrow::SliceBuffer(block_, data_at_[col], data_bytes_[col]);
  }
  arrow::Status Mismatch(size_t col, const char* what) const {
    return arrow::Status::Invalid("column '", specs_[col].name, "': ", what);
  }
  // Units whose row-major blocks differ in layout: a column whose rows differ in shape
  // between them (a list of another length) is named, not `col`, whose place the
  // other column's width moved.
  arrow::Status LayoutMismatch(size_t col) const {
    for (size_t c = 0; c < specs_.size(); ++c) {
      const std::vector<int64_t>* shape = nullptr;
      for (uint32_t u : src_.used_units) {
        const std::vector<int64_t>& s = units_[u]->columns[c].row_shape;
        if (shape == nullptr) {
          shape = &s;
        } else if (s != *shape) {
          return MakeError(ErrorKind::kInvalidData, "column '", specs_[c].name,
                           "': rows of one batch have different shapes, ", ShapeToString(*shape),
                           " and ", ShapeToString(s),
                           "; a list column must have one length in every row, or be batched "
                           "ragged or padded (lists=)");
        }
      }
    }
    return Mismatch(col, "units of one batch have different layouts");
  }

  // 1. Plans.
  arrow::Status PlanColumn(size_t col) {
    BatchColumn& out = batch_->columns[col];
    out.kind = specs_[col].kind;
    out.dtype = specs_[col].dtype;
    out.shape = {n_};
    // Per-row samples made before the cache point (deterministic transforms).
    bool unit_samples = false;
    if (!HasSamples(col) && !src_.used_units.empty()) {
      unit_samples = !units_[src_.used_units[0]]->columns[col].samples.empty();
      for (uint32_t u : src_.used_units) {
        const auto& c = units_[u]->columns[col];
        if (unit_samples != !c.samples.empty() ||
            (unit_samples && c.samples.size() != static_cast<size_t>(units_[u]->num_rows))) {
          return Mismatch(col, "units of one batch have different layouts");
        }
      }
    }
    const auto mode = col < collate_.size() ? collate_[col].mode : ColumnCollate::Mode::kAsIs;
    if (n_ == 0 && col < signatures_.size() && signatures_[col].has_value()) {
      return PlanEmpty(col, mode, *signatures_[col]);
    }
    if (mode != ColumnCollate::Mode::kAsIs) return PlanCollated(col, unit_samples, mode);
    if (HasSamples(col) || unit_samples) return PlanSamples(col, unit_samples);
    if (specs_[col].kind == ColumnKind::kTensor) return PlanFixed(col);
    plans_[col] = Plan::kVar;
    int64_t total = 0;
    for (const auto& r : src_.runs) {
      const auto* off = reinterpret_cast<const int64_t*>(units_[r.unit]->columns[col].offsets->data());
      total += off[r.row + r.count] - off[r.row];
    }
    data_bytes_[col] = total;
    return arrow::Status::OK();
  }

  // No rows (every row of the batch skipped): an empty tensor of the column's signature,
  // whether or not any row would have been bytes before its transforms.
  arrow::Status PlanEmpty(size_t col, ColumnCollate::Mode mode, const SampleSignature& sig) {
    BatchColumn& out = batch_->columns[col];
    out.kind = ColumnKind::kTensor;
    out.dtype = sig.dtype.value_or(DType::kUInt8);
    std::vector<int64_t> row;  // dimensions that depend on the data are 0
    if (sig.shape.has_value()) {
      for (int64_t d : *sig.shape) row.push_back(std::max<int64_t>(d, 0));
    }
    if (mode != ColumnCollate::Mode::kAsIs && !row.empty()) row.erase(row.begin());
    int64_t element = DTypeSize(out.dtype);
    for (int64_t d : row) element *= d;
    row_bytes_[col] = element;
    out.shape = {0};
    switch (mode) {
      case ColumnCollate::Mode::kAsIs:
        plans_[col] = Plan::kSamples;  // FillSamples: no rows to copy
        break;
      case ColumnCollate::Mode::kRagged:
        plans_[col] = Plan::kRagged;
        break;
      case ColumnCollate::Mode::kPad:
        plans_[col] = Plan::kPad;
        pad_to_[col] = std::max<int64_t>(collate_[col].length, 0);
        out.shape.push_back(pad_to_[col]);
        break;
    }
    out.shape.insert(out.shape.end(), row.begin(), row.end());
    data_bytes_[col] = 0;
    return arrow::Status::OK();
  }

  // Rows of any first dimension, one dtype and one inner shape (checked per sample,
  // or per unit); row_bytes holds the bytes of one element of the first dimension.
  arrow::Status PlanCollated(size_t col, bool unit_samples, ColumnCollate::Mode mode) {
    BatchColumn& out = batch_->columns[col];
    const bool samples = HasSamples(col) || unit_samples;
    DType dtype = specs_[col].dtype;
    const std::vector<int64_t>* inner = nullptr;
    auto check = [&](DType t, const std::vector<int64_t>& shape) -> arrow::Status {
      if (shape.empty() || (!samples && specs_[col].kind != ColumnKind::kTensor)) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name,
                         "': padding or ragged output needs a list (1-D or more) per row, got ",
                         shape.empty() ? "a scalar" : "bytes");
      }
      if (inner == nullptr) {
        dtype = t;
        inner = &shape;
      } else if (t != dtype ||
                 !std::equal(shape.begin() + 1, shape.end(), inner->begin() + 1, inner->end())) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name,
                         "': rows of one batch differ beyond their first dimension, ",
                         DTypeName(dtype), ShapeToString(*inner), " and ", DTypeName(t),
                         ShapeToString(shape));
      }
      return arrow::Status::OK();
    };
    if (samples) {
      for (int64_t i = 0; i < n_; ++i) {
        ARROW_RETURN_NOT_OK(check(SampleOf(col, i).dtype, SampleOf(col, i).shape));
      }
    } else {
      for (uint32_t u : src_.used_units) {
        ARROW_RETURN_NOT_OK(check(specs_[col].dtype, units_[u]->columns[col].row_shape));
      }
    }
    int64_t element = DTypeSize(dtype);
    std::vector<int64_t> inner_dims;
    if (inner != nullptr) {
      for (size_t d = 1; d < inner->size(); ++d) {
        element *= (*inner)[d];
        inner_dims.push_back((*inner)[d]);
      }
    }
    out.kind = ColumnKind::kTensor;
    out.dtype = dtype;
    row_bytes_[col] = element;
    const ColumnCollate& c = collate_[col];
    if (mode == ColumnCollate::Mode::kRagged) {
      plans_[col] = Plan::kRagged;
      int64_t total = 0;
      for (int64_t i = 0; i < n_; ++i) total += SpanOf(col, i).length;
      out.shape = {total};
      out.shape.insert(out.shape.end(), inner_dims.begin(), inner_dims.end());
      // One run of one unit's ragged rows: their values are contiguous there.
      const ColumnData* first =
          src_.used_units.empty() ? nullptr : &units_[src_.used_units[0]]->columns[col];
      zero_copy_ragged_[col] = src_.runs.size() == 1 && !samples && first != nullptr &&
                               first->offsets != nullptr && !units_[src_.used_units[0]]->shared;
      data_bytes_[col] = zero_copy_ragged_[col] ? 0 : total * element;
      return arrow::Status::OK();
    }
    plans_[col] = Plan::kPad;
    ARROW_RETURN_NOT_OK(c.Validate(specs_[col].name));
    if (!PadValueFits(dtype, c.pad_value)) {  // (300 in uint8 rows was written as 44)
      return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name, "': the pad value ",
                       ExactText(c.pad_value), " does not fit its rows' dtype ", DTypeName(dtype),
                       " (known only from the data, so not checked when the Loader was made); "
                       "Cast the column first, or pad with a value of that dtype");
    }
    int64_t length = c.length;
    if (length <= 0) {  // the longest row of the batch, capped, rounded up
      for (int64_t i = 0; i < n_; ++i) length = std::max(length, SpanOf(col, i).length);
      if (c.max_length > 0) length = std::min(length, c.max_length);
      const int64_t m = c.multiple_of;  // in [1, 2^40], as the length: no overflow
      length = (length + m - 1) / m * m;
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(n_, length, &bytes) || __builtin_mul_overflow(bytes, element, &bytes)) {
      return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name, "': ", n_,
                       " rows padded to length ", length, " are more than 2^63 bytes");
    }
    pad_to_[col] = length;
    out.shape = {n_, length};
    out.shape.insert(out.shape.end(), inner_dims.begin(), inner_dims.end());
    data_bytes_[col] = bytes;
    return arrow::Status::OK();
  }

  // Transformed samples: one dtype and shape for the whole batch, or an error.
  arrow::Status PlanSamples(size_t col, bool unit_samples) {
    BatchColumn& out = batch_->columns[col];
    const SampleTensor& first = SampleOf(col, 0);
    for (int64_t i = 0; i < n_; ++i) {
      const SampleTensor& s = SampleOf(col, i);
      if (s.shape != first.shape || s.dtype != first.dtype) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name,
                         "': transformed samples of one batch differ, ", DTypeName(first.dtype),
                         ShapeToString(first.shape), " and ", DTypeName(s.dtype),
                         ShapeToString(s.shape),
                         "; add Resize/CenterCrop, RandomResizedCrop or PadOrTruncate so every "
                         "sample has one shape");
      }
    }
    plans_[col] = unit_samples ? Plan::kUnitSamples : Plan::kSamples;
    out.kind = ColumnKind::kTensor;
    out.dtype = first.dtype;
    out.shape.insert(out.shape.end(), first.shape.begin(), first.shape.end());
    row_bytes_[col] = first.num_elements() * DTypeSize(first.dtype);
    data_bytes_[col] = n_ * row_bytes_[col];
    if (!unit_samples) PlaceSamples(col);
    return arrow::Status::OK();
  }

  // Samples that the transforms wrote into one block, row i at i * row bytes
  // (SampleSlotScope), are the column as they are: no copy. Not samples an op passed
  // through unchanged (RandomHorizontalFlip not drawn, then a Cast to their own dtype)
  // where they are slices of a shared unit's buffer, which an in-memory cache entry
  // keeps for every later epoch (DecodedUnit::shared: a caller's write into the batch
  // changed them), or rows of a row-major block beside other columns: copied.
  void PlaceSamples(size_t col) {
    const int64_t bytes = row_bytes_[col];
    const std::shared_ptr<arrow::Buffer>& block = samples_[col][0].data->parent();
    if (bytes <= 0 || block == nullptr) return;
    for (uint32_t u : src_.used_units) {
      const DecodedUnit& unit = *units_[u];
      if ((unit.shared && unit.columns[col].data == block) ||
          (unit.row_major != nullptr && unit.row_major->data == block)) {
        return;
      }
    }
    const uint8_t* base = samples_[col][0].data->data();
    const int64_t offset = base - block->data();
    if (offset < 0 || offset + n_ * bytes > block->size()) return;
    for (int64_t i = 0; i < n_; ++i) {
      const arrow::Buffer& d = *samples_[col][i].data;
      if (d.parent() != block || d.data() != base + i * bytes) return;
    }
    placed_[col] = arrow::SliceBuffer(block, offset, n_ * bytes);
    placed_bytes_ += block->size();  // all of it is held (rows skipped leave theirs unused)
    data_bytes_[col] = 0;
  }

  // Fixed-size rows: one row shape per unit (checked once per unit, not per row).
  arrow::Status PlanFixed(size_t col) {
    BatchColumn& out = batch_->columns[col];
    const std::vector<int64_t>* shape = nullptr;
    for (uint32_t u : src_.used_units) {
      const ColumnData& c = units_[u]->columns[col];
      if (c.offsets != nullptr) {  // ragged rows are gathered only by PadOrTruncate
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name,
                         "': rows of different lengths; a list column must have one length "
                         "in every row");
      }
      if (shape == nullptr) {
        shape = &c.row_shape;
        row_bytes_[col] = c.row_bytes;
      } else if (c.row_shape != *shape) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name,
                         "': rows of one batch have different shapes, ", ShapeToString(*shape),
                         " and ", ShapeToString(c.row_shape),
                         "; a list column must have one length in every row, or be batched "
                         "ragged or padded (lists=)");
      }
    }
    if (shape != nullptr) {
      out.shape.insert(out.shape.end(), shape->begin(), shape->end());
    } else {
      for (int64_t d : specs_[col].row_shape) out.shape.push_back(d < 0 ? 0 : d);
    }
    const RowMajorBlock* first =
        src_.used_units.empty() ? nullptr : units_[src_.used_units[0]]->row_major.get();
    const bool row_major = first != nullptr && first->offset[col] >= 0;
    for (uint32_t u : src_.used_units) {
      const RowMajorBlock* rm = units_[u]->row_major.get();
      const bool same = row_major ? rm != nullptr && rm->stride == first->stride &&
                                        rm->offset[col] == first->offset[col]
                                  : rm == nullptr || rm->offset[col] < 0;
      if (!same) return LayoutMismatch(col);
    }
    const bool slice = src_.runs.size() == 1 && !units_[src_.used_units[0]]->shared;
    plans_[col] = row_major ? Plan::kRowMajor : slice ? Plan::kZeroCopy : Plan::kFixed;
    if (plans_[col] != Plan::kZeroCopy) data_bytes_[col] = n_ * row_bytes_[col];
    return arrow::Status::OK();
  }

  // 2. One allocation holds every copied column (and the offsets of variable-length ones).
  arrow::Status Allocate(arrow::MemoryPool* pool) {
    int64_t bytes = 0;
    for (size_t col = 0; col < specs_.size(); ++col) {
      if (plans_[col] == Plan::kZeroCopy) continue;
      data_at_[col] = bytes;
      bytes = AlignUp(bytes + data_bytes_[col]);
      if (plans_[col] == Plan::kVar || plans_[col] == Plan::kRagged) {  // + offsets
        offsets_at_[col] = bytes;
        bytes = AlignUp(bytes + (n_ + 1) * static_cast<int64_t>(sizeof(int64_t)));
      } else if (plans_[col] == Plan::kPad) {  // + lengths
        offsets_at_[col] = bytes;
        bytes = AlignUp(bytes + n_ * static_cast<int64_t>(sizeof(int64_t)));
      }
    }
    ARROW_ASSIGN_OR_RAISE(block_, arrow::AllocateBuffer(bytes, pool));
    uint8_t* base = block_->mutable_data();
    for (size_t col = 0; col < specs_.size(); ++col) {
      dst_[col] = base + data_at_[col];
      aux_[col] = base + offsets_at_[col];
    }
    batch_->owned_bytes = bytes + placed_bytes_;
    return arrow::Status::OK();
  }

  // 2'. Or the caller's memory (AssembleInto): only fixed-width rows, as wide as it says.
  arrow::Status Target() {
    for (size_t col = 0; col < specs_.size(); ++col) {
      int64_t width = row_bytes_[col];
      switch (plans_[col]) {
        case Plan::kZeroCopy:
          plans_[col] = Plan::kFixed;  // copied: GatherFixed's memcpy per run
          break;
        case Plan::kSamples: case Plan::kUnitSamples: case Plan::kFixed: case Plan::kRowMajor:
          break;
        case Plan::kPad:
          width = pad_to_[col] * row_bytes_[col];
          if (into_->lengths[col] == nullptr) return Mismatch(col, "no place for its lengths");
          if (collate_[col].length > 0) break;
          [[fallthrough]];  // padded to each batch's longest row: of varying size
        case Plan::kVar: case Plan::kRagged:
          return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name,
                           "': rows of varying size cannot be written into a mixture's batch");
      }
      if (width != into_->row_bytes[col]) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name, "': rows of ",
                         width, " bytes where the mixture's batch has ", into_->row_bytes[col]);
      }
      const BatchColumn& out = batch_->columns[col];
      const std::vector<int64_t> row(out.shape.begin() + 1, out.shape.end());
      if ((!into_->dtype.empty() && out.dtype != into_->dtype[col]) ||
          (!into_->row_shape.empty() && row != into_->row_shape[col])) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs_[col].name, "': rows of ",
                         DTypeName(out.dtype), ShapeToString(row), " where the mixture's batch has ",
                         DTypeName(into_->dtype.empty() ? out.dtype : into_->dtype[col]),
                         ShapeToString(into_->row_shape.empty() ? row : into_->row_shape[col]));
      }
      dst_[col] = into_->data[col];
      aux_[col] = into_->lengths[col];
      placed_[col] = nullptr;  // copied from where the transforms wrote them
    }
    return arrow::Status::OK();
  }
  void SetColumn(size_t col) {
    if (into_ == nullptr) batch_->columns[col].data = DataSlice(col);
  }

  // 3. Fills.
  void FillSamples(size_t col) {
    if (placed_[col] != nullptr) {
      batch_->columns[col].data = placed_[col];
      return;
    }
    uint8_t* dst = dst_[col];
    const int64_t bytes = row_bytes_[col];
    for (int64_t i = 0; i < n_ && bytes > 0; ++i) {
      const uint8_t* from = SampleOf(col, i).data->data();
      // A sample the transforms wrote at its place already (AssembleInto's target).
      if (from != dst + i * bytes) std::memcpy(dst + i * bytes, from, bytes);
    }
    SetColumn(col);
  }

  void FillZeroCopy(size_t col) {
    const auto& r = src_.runs[0];
    const ColumnData& c = units_[r.unit]->columns[col];
    batch_->columns[col].data =
        c.data != nullptr ? arrow::SliceBuffer(c.data, r.row * row_bytes_[col], n_ * row_bytes_[col])
                          : arrow::SliceBuffer(block_, 0, 0);
  }

  void FillFixed(size_t col) {
    std::vector<const uint8_t*> bases(units_.size(), nullptr);
    for (uint32_t u : src_.used_units) {
      const ColumnData& c = units_[u]->columns[col];
      bases[u] = c.data ? c.data->data() : nullptr;
    }
    GatherFixed(bases, src_, row_bytes_[col], dst_[col]);
    SetColumn(col);
  }

  // Every row-major column at once: a tile of rows is copied into a buffer that stays
  // in L1, then each column takes its values from it.
  void FillRowMajor() {
    std::vector<size_t> cols;
    for (size_t col = 0; col < specs_.size(); ++col) {
      if (plans_[col] == Plan::kRowMajor) cols.push_back(col);
    }
    if (cols.empty()) return;
    const RowMajorBlock& layout = *units_[src_.used_units[0]]->row_major;
    const int64_t stride = layout.stride;
    const int64_t tile = std::clamp<int64_t>(kTileBytes / stride, 8, 256);
    std::vector<uint8_t> rows(static_cast<size_t>(tile * stride));
    std::vector<const uint8_t*> bases(units_.size(), nullptr);
    for (uint32_t u : src_.used_units) bases[u] = units_[u]->row_major->data->data();
    for (int64_t i0 = 0; i0 < n_; i0 += tile) {
      const int64_t m = std::min(tile, n_ - i0);
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(rows.data() + i * stride, bases[src_.unit[i0 + i]] + src_.row[i0 + i] * stride,
                    stride);
      }
      for (size_t col : cols) {
        const int64_t w = row_bytes_[col];
        CopyStridedAny(w, rows.data() + layout.offset[col], stride, m, dst_[col] + i0 * w, w);
      }
    }
    for (size_t col : cols) SetColumn(col);
  }

  void FillVar(size_t col) {
    auto* off = reinterpret_cast<int64_t*>(aux_[col]);
    uint8_t* dst = dst_[col];
    off[0] = 0;
    int64_t i = 0;
    for (const auto& r : src_.runs) {
      const ColumnData& c = units_[r.unit]->columns[col];
      const auto* s = reinterpret_cast<const int64_t*>(c.offsets->data());
      const int64_t begin = s[r.row], end = s[r.row + r.count];
      if (end > begin) std::memcpy(dst + off[i], c.data->data() + begin, end - begin);
      for (int64_t k = 0; k < r.count; ++k, ++i) {
        off[i + 1] = off[i] + (s[r.row + k + 1] - s[r.row + k]);
      }
    }
    batch_->columns[col].data = DataSlice(col);
    batch_->columns[col].offsets =
        arrow::SliceBuffer(block_, offsets_at_[col], (n_ + 1) * static_cast<int64_t>(sizeof(int64_t)));
  }

  // Row i of a padded column: its bytes and first dimension, wherever it lives.
  RowSpan SpanOf(size_t col, int64_t i) const {
    const DecodedUnit& unit = UnitOfRow(i);
    const ColumnData& c = unit.columns[col];
    const int64_t r = src_.row[i];
    if (HasSamples(col) || !c.samples.empty()) {
      const SampleTensor& smp = SampleOf(col, i);
      return {smp.data ? smp.data->data() : nullptr, smp.shape[0]};
    }
    if (c.offsets != nullptr) {
      const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
      const int64_t element = row_bytes_[col];
      return {c.data->data() + off[r], element > 0 ? (off[r + 1] - off[r]) / element : 0};
    }
    const RowMajorBlock* rm = unit.row_major.get();
    if (rm != nullptr && rm->offset[col] >= 0) {
      return {rm->data->data() + r * rm->stride + rm->offset[col], c.row_shape[0]};
    }
    return {c.data->data() + r * c.row_bytes, c.row_shape[0]};
  }

  // Each row's kept elements (its first or last ones), and padding before or after them
  // copied from a prebuilt padding row.
  void FillPad(size_t col) {
    const BatchColumn& out = batch_->columns[col];
    const ColumnCollate& c = collate_[col];
    const int64_t length = pad_to_[col], element = row_bytes_[col];
    const int64_t out_row = length * element;
    std::vector<uint8_t> padding(static_cast<size_t>(out_row), 0);
    const int64_t elem = DTypeSize(out.dtype);
    if (c.pad_value != 0) {
      for (int64_t k = 0; k < out_row / elem; ++k) {
        StoreScalar(out.dtype, c.pad_value, padding.data() + k * elem);
      }
    }
    uint8_t* dst = dst_[col];
    auto* valid = reinterpret_cast<int64_t*>(aux_[col]);
    // A row keeps at most max_length values even when rounding made the batch longer.
    const int64_t keep_at_most = c.length <= 0 && c.max_length > 0 ? std::min(length, c.max_length)
                                                                    : length;
    for (int64_t i = 0; i < n_; ++i, dst += out_row) {
      const RowSpan row = SpanOf(col, i);
      const int64_t kept = std::min(row.length, keep_at_most);
      const int64_t kept_bytes = kept * element, pad_bytes = out_row - kept_bytes;
      const uint8_t* from = row.data + (c.truncate_left ? (row.length - kept) * element : 0);
      uint8_t* values = dst + (c.pad_left ? pad_bytes : 0);
      if (kept_bytes > 0) std::memcpy(values, from, kept_bytes);
      if (pad_bytes > 0) std::memcpy(c.pad_left ? dst : dst + kept_bytes, padding.data(), pad_bytes);
      std::memcpy(&valid[i], &kept, sizeof(kept));  // the caller's memory may be unaligned
    }
    if (into_ != nullptr) return;
    batch_->columns[col].data = DataSlice(col);
    batch_->columns[col].lengths =
        arrow::SliceBuffer(block_, offsets_at_[col], n_ * static_cast<int64_t>(sizeof(int64_t)));
  }

  // Rows one after another, and their offsets along the first dimension.
  void FillRagged(size_t col) {
    const int64_t element = row_bytes_[col];
    auto* off = reinterpret_cast<int64_t*>(aux_[col]);
    off[0] = 0;
    for (int64_t i = 0; i < n_; ++i) off[i + 1] = off[i] + SpanOf(col, i).length;
    BatchColumn& out = batch_->columns[col];
    out.offsets =
        arrow::SliceBuffer(block_, offsets_at_[col], (n_ + 1) * static_cast<int64_t>(sizeof(int64_t)));
    if (zero_copy_ragged_[col]) {
      const auto& r = src_.runs[0];
      const ColumnData& c = units_[r.unit]->columns[col];
      const auto* s = reinterpret_cast<const int64_t*>(c.offsets->data());
      out.data = arrow::SliceBuffer(c.data, s[r.row], s[r.row + r.count] - s[r.row]);
      return;
    }
    uint8_t* dst = dst_[col];
    for (int64_t i = 0; i < n_; ++i) {
      const RowSpan row = SpanOf(col, i);
      if (row.length > 0) std::memcpy(dst + off[i] * element, row.data, row.length * element);
    }
    out.data = DataSlice(col);
  }

  const std::vector<ColumnSpec>& specs_;
  const std::vector<std::shared_ptr<const DecodedUnit>>& units_;
  const std::vector<std::vector<SampleTensor>>& samples_;
  const std::vector<ColumnCollate>& collate_;
  const std::vector<std::optional<SampleSignature>>& signatures_;
  const RowSources src_;
  const int64_t n_;
  std::vector<Plan> plans_;
  std::vector<int64_t> row_bytes_, data_bytes_, data_at_, offsets_at_;
  std::vector<int64_t> pad_to_;          // kPad: the first dimension of this batch
  std::vector<bool> zero_copy_ragged_;   // kRagged: values are a slice of one unit
  std::vector<std::shared_ptr<arrow::Buffer>> placed_;  // kSamples written in place
  int64_t placed_bytes_ = 0;                            // the blocks they are in
  std::shared_ptr<Batch> batch_;
  std::shared_ptr<arrow::Buffer> block_;
  std::vector<uint8_t*> dst_, aux_;  // each column's rows, and its offsets or lengths
  const BatchTarget* into_ = nullptr;
};

}  // namespace

arrow::Result<std::shared_ptr<Batch>> AssembleBatch(
    const std::vector<ColumnSpec>& specs,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
    arrow::MemoryPool* pool, const std::vector<ColumnCollate>& collate,
    const std::vector<std::optional<SampleSignature>>& signatures) {
  return Assembler(specs, units, unit_base, rows, samples, collate, signatures).Run(pool);
}

arrow::Status AssembleInto(
    const std::vector<ColumnSpec>& specs,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
    const BatchTarget& into, const std::vector<ColumnCollate>& collate,
    const std::vector<std::optional<SampleSignature>>& signatures) {
  if (rows.empty()) return arrow::Status::Invalid("AssembleInto needs rows");
  if (into.data.size() != specs.size() || into.lengths.size() != specs.size() ||
      into.row_bytes.size() != specs.size() ||
      (!into.dtype.empty() && into.dtype.size() != specs.size()) ||
      (!into.row_shape.empty() && into.row_shape.size() != specs.size())) {
    return arrow::Status::Invalid("AssembleInto: a target per column needed");
  }
  Assembler assembler(specs, units, unit_base, rows, samples, collate, signatures);
  assembler.set_target(&into);
  return assembler.Run(nullptr).status();
}

}  // namespace pqloader
