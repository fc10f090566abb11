#include "pqloader/transform/pipeline.h"

#include "pqloader/error.h"

namespace pqloader {

int64_t ResizeTarget(const Op& op);  // image_ops.cc
// image_ops.cc: whether `op` is PadOrTruncate, and then its parameters.
bool PadOrTruncateParams(const Op& op, ColumnCollate* collate);
// image_decode.cc: a DecodeImage that may DCT-scale to `min_short_side`, or nullptr.
std::shared_ptr<const Op> WithMinShortSide(const Op& op, int64_t min_short_side);
std::shared_ptr<const Op> FuseNormalizeToCHW(const Op& normalize, const Op& next);  // image_ops.cc
std::shared_ptr<const Op> FuseResizeCenterCrop(const std::shared_ptr<const Op>& resize,
                                               const std::shared_ptr<const Op>& next);

namespace {

// What the rows of column `spec` are before any data, after `ops` (if any): see
// TransformPlan::signatures().
arrow::Result<std::optional<SampleSignature>> SignatureOf(
    const ColumnSpec& spec, const std::vector<std::shared_ptr<const Op>>* ops) {
  SampleSignature s;
  if (spec.kind == ColumnKind::kTensor) {
    s.dtype = spec.dtype;
    s.shape = spec.row_shape;
  } else {  // ops see a row's encoded bytes (RowSample)
    s.dtype = DType::kUInt8;
    s.shape = std::vector<int64_t>{-1};
  }
  if (ops == nullptr || ops->empty()) {
    if (spec.kind != ColumnKind::kTensor) return std::nullopt;
    return s;
  }
  for (const auto& op : *ops) {
    const auto st = op->CheckInput(s);
    if (!st.ok()) {
      return MakeError(ErrorKind::kUnsupportedType, "transforms: column '", spec.name, "' (",
                       spec.arrow_type, "): ", op->ToString(), ": ", st.message());
    }
    s = op->OutputSignature(s);
  }
  return s;
}

// The bytes of every sample `sig` describes, if it fixes them (dtype and every
// dimension known); 0 otherwise.
int64_t FixedBytes(const std::optional<SampleSignature>& sig) {
  if (!sig.has_value() || !sig->dtype.has_value() || !sig->shape.has_value()) return 0;
  int64_t bytes = DTypeSize(*sig->dtype);
  for (int64_t d : *sig->shape) {
    if (d < 0 || (d > 0 && bytes > (int64_t{1} << 40) / d)) return 0;
    bytes *= d;
  }
  return bytes;
}

// Output part `part` of a column whose rows are `sig` before they are collated by `c`:
// its fixed rows, if every row has them (see TransformPlan::fixed_outputs).
std::optional<TransformPlan::FixedRows> FixedRowsOf(const std::optional<SampleSignature>& sig,
                                                    const ColumnCollate& c,
                                                    TransformPlan::Part part) {
  using Mode = ColumnCollate::Mode;
  if (part == TransformPlan::Part::kOffsets) return std::nullopt;
  if (part == TransformPlan::Part::kLength) {
    if (c.mode != Mode::kPad || c.length <= 0) return std::nullopt;
    return TransformPlan::FixedRows{DType::kInt64, {}};
  }
  if (!sig.has_value() || !sig->dtype.has_value() || !sig->shape.has_value()) return std::nullopt;
  std::vector<int64_t> shape = *sig->shape;
  if (c.mode == Mode::kRagged) return std::nullopt;
  if (c.mode == Mode::kPad) {
    if (c.length <= 0 || shape.empty()) return std::nullopt;
    shape[0] = c.length;
  }
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;  // depends on the data
  }
  return TransformPlan::FixedRows{*sig->dtype, std::move(shape)};
}

}  // namespace

bool MaskedNull(const std::vector<ColumnSpec>& specs, const DecodedUnit& unit, int col,
                int64_t row) {
  const size_t m = static_cast<size_t>(col) + 1;
  if (m >= specs.size() || m >= unit.columns.size() || specs[m].mask_of != col) return false;
  const ColumnData& d = unit.columns[m];
  const bool in_block = d.data == nullptr && unit.row_major != nullptr &&
                        unit.row_major->offset[m] >= 0;
  if (d.data == nullptr && !in_block && d.samples.empty()) return false;  // deferred
  const SampleTensor v = RowSample(specs[m], unit, static_cast<int>(m), row);
  return v.data != nullptr && v.data->size() > 0 && v.data->data()[0] == 0;
}

