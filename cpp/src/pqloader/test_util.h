// Helpers shared by the C++ tests: temporary directories and small Parquet files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pqloader {
class Dataset;
class Loader;
struct Split;
}

namespace pqloader::testing {

/// Return a fresh, empty temporary directory (removed at exit).
std::string MakeTempDir();

/// Write a Parquet file with columns id (int64, start_id, start_id + 1, ...) and
/// x (float32, id / 2), with one row group per entry of `row_groups` (its row count).
void WriteIdFile(const std::string& path, const std::vector<int64_t>& row_groups,
                 int64_t start_id);

/// Write a Parquet file with columns id (int64, 0, 1, ...) and tokens (list<int32>: row
/// i holds `lengths[i]` values 0, 1, ...), in row groups of `row_group_rows` rows.
void WriteTokensFile(const std::string& path, const std::vector<int32_t>& lengths,
                     int64_t row_group_rows);

/// Return a fresh directory of two files: a.parquet, one row group of ids 0-3 and token
/// lists (list<int32>) [0 1], null, [0 1 2], null; b.parquet, three rows of ids only (it
/// lacks the token column: its rows are null).
std::string MakeNullDocumentsDir();

/// Restrict each split of `dataset` to the rows `rows` gives it (ascending, as a filter
/// keeps them) and return the splits, as a filter's selection would leave them.
std::vector<Split> KeepRows(Dataset* dataset, const std::vector<std::vector<int32_t>>& rows);

/// The ids (column 0) of every batch left in the epoch `loader` has started, in order;
/// with `check_x`, also that column 1 holds id / 2 in every row (WriteIdFile's x); the
/// batch sizes in `sizes` if given.
std::vector<int64_t> DrainIds(Loader* loader, bool check_x = false,
                              std::vector<int64_t>* sizes = nullptr);

}  // namespace pqloader::testing
