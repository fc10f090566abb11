// The fanout cache of decoded, deterministically transformed splits.
//
// A DiskCache keeps one file per entry (docs/cache_format.md) in `shards` fan-out
// directories; each shard has its own lock file and byte budget (size_limit / shards),
// so writers in different threads and processes rarely contend, and readers never
// lock: entries are published by rename, read with pread (not mmap: see docs/design.md)
// into recycled buffers, and verified by checksum.
// A MemoryCache keeps entries in this process. Both are best effort: a failed insert
// (full disk, unwritable directory) is counted and the loader carries on uncached; an
// insert the budget refuses is counted by reason (CacheRefusal) and reported once.
// The owner of a cache may tell it about its future reads and its sources (a
// CacheSchedule): then entries of files that changed (stale entries) are deleted first
// when the budget is full, and CachePolicy::kPlan keeps the entries read soonest.
//
// Processes sharing a disk cache fetch each split once: before fetching a split it does
// not hold, a process claims it with an in-progress marker (`<key>.fetch`, holding its
// pid, host and time: written under a temp name, then linked to its name, which fails if
// the marker exists); another process that needs the split meanwhile waits for the entry
// (WaitForFetch) instead of fetching it too. A marker of a dead process (same host), or
// older than the wait timeout, is broken. Thread-safety: all methods may be called
// concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <arrow/result.h>

#include "pqloader/cache/entry_format.h"
#include "pqloader/tensor/batch.h"
#include "pqloader/util/cancel.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

/// What happens when the budget is full. Under every policy, stale entries (see
/// CacheSchedule::IsStale) are deleted first: no loader reads them again.
enum class CachePolicy {
  kKeep,  ///< Insert until the budget is full, then stop inserting (no eviction).
  kLru,   ///< Evict the least recently used entries to make room.
  /// Belady's rule on the owner's schedule (CacheSchedule::NextUse): evict the entries
  /// read furthest in the future (never read again: furthest of all) while each is read
  /// later than the entry to insert; if that does not make room, refuse the entry
  /// (CacheRefusal::kLater): everything held is needed sooner.
  kPlan,
};

/// The time of a read that never comes (CacheSchedule::NextUse): after every other.
constexpr double kNeverUsed = std::numeric_limits<double>::infinity();

/// Why an insert was not made.
enum class CacheRefusal {
  kNone,      ///< It was made.
  kFull,      ///< The budget is held by entries the policy keeps (kKeep: any entry).
  kTooLarge,  ///< The entry is larger than a shard's budget: it never fits.
  kLater,     ///< kPlan: every entry held is read sooner than this one.
  kStale,     ///< Its source file changed while it was read (entry of no current file).
};

/// How long a cache's writers, prunes and records wait for a lock another process holds
/// (for a few file operations) before they give up: see CacheOptions::lock_timeout_ms.
constexpr std::chrono::milliseconds kCacheLockTimeout{60000};

/// The most fan-out directories a disk cache has (a shard is picked by one byte of the
/// entry's key).
constexpr int kMaxCacheShards = 256;

struct CacheOptions {
  /// Directory of a disk cache, or ":memory:" for a cache in this process. Required.
  std::string dir;
  /// Bytes the cache may hold. Default: 0, meaning no limit.
  int64_t size_limit = 0;
  /// What happens when full. Default: kKeep.
  CachePolicy policy = CachePolicy::kKeep;
  /// Fan-out directories (disk only), 1 to kMaxCacheShards; each gets size_limit /
  /// shards. A directory keeps the count it was made with (recorded in its marker): a
  /// cache opened on it with another count uses the directory's, with a warning. Default: 8.
  int shards = 8;
  /// fsync entries before publishing them (durable across power loss). Default: false.
  bool fsync = false;
  /// How long a process waits for a split another process claimed (it is fetching it)
  /// before fetching it too, in milliseconds; also the age after which a claim is
  /// deemed abandoned. 0: no claims (each process fetches what it misses). Disk only.
  /// Default: 30 s.
  int64_t wait_timeout_ms = 30000;
  /// How long a writer or deleter waits for a shard's lock (held by another process or
  /// thread for a few file operations) before it gives up: the insert then fails (counted
  /// in write_errors, with a warning), a claim's marker is left to age out. So a holder
  /// that stops (a rank suspended, or paused in a debugger) cannot hang the others.
  /// Disk only. Default: 60 s.
  int64_t lock_timeout_ms = kCacheLockTimeout.count();
  /// Whether this object shares its claims with this process's other disk cache objects
  /// on the same directory and shard count (TryClaim returns their claim): a loader then never waits for
  /// another loader of its own process, which may hold a claimed split in a read-ahead
  /// its consumer does not drain (a paused iterator); it fetches the split too. Tests
  /// set false to stand an object in for another process. Default: true.
  bool share_claims_in_process = true;
};

