// RecyclingPool: an arrow::MemoryPool that keeps freed large blocks for reuse.
//
// Every epoch allocates the same sizes again and again: Parquet page buffers, decoded
// columns, batch buffers, per-sample images. Fresh large allocations cost page faults
// and the kernel zeroing each new page (profiles showed `clear_page` at 15-26 % of CPU),
// so blocks of at least kMinRecycledBytes go to a free list by size class when freed
// and are handed out again by the next allocation of that class. Smaller requests go
// straight to the underlying pool. A request no block of its class serves takes the
// smallest cached block of up to twice its class's capacity (windows of different sizes
// end in chunks of different sizes) before it maps fresh pages. A batch buffer handed
// to NumPy or torch returns here when the last view is dropped (its capsule / DLPack
// deleter frees the arrow::Buffer).
//
// The free lists hold at most `cache_limit()` bytes: when a freed block does not fit,
// the blocks freed longest ago (of any size) go back to the underlying pool first, so
// the cache follows the sizes the work allocates now. The limit is the sum of the
// reservations of live users (each Loader reserves twice its max_inflight_bytes: the
// blocks an epoch frees are the ones it allocates next, and a shuffled run's live
// blocks swing further than its budget), so memory held idle is bounded too.
//
// Blocks large against the cache (1 MiB or more, and over a quarter of its limit) are
// mapped and unmapped directly, so that freeing one beyond the cache returns its pages
// at once (the underlying allocator would keep them resident for a while).
//
// There is one process-wide pool (Global()): buffers may outlive the loader that made
// them (a NumPy view kept by the user), so the pool must outlive every loader.
// Thread-safety: all methods may be called concurrently; fork-safe (the lock is held
// across fork() and released in both processes).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <arrow/memory_pool.h>
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

class RecyclingPool : public arrow::MemoryPool {
 public:
  /// Blocks smaller than this are not recycled (the allocator's own caches serve them).
  static constexpr int64_t kMinRecycledBytes = int64_t{64} << 10;

  /// Recycle blocks of `base`, keeping at most `cache_limit` free bytes.
  RecyclingPool(arrow::MemoryPool* base, int64_t cache_limit);
  ~RecyclingPool() override;

  /// The process-wide pool over arrow::default_memory_pool(). Never destroyed.
  static RecyclingPool* Global();

  arrow::Status Allocate(int64_t size, int64_t alignment, uint8_t** out) override;
  arrow::Status Reallocate(int64_t old_size, int64_t new_size, int64_t alignment,
                           uint8_t** ptr) override;
  void Free(uint8_t* buffer, int64_t size, int64_t alignment) override;
  /// Return every cached block to the underlying pool.
  void ReleaseUnused() override;

  /// Bytes handed out and not yet freed (by the requested sizes).
  int64_t bytes_allocated() const override;
  int64_t max_memory() const override;
  int64_t total_bytes_allocated() const override;
  int64_t num_allocations() const override;
  std::string backend_name() const override;

  /// Free bytes kept for reuse now, and at most.
  int64_t cached_bytes() const;
  int64_t cache_limit() const;
  /// Allocations of a recyclable size, and those served from the free lists.
  int64_t recyclable_allocations() const;
  int64_t recycled_allocations() const;
  /// Bytes of recyclable-size blocks taken from the underlying pool (fresh pages).
  int64_t fresh_bytes() const;

  /// Raise the cache limit by `bytes` (a loader starting), or lower it (negative: one
  /// ending; excess cached blocks are released).
  void AdjustCacheLimit(int64_t bytes);

  /// The capacity of the block that serves a request of `size` bytes (test hook).
  static int64_t BlockCapacity(int64_t size);

  RecyclingPool(const RecyclingPool&) = delete;
  RecyclingPool& operator=(const RecyclingPool&) = delete;