namespace {

// The filter that keeps a column's non-null rows, as Python writes it: a dotted name is a
// struct's field, which filters read with struct_field (they name top-level columns:
// pc.field('image.bytes') is a ColumnNotFoundError).
std::string ValidFilter(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return "pc.field('" + name + "').is_valid()";
  std::string path;
  size_t parts = 0;
  for (size_t b = dot + 1;; ++parts) {
    const size_t e = name.find('.', b);
    path += (path.empty() ? "'" : ", '") + name.substr(b, e - b) + "'";
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return "pc.struct_field(pc.field('" + name.substr(0, dot) + "'), " +
         (parts == 0 ? path : "[" + path + "]") + ").is_valid()";
}

}  // namespace

arrow::Status NullFillError(const std::string& where, const ColumnSpec& spec,
                            const arrow::Status& failed) {
  return MakeError(ErrorKind::kInvalidData, where, ", column '", spec.name,
                   "': the row is null ('", spec.name, "_valid' False), and its fill (fill_null's "
                   "value for the column, else b'') is not what its ops take: ", failed.message(),
                   "; give fill_null={'", spec.name, "': <a value its first op decodes>} to "
                   "stand in for a null, or drop the null rows with filter=",
                   ValidFilter(spec.name));
}

SampleTensor RowSample(const ColumnSpec& spec, const DecodedUnit& unit, int col, int64_t row) {
  const ColumnData& data = unit.columns[col];
  if (!data.samples.empty()) return data.samples[row];
  SampleTensor s;
  if (data.data == nullptr && unit.row_major != nullptr && unit.row_major->offset[col] >= 0) {
    // A small fixed-size column moved into the unit's row-major block (a shuffled
    // loader's unit, see WithRowMajor): its row is a slice of the block's row.
    const RowMajorBlock& block = *unit.row_major;
    s.dtype = spec.dtype;
    s.shape = data.row_shape;
    s.data = arrow::SliceBuffer(block.data, row * block.stride + block.offset[col], data.row_bytes);
    return s;
  }
  if (data.offsets != nullptr) {
    const auto* off = reinterpret_cast<const int64_t*>(data.offsets->data());
    const int64_t begin = off[row], len = off[row + 1] - off[row];
    s.data = arrow::SliceBuffer(data.data, begin, len);
    if (spec.kind != ColumnKind::kTensor) {  // encoded bytes
      s.dtype = DType::kUInt8;
      s.shape = {len};
    } else {  // a ragged list row
      s.dtype = spec.dtype;
      s.shape = data.row_shape;
      int64_t inner = DTypeSize(spec.dtype);
      for (size_t i = 1; i < s.shape.size(); ++i) inner *= s.shape[i];
      s.shape[0] = inner == 0 ? 0 : len / inner;
    }
    return s;
  }
  s.dtype = spec.dtype;
  s.shape = data.row_shape;
  s.data = arrow::SliceBuffer(data.data, row * data.row_bytes, data.row_bytes);
  return s;
}

arrow::Result<TransformPlan> TransformPlan::Make(
    const std::vector<ColumnSpec>& specs,
    const std::map<std::string, std::vector<std::shared_ptr<const Op>>>& transforms,
    DecodeErrorPolicy policy, bool cache_point, const std::map<std::string, ColumnCollate>& lists) {
  TransformPlan plan;
  plan.collate_.resize(specs.size());
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == name) return static_cast<int>(i);
    }
    return -1;
  };
  for (const auto& [name, collate] : lists) {
    const int col = index_of(name);
    if (col < 0) {
      return MakeError(ErrorKind::kColumnNotFound, "lists names column '", name,
                       "', which is not among the selected columns");
    }
    if (collate.mode == ColumnCollate::Mode::kAsIs) continue;
    if (specs[col].kind != ColumnKind::kTensor || specs[col].row_shape.empty()) {
      if (transforms.count(name) == 0) {
        return MakeError(ErrorKind::kUnsupportedType, "lists: column '", name, "' (",
                         specs[col].arrow_type, ") is not a list of numbers; only list "
                         "columns (or transformed columns) can be padded or ragged");
      }
    }
    ARROW_RETURN_NOT_OK(collate.Validate(name));
    plan.collate_[col] = collate;
    plan.columns_[col].collate = "lists=" + collate.ToString();
  }
  plan.policy_ = policy;
  for (const auto& [name, ops] : transforms) {
    int col = -1;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == name) col = static_cast<int>(i);
    }
    if (col < 0) {
      return MakeError(ErrorKind::kColumnNotFound, "transforms name column '", name,
                       "', which is not among the selected columns");
    }
    if (ops.empty()) continue;
    if ((specs[col].kind != ColumnKind::kTensor && specs[col].kind != ColumnKind::kBytes) ||
        specs[col].text) {  // (text read as bytes: its UTF-8 codes all the same)
      // Ops see a row's bytes: of text (or of the encoded lists of strings), they would
      // be numbers no one meant (Cast('float32') of '1.5' is [49, 46, 53]).
      return MakeError(ErrorKind::kUnsupportedType, "transforms: column '", name, "' (",
                       specs[col].arrow_type, ") holds ",
                       specs[col].kind == ColumnKind::kString ||
                               specs[col].kind == ColumnKind::kBytes ? "text"
                       : specs[col].kind == ColumnKind::kStringList || specs[col].text
                           ? "lists of strings"
                           : "lists of binary values",
                       ", and transforms work on numbers and on encoded bytes (binary "
                       "columns: images, .npy); convert the text when the data is written, or "
                       "in a batch_transform");
    }
    Column c = plan.columns_[col];  // keeps a collate chosen by `lists`
    // Normalize directly followed by ToCHW becomes one op writing channels-first (same
    // values, one pass over the image instead of two); Resize directly followed by
    // CenterCrop computes only the cropped pixels.
    for (size_t i = 0; i < ops.size(); ++i) {
      std::shared_ptr<const Op> fused;
      if (i + 1 < ops.size()) {
        fused = FuseNormalizeToCHW(*ops[i], *ops[i + 1]);
        if (!fused) fused = FuseResizeCenterCrop(ops[i], ops[i + 1]);
      }
      c.ops.push_back(fused ? fused : ops[i]);
      c.positions.push_back(static_cast<int>(i));  // random draws keep the user's numbering
      if (fused) ++i;
    }
    // A final PadOrTruncate is the column's collate step (done during the gather).
    ColumnCollate collate;
    for (size_t i = 0; i < c.ops.size(); ++i) {
      if (!PadOrTruncateParams(*c.ops[i], &collate)) continue;
      if (i + 1 != c.ops.size()) {
        return arrow::Status::Invalid("column '", name,
                                      "': PadOrTruncate must be the last op of its column (it "
                                      "lays out the batch); move the ops after it before it");
      }
      if (!c.collate.empty()) {
        return arrow::Status::Invalid("column '", name, "': give its padding once, by "
                                      "PadOrTruncate or by lists=, not both");
      }
      c.collate = c.ops[i]->ToString();
      c.ops.pop_back();
      c.positions.pop_back();
      plan.collate_[col] = collate;
      if (c.ops.empty() &&
          (specs[col].kind != ColumnKind::kTensor || specs[col].row_shape.empty())) {
        // As lists= refuses it: else the first batch failed, as if the data were wrong.
        return MakeError(ErrorKind::kUnsupportedType, "transforms: column '", name, "' (",
                         specs[col].arrow_type, ") is not a list of numbers, so "
                         "PadOrTruncate alone cannot pad it",
                         specs[col].kind == ColumnKind::kBytes
                             ? " (to pad a binary value's bytes, put Cast('uint8') before it)"
                             : "",
                         "; only list columns (or transformed columns) can be padded");
      }
      if (!c.ops.empty()) {
        // Ops whose output is declared a scalar per row (Cast of a number column): the
        // first batch failed ("padding or ragged output needs a list"), where the ops
        // alone tell it when the Loader is made.
        const auto sig = SignatureOf(specs[col], &c.ops);
        if (sig.ok() && sig->has_value() && (*sig)->shape.has_value() && (*sig)->shape->empty()) {
          return MakeError(ErrorKind::kUnsupportedType, "transforms: column '", name, "' (",
                           specs[col].arrow_type, "): its ops give one number per row, so the "
                           "PadOrTruncate after them cannot pad it; only list columns (or ops "
                           "that give a list or an array per row) can be padded");
        }
      }
    }
    c.first_random = cache_point ? c.ops.size() : 0;
    for (size_t i = 0; i < c.first_random; ++i) {
      if (c.ops[i]->is_random()) c.first_random = i;
    }
    // Let DecodeImage shrink JPEGs (DCT scaling) when a Resize follows directly: to the
    // smallest scale whose shorter side still reaches the target (as PIL's draft mode),
    // which keeps the result within the documented tolerance of a full-size decode
    // followed by the same Resize (docs/design.md, "Transforms").
    for (size_t i = 0; i + 1 < c.ops.size(); ++i) {
      const int64_t target = ResizeTarget(*c.ops[i + 1]);
      if (target <= 0) continue;
      if (auto scaled = WithMinShortSide(*c.ops[i], target)) c.ops[i] = scaled;
    }
    plan.columns_[col] = std::move(c);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    ColumnSpec spec = specs[i];
    auto it = plan.columns_.find(static_cast<int>(i));
    if (it != plan.columns_.end() && !it->second.ops.empty()) {
      spec.kind = ColumnKind::kTensor;
      spec.row_shape.clear();  // known once data is transformed
      spec.transformed = true;
    }
    const auto mode = plan.collate_[i].mode;
    if (mode == ColumnCollate::Mode::kPad && !spec.row_shape.empty()) {
      spec.row_shape[0] = plan.collate_[i].length > 0 ? plan.collate_[i].length : -1;
    }
    plan.output_specs_.push_back(spec);
    plan.output_sources_.emplace_back(static_cast<int>(i), Part::kValues);
    ARROW_ASSIGN_OR_RAISE(auto signature,
                          SignatureOf(specs[i], it != plan.columns_.end() ? &it->second.ops
                                                                          : nullptr));
    plan.signatures_.push_back(std::move(signature));
    plan.slot_bytes_.push_back(mode == ColumnCollate::Mode::kAsIs &&
                                       plan.has_suffix(static_cast<int>(i))
                                   ? FixedBytes(plan.signatures_.back())
                                   : 0);
    if (mode == ColumnCollate::Mode::kAsIs) continue;
    ColumnSpec extra;
    extra.name = spec.name + (mode == ColumnCollate::Mode::kPad ? "_length" : "_offsets");
    if (index_of(extra.name) >= 0) {  // a batch (a dict) would keep one of the two
      return MakeError(ErrorKind::kInvalidData, "two output columns would be named '",
                       extra.name, "': lists= (or PadOrTruncate) adds it beside column '",
                       spec.name, "', and the dataset has a column of that name; leave it "
                       "out with columns=[...]");
    }
    extra.kind = ColumnKind::kTensor;
    extra.dtype = DType::kInt64;
    extra.arrow_type = "int64";
    plan.output_specs_.push_back(extra);
    plan.output_sources_.emplace_back(
        static_cast<int>(i), mode == ColumnCollate::Mode::kPad ? Part::kLength : Part::kOffsets);
  }
  for (const auto& [col, part] : plan.output_sources_) {
    plan.fixed_outputs_.push_back(FixedRowsOf(plan.signatures_[col], plan.collate_[col], part));
  }
  return plan;
}

