#include "pqloader/plan/epoch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "pqloader/random/philox.h"

namespace pqloader {

namespace {

// Global ids of the samples of `plan`, in order; split s row r has id prefix[s] + r.
std::vector<int64_t> Ids(const EpochPlan& plan, const std::vector<int64_t>& split_rows) {
  std::vector<int64_t> prefix(split_rows.size() + 1, 0);
  std::partial_sum(split_rows.begin(), split_rows.end(), prefix.begin() + 1);
  std::vector<RowRef> rows;
  plan.ResolveRows(0, plan.num_rows(),
                   [&](int64_t w) { return plan.WindowPermutation(w); }, &rows);
  std::vector<int64_t> ids;
  for (const RowRef& r : rows) {
    const Unit& u = plan.units()[r.unit];
    ids.push_back(prefix[u.split] + u.row_begin + r.row);
  }
  return ids;
}

const std::vector<int64_t> kUneven = {5, 3, 0, 4, 2, 6, 1, 9, 7};  // 37 rows

}  // namespace

TEST(EpochPlan, NaturalOrderWithoutShuffle) {
  PlanOptions o;
  o.batch_size = 4;
  auto plan = EpochPlan::Make(kUneven, o, 3);
  auto ids = Ids(plan, kUneven);
  std::vector<int64_t> expect(37);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(ids, expect);
  EXPECT_EQ(plan.num_batches(), 10);
  EXPECT_EQ(plan.BatchRowRange(9), std::make_pair(int64_t{36}, int64_t{37}));
}

TEST(EpochPlan, ShuffleIsAPermutationThatChangesWithEpochAndSeed) {
  PlanOptions o;
  o.shuffle = true;
  o.seed = 11;
  o.shuffle_window = 3;
  auto e0 = Ids(EpochPlan::Make(kUneven, o, 0), kUneven);
  auto e1 = Ids(EpochPlan::Make(kUneven, o, 1), kUneven);
  o.seed = 12;
  auto s2 = Ids(EpochPlan::Make(kUneven, o, 0), kUneven);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(37);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, s2);
  o.seed = 11;
  EXPECT_EQ(Ids(EpochPlan::Make(kUneven, o, 0), kUneven), e0);
}

TEST(EpochPlan, BatchUnitRangesAreMonotoneAndCoverTheirRows) {
  PlanOptions o;
  o.shuffle = true;
  o.seed = 5;
  o.shuffle_window = 2;
  o.batch_size = 3;
  auto plan = EpochPlan::Make(kUneven, o, 0);
  std::pair<int64_t, int64_t> prev{0, 0};
  for (int64_t b = 0; b < plan.num_batches(); ++b) {
    auto range = plan.BatchUnitRange(b);
    EXPECT_GE(range.first, prev.first);
    EXPECT_GE(range.second, prev.second);
    auto [first, last] = plan.BatchRowRange(b);
    std::vector<RowRef> rows;
    plan.ResolveRows(first, last, [&](int64_t w) { return plan.WindowPermutation(w); }, &rows);
    for (const RowRef& r : rows) {
      EXPECT_GE(r.unit, range.first);
      EXPECT_LT(r.unit, range.second);
      EXPECT_LT(r.row, plan.units()[r.unit].num_rows());
    }
    prev = range;
  }
}

TEST(EpochPlan, ABatchNeedsExactlyTheUnitsOfItsRowsWindows) {
  // Not one unit more: a window one too wide would hold a row group in memory for
  // nothing (the output would not change, so only this test sees it).
  for (bool shuffle : {false, true}) {
    for (int64_t window : {1, 2, 3}) {
      PlanOptions o;
      o.shuffle = shuffle;
      o.seed = 9;
      o.shuffle_window = window;
      o.batch_size = 4;
      auto plan = EpochPlan::Make(kUneven, o, 1);
      const int64_t w = shuffle ? window : 1;
      const auto num_units = static_cast<int64_t>(plan.units().size());
      for (int64_t b = 0; b < plan.num_batches(); ++b) {
        auto [first, last] = plan.BatchRowRange(b);
        std::vector<RowRef> rows;
        plan.ResolveRows(first, last, [&](int64_t x) { return plan.WindowPermutation(x); }, &rows);
        int64_t lo = num_units, hi = 0;
        for (const RowRef& r : rows) {
          lo = std::min(lo, r.unit / w * w);
          hi = std::max(hi, std::min(num_units, (r.unit / w + 1) * w));
        }
        EXPECT_EQ(plan.BatchUnitRange(b), std::make_pair(lo, hi))
            << "shuffle " << shuffle << " window " << window << " batch " << b;
      }
    }
  }
}