 private:
  static constexpr int kSubClasses = 8;  // per power of two: at most 12.5 % slack
  static constexpr int kNumClasses = 64 * kSubClasses;
  // A request no block of its class serves takes a cached block of one of the next
  // kLargerClasses classes (at most twice its capacity) before a fresh one.
  static constexpr int kLargerClasses = kSubClasses;
  static void LockForFork();
  static void UnlockAfterFork();
  static int SizeClass(int64_t size);
  static bool Recycles(int64_t size, int64_t alignment);
  // A block leaving the pool, given back once the lock is released (an munmap or the
  // underlying allocator's free of a large block takes long enough to stall every
  // thread allocating meanwhile).
  struct Evicted {
    uint8_t* block;
    int64_t capacity;
    bool mapped;
  };
  // Give a block back: unmapped if it was mapped directly (see kMinMappedBytes in
  // buffer_pool.cc), else to the underlying pool. Without the lock.
  void FreeBlock(uint8_t* block, int64_t capacity, bool mapped);
  void FreeBlocks(const std::vector<Evicted>& blocks);
  // Take the oldest cached blocks out until `incoming` more bytes fit; return them, to
  // be given back (FreeBlocks) after the lock is released.
  std::vector<Evicted> TrimLocked(int64_t incoming = 0) PQ_REQUIRES(mu_);
  static int64_t ClassCapacity(int c);

  arrow::MemoryPool* base_;
  mutable Mutex mu_;
  // The constructor's limit, and the sum of every AdjustCacheLimit since, exactly (two
  // loaders of the largest max_inflight_bytes reserve 2 x 2^62: their sum overflowed
  // int64). cache_limit_ is their sum, clamped to [0, INT64_MAX].
  const int64_t base_limit_;
  __int128 reserved_ PQ_GUARDED_BY(mu_) = 0;
  int64_t cache_limit_ PQ_GUARDED_BY(mu_);
  int64_t cached_bytes_ PQ_GUARDED_BY(mu_) = 0;
  int64_t bytes_allocated_ PQ_GUARDED_BY(mu_) = 0;
  int64_t max_memory_ PQ_GUARDED_BY(mu_) = 0;
  int64_t total_allocated_ PQ_GUARDED_BY(mu_) = 0;
  int64_t num_allocations_ PQ_GUARDED_BY(mu_) = 0;
  int64_t recyclable_ PQ_GUARDED_BY(mu_) = 0;
  int64_t recycled_ PQ_GUARDED_BY(mu_) = 0;
  int64_t fresh_bytes_ PQ_GUARDED_BY(mu_) = 0;
  int64_t free_seq_ PQ_GUARDED_BY(mu_) = 0;
  // Blocks handed out for a request of a smaller class than theirs: their class.
  std::unordered_map<uint8_t*, int> larger_ PQ_GUARDED_BY(mu_);
  // Blocks mapped directly (large against the cache), wherever they are now.
  std::unordered_set<uint8_t*> mapped_ PQ_GUARDED_BY(mu_);
  // Per size class: (block, sequence number of its free), oldest first.
  std::array<std::deque<std::pair<uint8_t*, int64_t>>, kNumClasses> free_ PQ_GUARDED_BY(mu_);
};

/// Reserve `bytes` of the global pool's cache for the lifetime of this object.
class PoolCacheReservation {
 public:
  explicit PoolCacheReservation(int64_t bytes) : bytes_(bytes) {
    RecyclingPool::Global()->AdjustCacheLimit(bytes_);
  }
  ~PoolCacheReservation() { GiveBack(); }
  /// Give the share back now, once (the destructor then gives nothing back): for a
  /// loader abandoned in a forked child, which is never destroyed.
  void GiveBack() {
    if (!given_back_.exchange(true)) RecyclingPool::Global()->AdjustCacheLimit(-bytes_);
  }
  PoolCacheReservation(const PoolCacheReservation&) = delete;
  PoolCacheReservation& operator=(const PoolCacheReservation&) = delete;

 private:
  int64_t bytes_;
  std::atomic<bool> given_back_{false};
};

}  // namespace pqloader