/// The right to fetch a split and insert its entry, held by this process: its marker file
/// is deleted when the last reference goes (after the entry is published, or dropped).
class FetchClaim {
 public:
  virtual ~FetchClaim() = default;
  /// Refresh the claim's time (its marker's modification time) if the marker is still
  /// this claim's: its holder works on the split now. A claim's age is the time since its
  /// holder last gave that sign (its creation, when the fetch started, or the last Touch),
  /// so a claim held in a read-ahead, whose consumer reaches it after the wait timeout,
  /// is not broken while that consumer decodes and inserts it.
  virtual void Touch() {}
};

/// How a wait for another process's fetch ended.
enum class FetchWait {
  kCached,     ///< The entry is in the cache now.
  kFree,       ///< No process claims the split any more (it may not have inserted it).
  kTimedOut,   ///< The wait outlived the wait timeout (the claim is still held).
  kCancelled,  ///< The caller's cancel flag was raised.
};

/// Counters of one cache object (this process).
struct CacheCounters {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t inserts = 0;
  int64_t bytes_written = 0;
  int64_t refused_full = 0;       ///< Inserts refused: CacheRefusal::kFull.
  int64_t refused_too_large = 0;  ///< Inserts refused: CacheRefusal::kTooLarge.
  int64_t refused_later = 0;      ///< Inserts refused: CacheRefusal::kLater.
  int64_t refused_stale = 0;      ///< Inserts refused: CacheRefusal::kStale.
  int64_t evictions = 0;          ///< Entries deleted to make room (stale ones included).
  int64_t evicted_stale = 0;      ///< Of evictions: stale entries.
  int64_t corrupt = 0;        ///< Entries that failed verification and were dropped.
  /// Entries found that could not be read (EIO, ESTALE, ENOMEM ..., or a file changed in
  /// place): nothing says their bytes are bad, so they are kept; the row group is read
  /// from its source instead. A deferred hit (GetDeferred) whose columns then fail counts
  /// once here, and as a hit.
  int64_t read_errors = 0;
  int64_t write_errors = 0;   ///< Inserts that failed (disk full, permissions ...).
  int64_t waits = 0;          ///< Reads that waited for another process's fetch.
  /// Of waits: ended by the wait timeout (a claim older than it, broken, whether found so
  /// by a worker's claim or during its wait; the wait outliving it; or an abandoned claim
  /// not broken for want of the shard's lock).
  int64_t wait_timeouts = 0;
  int64_t wait_ns = 0;        ///< Time spent in those waits.
  /// Inserts refused for want of room (all reasons but kStale).
  int64_t refused_room() const { return refused_full + refused_too_large + refused_later; }
  /// Whether any counter but bytes_written is not zero.
  bool any() const;
};
/// Return `now` minus `then`, counter by counter.
CacheCounters CountersSince(const CacheCounters& now, const CacheCounters& then);

/// What the owner of a cache (a loader) knows of its reads and its sources.
/// Thread-safety: methods are called concurrently, from any thread.
class CacheSchedule {
 public:
  virtual ~CacheSchedule() = default;
  /// Return the time of the first read of `key` strictly after `now`, on the owner's
  /// clock (the loader's: epoch + position / units, see plan/split_uses.h), or
  /// kNeverUsed, also for keys the owner does not read.
  virtual double NextUse(const std::string& key, double now) const = 0;
  /// Return whether `key` is the key of an entry the owner reads (so, not stale).
  virtual bool Owns(const std::string& key) const = 0;
  /// Return whether an entry decoded from `source` is stale: its file is one the owner
  /// reads, and the file has changed since (other size, mtime or footer).
  virtual bool IsStale(const SourceIdentity& source) const = 0;
};

class SplitCache {
 public:
  virtual ~SplitCache() = default;
  /// Open the cache described by `options`. A disk cache whose directory cannot be
  /// created still opens; its errors are counted and reported by TakeWarning().
  static std::shared_ptr<SplitCache> Open(const CacheOptions& options);

