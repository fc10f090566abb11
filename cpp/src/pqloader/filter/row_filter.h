// Row filters pushed down to Parquet: which row groups, and which of their rows, a
// Loader reads.
//
// A filter is an Arrow compute expression (pyarrow's `pc.field("lang") == "en"`), and
// optionally a predicate (a callable on whole Arrow record batches of some columns, e.g.
// from Python). EvaluateFilter decides in three stages, each only for what the one before
// left undecided:
//   1. partition keys (hive `key=value` directories) prune whole files;
//   2. row-group statistics (min, max, null count in the footers) prune row groups, or
//      show that every row of a row group passes;
//   3. the remaining row groups are read, the filter's columns only, and get a row mask.
// The result (RowSelection) is a pure function of the data and the filter: applied to the
// Dataset (ApplySelection) before the plan is made, so the plan, sharding and resume stay
// functions of (data, filter, options, seed, epoch, rank). Rows whose filter value is null
// are dropped, as pyarrow's `dataset.to_table(filter=...)` drops them.
//
// Thread-safety: EvaluateFilter runs its own threads and may call `predicate` from
// several of them at once.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <arrow/chunked_array.h>
#include <arrow/compute/expression.h>
#include <arrow/record_batch.h>
#include <arrow/result.h>

#include "pqloader/dataset/dataset.h"

namespace pqloader {

/// A predicate on whole record batches: one boolean per row (null counts as false).
/// A Cancelled status (the caller was interrupted) is returned as it is, without the
/// file and row group other errors are given.
using BatchPredicate = std::function<arrow::Result<std::shared_ptr<arrow::Array>>(
    const std::shared_ptr<arrow::RecordBatch>&)>;

struct FilterOptions {
  /// The filter, as arrow::compute::Serialize writes it (what pyarrow's
  /// `Expression.__reduce__` carries). Empty: no expression.
  std::string serialized_expression;
  /// A predicate on the columns `predicate_columns` (top-level columns or partition
  /// keys), ANDed with the expression; it is opaque, so it has no statistics stage.
  /// Default: none.
  BatchPredicate predicate;
  std::vector<std::string> predicate_columns;
  /// Threads of the mask pass. Default: 0, one per CPU the process may use (AvailableCpus).
  int threads = 0;
  /// Directory where the selection of an expression (not of a predicate, whose code has
  /// no identity) is kept, keyed by the expression and the files' identities, so that
  /// the mask pass runs once per (files, expression). Default: empty (not kept).
  std::string store_dir;
  /// Set to stop the mask pass (and the wait for another process's) early: Cancelled.
  /// Default: none.
  CancelFlag cancel;
  /// Verify the page checksums of the filter's columns (the Loader's verify_checksums);
  /// part of the stored selection's key. Default: false.
  bool verify_checksums = false;

