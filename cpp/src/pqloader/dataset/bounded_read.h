// Reading a row group's columns without trusting the footer's row count for memory.
//
// Parquet's one-piece read (FileReader::ReadRowGroup / ReadColumn) reserves memory for
// every row the footer claims: a corrupt footer's 2^31 rows cost gigabytes before any
// check. Read in batches instead, stopping once more rows than claimed arrived, and the
// caller compares the rows read with the claim.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <arrow/result.h>
#include <arrow/table.h>
#include <parquet/arrow/reader.h>

namespace pqloader {

/// Rows per batch of ReadRowGroupBounded.
inline constexpr int64_t kBoundedBatchRows = int64_t{1} << 16;

/// The leaf columns `leaves` of row group `row_group`, read in batches of
/// kBoundedBatchRows rows until the data ends or more than `claimed_rows` rows arrived.
/// A row group of no rows gives a table of no chunks. Sets `reader`'s batch size.
arrow::Result<std::shared_ptr<arrow::Table>> ReadRowGroupBounded(
    parquet::arrow::FileReader* reader, int row_group, const std::vector<int>& leaves,
    int64_t claimed_rows);

}  // namespace pqloader
