// Column transform pipelines: which ops run before the cache point, which after.
//
// Each column's ops are split at the first random op: the deterministic prefix runs
// once per unit in ReadUnit's worker task (its output is what a cache would keep), the
// suffix runs per sample while a batch is assembled, keyed by (seed, epoch, global
// sample index, op position). A final PadOrTruncate is not an op of either: it is the
// column's collate step, done while the batch is gathered (straight into the batch,
// no per-sample buffer). Thread-safety: immutable after Make(); Apply* may run
// concurrently.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pqloader/tensor/batch.h"
#include "pqloader/transform/op.h"

namespace pqloader {

/// How a failing transform is handled.
enum class DecodeErrorPolicy {
  kRaise,  ///< The error reaches the consumer, naming file, row group, row and column.
  kSkip,   ///< The row is dropped from its batch and counted.
};

class TransformPlan {
 public:
  /// Build the plan for columns `specs` from per-column op lists (column name → ops).
  /// Without a `cache_point` (no cache to fill), every op runs per sample while its
  /// batch is assembled: nothing is held per unit that a cache would not keep, and each
  /// sample goes from decode to batch while it is in the CPU caches.
  /// `lists` chooses how a column's rows of varying first dimension are collated
  /// (ragged, padded; a final PadOrTruncate op is the same as a fixed-length pad).
  static arrow::Result<TransformPlan> Make(
      const std::vector<ColumnSpec>& specs,
      const std::map<std::string, std::vector<std::shared_ptr<const Op>>>& transforms,
      DecodeErrorPolicy policy, bool cache_point = true,
      const std::map<std::string, ColumnCollate>& lists = {});

  /// What an output column holds of its input column.
  enum class Part : uint8_t {
    kValues,   ///< The column itself.
    kLength,   ///< "<name>_length": each row's valid length (padded columns).
    kOffsets,  ///< "<name>_offsets": row offsets along the first dimension (ragged).
  };

  bool empty() const { return columns_.empty(); }
  DecodeErrorPolicy policy() const { return policy_; }
  /// Output columns: the input specs (transformed ones become tensors), each followed by
  /// "<name>_length" (int64) when it is padded, or "<name>_offsets" when ragged.
  const std::vector<ColumnSpec>& output_specs() const { return output_specs_; }
  /// For each output column: the input column it comes from, and which part of it.
  const std::vector<std::pair<int, Part>>& output_sources() const { return output_sources_; }
  /// The dtype and row shape every row of an output column has, known before any data.
  using FixedRows = pqloader::FixedRows;
  /// For each output column, its FixedRows where every row has them: numbers and
  /// fixed-size lists, ops whose output signature fixes dtype and shape, rows padded or
  /// truncated to a fixed length and their lengths; unset where they depend on the data
  /// (strings, bytes, ragged lists, padding to a batch's longest row, and their offsets).
  const std::vector<std::optional<FixedRows>>& fixed_outputs() const { return fixed_outputs_; }
  /// A stable description of every op, for state fingerprints.
  std::string Fingerprint() const;
  /// A stable description of the ops before the cache point, for cache keys.
  std::string PrefixFingerprint() const;

  /// Run the deterministic prefixes on every row of `unit`. `where(row)` names the row
  /// for error messages.
  template <typename WhereFn>
  arrow::Status ApplyPrefix(DecodedUnit* unit, const std::vector<ColumnSpec>& specs,
                            WhereFn&& where) const;

  /// Run the suffix of column `col` on one row and return its output sample. With a
  /// `block`, an output of SlotBytes(col) bytes is written into it at `offset` (see
  /// SampleSlotScope) rather than into memory of its own.
  arrow::Result<SampleTensor> ApplySuffix(int col, const ColumnSpec& spec,
                                          const DecodedUnit& unit, int64_t row,
                                          const SampleContext& ctx,
                                          std::shared_ptr<arrow::Buffer> block = nullptr,
                                          int64_t offset = 0) const;
  /// The bytes of every output row of column `col`'s suffix where its signature fixes
  /// them and the rows are batched as they are (so a batch column is n of them, one
  /// after another); 0 otherwise.
  int64_t SlotBytes(int col) const;