TEST(EpochPlan, SeedsDifferingOnlyInTheirHighWordShuffleDifferently) {
  // A key made of the seed's low 32 bits only would give drawn 64-bit seeds that share
  // them the same order.
  PlanOptions o;
  o.shuffle = true;
  o.shuffle_window = 3;
  o.seed = 0x0000000100000007ull;
  const auto a = Ids(EpochPlan::Make(kUneven, o, 0), kUneven);
  o.seed = 0x0000000200000007ull;
  const auto b = Ids(EpochPlan::Make(kUneven, o, 0), kUneven);
  o.seed = 7;
  const auto c = Ids(EpochPlan::Make(kUneven, o, 0), kUneven);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, c);
}

TEST(EpochPlan, ShardsAreEqualDisjointAndComplete) {
  for (bool shuffle : {false, true}) {
    for (auto policy : {ShardPolicy::kDrop, ShardPolicy::kPad}) {
      for (int64_t world = 1; world <= 5; ++world) {
        std::map<int64_t, int> seen;
        int64_t per_rank = -1;
        for (int64_t rank = 0; rank < world; ++rank) {
          PlanOptions o;
          o.shuffle = shuffle;
          o.seed = 3;
          o.rank = rank;
          o.world_size = world;
          o.shard_policy = policy;
          o.batch_size = 4;
          auto plan = EpochPlan::Make(kUneven, o, 2);
          auto ids = Ids(plan, kUneven);
          if (per_rank < 0) per_rank = static_cast<int64_t>(ids.size());
          EXPECT_EQ(static_cast<int64_t>(ids.size()), per_rank);
          for (int64_t id : ids) ++seen[id];
        }
        const int64_t total = 37;
        if (policy == ShardPolicy::kDrop) {
          EXPECT_EQ(per_rank, total / world);
          EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank * world);  // disjoint
          for (auto& [id, n] : seen) EXPECT_EQ(n, 1);
          EXPECT_LT(total - static_cast<int64_t>(seen.size()), world);
        } else {
          EXPECT_EQ(per_rank, (total + world - 1) / world);
          EXPECT_EQ(static_cast<int64_t>(seen.size()), total);  // complete
          int64_t repeats = 0;
          for (auto& [id, n] : seen) repeats += n - 1;
          EXPECT_EQ(repeats, per_rank * world - total);
        }
      }
    }
  }
}

TEST(EpochPlan, RanksCutTheEpochsSplitOrderIntoConsecutiveUnits) {
  // With kDrop and no rank dropping anything (rows a multiple of the world), the ranks'
  // units, in rank order, are the epoch's split order cut at the shares' bounds: a plan
  // made from a shared EpochOrder (what EpochSplitUses does for every rank) finds its
  // units by binary search; this walks the order from the start, as a reference.
  const std::vector<int64_t> rows = {5, 3, 0, 4, 2, 6, 0, 1, 9, 7, 0, 2};  // 39 rows
  for (bool shuffle : {false, true}) {
    for (int64_t world : {1, 3, 13, 39}) {
      PlanOptions o;
      o.shuffle = shuffle;
      o.seed = 11;
      o.world_size = world;
      const auto order = EpochOrder::Make(rows, o, 4);
      std::vector<Unit> got;
      for (int64_t rank = 0; rank < world; ++rank) {
        o.rank = rank;
        const EpochPlan shared = EpochPlan::Make(o, 4, order);
        const EpochPlan own = EpochPlan::Make(rows, o, 4);
        EXPECT_EQ(shared.units(), own.units());
        const int64_t share = 39 / world;
        for (const Unit& u : shared.units()) got.push_back(u);
        // Cut the rank's share out of the order, walking it from the start.
        std::vector<Unit> want;
        int64_t start = 0;
        for (int64_t s : order->split_order) {
          const int64_t lo = std::max(rank * share, start);
          const int64_t hi = std::min((rank + 1) * share, start + rows[s]);
          if (lo < hi) want.push_back(Unit{s, lo - start, hi - start});
          start += rows[s];
        }
        EXPECT_EQ(shared.units(), want) << "world " << world << " rank " << rank;
      }
      int64_t covered = 0;
      for (const Unit& u : got) covered += u.num_rows();
      EXPECT_EQ(covered, 39);
    }
  }
}

