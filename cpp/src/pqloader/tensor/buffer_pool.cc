#include "pqloader/tensor/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "pqloader/util/fork_gate.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace {

// Blocks are allocated with this alignment so that any recycled block serves any
// request of its class (Arrow asks for 64 bytes by default).
constexpr int64_t kBlockAlignment = 64;
// Cache limit of the global pool before any loader reserves more.
constexpr int64_t kDefaultCacheLimit = int64_t{32} << 20;
// Blocks of at least this capacity that are large against the cache (more than a
// quarter of its limit) are mapped and unmapped directly instead of taken from the
// underlying allocator. mimalloc (Arrow's default) keeps a freed block's pages resident
// for its purge delay (longer when another thread frees it) while the next allocation
// maps fresh ones: a loader whose max_inflight_bytes was below its row groups' size
// peaked 3-6 row groups (32 MiB each) higher in some runs than in others. Blocks small
// against the cache keep the allocator's quick reuse of resident pages: mapping every
// block of 4 MiB or more cost ~8 % of a shuffled epoch.
constexpr int64_t kMinMappedBytes = int64_t{1} << 20;

}  // namespace

RecyclingPool::RecyclingPool(arrow::MemoryPool* base, int64_t cache_limit)
    : base_(base), base_limit_(cache_limit), cache_limit_(cache_limit) {}

RecyclingPool::~RecyclingPool() { ReleaseUnused(); }

RecyclingPool* RecyclingPool::Global() {
  static RecyclingPool* pool = [] {
    auto* p = new RecyclingPool(arrow::default_memory_pool(), kDefaultCacheLimit);
    // Hold the lock across fork() so the child never inherits it locked by a thread
    // that does not exist there; taken after the storage tasks left (they allocate).
    fork_gate::AddLock(&RecyclingPool::LockForFork, &RecyclingPool::UnlockAfterFork);
    return p;
  }();
  return pool;
}

// Taken in one fork handler and released in another: outside what the analysis follows.
void RecyclingPool::LockForFork() PQ_NO_THREAD_SAFETY_ANALYSIS { Global()->mu_.Lock(); }
void RecyclingPool::UnlockAfterFork() PQ_NO_THREAD_SAFETY_ANALYSIS { Global()->mu_.Unlock(); }

int RecyclingPool::SizeClass(int64_t size) {
  const int e = 63 - std::countl_zero(static_cast<uint64_t>(size));
  const int64_t base = int64_t{1} << e;
  const int64_t step = base / kSubClasses;
  const int64_t k = (size - base + step - 1) / step;  // 0..kSubClasses
  return e * kSubClasses + static_cast<int>(k);       // k == kSubClasses: next power
}

int64_t RecyclingPool::ClassCapacity(int c) {
  const int e = c / kSubClasses, k = c % kSubClasses;
  const int64_t base = int64_t{1} << e;
  return base + k * (base / kSubClasses);
}

int64_t RecyclingPool::BlockCapacity(int64_t size) {
  if (size < kMinRecycledBytes) return size;
  return ClassCapacity(SizeClass(size));
}

bool RecyclingPool::Recycles(int64_t size, int64_t alignment) {
  return size >= kMinRecycledBytes && alignment <= kBlockAlignment &&
         size <= (int64_t{1} << 56);
}

arrow::Status RecyclingPool::Allocate(int64_t size, int64_t alignment, uint8_t** out) {
  if (!Recycles(size, alignment)) {
    ARROW_RETURN_NOT_OK(base_->Allocate(size, alignment, out));
  } else {
    const int c = SizeClass(size);
    const int64_t capacity = BlockCapacity(size);
    uint8_t* block = nullptr;
    bool map = false;  // a fresh block is mapped directly (see kMinMappedBytes)
    {
      MutexLock lock(mu_);
      ++recyclable_;
      // The request's own class, else the smallest cached block of the next classes up
      // to twice its capacity: windows of different sizes end in chunks of different
      // sizes, and a fresh block costs its pages' faults (see the header).
      int from = c;
      while (from < c + kLargerClasses && from + 1 < kNumClasses && free_[from].empty()) ++from;
      if (!free_[from].empty()) {
        block = free_[from].back().first;  // the most recently freed: warmest in the caches
        free_[from].pop_back();
        cached_bytes_ -= ClassCapacity(from);
        ++recycled_;
        if (from != c) larger_.emplace(block, from);
      } else {
        map = capacity >= kMinMappedBytes && capacity > cache_limit_ / 4;
      }
    }
    if (block == nullptr) {
      if (map) {
        void* p = ::mmap(nullptr, static_cast<size_t>(capacity), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
          return arrow::Status::OutOfMemory("mapping a block of ", capacity,
                                            " bytes failed: ", std::strerror(errno));
        }
        block = static_cast<uint8_t*>(p);
      } else {
        ARROW_RETURN_NOT_OK(base_->Allocate(capacity, kBlockAlignment, &block));
      }
      MutexLock lock(mu_);
      if (map) mapped_.insert(block);
      fresh_bytes_ += capacity;
    }
    *out = block;
  }
  MutexLock lock(mu_);
  bytes_allocated_ += size;
  max_memory_ = std::max(max_memory_, bytes_allocated_);
  total_allocated_ += size;
  ++num_allocations_;
  return arrow::Status::OK();
}

