// Looking after cache directories without a loader: `pqloader cache stats|prune`.
//
// An entry is stale when the file it was decoded from has changed since (other size,
// modification time or footer) or is gone: no loader asks for its key any more, so it
// only takes room. Every entry's header names its source (docs/cache_format.md); these
// functions check each distinct source file once, as a Dataset would open it now.
// Thread-safety: functions may be called concurrently (for different directories; a
// prune and writers of the same directory take the shard locks).
#pragma once

#include <string>
#include <vector>

#include <arrow/result.h>

#include "pqloader/cache/split_cache.h"
#include "pqloader/io/filesystem.h"

namespace pqloader {

struct CacheAdminOptions {
  /// Sources of one dataset, as given to a Loader. When set, only entries of its files
  /// are checked against the files as they are listed now, an entry of a file that was
  /// below one of its directories and is gone is stale, and every other entry counts as
  /// unverified. Default: empty, meaning each entry's own local file is looked up (a
  /// stat, and a footer read when size and mtime still match); entries of remote files
  /// are unverified (checking them costs requests: give their dataset).
  std::vector<std::string> dataset;
  /// Options of s3:// sources. Default: none (the standard AWS sources).
  StorageOptions storage;
  /// Set: InspectCache and PruneCache return Cancelled at their next entry.
  CancelFlag cancel;
};

/// Return a checker of entries' sources (see SourceChecker) under `options`; footers of
/// remote files come from `dir`'s footer cache when it has them. Fails if the dataset
/// of `options` cannot be listed.
arrow::Result<SourceChecker> MakeSourceChecker(const std::string& dir,
                                               const CacheAdminOptions& options);

/// Describe the cache directory `dir`, stale entries included.
arrow::Result<CacheDirStats> InspectCache(const std::string& dir, const CacheAdminOptions& options);

/// Delete the stale entries of the cache directory `dir` (see PruneCacheDir).
arrow::Result<CachePruneReport> PruneCache(const std::string& dir,
                                           const CacheAdminOptions& options);

}  // namespace pqloader
