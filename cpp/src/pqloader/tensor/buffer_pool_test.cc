#include "pqloader/tensor/buffer_pool.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>

#include <arrow/buffer.h>

namespace pqloader {

namespace {

constexpr int64_t kBig = RecyclingPool::kMinRecycledBytes * 4;

}  // namespace

TEST(RecyclingPool, AFreedBlockServesTheNextRequestOfItsSizeClass) {
  RecyclingPool pool(arrow::default_memory_pool(), int64_t{64} << 20);
  uint8_t* a = nullptr;
  ASSERT_TRUE(pool.Allocate(kBig, 64, &a).ok());
  std::memset(a, 1, kBig);
  pool.Free(a, kBig, 64);
  EXPECT_EQ(pool.cached_bytes(), RecyclingPool::BlockCapacity(kBig));
  uint8_t* b = nullptr;
  // A slightly smaller request of the same class gets the same block.
  ASSERT_TRUE(pool.Allocate(kBig - 100, 64, &b).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool.recycled_allocations(), 1);
  EXPECT_EQ(pool.recyclable_allocations(), 2);
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(pool.bytes_allocated(), kBig - 100);
  pool.Free(b, kBig - 100, 64);
  EXPECT_EQ(pool.bytes_allocated(), 0);
}

TEST(RecyclingPool, SizeClassesWasteAtMostAnEighth) {
  for (int64_t size = RecyclingPool::kMinRecycledBytes; size < (int64_t{1} << 32); size = size * 5 / 3) {
    const int64_t cap = RecyclingPool::BlockCapacity(size);
    EXPECT_GE(cap, size);
    EXPECT_LE(cap, size + size / 8 + 1) << size;
  }
  EXPECT_EQ(RecyclingPool::BlockCapacity(100), 100);  // not recycled: exact
}

TEST(RecyclingPool, KeepsAtMostItsLimitAndEvictsTheOldestFirst) {
  const int64_t cap = RecyclingPool::BlockCapacity(kBig);
  RecyclingPool pool(arrow::default_memory_pool(), 2 * cap);
  uint8_t* blocks[3];
  for (auto& p : blocks) ASSERT_TRUE(pool.Allocate(kBig, 64, &p).ok());
  for (auto& p : blocks) pool.Free(p, kBig, 64);  // the first freed is evicted
  EXPECT_EQ(pool.cached_bytes(), 2 * cap);
  uint8_t* x = nullptr;
  uint8_t* y = nullptr;
  ASSERT_TRUE(pool.Allocate(kBig, 64, &x).ok());
  ASSERT_TRUE(pool.Allocate(kBig, 64, &y).ok());
  EXPECT_EQ(x, blocks[2]);  // the most recently freed first
  EXPECT_EQ(y, blocks[1]);
  pool.Free(x, kBig, 64);
  pool.Free(y, kBig, 64);
  pool.AdjustCacheLimit(-cap);  // a loader ending: the cache shrinks at once
  EXPECT_EQ(pool.cached_bytes(), cap);
  pool.ReleaseUnused();
  EXPECT_EQ(pool.cached_bytes(), 0);
}

TEST(RecyclingPool, EvictsTheOldestBlockAcrossSizeClasses) {
  const int64_t small = kBig, large = 2 * kBig;
  const int64_t cs = RecyclingPool::BlockCapacity(small), cl = RecyclingPool::BlockCapacity(large);
  ASSERT_LT(cs, cl);
  RecyclingPool pool(arrow::default_memory_pool(), cs + cl);
  uint8_t *s1 = nullptr, *l1 = nullptr, *s2 = nullptr;
  ASSERT_TRUE(pool.Allocate(small, 64, &s1).ok());
  ASSERT_TRUE(pool.Allocate(large, 64, &l1).ok());
  ASSERT_TRUE(pool.Allocate(small, 64, &s2).ok());
  pool.Free(s1, small, 64);  // oldest
  pool.Free(l1, large, 64);
  pool.Free(s2, small, 64);  // over the limit: s1 goes, not the newer large block
  EXPECT_EQ(pool.cached_bytes(), cs + cl);
  uint8_t* again = nullptr;
  ASSERT_TRUE(pool.Allocate(large, 64, &again).ok());
  EXPECT_EQ(again, l1);
  pool.Free(again, large, 64);
}

TEST(RecyclingPool, ARequestTakesACachedBlockOfALargerClassUpToTwiceItsSize) {
  RecyclingPool pool(arrow::default_memory_pool(), int64_t{64} << 20);
  const int64_t small = kBig, larger = kBig * 3 / 2, huge = 4 * kBig;
  ASSERT_LT(RecyclingPool::BlockCapacity(small), RecyclingPool::BlockCapacity(larger));
  uint8_t *a = nullptr, *h = nullptr;
  ASSERT_TRUE(pool.Allocate(larger, 64, &a).ok());
  ASSERT_TRUE(pool.Allocate(huge, 64, &h).ok());
  pool.Free(a, larger, 64);
  pool.Free(h, huge, 64);
  const int64_t cached = pool.cached_bytes();
  uint8_t* b = nullptr;
  ASSERT_TRUE(pool.Allocate(small, 64, &b).ok());  // no block of its class: the larger one
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.cached_bytes(), cached - RecyclingPool::BlockCapacity(larger));
  std::memset(b, 3, larger);  // the whole block is the request's
  pool.Free(b, small, 64);  // back to its own class's list, with its own capacity
  EXPECT_EQ(pool.cached_bytes(), cached);
  uint8_t* c = nullptr;
  ASSERT_TRUE(pool.Allocate(larger, 64, &c).ok());
  EXPECT_EQ(c, a);
  uint8_t* d = nullptr;
  ASSERT_TRUE(pool.Allocate(small / 2 + 1, 64, &d).ok());  // more than twice: not the huge one
  EXPECT_NE(d, h);
  EXPECT_EQ(pool.recycled_allocations(), 2);
  pool.Free(c, larger, 64);
  pool.Free(d, small / 2 + 1, 64);
  pool.ReleaseUnused();
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(pool.bytes_allocated(), 0);
}

