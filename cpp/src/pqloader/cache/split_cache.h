// The fanout cache of decoded, deterministically transformed splits.
//
// A DiskCache keeps one file per entry (docs/cache_format.md) in `shards` fan-out
// directories; each shard has its own lock file and byte budget (size_limit / shards),
// so writers in different threads and processes rarely contend, and readers never
// lock: entries are published by rename, read through mmap, and verified by checksum.
// A MemoryCache keeps entries in this process. Both are best effort: a failed insert
// (full disk, unwritable directory) is counted and the loader carries on uncached.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <arrow/result.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

enum class CachePolicy {
  kKeep,  ///< Insert until the budget is full, then stop inserting (no eviction).
  kLru,   ///< Evict the least recently used entries to make room.
};

struct CacheOptions {
  /// Directory of a disk cache, or ":memory:" for a cache in this process. Required.
  std::string dir;
  /// Bytes the cache may hold. Default: 0, meaning no limit.
  int64_t size_limit = 0;
  /// What happens when full. Default: kKeep.
  CachePolicy policy = CachePolicy::kKeep;
  /// Fan-out directories (disk only); each gets size_limit / shards. Default: 8.
  int shards = 8;
  /// fsync entries before publishing them (durable across power loss). Default: false.
  bool fsync = false;
};

/// Counters of one cache object (this process).
struct CacheCounters {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t inserts = 0;
  int64_t bytes_written = 0;
  int64_t skipped_full = 0;   ///< Inserts refused by the kKeep budget.
  int64_t evictions = 0;
  int64_t corrupt = 0;        ///< Entries that failed verification and were dropped.
  int64_t write_errors = 0;   ///< Inserts that failed (disk full, permissions ...).
};

class SplitCache {
 public:
  virtual ~SplitCache() = default;
  /// Open the cache described by `options`. A disk cache whose directory cannot be
  /// created still opens; its errors are counted and reported by TakeWarning().
  static std::shared_ptr<SplitCache> Open(const CacheOptions& options);

  /// Return the entry for `key`, or nullptr on a miss (including a corrupt entry,
  /// which is dropped).
  virtual std::shared_ptr<const DecodedUnit> Get(const std::string& key) = 0;
  /// Return whether an entry for `key` exists (without verifying it).
  virtual bool Contains(const std::string& key) = 0;
  /// Insert `unit` under `key`, best effort.
  virtual void Put(const std::string& key, const std::shared_ptr<const DecodedUnit>& unit) = 0;

  CacheCounters counters() const;
  /// Return (and forget) the first warning not yet reported, or an empty string.
  std::string TakeWarning();

 protected:
  void Warn(const std::string& message);

  std::atomic<int64_t> hits_{0}, misses_{0}, inserts_{0}, bytes_written_{0}, skipped_full_{0},
      evictions_{0}, corrupt_{0}, write_errors_{0};

 private:
  std::mutex warn_mu_;
  std::string warning_;       // GUARDED_BY(warn_mu_)
  bool warned_ = false;       // GUARDED_BY(warn_mu_)
};

/// Return the cache key (32 hex digits) of a split from the strings that identify it.
std::string CacheKey(const std::string& identity);

/// Name of the marker file at the top of every cache directory. Its first line is
/// kCacheMarkerFirstLine; `pqloader cache clear` refuses a directory without it.
constexpr char kCacheMarkerName[] = "PQLOADER_CACHE";
constexpr char kCacheMarkerFirstLine[] = "pqloader cache";

/// Mark `dir` as a cache directory (write its marker file) unless it is marked already
/// or holds something pqloader did not write (then it stays unmarked, and `cache clear`
/// refuses it). Best effort; returns whether `dir` is marked afterwards.
bool MarkCacheDir(const std::string& dir);
/// Return whether `dir` has a cache marker file.
bool IsMarkedCacheDir(const std::string& dir);

/// What `pqloader cache stats` reports of a directory.
struct CacheDirStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t temp_files = 0;
  std::map<std::string, int64_t> recorded;  ///< hits/misses... recorded by loaders
};
arrow::Result<CacheDirStats> InspectCacheDir(const std::string& dir);
/// What ClearCacheDir did.
struct CacheClearReport {
  int64_t entries = 0;       ///< Entries deleted.
  int64_t bytes = 0;         ///< Bytes of the entries deleted.
  int64_t other_files = 0;   ///< Footers, temp files, locks and records deleted.
  /// Paths below the directory that were left alone because nothing proves pqloader
  /// wrote them (at most kMaxReportedForeign are listed; foreign_count counts all).
  std::vector<std::string> foreign;
  int64_t foreign_count = 0;
};
constexpr int64_t kMaxReportedForeign = 10;
/// Delete what pqloader provably wrote in the cache directory `dir`: entry files whose
/// header is an entry's (magic and own key), footers whose checksum verifies, temp files
/// by their name pattern, shard locks and usage files, records; then the shard and
/// footer directories if they are empty. Never follows symbolic links, never descends
/// into a directory it did not create, never deletes the directory itself or its marker.
/// Fails, deleting nothing, if `dir` is not a directory or (unless it is empty) has no
/// cache marker file.
arrow::Result<CacheClearReport> ClearCacheDir(const std::string& dir);
/// Add `counters` to the records kept in `dir` (for `pqloader cache stats`).
void RecordCacheCounters(const std::string& dir, const CacheCounters& counters);

}  // namespace pqloader
