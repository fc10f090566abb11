#include "pqloader/pack/packer.h"

#include <algorithm>
#include <cstring>

#include "pqloader/error.h"

namespace pqloader {

namespace {

// A document's tokens: its bytes in a unit and its length.
struct Tokens {
  const uint8_t* data;
  int64_t length;
};

arrow::Result<Tokens> TokensOf(const DecodedUnit& unit, int col, int64_t row, int64_t elem) {
  const ColumnData& c = unit.columns[col];
  if (c.offsets != nullptr) {
    const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
    return Tokens{c.data->data() + off[row], (off[row + 1] - off[row]) / elem};
  }
  if (c.row_shape.size() != 1) return arrow::Status::Invalid("not a list of numbers");
  const RowMajorBlock* rm = unit.row_major.get();
  if (rm != nullptr && rm->offset[col] >= 0) {
    return Tokens{rm->data->data() + row * rm->stride + rm->offset[col], c.row_shape[0]};
  }
  return Tokens{c.data->data() + row * c.row_bytes, c.row_shape[0]};
}

// The bytes of row `row` of a scalar column of `unit`.
const uint8_t* ScalarOf(const DecodedUnit& unit, int col, int64_t row) {
  const ColumnData& c = unit.columns[col];
  const RowMajorBlock* rm = unit.row_major.get();
  if (rm != nullptr && rm->offset[col] >= 0) return rm->data->data() + row * rm->stride + rm->offset[col];
  return c.data->data() + row * c.row_bytes;
}

}  // namespace

const std::vector<std::string>& PackedOutputNames() {
  static const std::vector<std::string> kNames = {"position_ids", "document_ids", "loss_mask",
                                                  "cu_seqlens"};
  return kNames;
}

arrow::Result<std::shared_ptr<Batch>> PackBatch(
    const std::vector<ColumnSpec>& specs, const PackOptions& o, const PackPlan& pack,
    int64_t b0, int64_t b1, const std::vector<std::shared_ptr<const DecodedUnit>>& units,
    int64_t unit_base, const std::vector<RowRef>& docs, const std::vector<int>& companions,
    arrow::MemoryPool* pool) {
  const int64_t L = o.seq_len, blocks = b1 - b0, total = blocks * L;
  // Documents' tokens up to the end of the blocks the rank fills (one running into a
  // dropped partial block stops there, as BlocksSpan does); padding after.
  const int64_t filled = std::min(
      total, std::max<int64_t>(0, std::min(pack.num_tokens(), pack.num_blocks() * L) - b0 * L));
  const ColumnSpec& spec = specs[o.column];
  const int64_t elem = DTypeSize(spec.dtype);
  const PackPlan::Span span = pack.BlocksSpan(b0, b1);
  if (static_cast<int64_t>(docs.size()) != span.last - span.first) {
    return arrow::Status::Invalid("packing: ", docs.size(), " documents for a span of ",
                                  span.last - span.first);
  }
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> tokens, arrow::AllocateBuffer(total * elem, pool));
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> positions, arrow::AllocateBuffer(total * 8, pool));
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> segments, arrow::AllocateBuffer(total * 8, pool));
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> mask, arrow::AllocateBuffer(total, pool));
  std::vector<std::shared_ptr<arrow::Buffer>> extra;
  for (int c : companions) {
    ARROW_ASSIGN_OR_RAISE(auto b, arrow::AllocateBuffer(total * DTypeSize(specs[c].dtype), pool));
    std::memset(b->mutable_data(), 0, static_cast<size_t>(b->size()));
    extra.push_back(std::move(b));
  }
  uint8_t* tok = tokens->mutable_data();
  auto* pos = reinterpret_cast<int64_t*>(positions->mutable_data());
  auto* seg = reinterpret_cast<int64_t*>(segments->mutable_data());
  uint8_t* msk = mask->mutable_data();
  std::vector<int32_t> cu = {0};
  std::vector<uint8_t> eos(static_cast<size_t>(elem)), pad(static_cast<size_t>(elem));
  StoreScalar(spec.dtype, static_cast<double>(o.eos), eos.data());
  StoreScalar(spec.dtype, o.pad_value, pad.data());

  int64_t t = 0;          // tokens written
  int64_t in_block = -1;  // segment index in the current block
  auto start_segment = [&] {
    if (t % L == 0) in_block = -1;  // a new block
    ++in_block;
    if (t > 0 && cu.back() != t) cu.push_back(static_cast<int32_t>(t));
  };
  for (size_t i = 0; i < docs.size() && t < filled; ++i) {
    const RowRef& r = docs[i];
    const DecodedUnit& unit = *units[r.unit - unit_base];
    ARROW_ASSIGN_OR_RAISE(Tokens doc, TokensOf(unit, o.column, r.row, elem));
    const int64_t own = pack.DocumentTokensAt(span.first + static_cast<int64_t>(i));
    if (own > doc.length) return arrow::Status::Invalid("packing: a document shorter than planned");
    const int64_t n = pack.TokensAt(span.first + static_cast<int64_t>(i));
    int64_t k = i == 0 ? span.offset : 0;  // the first document may have begun in an earlier block
    while (k < n && t < filled) {
      start_segment();
      const int64_t m = std::min(n - k, (t / L + 1) * L - t);  // up to the block's end
      const int64_t copy = std::max<int64_t>(0, std::min(m, own - k));
      if (copy > 0) std::memcpy(tok + t * elem, doc.data + k * elem, copy * elem);
      if (copy < m) std::memcpy(tok + (t + copy) * elem, eos.data(), elem);  // the separator
      for (int64_t j = 0; j < m; ++j) {
        pos[t + j] = k + j;
        seg[t + j] = in_block;
        msk[t + j] = 1;
      }
      for (size_t e = 0; e < companions.size(); ++e) {
        const int64_t w = DTypeSize(specs[companions[e]].dtype);
        const uint8_t* v = ScalarOf(unit, companions[e], r.row);
        for (int64_t j = 0; j < m; ++j) std::memcpy(extra[e]->mutable_data() + (t + j) * w, v, w);
      }
      t += m;
      k += m;
    }
  }
  // Padding: the end of the last block, and whole blocks of padding (kPad ranks).
  while (t < total) {
    start_segment();
    const int64_t m = (t / L + 1) * L - t;
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(tok + (t + j) * elem, pad.data(), elem);
      pos[t + j] = 0;
      seg[t + j] = -1;
      msk[t + j] = 0;
    }
    t += m;
  }
  if (cu.back() != total) cu.push_back(static_cast<int32_t>(total));
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> cu_buffer,
                        arrow::AllocateBuffer(static_cast<int64_t>(cu.size() * sizeof(int32_t)), pool));
  std::memcpy(cu_buffer->mutable_data(), cu.data(), cu.size() * sizeof(int32_t));

  auto batch = std::make_shared<Batch>();
  batch->num_rows = blocks;
  auto add = [&](DType dtype, std::vector<int64_t> shape, std::shared_ptr<arrow::Buffer> data) {
    BatchColumn c;
    c.kind = ColumnKind::kTensor;
    c.dtype = dtype;
    c.shape = std::move(shape);
    batch->owned_bytes += data->size();
    c.data = std::move(data);
    batch->columns.push_back(std::move(c));
  };
  add(spec.dtype, {blocks, L}, tokens);
  add(DType::kInt64, {blocks, L}, positions);
  add(DType::kInt64, {blocks, L}, segments);
  add(DType::kBool, {blocks, L}, mask);
  add(DType::kInt32, {static_cast<int64_t>(cu.size())}, cu_buffer);
  for (size_t e = 0; e < companions.size(); ++e) add(specs[companions[e]].dtype, {blocks, L}, extra[e]);
  return batch;
}

}  // namespace pqloader
