// DocumentLengths: the number of tokens of every row (document) of a list column, read
// once before the first epoch, so that packing can be planned as a pure function of
// (data, options, seed, epoch, rank): which rows fill which block, and how many blocks
// each rank gets, are known before any block is made.
//
// Reading them is one pass over that column alone (its values are decoded, as Parquet
// stores lengths only as repetition levels), in parallel over row groups. The same pass
// gives `pqloader inspect --lengths` its statistics (SummarizeLengths).
// Thread-safety: immutable after Read(); shareable. SummarizeLengths is a pure function.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/dataset/dataset.h"
#include "pqloader/pack/checkpointed_sums.h"

namespace pqloader {

class DocumentLengths {
 public:
  /// Read the row lengths of list column `column` (an index into dataset.specs()) of
  /// every split, with `threads` threads. A null row is an error naming it (and
  /// `null_remedy`, if not empty), unless the split's filter drops it or `null_is_empty`
  /// (a fill: an empty document, length 0). Errors name the file and row group;
  /// Cancelled once `cancel` is set. With `store_dir` (a cache directory), each file's
  /// lengths are taken from it where it has them (pack/length_store.h) and kept there
  /// once read; one process of a node reads what it lacks while the others wait.
  static arrow::Result<std::shared_ptr<const DocumentLengths>> Read(
      const Dataset& dataset, int column, bool null_is_empty, const std::string& null_remedy,
      int threads, arrow::MemoryPool* pool, const CancelFlag& cancel = nullptr,
      const std::string& store_dir = "");

  /// Tokens of rows [begin, end) of split `split`, summed.
  int64_t Sum(int64_t split, int64_t begin, int64_t end) const {
    return lengths_.Sum(first_[split] + begin, first_[split] + end);
  }
  /// Tokens of row `row` of split `split`.
  int64_t Length(int64_t split, int64_t row) const { return lengths_[first_[split] + row]; }
  /// Every row's length, split after split.
  const std::vector<int32_t>& lengths() const { return lengths_.values(); }
  /// Null rows (with `null_is_empty`: each an empty document, length 0), and the rows of
  /// files that lack the column.
  int64_t null_rows() const { return null_rows_; }
  /// Files whose lengths all came from `store_dir`, and files whose lengths were stored
  /// there by this read.
  int64_t files_from_store() const { return files_from_store_; }
  int64_t files_stored() const { return files_stored_; }
  /// Why lengths could not be stored (the first failure: a full or read-only disk),
  /// or "": they are read from the source again next time.
  const std::string& store_error() const { return store_error_; }

 private:
  int64_t null_rows_ = 0;
  int64_t files_from_store_ = 0;
  int64_t files_stored_ = 0;
  std::string store_error_;
  // All rows, split after split. Every rank holds every row's length (a pack plan sums
  // any rank's rows): 4.125 bytes a document with checkpointed sums, 12 with a prefix sum
  // per row (10^9 documents: 4.1 GB, not 12 GB).
  CheckpointedSums<int32_t> lengths_;
  std::vector<int64_t> first_;  // index in lengths_ of each split's first row
};

/// What `pqloader inspect --lengths` shows of a list column: its rows' lengths.
struct LengthStats {
  /// Rows (documents) summarized.
  int64_t rows = 0;
  /// Values of all rows together (tokens of a token column).
  int64_t total = 0;
  /// Shortest and longest row, in values; 0 without rows.
  int32_t min = 0;
  int32_t max = 0;
  /// The median and the 99th percentile of the lengths, each a length that occurs: the
  /// lower order statistic, at index floor(q * (rows - 1)) of the sorted lengths (NumPy's
  /// percentile(method="lower"), Arrow's quantile(interpolation="lower")). 0 without rows.
  int32_t median = 0;
  int32_t p99 = 0;
};

/// Summarize the row lengths `lengths` (in any order).
LengthStats SummarizeLengths(const std::vector<int32_t>& lengths);

}  // namespace pqloader
