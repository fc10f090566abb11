#include "pqloader/tensor/stack.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "pqloader/error.h"
#include "pqloader/tensor/group_rows.h"

namespace pqloader {

namespace {

// Rows [r0, n) of columns [c0, k), W bytes each, one value at a time.
template <int W>
void StackTail(const uint8_t* const* cols, int64_t k, int64_t c0, int64_t r0, int64_t n,
               uint8_t* out) {
  for (int64_t r = r0; r < n; ++r) {
    for (int64_t c = c0; c < k; ++c) std::memcpy(out + (r * k + c) * W, cols[c] + r * W, W);
  }
}

// Columns in groups of K = kGroupBytes / W: each block of K rows x K columns one K x K
// transpose (group_rows.h), the rest value by value.
template <int W>
__attribute__((target("avx2"))) void StackAvx2(const uint8_t* const* cols, int64_t k, int64_t n,
                                               uint8_t* out) {
  constexpr int64_t K = kGroupBytes / W;
  const int64_t stride = k * W;
  const int64_t groups = k / K, rows = n - n % K;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* src[K];
    uint8_t* dst[K];
    for (int64_t r = 0; r < rows; r += K) {
      for (int64_t j = 0; j < K; ++j) {
        src[j] = cols[g * K + j] + r * W;
        dst[j] = out + (r + j) * stride + g * kGroupBytes;
      }
      TransposeBlock<W>(src, dst);
    }
  }
  StackTail<W>(cols, k, 0, rows, n, out);           // the last rows, every column
  StackTail<W>(cols, k, groups * K, 0, rows, out);  // the other rows' last columns
}

}  // namespace

void StackRows(const uint8_t* const* cols, int64_t k, int64_t n, int64_t row_bytes, uint8_t* out) {
  if (HasAvx2() && row_bytes == 4 && k >= kGroupBytes / 4) return StackAvx2<4>(cols, k, n, out);
  if (HasAvx2() && row_bytes == 8 && k >= kGroupBytes / 8) return StackAvx2<8>(cols, k, n, out);
  switch (row_bytes) {
    case 1: return StackTail<1>(cols, k, 0, 0, n, out);
    case 2: return StackTail<2>(cols, k, 0, 0, n, out);
    case 4: return StackTail<4>(cols, k, 0, 0, n, out);
    case 8: return StackTail<8>(cols, k, 0, 0, n, out);
    default:
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          std::memcpy(out + (r * k + c) * row_bytes, cols[c] + r * row_bytes, row_bytes);
        }
      }
  }
}