  /// Return the entry for `key`, or nullptr on a miss (including a corrupt entry,
  /// which is dropped, and an entry that could not be read, which is kept: read_errors).
  virtual std::shared_ptr<const DecodedUnit> Get(const std::string& key) = 0;
  /// As Get, but a disk cache may leave the columns of a plain entry unread
  /// (ColumnData::deferred, read on demand from the open entry file) where this process
  /// verified that version of the file before. Such a unit is only for a WindowGather.
  /// A deferred column whose read fails returns the error (naming the entry file) and
  /// counts in read_errors; its reader takes the rows from the source instead.
  virtual std::shared_ptr<const DecodedUnit> GetDeferred(const std::string& key) {
    return Get(key);
  }
  /// Whether the units Get returns and Put keeps are the cache's own, held across epochs
  /// (the in-memory cache): batches must not hand their buffers out (DecodedUnit::shared).
  virtual bool KeepsUnits() const { return false; }
  /// Return whether an entry for `key` exists (without verifying it).
  virtual bool Contains(const std::string& key) = 0;
  /// Insert `unit`, decoded from `source`, under `key`, best effort; return why not if
  /// it was not inserted (kNone also when another writer inserted it first, or it
  /// failed: see counters().write_errors). `now` is the time of this read on the
  /// schedule's clock (kPlan). Once `*cancel` is true, a wait for the shard's lock
  /// gives up and nothing is inserted (not counted as a failure).
  virtual CacheRefusal Put(const std::string& key, const std::shared_ptr<const DecodedUnit>& unit,
                           const SourceIdentity& source, double now = 0,
                           const std::atomic<bool>* cancel = nullptr) = 0;
  /// Count an insert of `source`'s row group that its owner refused (CacheRefusal::kStale:
  /// the file changed while it was read), and warn once.
  void Refuse(CacheRefusal reason, const SourceIdentity& source);

  /// Claim `key` before fetching its split: return a claim, or nullptr if another
  /// process holds one (it is fetching the split; see WaitForFetch). Claims of one process
  /// are shared (CacheOptions::share_claims_in_process): claiming a key this process holds
  /// returns the same claim. Without
  /// coordination (memory cache, wait_timeout_ms 0, unusable directory) every claim
  /// succeeds and holds nothing; so does a claim of a key whose insert this object
  /// knows it refuses (refused as too large before, or its shard refused an insert for
  /// want of room under kKeep and none went in since): others would wait for nothing. Once `cancel` is set, a wait for the shard's lock (to
  /// break an abandoned claim) gives up: nullptr. The claim keeps `cancel`: its release
  /// (which deletes its marker under the shard's lock) gives up the lock's wait once it
  /// is set, and leaves the marker to age out (see CacheOptions::wait_timeout_ms).
  /// Other threads' claims do not wait while one waits for a shard's lock.
  /// `needed_now`: the caller needs the split now (a worker, not the read-ahead): a claim
  /// it takes over from a marker older than the wait timeout (its holder gave no sign for
  /// that long) counts as a wait that timed out (of 0 s) in waits and wait_timeouts.
  virtual std::shared_ptr<FetchClaim> TryClaim(const std::string& key,
                                               CancelFlag cancel = nullptr,
                                               bool needed_now = false) = 0;
  /// Wait, polling, until `key` is cached or no other process claims it, at most the
  /// wait timeout; give up at once when `*cancel` becomes true.
  virtual FetchWait WaitForFetch(const std::string& key, const std::atomic<bool>* cancel) = 0;

  /// Tell the cache about its owner's sources (and, with kPlan, its reads). Set once,
  /// before the first Put.
  void set_schedule(std::shared_ptr<const CacheSchedule> schedule) {
    schedule_ = std::move(schedule);
  }

  /// Count a write of its owner's into the cache directory beside the entries that failed
  /// (a filter's selection not saved: FilterStats::store_error) in write_errors, and warn
  /// once, as a failed insert is (the same warning kind).
  void CountWriteFailure(const std::string& message);

  CacheCounters counters() const;
  /// Return (and forget) the oldest warning not yet reported, or an empty string. Each
  /// kind of warning (write failure; each refusal reason) is issued once per cache object.
  std::string TakeWarning();

 protected:
  enum class WarningKind { kWriteFailure, kFull, kTooLarge, kLater, kStale, kShards, kCount };
  /// Queue `message` unless a warning of `kind` was issued before.
  void Warn(WarningKind kind, const std::string& message);
  /// Count a refusal (not kNone) and warn about it once per reason; `source` is the
  /// refused entry's, `size` its bytes.
  void CountRefusal(CacheRefusal reason, const SourceIdentity& source, int64_t size);
  /// Describe the cache for refusal messages ("cache '<dir>' (limit ..., policy ...)").
  virtual std::string Describe() const = 0;

