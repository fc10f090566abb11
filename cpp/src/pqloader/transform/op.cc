#include "pqloader/transform/op.h"

#include "pqloader/tensor/buffer_pool.h"

namespace pqloader {

namespace {
// Largest sample an op may allocate (a corrupt header must not ask for more).
constexpr int64_t kMaxSampleBytes = int64_t{1} << 34;

// This thread's open SampleSlotScope (block null: none, or its slot taken).
struct SampleSlot {
  std::shared_ptr<arrow::Buffer> block;
  int64_t offset = 0;
  int64_t bytes = 0;
};
thread_local SampleSlot tls_slot;
}  // namespace

SampleSlotScope::SampleSlotScope(std::shared_ptr<arrow::Buffer> block, int64_t offset,
                                 int64_t bytes) {
  tls_slot = SampleSlot{std::move(block), offset, bytes};
}

SampleSlotScope::~SampleSlotScope() { tls_slot = SampleSlot{}; }

double OpParams::Number(const std::string& key, double fallback) const {
  auto it = numbers.find(key);
  if (it != numbers.end()) return it->second;
  auto lit = lists.find(key);
  if (lit != lists.end() && lit->second.size() == 1) return lit->second[0];
  return fallback;
}

std::vector<double> OpParams::List(const std::string& key, std::vector<double> fallback) const {
  auto it = lists.find(key);
  if (it != lists.end()) return it->second;
  auto nit = numbers.find(key);
  if (nit != numbers.end()) return {nit->second};
  return fallback;
}

std::string OpParams::String(const std::string& key, const std::string& fallback) const {
  auto it = strings.find(key);
  return it == strings.end() ? fallback : it->second;
}

arrow::Status CheckEncodedInput(const SampleSignature& in, const std::string& op) {
  const bool bytes = !in.dtype.has_value() || *in.dtype == DType::kUInt8;
  const bool flat = !in.shape.has_value() || in.shape->size() == 1;
  if (bytes && flat) return arrow::Status::OK();
  std::string rows = in.dtype.has_value() ? DTypeName(*in.dtype) : "";
  if (in.shape.has_value()) {
    rows += (rows.empty() ? "shape " : ", shape ") + ShapeToString(*in.shape);
  }
  return arrow::Status::Invalid(op, " needs encoded bytes (a binary column), got rows of ", rows);
}

arrow::Result<SampleTensor> AllocateSample(DType dtype, std::vector<int64_t> shape,
                                           bool channels_first) {
  SampleTensor s;
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.channels_first = channels_first;
  for (int64_t d : s.shape) {
    if (d < 0) return arrow::Status::Invalid("negative dimension in ", ShapeToString(s.shape));
  }
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : s.shape) {
    if (d > 0 && bytes > kMaxSampleBytes / d) {
      return arrow::Status::Invalid("a sample of shape ", ShapeToString(s.shape), " is too large");
    }
    bytes *= d;
  }
  if (tls_slot.block != nullptr && bytes == tls_slot.bytes) {
    s.data = arrow::SliceMutableBuffer(std::move(tls_slot.block), tls_slot.offset, bytes);
    tls_slot = SampleSlot{};
    return s;
  }
  ARROW_ASSIGN_OR_RAISE(s.data, arrow::AllocateBuffer(bytes, RecyclingPool::Global()));
  return s;
}


}  // namespace pqloader