  bool enabled() const { return !serialized_expression.empty() || predicate != nullptr; }
};

/// What each stage pruned or read.
struct FilterStats {
  int64_t files = 0;                    ///< Files before filtering.
  int64_t files_pruned = 0;             ///< By partition keys.
  int64_t row_groups = 0;               ///< Row groups before filtering.
  int64_t row_groups_pruned_partition = 0;
  int64_t row_groups_pruned_statistics = 0;
  int64_t row_groups_all_rows = 0;      ///< Kept whole (partition keys show every row passes).
  int64_t row_groups_masked = 0;        ///< Read for a row mask (stage 3).
  int64_t row_groups_pruned_mask = 0;   ///< Of those, no row passed.
  int64_t rows = 0;                     ///< Rows before filtering.
  int64_t rows_kept = 0;
  int64_t bytes = 0;            ///< Compressed bytes of the selected columns, before filtering.
  int64_t bytes_pruned = 0;     ///< Of those, in row groups pruned (never read for the batches).
  int64_t mask_bytes_read = 0;  ///< Compressed bytes of the filter columns read by the mask pass.
  bool from_store = false;      ///< The selection came from FilterOptions::store_dir.
  /// Why the selection could not be saved into FilterOptions::store_dir (a full or
  /// read-only disk), empty if it was (or there is no store): the Loader counts it as a
  /// cache write error and warns (it was dropped silently). Not stored.
  std::string store_error;
};

/// Per split of the dataset (in split order): kept or not, and which rows.
struct RowSelection {
  enum class Stage : uint8_t { kAll = 0, kPartition = 1, kStatistics = 2, kMask = 3, kMasked = 4 };
  /// Why each split is kept or pruned: kAll (kept whole), kPartition / kStatistics /
  /// kMask (pruned there), kMasked (kept, rows in `rows`).
  std::vector<Stage> stage;
  /// For kMasked splits: the kept rows (ascending row indices within the row group).
  std::vector<std::shared_ptr<const std::vector<int32_t>>> rows;
  FilterStats stats;
};

/// Evaluate `options`' filter over every split of `dataset`. Errors name the file, row
/// group and column: a column the filter names that no file has (kColumnNotFound), an
/// expression that does not bind to the columns' types, a row group that cannot be read.
arrow::Result<RowSelection> EvaluateFilter(const Dataset& dataset, const FilterOptions& options);

/// Restrict `dataset` to the rows `selection` keeps (splits pruned, masked splits given
/// their rows). For a dataset not yet shared (the Loader does it before planning).
void ApplySelection(const RowSelection& selection, Dataset* dataset);

/// The chunks of filter column `column` of one row group as one array (the filter and
/// the predicate see a row group's rows at once). Where its type's 32-bit offsets cannot
/// index them (a string or binary column of more than `max_offset` bytes in the row
/// group, a list or map of more than `max_offset` values; 2^31 - 1), an InvalidData error
/// naming the column, `where` and the limit (Arrow's "offset overflow while concatenating
/// arrays" named neither); other failures name the column and `where` too.
arrow::Result<std::shared_ptr<arrow::Array>> ConcatenateFilterColumn(
    const arrow::ChunkedArray& chunked, const std::string& column, const std::string& where,
    int64_t max_offset = std::numeric_limits<int32_t>::max());

/// A short identity of a split's kept rows for cache keys ("" for all rows).
std::string SelectionFingerprint(const Split& split);

/// `serialized_expression` as the engine's Arrow serializes it (Serialize of its
/// Deserialize): one value for an expression whichever pyarrow wrote it (pyarrow 14's
/// bytes differ from 25's for every expression); the input where it does not read.
std::string CanonicalExpression(const std::string& serialized_expression);

/// `serialized_expression` with the value set of every `is_in` sorted and without
/// duplicates (as the engine's Arrow serializes it): the same rows, whatever order the
/// caller's set was iterated in (`pc.field("lang").isin({"en", "de"})` takes a Python
/// set's order, another per process for strings: a state saved in one process was refused
/// in the next, and a kept selection recomputed). `index_in` keeps its order (its result
/// is the position). The input where it does not read.
std::string SortedValueSets(const std::string& serialized_expression);

/// A human-readable form of a serialized expression (for messages), or "".
std::string DescribeExpression(const std::string& serialized_expression);

/// Whether an is_in / index_in value set of strings or binaries holds a value with '"', a
/// line break or '\': DescribeExpression prints such sets one unescaped value a line, so
/// `["a\",\n  \"b"]` reads as two values.
bool ValueSetPrintsAmbiguously(const std::string& serialized_expression);

/// The types of the expression's literals whose text in
/// DescribeExpression can stand for another value, comma-separated and sorted, or "":
/// float16 and float32 print as their shortest decimal (float32 0.1 as a double 0.1
/// prints), binaries as hex (b"s1" as the string "7331"), integers but int64 by their
/// value only (uint8 arithmetic wraps where int64's does not; a uint64 past int64 is no
/// other type's), a double of a whole value as that integer (`x / 2.0` as `x / 2`), a
/// duration as its count (the unit left out), a date64 with a time of day as its day.
std::string AmbiguousLiteralTypes(const std::string& serialized_expression);

}  // namespace pqloader