  std::shared_ptr<const CacheSchedule> schedule_;
  std::atomic<int64_t> hits_{0}, misses_{0}, inserts_{0}, bytes_written_{0}, refused_full_{0},
      refused_too_large_{0}, refused_later_{0}, refused_stale_{0}, evictions_{0}, evicted_stale_{0}, corrupt_{0},
      write_errors_{0}, waits_{0}, wait_timeouts_{0}, wait_ns_{0};
  /// Shared with the units of deferred hits, which may outlive this object.
  const std::shared_ptr<std::atomic<int64_t>> read_errors_ =
      std::make_shared<std::atomic<int64_t>>(0);

 private:
  Mutex warn_mu_;
  std::vector<std::string> warnings_ PQ_GUARDED_BY(warn_mu_);
  bool warned_[static_cast<int>(WarningKind::kCount)] PQ_GUARDED_BY(warn_mu_) = {};
};

/// An entry a cache holds, as its policy sees it.
struct HeldEntry {
  int64_t size = 0;
  /// Larger is more recent (kLru: evicted oldest first).
  int64_t last_use = 0;
  /// Its source changed (see CacheSchedule::IsStale), or it has an older format: no
  /// reader of this version asks for it.
  bool stale = false;
  /// When it is read next (kPlan; see CacheSchedule::NextUse).
  double next_use = kNeverUsed;
};

/// How an insert goes.
struct Admission {
  /// kNone: insert it (after deleting `evict`); otherwise refuse it (`evict` is still
  /// deleted: only stale entries then).
  CacheRefusal refusal = CacheRefusal::kNone;
  /// Indices into `held` of the entries to delete, in order.
  std::vector<size_t> evict;
};

/// Decide how an entry of `size` bytes, read next at `next_use`, enters a cache (or
/// shard) of `budget` bytes (0: no limit) that holds `held`, `usage` bytes in all, under
/// `policy`: stale entries go first, then kLru evicts the least recently used, kPlan
/// the entries read furthest in the future (see CachePolicy::kPlan), kKeep nothing. Pure.
Admission Admit(CachePolicy policy, const std::vector<HeldEntry>& held, int64_t usage,
                int64_t budget, int64_t size, double next_use = kNeverUsed);

/// Return the cache key (32 hex digits) of a split from the strings that identify it.
std::string CacheKey(const std::string& identity);

/// Name of the marker file at the top of every cache directory. Its first line is
/// kCacheMarkerFirstLine; `pqloader cache clear` refuses a directory without it.
constexpr char kCacheMarkerName[] = "PQLOADER_CACHE";
constexpr char kCacheMarkerFirstLine[] = "pqloader cache";

/// Mark `dir` as a cache directory (write its marker file) unless it is marked already
/// or holds something pqloader did not write (then it stays unmarked, and `cache clear`
/// refuses it). With `shards` (1 to kMaxCacheShards) the marker records that shard count
/// (a disk cache's; 0: none recorded, as a footer or filter store marks it). Never
/// replaces another process's marker. Best effort; returns whether `dir` is marked
/// afterwards.
bool MarkCacheDir(const std::string& dir, int shards = 0);
/// Return whether `dir` has a cache marker file.
bool IsMarkedCacheDir(const std::string& dir);
/// Return the shard count the marker of `dir` records ("shards N"), or 0 if it records
/// none (a marker written before 2026-12, or by a footer or filter store) or is missing.
int CacheDirShards(const std::string& dir);

/// Delete the files of `dir` whose names `is_temp` accepts that are regular files (not
/// links) not written to for 10 minutes: temp files of writers killed mid-write, never
/// read (a shard's, the marker's, a filter store's). Best effort.
void SweepStaleTemps(const std::string& dir, const std::function<bool(const std::string&)>& is_temp);

/// Read the regular file at `path` whole into `*out` if it holds at most `max_bytes`.
/// Opened without following a symbolic link and without blocking, as entries are: a
/// FIFO (or a link to one, or to /dev/zero) in place of a cache file is not waited on
/// or read without end. False when missing, not a regular file, too large or unreadable.
bool ReadCacheFile(const std::string& path, int64_t max_bytes, std::string* out);

/// Write `bytes` to `path` by a temp file beside it ("<path>.tmp-<pid>-<thread>", which the
/// cache directory's sweeps and `cache clear` know) renamed into place: a reader never
/// sees part of it. Returns why it failed (the OS's words: a full or read-only disk), or
/// "" once it is in place; a failed write leaves no temp file.
std::string WriteCacheFile(const std::string& path, const std::string& bytes);

/// Whether an entry's source file is still the one it was decoded from.
enum class SourceState {
  kCurrent,  ///< The file is unchanged: the entry can be read.
  kStale,    ///< The file changed or is gone (or the entry has an older format).
  kUnknown,  ///< The file could not be checked (unreachable storage, not asked about).
};
/// Tell the state of an entry's source (see cache_admin.h for the checker loaders'
/// sources get). Called from one thread.
using SourceChecker = std::function<SourceState(const SourceIdentity&)>;

