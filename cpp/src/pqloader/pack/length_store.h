// The row lengths of a list column kept in a cache directory (CACHE_DIR/lengths/), so
// that packing reads a token column's lengths once per (file, column) and node, not at
// every start of every rank (DocumentLengths::Read is one pass over the whole column).
//
// One file per (data file, column): `lengths/<key>.len`, the raw lengths of the row
// groups read (every row of each, -1 for a null row: a filter's rows and how nulls are
// treated are applied when the lengths are used, so neither is part of the key). Keyed
// by the file's identity (path, size, mtime, footer hash: as split cache entries) and the
// column's place in it; see docs/cache_format.md for the layout. A damaged file, one of
// another key, or one that lacks a row group is read from the source again.
// Thread-safety: functions may be called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pqloader/dataset/columns.h"
#include "pqloader/dataset/dataset.h"

namespace pqloader {

/// The raw lengths of some row groups of one file's list column.
struct FileLengths {
  /// Row groups (the file's indices, ascending) and the rows of each, in the order
  /// `lengths` holds them.
  std::vector<int64_t> row_groups;
  std::vector<int64_t> rows;
  /// Every row of each row group, one row group after another; -1 for a null row.
  std::vector<int32_t> lengths;

  /// Index in `lengths` of row group `row_group`'s first row, or -1 if not held (or held
  /// with another count of rows than `rows`).
  int64_t Find(int64_t row_group, int64_t rows) const;
};

/// The key (32 hex digits) of the lengths of column `src` of `file`.
std::string LengthsKey(const DataFile& file, const ColumnSource& src);

/// The lengths stored under `key` in cache directory `dir`, or nullopt when missing,
/// damaged, another key's, or holding more than the file's `max_row_groups` row groups
/// or `max_rows` rows.
std::optional<FileLengths> LoadLengths(const std::string& dir, const std::string& key,
                                       int64_t max_row_groups, int64_t max_rows);

/// Make `dir` a cache directory with its lengths/ (marked first, as the cache's shards
/// are) and delete the temp files killed writers left there: once before storing. Why
/// it could not be (a read-only disk, a lengths/ this process may not write in), or "".
std::string PrepareLengthsStore(const std::string& dir);

/// Store `lengths` under `key` in cache directory `dir`, prepared by PrepareLengthsStore
/// (written under a temp name, then renamed), best effort: why it could not be (a full
/// or read-only disk), or "".
std::string StoreLengths(const std::string& dir, const std::string& key,
                         const FileLengths& lengths);

/// The lock the ranks of a node take while one of them reads lengths the store lacks.
std::string LengthsLockPath(const std::string& dir);

}  // namespace pqloader
