#include "pqloader/tensor/batch.h"

#include <cstring>
#include <sstream>

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
  int64_t n = 0;
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


// Copy fixed-size rows, one memcpy per run of consecutive rows of one unit.
void GatherFixed(const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                 int64_t unit_base, const std::vector<RowRef>& rows, size_t col,
                 int64_t row_bytes, uint8_t* out) {
  if (row_bytes == 0) return;
  size_t i = 0;
  while (i < rows.size()) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j].unit == rows[i].unit &&
           rows[j].row == rows[j - 1].row + 1) {
      ++j;
    }
    const ColumnData& c = units[rows[i].unit - unit_base]->columns[col];
    std::memcpy(out, c.data->data() + rows[i].row * row_bytes, (j - i) * row_bytes);
    out += (j - i) * row_bytes;
    i = j;
  }
}

}  // namespace

arrow::Result<std::shared_ptr<Batch>> AssembleBatch(
    const std::vector<ColumnSpec>& specs,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
    arrow::MemoryPool* pool) {
  auto batch = std::make_shared<Batch>();
  const auto n = static_cast<int64_t>(rows.size());
  batch->num_rows = n;
  for (size_t col = 0; col < specs.size(); ++col) {
    BatchColumn out;
    out.kind = specs[col].kind;
    out.dtype = specs[col].dtype;
    if (col < samples.size() && !samples[col].empty()) {
      // Transformed samples: one dtype and shape for the whole batch, or an error.
      const std::vector<SampleTensor>& rows_of = samples[col];
      const SampleTensor& first = rows_of[0];
      for (const SampleTensor& s : rows_of) {
        if (s.shape != first.shape || s.dtype != first.dtype) {
          return MakeError(ErrorKind::kInvalidData, "column '", specs[col].name,
                           "': transformed samples of one batch differ, ", DTypeName(first.dtype),
                           ShapeToString(first.shape), " and ", DTypeName(s.dtype),
                           ShapeToString(s.shape),
                           "; add Resize/CenterCrop, RandomResizedCrop or PadOrTruncate so every "
                           "sample has one shape");
        }
      }
      const int64_t bytes = first.num_elements() * DTypeSize(first.dtype);
      ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(n * bytes, pool));
      for (int64_t i = 0; i < n; ++i) {
        if (bytes > 0) std::memcpy(data->mutable_data() + i * bytes, rows_of[i].data->data(), bytes);
      }
      out.kind = ColumnKind::kTensor;
      out.dtype = first.dtype;
      out.shape.push_back(n);
      out.shape.insert(out.shape.end(), first.shape.begin(), first.shape.end());
      out.data = std::move(data);
      batch->columns.push_back(std::move(out));
      continue;
    }
    if (specs[col].kind == ColumnKind::kTensor) {
      const std::vector<int64_t>* shape = nullptr;
      int64_t row_bytes = 0;
      for (const RowRef& r : rows) {
        const ColumnData& c = units[r.unit - unit_base]->columns[col];
        if (shape == nullptr) {
          shape = &c.row_shape;
          row_bytes = c.row_bytes;
        } else if (c.row_shape != *shape) {
          return MakeError(ErrorKind::kInvalidData, "column '", specs[col].name,
                           "': rows of one batch have different shapes, ", ShapeToString(*shape),
                           " and ", ShapeToString(c.row_shape),
                           "; a list column must have one length in every row");
        }
      }
      out.shape.push_back(n);
      if (shape != nullptr) {
        out.shape.insert(out.shape.end(), shape->begin(), shape->end());
      } else {
        for (int64_t d : specs[col].row_shape) out.shape.push_back(d < 0 ? 0 : d);
      }
      ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(n * row_bytes, pool));
      if (n > 0) GatherFixed(units, unit_base, rows, col, row_bytes, data->mutable_data());
      out.data = std::move(data);
    } else {
      ARROW_ASSIGN_OR_RAISE(auto offsets,
                            arrow::AllocateBuffer((n + 1) * sizeof(int64_t), pool));
      auto* off = reinterpret_cast<int64_t*>(offsets->mutable_data());
      off[0] = 0;
      for (int64_t i = 0; i < n; ++i) {
        const ColumnData& c = units[rows[i].unit - unit_base]->columns[col];
        const auto* src = reinterpret_cast<const int64_t*>(c.offsets->data());
        off[i + 1] = off[i] + (src[rows[i].row + 1] - src[rows[i].row]);
      }
      ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(off[n], pool));
      uint8_t* dst = data->mutable_data();
      for (int64_t i = 0; i < n; ++i) {
        const ColumnData& c = units[rows[i].unit - unit_base]->columns[col];
        const auto* src = reinterpret_cast<const int64_t*>(c.offsets->data());
        const int64_t len = off[i + 1] - off[i];
        if (len > 0) std::memcpy(dst + off[i], c.data->data() + src[rows[i].row], len);
      }
      out.shape.push_back(n);
      out.data = std::move(data);
      out.offsets = std::move(offsets);
    }
    batch->columns.push_back(std::move(out));
  }
  return batch;
}

}  // namespace pqloader