/// What `pqloader cache stats` reports of a directory.
struct CacheDirStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t temp_files = 0;
  /// Splits being fetched now: claim markers whose entry is not published and whose
  /// process is not known to be dead (same host); others wait to be swept.
  int64_t fetch_markers = 0;
  /// With a checker: entries (and their bytes) whose source is stale, and entries whose
  /// source could not be checked; entries of an older format count as stale.
  int64_t stale_entries = 0;
  int64_t stale_bytes = 0;
  int64_t unverified_entries = 0;
  /// Outside the entries and the size limit: filter selections (`filters/`, one per
  /// filter and state of the dataset's files), the row lengths packing read (`lengths/`,
  /// one per file and column) and remote footers (`footers/`), with their bytes. Only
  /// `cache clear` deletes them.
  int64_t selections = 0;
  int64_t selection_bytes = 0;
  int64_t lengths = 0;
  int64_t lengths_bytes = 0;
  int64_t footers = 0;
  int64_t footer_bytes = 0;
  std::map<std::string, int64_t> recorded;  ///< hits/misses... recorded by loaders
};
/// Describe the cache directory `dir`; with `checker`, also read every entry's header
/// and count stale entries. Each of these three returns Cancelled at its next entry once
/// `cancel` is set (what was deleted by then stays deleted).
arrow::Result<CacheDirStats> InspectCacheDir(const std::string& dir,
                                             const SourceChecker& checker = nullptr,
                                             const CancelFlag& cancel = nullptr);
/// What PruneCacheDir did.
struct CachePruneReport {
  int64_t entries = 0;             ///< Stale entries deleted.
  int64_t bytes = 0;               ///< Their bytes.
  int64_t kept = 0;                ///< Entries left: current or unverified.
  int64_t unverified_entries = 0;  ///< Of kept: sources that could not be checked.
  /// Stale entries that could not be deleted ("PATH: reason", e.g. another user's file in
  /// a directory with the sticky bit; at most kMaxReportedForeign listed, the count counts
  /// all): the prune goes on past them.
  std::vector<std::string> not_removed;
  int64_t not_removed_count = 0;
};
/// Delete the stale entries of the cache directory `dir` (`checker` says which), each
/// under its shard's lock, and only files proven to be entries (as ClearCacheDir).
/// Fails, deleting nothing, if `dir` is not a marked cache directory (an empty one is
/// left as it is); fails naming the shard (and what was deleted before) if a shard's
/// lock cannot be had within `lock_timeout` (another process holds it).
arrow::Result<CachePruneReport> PruneCacheDir(
    const std::string& dir, const SourceChecker& checker, const CancelFlag& cancel = nullptr,
    std::chrono::milliseconds lock_timeout = kCacheLockTimeout);
/// What ClearCacheDir did.
struct CacheClearReport {
  int64_t entries = 0;       ///< Entries deleted.
  int64_t bytes = 0;         ///< Bytes of the entries deleted.
  int64_t other_files = 0;   ///< Footers, temp files, locks and records deleted.
  /// Paths below the directory that were left alone because nothing proves pqloader
  /// wrote them (at most kMaxReportedForeign are listed; foreign_count counts all).
  std::vector<std::string> foreign;
  int64_t foreign_count = 0;
  /// Files of pqloader's that could not be deleted ("PATH: reason", e.g. another user's
  /// file in a directory this one may not write; at most kMaxReportedForeign listed, the
  /// count counts all): the clear goes on past them.
  std::vector<std::string> not_removed;
  int64_t not_removed_count = 0;
};
constexpr int64_t kMaxReportedForeign = 10;
/// Delete what pqloader provably wrote in the cache directory `dir`: entry files whose
/// header is an entry's (magic and own key), footers whose checksum verifies, temp files
/// by their name pattern, shard locks and usage files, records; then the shard and
/// footer directories if they are empty. Never follows symbolic links, never descends
/// into a directory it did not create, never deletes the directory itself or its marker.
/// Fails, deleting nothing, if `dir` is not a directory or (unless it is empty) has no
/// cache marker file.
arrow::Result<CacheClearReport> ClearCacheDir(const std::string& dir,
                                              const CancelFlag& cancel = nullptr);
/// Add `counters` to the records kept in `dir` (for `pqloader cache stats`). False when
/// they could not be written (the lock not taken, a full disk): the caller keeps them to
/// add the next time.
bool RecordCacheCounters(const std::string& dir, const CacheCounters& counters);

}  // namespace pqloader
