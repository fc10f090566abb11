// DocumentLengths: the number of tokens of every row (document) of a list column, read
// once before the first epoch, so that packing can be planned as a pure function of
// (data, options, seed, epoch, rank): which rows fill which block, and how many blocks
// each rank gets, are known before any block is made.
//
// Reading them is one pass over that column alone (its values are decoded, as Parquet
// stores lengths only as repetition levels), in parallel over row groups.
// Thread-safety: immutable after Read(); shareable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/dataset/dataset.h"

namespace pqloader {

class DocumentLengths {
 public:
  /// Read the row lengths of list column `column` (an index into dataset.specs()) of
  /// every split, with `threads` threads. Errors name the file and row group.
  static arrow::Result<std::shared_ptr<const DocumentLengths>> Read(const Dataset& dataset,
                                                                    int column, int threads,
                                                                    arrow::MemoryPool* pool);

  /// Tokens of rows [begin, end) of split `split`, summed.
  int64_t Sum(int64_t split, int64_t begin, int64_t end) const;
  /// Tokens of row `row` of split `split`.
  int64_t Length(int64_t split, int64_t row) const { return lengths_[first_[split] + row]; }
  /// Every row's length, split after split.
  const std::vector<int32_t>& lengths() const { return lengths_; }

 private:
  std::vector<int32_t> lengths_;  // all rows, split after split
  std::vector<int64_t> first_;    // index in lengths_ of each split's first row
  std::vector<int64_t> prefix_;   // prefix sums of lengths_, size + 1
};

}  // namespace pqloader