TEST(EpochPlan, PaddingRepeatsTheRanksOwnFirstRow) {
  PlanOptions o;
  o.world_size = 3;
  o.shard_policy = ShardPolicy::kPad;
  const std::vector<std::vector<int64_t>> expect = {{0, 1, 2}, {3, 4, 3}, {5, 6, 5}};
  for (int64_t rank = 0; rank < 3; ++rank) {
    o.rank = rank;
    auto plan = EpochPlan::Make({3, 4}, o, 0);
    EXPECT_EQ(Ids(plan, {3, 4}), expect[rank]) << "rank " << rank;
    EXPECT_EQ(plan.padded_rows(), 2);
  }
}

TEST(EpochPlan, PaddingBorrowsARowWhenRanksOutnumberRows) {
  // An empty share borrows row rank % total: the borrowed rows are spread, not all row 0.
  PlanOptions o;
  o.world_size = 5;
  o.shard_policy = ShardPolicy::kPad;
  for (int64_t rank : {2, 3, 4}) {
    o.rank = rank;
    auto plan = EpochPlan::Make({2}, o, 0);
    EXPECT_EQ(plan.num_rows(), 1);
    EXPECT_EQ(plan.padded_rows(), 3);
    EXPECT_EQ(Ids(plan, {2}), std::vector<int64_t>({rank % 2})) << "rank " << rank;
  }
}

namespace {

// Fisher-Yates from the end, j uniform in [0, i]: the shuffle the determinism contract
// names, written out here as a reference.
template <typename T>
std::vector<T> FisherYates(int64_t n, CounterRng rng) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), T{0});
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(v[i], v[rng.Uniform(static_cast<uint64_t>(i) + 1)]);
  }
  return v;
}

}  // namespace

TEST(EpochPlan, OrdersAreFisherYatesOfTheDocumentedStreams) {
  // The epoch's split order is a Fisher-Yates shuffle of the splits by the stream
  // (seed, kSplitOrder, epoch, 0); window w's row permutation one of its rows by
  // (seed, kWindowRows, epoch, w). Any other stream or shuffle would change every
  // user's order (and what a checkpoint resumes to) between versions.
  const std::vector<int64_t> rows = {5, 3, 4, 2, 6, 1, 9, 7};  // no empty split
  PlanOptions o;
  o.shuffle = true;
  o.seed = 0x5eed00000000002aull;
  o.shuffle_window = 3;
  for (int64_t epoch : {0, 1, 7}) {
    const auto order = EpochOrder::Make(rows, o, epoch);
    EXPECT_EQ(order->split_order,
              FisherYates<int64_t>(8, CounterRng(o.seed, RngPurpose::kSplitOrder,
                                                 static_cast<uint32_t>(epoch), 0)))
        << "epoch " << epoch;
    const EpochPlan plan = EpochPlan::Make(rows, o, epoch);
    ASSERT_GT(plan.num_windows(), 2);
    for (int64_t w = 0; w < plan.num_windows(); ++w) {
      const auto [first, last] = plan.WindowRowRange(w);
      EXPECT_EQ(plan.WindowPermutation(w),
                FisherYates<uint32_t>(last - first,
                                      CounterRng(o.seed, RngPurpose::kWindowRows,
                                                 static_cast<uint32_t>(epoch), static_cast<uint32_t>(w))))
          << "epoch " << epoch << " window " << w;
    }
  }
  // On other ranks, (seed, kWindowRows with the rank, epoch, w): every rank's window w
  // took its rows at the same offsets before.
  o.world_size = 2;
  for (int64_t rank : {0, 1}) {
    o.rank = rank;
    const EpochPlan plan = EpochPlan::Make(rows, o, 1);
    for (int64_t w = 0; w < plan.num_windows(); ++w) {
      const auto [first, last] = plan.WindowRowRange(w);
      EXPECT_EQ(plan.WindowPermutation(w),
                FisherYates<uint32_t>(last - first, CounterRng::ForWindow(o.seed, 1, w, rank)))
          << "rank " << rank << " window " << w;
    }
  }
}