std::string TransformPlan::Fingerprint() const {
  std::string out;
  for (const auto& [col, c] : columns_) {
    out += std::to_string(col) + ":";
    for (const auto& op : c.ops) out += op->ToString() + ";";
    out += c.collate + "|";
  }
  return out;
}

std::string TransformPlan::PrefixFingerprint() const {
  std::string out;
  for (const auto& [col, c] : columns_) {
    out += std::to_string(col) + ":";
    for (size_t i = 0; i < c.first_random; ++i) out += c.ops[i]->Fingerprint() + ";";
    out += "|";
  }
  return out;
}

arrow::Result<SampleTensor> TransformPlan::RunOps(const Column& c, size_t begin, size_t end,
                                                  SampleTensor s, const SampleContext& ctx) const {
  for (size_t i = begin; i < end; ++i) {
    arrow::Result<SampleTensor> r;
    try {
      r = c.ops[i]->Apply(s, ctx, c.positions[i]);
    } catch (const std::bad_alloc&) {
      // A decoder's or op's own buffer (a std::vector: a PNG's rows, a CMYK JPEG's ink)
      // that memory cannot hold: this sample's error, with its position, as when
      // AllocateSample fails (it was "unexpected exception in worker", not skippable).
      r = arrow::Status::OutOfMemory("cannot allocate the sample's working buffers");
    }
    if (!r.ok()) {
      return arrow::Status(r.status().code(), c.ops[i]->ToString() + ": " + r.status().message(),
                           r.status().detail());
    }
    s = std::move(r).ValueUnsafe();
  }
  return s;
}

arrow::Result<SampleTensor> TransformPlan::ApplySuffix(int col, const ColumnSpec& spec,
                                                       const DecodedUnit& unit, int64_t row,
                                                       const SampleContext& ctx,
                                                       std::shared_ptr<arrow::Buffer> block,
                                                       int64_t offset) const {
  const Column& c = columns_.at(col);
  if (block == nullptr) {
    return RunOps(c, c.first_random, c.ops.size(), RowSample(spec, unit, col, row), ctx);
  }
  SampleSlotScope slot(std::move(block), offset, SlotBytes(col));
  return RunOps(c, c.first_random, c.ops.size(), RowSample(spec, unit, col, row), ctx);
}

int64_t TransformPlan::SlotBytes(int col) const {
  return col >= 0 && col < static_cast<int>(slot_bytes_.size()) ? slot_bytes_[col] : 0;
}

bool TransformPlan::has_suffix(int col) const {
  auto it = columns_.find(col);
  return it != columns_.end() && it->second.first_random < it->second.ops.size();
}

}  // namespace pqloader