TEST(RecyclingPool, ReallocateKeepsTheContents) {
  RecyclingPool pool(arrow::default_memory_pool(), int64_t{64} << 20);
  uint8_t* p = nullptr;
  ASSERT_TRUE(pool.Allocate(1000, 64, &p).ok());  // small: the underlying pool's
  std::memset(p, 7, 1000);
  ASSERT_TRUE(pool.Reallocate(1000, kBig - 1000, 64, &p).ok());  // into a recycled class
  EXPECT_EQ(p[999], 7);
  uint8_t* same = p;
  ASSERT_EQ(RecyclingPool::BlockCapacity(kBig - 1000), RecyclingPool::BlockCapacity(kBig));
  ASSERT_TRUE(pool.Reallocate(kBig - 1000, kBig, 64, &p).ok());  // room in the block
  EXPECT_EQ(p, same);
  const int64_t fresh = pool.fresh_bytes();
  ASSERT_TRUE(pool.Reallocate(kBig, 4 * kBig, 64, &p).ok());  // past the block's class
  EXPECT_EQ(p[999], 7);
  EXPECT_NE(p, same);  // a block never grows past its capacity: moved to a larger one
  EXPECT_EQ(pool.fresh_bytes() - fresh, RecyclingPool::BlockCapacity(4 * kBig));
  EXPECT_EQ(pool.bytes_allocated(), 4 * kBig);
  pool.Free(p, 4 * kBig, 64);
  EXPECT_EQ(pool.bytes_allocated(), 0);
}

TEST(RecyclingPool, BuffersMadeFromItReturnTheirMemoryWhenDropped) {
  RecyclingPool* pool = RecyclingPool::Global();
  auto before = pool->recycled_allocations();
  const uint8_t* first = nullptr;
  {
    auto b = arrow::AllocateBuffer(kBig, pool).ValueOrDie();
    first = b->data();
  }  // as when NumPy drops a batch: the arrow::Buffer frees into the pool
  auto again = arrow::AllocateBuffer(kBig, pool).ValueOrDie();
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(pool->recycled_allocations(), before + 1);
}

}  // namespace pqloader

namespace pqloader {
namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// A block large against the cache is mapped directly, so one the cache cannot keep goes
// back to the system at once: an allocator that kept it resident for a while made a
// small-budget loader's peak memory vary by several row groups from run to run.
TEST(RecyclingPool, ALargeBlockBeyondTheLimitIsReturnedAtOnce) {
  RecyclingPool pool(arrow::default_memory_pool(), /*cache_limit=*/0);
  constexpr int64_t kSize = int64_t{64} << 20;
  const int64_t before = ResidentBytes();
  uint8_t* block = nullptr;
  ASSERT_TRUE(pool.Allocate(kSize, 64, &block).ok());
  std::memset(block, 7, kSize);
  EXPECT_GE(ResidentBytes() - before, kSize * 9 / 10);
  pool.Free(block, kSize, 64);
  EXPECT_LT(ResidentBytes() - before, kSize / 8);
  EXPECT_EQ(pool.cached_bytes(), 0);
  // Within the limit it is kept and serves the next request of its class.
  RecyclingPool keeping(arrow::default_memory_pool(), int64_t{128} << 20);
  ASSERT_TRUE(keeping.Allocate(kSize, 64, &block).ok());
  block[kSize - 1] = 1;
  uint8_t* first = block;
  keeping.Free(block, kSize, 64);
  ASSERT_TRUE(keeping.Allocate(kSize - 4096, 64, &block).ok());
  EXPECT_EQ(block, first);
  keeping.Free(block, kSize - 4096, 64);
}

TEST(RecyclingPool, ReservationsSummingPastInt64KeepTheBaseLimit) {
  // Two loaders of the largest max_inflight_bytes (2^61) reserve 2^62 each: the sum
  // overflowed int64, was clamped to 0, and the base limit was lost for the process.
  const int64_t base = int64_t{32} << 20;
  RecyclingPool pool(arrow::default_memory_pool(), base);
  const int64_t share = int64_t{1} << 62;
  pool.AdjustCacheLimit(share);
  pool.AdjustCacheLimit(share);
  EXPECT_EQ(pool.cache_limit(), std::numeric_limits<int64_t>::max());
  pool.AdjustCacheLimit(-share);
  pool.AdjustCacheLimit(-share);
  EXPECT_EQ(pool.cache_limit(), base);
}

}  // namespace
}  // namespace pqloader