TEST(EpochPlan, RanksShuffleWindowsOfEqualSizeIndependently) {
  // 8 splits of 64 rows, 2 ranks, windows of 2 splits: each rank's windows hold 128 rows.
  const std::vector<int64_t> rows(8, 64);
  PlanOptions o;
  o.shuffle = true;
  o.seed = 5;
  o.shuffle_window = 2;
  o.world_size = 2;
  o.rank = 0;
  const EpochPlan zero = EpochPlan::Make(rows, o, 0);
  o.rank = 1;
  const EpochPlan one = EpochPlan::Make(rows, o, 0);
  ASSERT_EQ(zero.num_windows(), one.num_windows());
  for (int64_t w = 0; w < zero.num_windows(); ++w) {
    const auto a = zero.WindowPermutation(w), b = one.WindowPermutation(w);
    ASSERT_EQ(a.size(), b.size());
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i] ? 1 : 0;
    EXPECT_LT(same, 10) << "window " << w;  // ~1 of 128 by chance; all 128 before
  }
}

TEST(EpochPlan, EveryOrderOfThreeSplitsIsEquallyLikely) {
  // An unbiased shuffle: over 6,000 seeds each of the 6 orders of 3 splits comes up about
  // 1,000 times (a shuffle off by one, e.g. Sattolo's, makes only some of them).
  PlanOptions o;
  o.shuffle = true;
  std::map<std::vector<int64_t>, int> counts;
  for (uint64_t seed = 0; seed < 6000; ++seed) {
    o.seed = seed;
    ++counts[EpochOrder::Make({1, 1, 1}, o, 0)->split_order];
  }
  EXPECT_EQ(counts.size(), 6u);
  for (const auto& [order, n] : counts) {
    EXPECT_GT(n, 850) << order[0] << order[1] << order[2];
    EXPECT_LT(n, 1150) << order[0] << order[1] << order[2];
  }
}

TEST(EpochPlan, DropLastDropsOnlyTheIncompleteBatch) {
  PlanOptions o;
  o.batch_size = 10;
  o.drop_last = true;
  auto plan = EpochPlan::Make(kUneven, o, 0);
  EXPECT_EQ(plan.num_batches(), 3);
  EXPECT_EQ(plan.drop_last_rows(), 7);
  o.drop_last = false;  // the incomplete batch is kept: nothing dropped
  plan = EpochPlan::Make(kUneven, o, 0);
  EXPECT_EQ(plan.num_batches(), 4);
  EXPECT_EQ(plan.drop_last_rows(), 0);
}

TEST(EpochPlan, EmptyDatasetHasNoBatches) {
  PlanOptions o;
  auto plan = EpochPlan::Make({}, o, 0);
  EXPECT_EQ(plan.num_batches(), 0);
  EXPECT_TRUE(plan.units().empty());
}

TEST(EpochPlan, ValidationNamesTheBadOption) {
  PlanOptions o;
  o.rank = 3;
  o.world_size = 2;
  EXPECT_NE(ValidatePlanOptions(o).find("rank"), std::string::npos);
  o = PlanOptions{};
  o.batch_size = 0;
  EXPECT_NE(ValidatePlanOptions(o).find("batch_size"), std::string::npos);
  EXPECT_EQ(ValidatePlanOptions(PlanOptions{}), "");
}

}  // namespace pqloader
