// CachePolicy::kPlan against the optimum: on sequences of reads of entries of one size,
// Belady's rule with bypass (evict the entry read furthest in the future, or do not
// insert when the newcomer is read later than everything held) is optimal, so the cache
// must make exactly as many hits as an exhaustive search over every insert/evict choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "pqloader/cache/split_cache.h"
#include "pqloader/test_util.h"

namespace pqloader {

namespace {

// A hand-made schedule: the reads are `sequence` (entry ids), read i at time i.
class SequenceSchedule : public CacheSchedule {
 public:
  explicit SequenceSchedule(std::vector<int> sequence) : sequence_(std::move(sequence)) {}
  double NextUse(const std::string& key, double now) const override {
    for (size_t t = 0; t < sequence_.size(); ++t) {
      if (static_cast<double>(t) > now && Key(sequence_[t]) == key) return static_cast<double>(t);
    }
    return kNeverUsed;
  }
  bool Owns(const std::string& key) const override { return true; }
  bool IsStale(const SourceIdentity&) const override { return false; }
  static std::string Key(int id) { return CacheKey("entry " + std::to_string(id)); }

 private:
  std::vector<int> sequence_;
};

std::shared_ptr<DecodedUnit> UnitOfBytes(int64_t n) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = 1;
  ColumnData c;
  c.row_shape = {n};
  c.row_bytes = n;
  c.data = arrow::Buffer::FromString(std::string(static_cast<size_t>(n), 'x'));
  u->columns = {c};
  return u;
}

// Hits of `policy` on `sequence` with room for `capacity` entries.
int64_t Simulate(CachePolicy policy, const std::vector<int>& sequence, int capacity,
                 const std::string& dir) {
  auto unit = UnitOfBytes(1000);
  CacheOptions o;
  o.dir = dir;
  o.policy = policy;
  o.shards = 1;
  int64_t entry_bytes = unit->ByteSize();
  if (dir != ":memory:") {  // an entry file is the data plus its header and metadata
    CacheOptions probe = o;
    probe.dir = testing::MakeTempDir() + "/probe";
    auto c = SplitCache::Open(probe);
    c->Put(SequenceSchedule::Key(0), unit, SourceIdentity{"/f", 1, 1, "h", 0});
    entry_bytes = InspectCacheDir(probe.dir).ValueOrDie().bytes;
  }
  o.size_limit = entry_bytes * capacity + entry_bytes / 2;
  auto cache = SplitCache::Open(o);
  cache->set_schedule(std::make_shared<SequenceSchedule>(sequence));
  int64_t hits = 0;
  for (size_t t = 0; t < sequence.size(); ++t) {
    const std::string key = SequenceSchedule::Key(sequence[t]);
    if (cache->Get(key) != nullptr) {
      ++hits;
    } else {
      cache->Put(key, unit, SourceIdentity{"/f", 1, 1, "h", sequence[t]}, static_cast<double>(t));
    }
  }
  return hits;
}

// The most hits any sequence of choices (insert or not; which entry to evict) makes.
int64_t BruteForceOptimum(const std::vector<int>& sequence, int capacity) {
  std::map<std::pair<size_t, uint32_t>, int64_t> memo;
  std::function<int64_t(size_t, uint32_t)> best = [&](size_t t, uint32_t held) -> int64_t {
    if (t == sequence.size()) return 0;
    auto it = memo.find({t, held});
    if (it != memo.end()) return it->second;
    const uint32_t bit = 1u << sequence[t];
    int64_t out;
    if (held & bit) {
      out = 1 + best(t + 1, held);
    } else {
      out = best(t + 1, held);  // leave it out
      if (__builtin_popcount(held) < capacity) {
        out = std::max(out, best(t + 1, held | bit));
      } else {
        for (uint32_t h = held; h != 0; h &= h - 1) {
          const uint32_t victim = h & (~h + 1);
          out = std::max(out, best(t + 1, (held & ~victim) | bit));
        }
      }
    }
    memo[{t, held}] = out;
    return out;
  };
  return best(0, 0);
}

}  // namespace

TEST(CachePolicy, PlanEvictsTheEntryReadFurthestInTheFuture) {
  // Budget of 3 entries of 10, all held: read next at 5, never, 2.
  const std::vector<HeldEntry> held = {
      {10, 0, false, 5.0}, {10, 0, false, kNeverUsed}, {10, 0, false, 2.0}};
  Admission a = Admit(CachePolicy::kPlan, held, 30, 30, 10, 3.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kNone);
  EXPECT_EQ(a.evict, std::vector<size_t>{1});  // never read again: furthest of all
  // A newcomer read later than everything held is left out.
  const std::vector<HeldEntry> soon = {{10, 0, false, 5.0}, {10, 0, false, 2.0}};
  a = Admit(CachePolicy::kPlan, soon, 20, 20, 10, 6.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kLater);
  EXPECT_TRUE(a.evict.empty());
  // Two must go to make room, but only one is read later than the newcomer: refused, and
  // nothing live is evicted.
  a = Admit(CachePolicy::kPlan, soon, 20, 20, 20, 3.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kLater);
  EXPECT_TRUE(a.evict.empty());
  // Both are read later, but both are read again: two hits given up for one is a bad
  // trade, so the newcomer is refused. (Two never read again may both go.)
  const std::vector<HeldEntry> later = {{10, 0, false, 5.0}, {10, 0, false, 4.0}};
  a = Admit(CachePolicy::kPlan, later, 20, 20, 20, 3.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kLater);
  EXPECT_TRUE(a.evict.empty());
  const std::vector<HeldEntry> unread = {{10, 0, false, kNeverUsed}, {10, 0, false, kNeverUsed}};
  a = Admit(CachePolicy::kPlan, unread, 20, 20, 20, 3.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kNone);
  EXPECT_EQ(a.evict.size(), 2u);
  // An entry read at the same time as the newcomer is worth as much: it stays.
  const std::vector<HeldEntry> tie = {{10, 0, false, 3.0}};
  a = Admit(CachePolicy::kPlan, tie, 10, 10, 10, 3.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kLater);
  EXPECT_TRUE(a.evict.empty());
  // Stale entries go first, even before entries never read again.
  const std::vector<HeldEntry> with_stale = {
      {10, 0, false, kNeverUsed}, {10, 0, true, 1.0}, {10, 0, false, 4.0}};
  a = Admit(CachePolicy::kPlan, with_stale, 30, 30, 10, 2.0);
  EXPECT_EQ(a.refusal, CacheRefusal::kNone);
  EXPECT_EQ(a.evict, std::vector<size_t>{1});
  a = Admit(CachePolicy::kPlan, with_stale, 30, 30, 20, 2.0);
  EXPECT_EQ(a.evict, (std::vector<size_t>{1, 0}));
  // Refused with stale entries held: they go anyway.
  a = Admit(CachePolicy::kPlan, with_stale, 30, 30, 30, kNeverUsed);
  EXPECT_EQ(a.refusal, CacheRefusal::kLater);
  EXPECT_EQ(a.evict, std::vector<size_t>{1});
}

