// What the footers tell about a column before any data page is read: its nulls (from
// the statistics' null counts, or the definition-level histograms Arrow writes as
// size statistics), whether a list column's rows have one length (from the values per
// row of each row group), whether a partition key stored in the files agrees with the
// path, and whether an integer column a declared float loads holds a value the float
// does not (the statistics' min/max). Used to refuse a dataset when the Loader is made rather than in the middle
// of an epoch. Footers can prove a problem but not always its absence: what they cannot
// tell is checked when the row group is decoded. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <arrow/status.h>

#include "pqloader/dataset/dataset.h"

namespace pqloader {

/// Null values of output column `column` in each file (null rows, and null elements of
/// a list), over the row groups in `splits`; -1 for a file whose footers cannot tell.
std::vector<int64_t> NullsFromFooters(const std::vector<DataFile>& files,
                                      const std::vector<Split>& splits, int column,
                                      int partition_key);

/// What the footers say about the lengths of a list column's rows.
struct ListLayout {
  enum class Lengths { kUnknown, kUniform, kRagged };
  Lengths lengths = Lengths::kUnknown;
  /// kUniform: values per row (leaf values, so a list of fixed-size lists counts each).
  int64_t values_per_row = -1;
  /// kRagged: why, naming the file(s) and row group(s).
  std::string evidence;
  /// kUnknown: the values per row that the row groups whose footers tell agree on (0
  /// where every row group tells and none holds a row that is not null), -1 where none
  /// tells. Where the data has one length, it is that length.
  int64_t known_values_per_row = -1;
};

/// Return whether the rows of list column `column` have one length, as far as the
/// footers tell (kUnknown when they cannot; kUniform means every row group holds the
/// same whole number of values per row, which one length needs but does not prove).
ListLayout ListLayoutFromFooters(const std::vector<DataFile>& files,
                                 const std::vector<Split>& splits, int column);

/// Refuse, naming the files, columns and counts and what to do: a column with nulls
/// where `null_policy[c]` is false (no fill_null, no null_mask); a list column whose
/// rows differ in length where `ragged_ok[c]` is false (no lists=, transforms or pack);
/// a partition key stored in the files whose statistics disagree with the path; a null
/// inside a list of a column whose policy only flags null rows (`rows_only[c]`: a
/// null_mask without fill_null).
arrow::Status CheckColumnsFromFooters(const Dataset& dataset,
                                      const std::vector<bool>& null_policy,
                                      const std::vector<bool>& ragged_ok,
                                      const std::vector<bool>& rows_only = {});

/// For a list column of one length per row: that length where the footers show it,
/// from the row groups of `all_splits` (every one, before a filter restricted them: a null
/// list's length must not depend on which rows a filter keeps), else of the dataset's own
/// splits, else the length of the row groups whose footers tell (ListLayout::
/// known_values_per_row); -1 where none tells or the column is not a list (of scalars or
/// of fixed-size lists: the length counts their elements).
int64_t ListLengthFromFooters(const Dataset& dataset, const std::vector<Split>& all_splits, int column);

/// Refuse a partition key stored in the files whose statistics disagree with the path
/// (CheckColumnsFromFooters' check alone), selected or among `named` (a filter's columns),
/// over every split: run before a filter restricts the splits (one that pruned the
/// disagreeing row groups by those statistics hid the disagreement).
arrow::Status CheckStoredKeys(const Dataset& dataset, const std::vector<std::string>& named = {});

}  // namespace pqloader
