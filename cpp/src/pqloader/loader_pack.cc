// Loader: packing set up (see pack/): its options checked, the documents' lengths read,
// the packed batch's specs made.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "pqloader/error.h"
#include "pqloader/loader.h"
#include "pqloader/loader_internal.h"
#include "pqloader/util/exact_text.h"

namespace pqloader {

namespace {

// Column `name` as a filter's text names it: as it is where it is a Python name (ASCII
// here), else in backticks, a backtick in it doubled (python/pqloader/_filter.py).
std::string FilterName(const std::string& name) {
  static const std::vector<std::string> kKeywords = {
      "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
      "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
      "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
      "return", "try", "while", "with", "yield"};
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  auto word = [&](char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || digit(c);
  };
  if (!name.empty() && !digit(name[0]) && std::all_of(name.begin(), name.end(), word) &&
      std::find(kKeywords.begin(), kKeywords.end(), name) == kKeywords.end()) {
    return name;
  }
  std::string quoted = "`";
  for (char c : name) quoted += c == '`' ? std::string("``") : std::string(1, c);
  return quoted + "`";
}

}  // namespace

arrow::Status Loader::SetUpPacking() {
  const auto& specs = dataset_->specs();
  PackOptions& pack = options_.pack;
  pack.column = -1;
  for (size_t c = 0; c < specs.size(); ++c) {
    if (specs[c].name == options_.pack_column) pack.column = static_cast<int>(c);
  }
  if (pack.column < 0) {
    return MakeError(ErrorKind::kColumnNotFound, "pack names column '", options_.pack_column,
                     "', which is not among the selected columns");
  }
  const ColumnSpec& tokens = specs[pack.column];
  if (tokens.kind != ColumnKind::kTensor || tokens.row_shape.size() != 1 ||
      dataset_->partition_index()[pack.column] >= 0) {
    return MakeError(ErrorKind::kUnsupportedType, "pack: column '", tokens.name, "' (",
                     tokens.arrow_type, ") is not a list of numbers");
  }
  if (pack.seq_len <= 0) return arrow::Status::Invalid("pack needs seq_len > 0");
  if (pack.truncate && pack.has_eos && pack.seq_len < 2) {  // (Python's Pack refuses it too)
    return arrow::Status::Invalid(
        "pack: seq_len=1 with eos and truncate leaves no room for a document's tokens "
        "(a truncated document keeps seq_len - 1 tokens before eos): use seq_len >= 2, or "
        "truncate=false");
  }
  ARROW_RETURN_NOT_OK(CheckPackedBatchFits(options_.plan.batch_size, pack.seq_len, "pack"));
  // As Python's check_value_fits, in its words (a C++ caller has only this): eos=2^40 in
  // int32 tokens was written as -2^31, pad=0.5 as 0, an int64 eos above 2^53 rounded
  // (the packer stores both as doubles).
  auto unfit = [&](const std::string& what, double v) -> arrow::Status {
    if (PadValueFits(tokens.dtype, v) && std::abs(v) <= 9007199254740992.0) {
      return arrow::Status::OK();
    }
    const char* dtype = DTypeName(tokens.dtype);
    if (v != std::floor(v)) {
      return arrow::Status::Invalid(what, " is not a whole number, but column '", tokens.name,
                                    "' is ", dtype);
    }
    // An integer dtype: within it, past 2^53. (int64's largest, 2^63 - 1, is 2^63 as a
    // double: "does not fit column (int64)" was said of it.)
    const bool wide = (tokens.dtype == DType::kInt64 && std::abs(v) <= 9223372036854775808.0) ||
                      (tokens.dtype == DType::kUInt64 && v >= 0 && v <= 18446744073709551616.0);
    if (PadValueFits(tokens.dtype, v) || wide) {
      return arrow::Status::Invalid(what, ": values beyond 2**53 are not exact in column '",
                                    tokens.name, "'");
    }
    return arrow::Status::Invalid(what, " does not fit column '", tokens.name, "' (", dtype, ")");
  };
  if (pack.has_eos) {
    const std::string what = "Pack(eos=" + std::to_string(pack.eos) + ")";
    ARROW_RETURN_NOT_OK(unfit(what, static_cast<double>(pack.eos)));
    // unfit sees the eos as a double: 2^53 + 1 was 2^53 there, passed, and was written as
    // 2^53; 2049 in float16 tokens passed and was written as 2048 (the packer stores it
    // through a double in the column's dtype). The token written must be the one given.
    constexpr int64_t kExact = int64_t{1} << 53;
    if (pack.eos > kExact || pack.eos < -kExact) {
      return arrow::Status::Invalid(what, ": values beyond 2**53 are not exact in column '",
                                    tokens.name, "'");
    }
    uint8_t stored[8] = {};
    StoreScalar(tokens.dtype, static_cast<double>(pack.eos), stored);
    if (LoadScalar(tokens.dtype, stored) != static_cast<double>(pack.eos)) {
      return arrow::Status::Invalid(what, " is not exact in column '", tokens.name, "' (",
                                    DTypeName(tokens.dtype), ": it would be ",
                                    ExactText(LoadScalar(tokens.dtype, stored)), ")");
    }
  }
  if (tokens.dtype != DType::kFloat16 && tokens.dtype != DType::kFloat32 &&
      tokens.dtype != DType::kFloat64) {
    ARROW_RETURN_NOT_OK(unfit("Pack(pad=" + ExactText(pack.pad_value) + ")", pack.pad_value));
  } else if (!PadValueFits(tokens.dtype, pack.pad_value)) {
    return arrow::Status::Invalid("Pack(pad=", ExactText(pack.pad_value), ") overflows column '",
                                  tokens.name, "' (", DTypeName(tokens.dtype), ")");
  }
  if (!options_.transforms.empty() || !options_.lists.empty()) {
    return arrow::Status::Invalid("pack cannot be combined with transforms or lists");
  }
  packed_specs_ = {tokens};
  packed_specs_[0].row_shape = {pack.seq_len};
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, DType>>{
           {"position_ids", DType::kInt64}, {"document_ids", DType::kInt64},
           {"loss_mask", DType::kBool}, {"cu_seqlens", DType::kInt32}}) {
    ColumnSpec s;
    s.name = name;
    s.dtype = dtype;
    s.arrow_type = DTypeName(dtype);
    if (name != "cu_seqlens") s.row_shape = {pack.seq_len};
    packed_specs_.push_back(s);
  }
  for (size_t c = 0; c < specs.size(); ++c) {
    if (static_cast<int>(c) == pack.column) continue;
    for (const auto& out : packed_specs_) {
      if (out.name == specs[c].name) {
        return arrow::Status::Invalid("pack: column '", specs[c].name,
                                      "' has the name of one of packing's outputs; rename it");
      }
    }
    if (specs[c].kind != ColumnKind::kTensor || !specs[c].row_shape.empty()) {
      return MakeError(ErrorKind::kUnsupportedType, "pack: column '", specs[c].name, "' (",
                       specs[c].arrow_type, ") cannot follow packed tokens; with pack, the other "
                       "selected columns must be numbers (one per document, copied per token)");
    }
    pack_companions_.push_back(static_cast<int>(c));
    ColumnSpec s = specs[c];
    s.row_shape = {pack.seq_len};
    packed_specs_.push_back(s);
  }
  read_options_.allow_ragged[pack.column] = true;
  const NullFill& fill = read_options_.fills[pack.column];
  const std::string& name = specs[pack.column].name;
  std::string remedy = "a null document: pass fill_null={'" + name +
                       "': 0} to pack null documents as empty ones (they add no tokens)";
  // A filter that drops them, written as a filter names the column ("my-tokens is not
  // None" did not parse); none for a struct's field, which no filter names.
  const auto& files = dataset_->files();
  const bool field = std::any_of(files.begin(), files.end(), [&](const DataFile& f) {
    return !f.columns[pack.column].path.empty();
  });
  if (!field) remedy += ", or filter them out (filter=\"" + FilterName(name) + " is not None\")";
  // Kept in cache_dir (lengths/): read once per file and node, not at every start.
  ARROW_ASSIGN_OR_RAISE(lengths_, DocumentLengths::Read(*dataset_, pack.column,
                                                        fill.enabled && !fill.rows_only, remedy,
                                                        options_.num_workers, pool_,
                                                        options_.cancel, options_.cache.dir));
  return arrow::Status::OK();
}

}  // namespace pqloader