  /// Whether column `col` (input index) has transforms (ops or a collate step): its
  /// list rows may then differ in length when decoded.
  bool transforms_column(int col) const { return columns_.count(col) > 0; }
  /// Whether column `col` has ops after the cache point (run per sample).
  bool has_suffix(int col) const;
  /// How each input column is collated (may be empty: all as they are).
  const std::vector<ColumnCollate>& collate() const { return collate_; }
  /// What each input column's rows are before any data (see SampleSignature): its ops'
  /// output for a transformed column, its spec for another tensor column, unset for
  /// string and bytes columns (they stay lists). For AssembleBatch.
  const std::vector<std::optional<SampleSignature>>& signatures() const { return signatures_; }

 private:
  struct Column {
    std::vector<std::shared_ptr<const Op>> ops;
    std::vector<int> positions;  // each op's index in the user's list (RNG key)
    size_t first_random = 0;  // ops [0, first_random) run before the cache point
    std::string collate;      // how its rows are collated, if not as they are (fingerprints)
  };

  arrow::Result<SampleTensor> RunOps(const Column& c, size_t begin, size_t end, SampleTensor s,
                                     const SampleContext& ctx) const;

  std::map<int, Column> columns_;
  std::vector<ColumnCollate> collate_;
  std::vector<std::optional<SampleSignature>> signatures_;
  std::vector<int64_t> slot_bytes_;  // SlotBytes per input column, fixed at Make
  DecodeErrorPolicy policy_ = DecodeErrorPolicy::kRaise;
  std::vector<ColumnSpec> output_specs_;
  std::vector<std::pair<int, Part>> output_sources_;
  std::vector<std::optional<FixedRows>> fixed_outputs_;
};

/// View row `row` of column `col` of a decoded unit as a sample (no copy), also where the
/// column is in the unit's row-major block.
SampleTensor RowSample(const ColumnSpec& spec, const DecodedUnit& unit, int col, int64_t row);

/// Whether row `row` of column `col` is null, where null_mask= gave the column its
/// "<name>_valid" column (the spec after it); false where it has none, or its bytes are
/// not at hand (a window's deferred column).
bool MaskedNull(const std::vector<ColumnSpec>& specs, const DecodedUnit& unit, int col,
                int64_t row);
/// The error for a null row whose fill its ops could not take (`failed`): never skipped
/// by on_decode_error="skip", a null being no corrupt value.
arrow::Status NullFillError(const std::string& where, const ColumnSpec& spec,
                            const arrow::Status& failed);

template <typename WhereFn>
arrow::Status TransformPlan::ApplyPrefix(DecodedUnit* unit, const std::vector<ColumnSpec>& specs,
                                         WhereFn&& where) const {
  const SampleContext no_randomness;  // deterministic ops draw nothing
  for (const auto& [col, c] : columns_) {
    if (c.first_random == 0) continue;
    ColumnData& data = unit->columns[col];
    std::vector<SampleTensor> out(unit->num_rows);
    for (int64_t r = 0; r < unit->num_rows; ++r) {
      if (!unit->row_ok.empty() && !unit->row_ok[r]) continue;
      auto result = RunOps(c, 0, c.first_random, RowSample(specs[col], *unit, col, r), no_randomness);
      if (!result.ok()) {
        if (MaskedNull(specs, *unit, col, r)) return NullFillError(where(r), specs[col], result.status());
        if (policy_ == DecodeErrorPolicy::kSkip) {
          if (unit->row_ok.empty()) unit->row_ok.assign(unit->num_rows, 1);
          unit->row_ok[r] = 0;
          ++unit->skipped_rows;
          continue;
        }
        return arrow::Status(result.status().code(),
                             where(r) + ", column '" + specs[col].name + "': " +
                                 result.status().message(),
                             result.status().detail());
      }
      out[r] = std::move(result).ValueUnsafe();
    }
    data.samples = std::move(out);
    // The encoded input is no longer needed.
    data.data.reset();
    data.offsets.reset();
  }
  return arrow::Status::OK();
}

}  // namespace pqloader