TEST(CachePolicy, PlanMakesAsManyHitsAsTheBruteForceOptimum) {
  std::mt19937 rng(18);
  int64_t plan_total = 0, lru_total = 0, keep_total = 0;
  for (int round = 0; round < 300; ++round) {
    const int keys = 2 + static_cast<int>(rng() % 5);      // 2..6 entries
    const int capacity = 1 + static_cast<int>(rng() % 3);  // room for 1..3
    std::vector<int> sequence(4 + rng() % 11);              // 4..14 reads
    for (int& k : sequence) k = static_cast<int>(rng() % keys);
    const int64_t optimum = BruteForceOptimum(sequence, capacity);
    const int64_t plan = Simulate(CachePolicy::kPlan, sequence, capacity, ":memory:");
    EXPECT_EQ(plan, optimum) << "round " << round;
    plan_total += plan;
    lru_total += Simulate(CachePolicy::kLru, sequence, capacity, ":memory:");
    keep_total += Simulate(CachePolicy::kKeep, sequence, capacity, ":memory:");
  }
  EXPECT_GT(plan_total, lru_total);
  EXPECT_GT(plan_total, keep_total);
}

TEST(CachePolicy, ADiskCacheFollowsThePlanToo) {
  std::mt19937 rng(7);
  for (int round = 0; round < 12; ++round) {
    std::vector<int> sequence(12);
    for (int& k : sequence) k = static_cast<int>(rng() % 5);
    const int capacity = 2;
    EXPECT_EQ(Simulate(CachePolicy::kPlan, sequence, capacity, testing::MakeTempDir() + "/c"),
              BruteForceOptimum(sequence, capacity))
        << "round " << round;
  }
}

TEST(CachePolicy, ReshuffledScansLargerThanTheCacheKeepHitsWhereLruLosesThem) {
  // Five epochs of 20 entries, each a new permutation; room for 10. When every entry is
  // read once per epoch, a slot gives at most one hit per epoch, so the optimum is 10
  // hits per epoch after the first: what kKeep gets by never evicting, and kPlan by
  // Belady. LRU evicts what the next epoch needs.
  std::mt19937 rng(3);
  std::vector<int> sequence;
  for (int e = 0; e < 5; ++e) {
    std::vector<int> order(20);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    sequence.insert(sequence.end(), order.begin(), order.end());
  }
  const int64_t plan = Simulate(CachePolicy::kPlan, sequence, 10, ":memory:");
  const int64_t lru = Simulate(CachePolicy::kLru, sequence, 10, ":memory:");
  const int64_t keep = Simulate(CachePolicy::kKeep, sequence, 10, ":memory:");
  EXPECT_EQ(keep, 40);
  EXPECT_EQ(plan, 40);
  EXPECT_LT(lru, 30);
}

TEST(CachePolicy, PlanEvictsEntriesItsOwnerNeverReadsWhereKeepIsStuckWithThem) {
  // A disk cache left full by another loader (other keys): kKeep never makes a hit,
  // kPlan evicts those entries first (never read: furthest in the future).
  const std::vector<int> sequence = {0, 1, 2, 0, 1, 2, 0, 1, 2};
  for (CachePolicy policy : {CachePolicy::kKeep, CachePolicy::kPlan}) {
    const std::string dir = testing::MakeTempDir() + "/c";
    auto unit = UnitOfBytes(1000);
    CacheOptions o;
    o.dir = dir;
    o.shards = 1;
    o.policy = policy;
    {
      auto other = SplitCache::Open(o);
      for (int k = 10; k < 13; ++k) {
        other->Put(SequenceSchedule::Key(k), unit, SourceIdentity{"/g", 1, 1, "h", k});
      }
    }
    o.size_limit = InspectCacheDir(dir).ValueOrDie().bytes;  // full: room for 3
    auto cache = SplitCache::Open(o);
    cache->set_schedule(std::make_shared<SequenceSchedule>(sequence));
    int64_t hits = 0;
    for (size_t t = 0; t < sequence.size(); ++t) {
      const std::string key = SequenceSchedule::Key(sequence[t]);
      if (cache->Get(key) != nullptr) {
        ++hits;
      } else {
        cache->Put(key, unit, SourceIdentity{"/f", 1, 1, "h", sequence[t]}, static_cast<double>(t));
      }
    }
    EXPECT_EQ(hits, policy == CachePolicy::kKeep ? 0 : 6);
  }
}

}  // namespace pqloader