arrow::Result<StackPlan> StackPlan::Make(const std::vector<ColumnSpec>& specs,
                                         const std::vector<std::optional<FixedRows>>& fixed,
                                         const std::vector<StackSpec>& stacks) {
  std::map<std::string, int> index;
  for (size_t c = 0; c < specs.size(); ++c) index.emplace(specs[c].name, static_cast<int>(c));
  std::map<int, std::string> member_of;  // column -> its stack's name
  std::map<int, int> first_of;           // earliest member -> its stack (index in `stacks`)
  std::set<std::string> names;
  std::vector<Stacked> made(stacks.size());
  for (size_t s = 0; s < stacks.size(); ++s) {
    const StackSpec& stack = stacks[s];
    const std::string what = "stack '" + stack.name + "'";
    if (stack.name.empty()) return arrow::Status::Invalid("stack: a stacked column needs a name");
    if (!names.insert(stack.name).second) {
      return arrow::Status::Invalid(what, ": two stacks have this name");
    }
    if (stack.columns.empty()) return arrow::Status::Invalid(what, ": no columns to stack");
    Stacked& out = made[s];
    for (const std::string& name : stack.columns) {
      const auto it = index.find(name);
      if (it == index.end()) {
        return MakeError(ErrorKind::kColumnNotFound, what, ": names column '", name,
                         "', which is not among the selected columns");
      }
      const int c = it->second;
      if (const auto seen = member_of.find(c); seen != member_of.end()) {
        return arrow::Status::Invalid(what, ": column '", name, "' is already in ",
                                      seen->second == stack.name ? "this stack"
                                                                 : "stack '" + seen->second + "'");
      }
      member_of.emplace(c, stack.name);
      const ColumnSpec& spec = specs[c];
      const std::optional<FixedRows>& rows = c < static_cast<int>(fixed.size()) ? fixed[c] : std::nullopt;
      if (spec.kind != ColumnKind::kTensor || !rows.has_value()) {
        return arrow::Status::Invalid(
            what, ": column '", name, "' ",
            spec.kind != ColumnKind::kTensor
                ? "holds strings or bytes"
                : "has rows whose shape or dtype depends on the data (a list of varying "
                  "length, a ragged or batch-padded column, or a transform without a fixed "
                  "output)",
            "; only numbers of one dtype and row shape can be stacked");
      }
      if (out.members.empty()) {
        out.dtype = rows->dtype;
        out.row_shape = rows->shape;
        out.row_bytes = rows->bytes();
      } else if (rows->dtype != out.dtype || rows->shape != out.row_shape) {
        const std::string& first = specs[out.members.front()].name;
        return arrow::Status::Invalid(what, ": column '", name, "' is ", DTypeName(rows->dtype),
                                      " with rows of shape ", ShapeToString(rows->shape), ", column '",
                                      first, "' ", DTypeName(out.dtype), " with rows of shape ",
                                      ShapeToString(out.row_shape),
                                      "; stacked columns must share both (Cast one first)");
      }
      out.members.push_back(c);
    }
    first_of.emplace(*std::min_element(out.members.begin(), out.members.end()), static_cast<int>(s));
  }
  for (size_t s = 0; s < stacks.size(); ++s) {
    const auto it = index.find(stacks[s].name);
    if (it != index.end() && member_of.count(it->second) == 0) {
      return arrow::Status::Invalid("stack '", stacks[s].name,
                                    "': the name of an output column that is not one of its "
                                    "members (the batch would have two columns of that name)");
    }
    if (it != index.end() && member_of.at(it->second) != stacks[s].name) {
      return arrow::Status::Invalid("stack '", stacks[s].name, "': the name of a member of stack '",
                                    member_of.at(it->second), "'");
    }
  }
  StackPlan plan;
  for (size_t c = 0; c < specs.size(); ++c) {
    const int ci = static_cast<int>(c);
    if (const auto first = first_of.find(ci); first != first_of.end()) {
      const Stacked& st = made[first->second];
      ColumnSpec spec;
      spec.name = stacks[first->second].name;
      spec.kind = ColumnKind::kTensor;
      spec.dtype = st.dtype;
      spec.row_shape = {static_cast<int64_t>(st.members.size())};
      spec.row_shape.insert(spec.row_shape.end(), st.row_shape.begin(), st.row_shape.end());
      spec.arrow_type = "stack of " + std::to_string(st.members.size()) + " columns";
      plan.specs_.push_back(std::move(spec));
      plan.sources_.push_back(-1);
      plan.stacked_.push_back(st);
    } else if (member_of.count(ci) == 0) {
      plan.specs_.push_back(specs[c]);
      plan.sources_.push_back(ci);
    }
  }
  // A "<name>_valid" mask follows its column: a stacked member's mask marks the stack.
  std::vector<int> where(specs.size(), -1);
  for (size_t o = 0, s = 0; o < plan.specs_.size(); ++o) {
    if (plan.sources_[o] >= 0) {
      where[plan.sources_[o]] = static_cast<int>(o);
    } else {
      for (int m : plan.stacked_[s++].members) where[m] = static_cast<int>(o);
    }
  }
  for (size_t o = 0; o < plan.specs_.size(); ++o) {
    int& mask_of = plan.specs_[o].mask_of;
    if (mask_of >= 0) mask_of = mask_of < static_cast<int>(where.size()) ? where[mask_of] : -1;
  }
  return plan;
}

arrow::Result<std::shared_ptr<Batch>> StackPlan::Apply(std::shared_ptr<Batch> batch,
                                                       arrow::MemoryPool* pool) const {
  const int64_t n = batch->num_rows;
  std::vector<BatchColumn> columns;
  columns.reserve(specs_.size());
  for (size_t o = 0, s = 0; o < specs_.size(); ++o) {
    if (sources_[o] >= 0) {
      columns.push_back(std::move(batch->columns[sources_[o]]));
      continue;
    }
    const Stacked& st = stacked_[s++];
    const int64_t k = static_cast<int64_t>(st.members.size());
    std::vector<int64_t> member_shape = {n};
    member_shape.insert(member_shape.end(), st.row_shape.begin(), st.row_shape.end());
    std::vector<const uint8_t*> cols;
    for (int m : st.members) {
      const BatchColumn& c = batch->columns[m];
      if (c.kind != ColumnKind::kTensor || c.dtype != st.dtype || c.shape != member_shape ||
          (n > 0 && (c.data == nullptr || c.data->size() < n * st.row_bytes))) {
        return arrow::Status::Invalid("stack '", specs_[o].name, "': column ", m,
                                      " of the batch is not ", DTypeName(st.dtype), " of shape ",
                                      ShapeToString(member_shape));
      }
      cols.push_back(n > 0 ? c.data->data() : nullptr);
    }
    BatchColumn out;
    out.kind = ColumnKind::kTensor;
    out.dtype = st.dtype;
    out.shape = {n, k};
    out.shape.insert(out.shape.end(), st.row_shape.begin(), st.row_shape.end());
    ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> block,
                          arrow::AllocateBuffer(n * k * st.row_bytes, pool));
    if (n > 0) StackRows(cols.data(), k, n, st.row_bytes, block->mutable_data());
    batch->owned_bytes += block->size();
    out.data = std::move(block);
    columns.push_back(std::move(out));
  }
  batch->columns = std::move(columns);
  return batch;
}

}  // namespace pqloader