arrow::Status RecyclingPool::Reallocate(int64_t old_size, int64_t new_size, int64_t alignment,
                                        uint8_t** ptr) {
  const bool old_r = Recycles(old_size, alignment), new_r = Recycles(new_size, alignment);
  if (!old_r && !new_r) {
    ARROW_RETURN_NOT_OK(base_->Reallocate(old_size, new_size, alignment, ptr));
    MutexLock lock(mu_);
    bytes_allocated_ += new_size - old_size;
    max_memory_ = std::max(max_memory_, bytes_allocated_);
    if (new_size > old_size) total_allocated_ += new_size - old_size;
    return arrow::Status::OK();
  }
  if (old_r && new_r && SizeClass(old_size) == SizeClass(new_size)) {
    MutexLock lock(mu_);  // the block already has room
    bytes_allocated_ += new_size - old_size;
    max_memory_ = std::max(max_memory_, bytes_allocated_);
    if (new_size > old_size) total_allocated_ += new_size - old_size;
    return arrow::Status::OK();
  }
  uint8_t* fresh = nullptr;
  ARROW_RETURN_NOT_OK(Allocate(new_size, alignment, &fresh));
  std::memcpy(fresh, *ptr, static_cast<size_t>(std::min(old_size, new_size)));
  Free(*ptr, old_size, alignment);
  *ptr = fresh;
  return arrow::Status::OK();
}

void RecyclingPool::Free(uint8_t* buffer, int64_t size, int64_t alignment) {
  if (!Recycles(size, alignment)) {
    base_->Free(buffer, size, alignment);
    MutexLock lock(mu_);
    bytes_allocated_ -= size;
    return;
  }
  int c = SizeClass(size);
  std::vector<Evicted> evicted;
  bool mapped = false;
  int64_t capacity = 0;
  {
    MutexLock lock(mu_);
    bytes_allocated_ -= size;
    if (!larger_.empty()) {
      auto it = larger_.find(buffer);
      if (it != larger_.end()) {  // a block of a larger class: back to its own list
        c = it->second;
        larger_.erase(it);
      }
    }
    capacity = ClassCapacity(c);
    if (capacity <= cache_limit_) {
      evicted = TrimLocked(capacity);
      free_[c].emplace_back(buffer, free_seq_++);
      cached_bytes_ += capacity;
      buffer = nullptr;  // kept
    } else {
      mapped = mapped_.erase(buffer) > 0;
    }
  }
  FreeBlocks(evicted);
  if (buffer != nullptr) FreeBlock(buffer, capacity, mapped);
}

void RecyclingPool::FreeBlocks(const std::vector<Evicted>& blocks) {
  for (const Evicted& e : blocks) FreeBlock(e.block, e.capacity, e.mapped);
}

void RecyclingPool::FreeBlock(uint8_t* block, int64_t capacity, bool mapped) {
  if (mapped) {
    ::munmap(block, static_cast<size_t>(capacity));
  } else {
    base_->Free(block, capacity, kBlockAlignment);
  }
}

std::vector<RecyclingPool::Evicted> RecyclingPool::TrimLocked(int64_t incoming) {
  std::vector<Evicted> evicted;
  while (cached_bytes_ + incoming > cache_limit_ && cached_bytes_ > 0) {
    int oldest = -1;
    for (int c = 0; c < kNumClasses; ++c) {
      if (!free_[c].empty() &&
          (oldest < 0 || free_[c].front().second < free_[oldest].front().second)) {
        oldest = c;
      }
    }
    const int64_t capacity = ClassCapacity(oldest);
    uint8_t* block = free_[oldest].front().first;
    evicted.push_back(Evicted{block, capacity, mapped_.erase(block) > 0});
    free_[oldest].pop_front();
    cached_bytes_ -= capacity;
  }
  return evicted;
}

void RecyclingPool::ReleaseUnused() {
  std::vector<Evicted> evicted;
  {
    MutexLock lock(mu_);
    const int64_t limit = cache_limit_;
    cache_limit_ = 0;
    evicted = TrimLocked();
    cache_limit_ = limit;
  }
  FreeBlocks(evicted);
}

void RecyclingPool::AdjustCacheLimit(int64_t bytes) {
  std::vector<Evicted> evicted;
  {
    MutexLock lock(mu_);
    reserved_ += bytes;
    const __int128 limit = static_cast<__int128>(base_limit_) + reserved_;
    cache_limit_ = static_cast<int64_t>(std::clamp<__int128>(
        limit, 0, static_cast<__int128>(std::numeric_limits<int64_t>::max())));
    evicted = TrimLocked();
  }
  FreeBlocks(evicted);
}

int64_t RecyclingPool::bytes_allocated() const {
  MutexLock lock(mu_);
  return bytes_allocated_;
}
int64_t RecyclingPool::max_memory() const {
  MutexLock lock(mu_);
  return max_memory_;
}
int64_t RecyclingPool::total_bytes_allocated() const {
  MutexLock lock(mu_);
  return total_allocated_;
}
int64_t RecyclingPool::num_allocations() const {
  MutexLock lock(mu_);
  return num_allocations_;
}
int64_t RecyclingPool::cached_bytes() const {
  MutexLock lock(mu_);
  return cached_bytes_;
}
int64_t RecyclingPool::cache_limit() const {
  MutexLock lock(mu_);
  return cache_limit_;
}
int64_t RecyclingPool::recyclable_allocations() const {
  MutexLock lock(mu_);
  return recyclable_;
}
int64_t RecyclingPool::fresh_bytes() const {
  MutexLock lock(mu_);
  return fresh_bytes_;
}

int64_t RecyclingPool::recycled_allocations() const {
  MutexLock lock(mu_);
  return recycled_;
}
std::string RecyclingPool::backend_name() const {
  return "pqloader-recycling(" + base_->backend_name() + ")";
}

}  // namespace pqloader
