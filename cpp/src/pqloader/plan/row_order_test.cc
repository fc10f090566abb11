#include "pqloader/plan/row_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace pqloader {
namespace {

// Sample ids (global row numbers) of positions [first, last) of `order`.
std::vector<int64_t> Samples(const RowOrder& order, const std::vector<int64_t>& split_rows,
                             int64_t first, int64_t last) {
  std::vector<int64_t> split_first(split_rows.size() + 1, 0);
  std::partial_sum(split_rows.begin(), split_rows.end(), split_first.begin() + 1);
  std::vector<RowRef> refs;
  order.Resolve(first, last, &refs);
  std::vector<int64_t> out;
  for (const RowRef& r : refs) {
    const Unit& u = order.units()[r.unit];
    out.push_back(split_first[u.split] + u.row_begin + r.row);
  }
  return out;
}

PlanOptions Options(int64_t batch, int64_t rank, int64_t world, bool shuffle, bool drop_last,
                    ShardPolicy policy) {
  PlanOptions o;
  o.batch_size = batch;
  o.rank = rank;
  o.world_size = world;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = 7;
  o.shuffle_window = 2;
  o.shard_policy = policy;
  return o;
}

int64_t Batches(int64_t rows, int64_t batch, bool drop_last) {
  return drop_last ? rows / batch : (rows + batch - 1) / batch;
}

struct Case {
  int64_t old_world, new_world, old_batch, new_batch;
};

// The samples an epoch hands out in total, as a sorted multiset: what the old ranks
// consumed (their first k batches) plus everything the new ranks read.
TEST(RemainderOrder, ResumingOnAnotherWorldHandsOutTheRestOfTheEpochExactlyOnce) {
  const std::vector<int64_t> split_rows = {37, 50, 11, 64, 29, 40, 3, 58};
  for (const Case c : {Case{4, 2, 8, 8}, Case{2, 3, 8, 8}, Case{3, 1, 8, 8}, Case{1, 4, 8, 8},
                       Case{2, 3, 8, 5}, Case{4, 4, 6, 16}}) {
    for (bool shuffle : {false, true}) {
      for (int cut = 0; cut < 4; ++cut) {
        SCOPED_TRACE(testing::Message() << c.old_world << "->" << c.new_world << " batch "
                                        << c.old_batch << "->" << c.new_batch << " shuffle "
                                        << shuffle << " cut " << cut);
        // What an uninterrupted old world hands out in the epoch.
        std::vector<int64_t> expected, got;
        ElasticBase base{c.old_world, c.old_batch, {}, nullptr};
        for (int64_t r = 0; r < c.old_world; ++r) {
          PlanOrder order(std::make_shared<const EpochPlan>(EpochPlan::Make(
              split_rows, Options(c.old_batch, r, c.old_world, shuffle, false, ShardPolicy::kDrop),
              3)));
          auto all = Samples(order, split_rows, 0, order.num_rows());
          expected.insert(expected.end(), all.begin(), all.end());
          // Ranks stopped at different points (one a batch ahead, as after a crash).
          const int64_t nb = Batches(order.num_rows(), c.old_batch, false);
          const int64_t k = std::min(nb, cut * nb / 4 + (r % 2));
          base.batches.push_back(k);
          auto done = Samples(order, split_rows, 0, std::min(order.num_rows(), k * c.old_batch));
          got.insert(got.end(), done.begin(), done.end());
        }
        ASSERT_EQ(ValidateElasticBase(base, split_rows, Options(8, 0, 1, shuffle, false, ShardPolicy::kDrop), 3), "");
        std::vector<int64_t> counts;
        for (int64_t r = 0; r < c.new_world; ++r) {
          auto rest = MakeRemainderOrder(
              split_rows, Options(c.new_batch, r, c.new_world, shuffle, false, ShardPolicy::kDrop),
              3, base);
          auto s = Samples(*rest, split_rows, 0, rest->num_rows());
          got.insert(got.end(), s.begin(), s.end());
          counts.push_back(rest->num_rows());
          // Deterministic: the same base gives the same order.
          auto again = MakeRemainderOrder(
              split_rows, Options(c.new_batch, r, c.new_world, shuffle, false, ShardPolicy::kDrop),
              3, base);
          EXPECT_EQ(Samples(*again, split_rows, 0, again->num_rows()), s);
        }
        // kDrop drops at most world-1 samples of the rest to equalise the new ranks.
        const int64_t dropped = static_cast<int64_t>(expected.size() - got.size());
        EXPECT_GE(dropped, 0);
        EXPECT_LT(dropped, c.new_world);
        for (int64_t n : counts) EXPECT_EQ(n, counts[0]);
        std::sort(expected.begin(), expected.end());
        std::sort(got.begin(), got.end());
        // Every sample handed out is one of the epoch's, none twice.
        EXPECT_TRUE(std::includes(expected.begin(), expected.end(), got.begin(), got.end()));
        EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end());
      }
    }
  }
}

TEST(RemainderOrder, PadRepeatsInsteadOfDropping) {
  const std::vector<int64_t> split_rows = {10, 11};  // 21 rows
  ElasticBase base{1, 4, {2}, nullptr};              // 8 consumed, 13 left
  int64_t total = 0;
  std::vector<int64_t> got;
  for (int64_t r = 0; r < 3; ++r) {
    auto rest = MakeRemainderOrder(split_rows, Options(4, r, 3, true, false, ShardPolicy::kPad),
                                   0, base);
    EXPECT_EQ(rest->num_rows(), 5);  // 13 = 5 + 4 + 4, two padded
    total += rest->num_rows();
    auto s = Samples(*rest, split_rows, 0, rest->num_rows());
    got.insert(got.end(), s.begin(), s.end());
  }
  EXPECT_EQ(total, 15);
  std::sort(got.begin(), got.end());
  got.erase(std::unique(got.begin(), got.end()), got.end());
  EXPECT_EQ(got.size(), 13u);  // every remaining sample, two of them twice
}

TEST(RemainderOrder, DropLastExcludesWhatTheOldWorldWouldHaveDropped) {
  const std::vector<int64_t> split_rows = {10, 13};  // 23 rows, batch 4: 5 full batches
  ElasticBase base{1, 4, {1}, nullptr};
  auto rest = MakeRemainderOrder(split_rows, Options(4, 0, 1, false, true, ShardPolicy::kDrop), 0,
                                 base);
  EXPECT_EQ(rest->num_rows(), 16);  // rows 4..19; 20..22 were the dropped last batch
  std::vector<int64_t> want(16);
  std::iota(want.begin(), want.end(), 4);
  EXPECT_EQ(Samples(*rest, split_rows, 0, 16), want);
}

TEST(RemainderOrder, NestedResizesContinueTheSameEpoch) {
  const std::vector<int64_t> split_rows = {33, 40, 27, 51};
  auto old_base = std::make_shared<ElasticBase>(ElasticBase{4, 5, {2, 3, 1, 2}, nullptr});
  // A 3-rank world resumed it, consumed some, and is resumed by 2 ranks.
  ElasticBase base{3, 6, {1, 2, 0}, old_base};
  ASSERT_EQ(ValidateElasticBase(base, split_rows, Options(7, 0, 2, true, false, ShardPolicy::kDrop), 1), "");
  std::vector<int64_t> got;
  for (int64_t r = 0; r < 4; ++r) {
    PlanOrder o(std::make_shared<const EpochPlan>(
        EpochPlan::Make(split_rows, Options(5, r, 4, true, false, ShardPolicy::kDrop), 1)));
    auto s = Samples(o, split_rows, 0, old_base->batches[r] * 5);
    got.insert(got.end(), s.begin(), s.end());
  }
  for (int64_t r = 0; r < 3; ++r) {
    auto mid = MakeRemainderOrder(split_rows, Options(6, r, 3, true, false, ShardPolicy::kDrop), 1,
                                  *old_base);
    auto s = Samples(*mid, split_rows, 0, std::min(mid->num_rows(), base.batches[r] * 6));
    got.insert(got.end(), s.begin(), s.end());
  }
  for (int64_t r = 0; r < 2; ++r) {
    auto rest = MakeRemainderOrder(split_rows, Options(7, r, 2, true, false, ShardPolicy::kDrop), 1,
                                   base);
    auto s = Samples(*rest, split_rows, 0, rest->num_rows());
    got.insert(got.end(), s.begin(), s.end());
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end());
  EXPECT_GE(static_cast<int64_t>(got.size()), 151 - 4 - 3 - 2);  // only equalising drops
}

// Many old ranks over many splits, three levels (64 ranks, resumed by 32, resumed by 3):
// each level's rest is made once and shared by its old ranks' shares (it was made anew
// per old rank: old world x its old world x splits, minutes and GBs at 1,024 -> 512).
TEST(RemainderOrder, ManyOldRanksAndNestedResizesHandOutEachSampleOnce) {
  std::vector<int64_t> split_rows(2000);
  for (size_t i = 0; i < split_rows.size(); ++i) split_rows[i] = 3 + static_cast<int64_t>(i % 5);
  const int64_t total = std::accumulate(split_rows.begin(), split_rows.end(), int64_t{0});
  for (const ShardPolicy policy : {ShardPolicy::kDrop, ShardPolicy::kPad}) {
    std::vector<int64_t> first(64), second(32);
    for (int64_t r = 0; r < 64; ++r) first[r] = r % 7;
    for (int64_t r = 0; r < 32; ++r) second[r] = r % 5;
    auto inner = std::make_shared<ElasticBase>(ElasticBase{64, 4, first, nullptr});
    const ElasticBase base{32, 6, second, inner};
    ASSERT_EQ(ValidateElasticBase(base, split_rows, Options(5, 0, 3, true, false, policy), 2), "");
    std::vector<int64_t> got;
    for (int64_t r = 0; r < 64; ++r) {
      PlanOrder o(std::make_shared<const EpochPlan>(
          EpochPlan::Make(split_rows, Options(4, r, 64, true, false, policy), 2)));
      auto s = Samples(o, split_rows, 0, first[r] * 4);
      got.insert(got.end(), s.begin(), s.end());
    }
    for (int64_t r = 0; r < 32; ++r) {
      auto mid = MakeRemainderOrder(split_rows, Options(6, r, 32, true, false, policy), 2, *inner);
      auto s = Samples(*mid, split_rows, 0, std::min(mid->num_rows(), second[r] * 6));
      got.insert(got.end(), s.begin(), s.end());
    }
    int64_t rest_rows = -1;
    for (int64_t r = 0; r < 3; ++r) {
      auto rest = MakeRemainderOrder(split_rows, Options(5, r, 3, true, false, policy), 2, base);
      if (rest_rows >= 0) {
        EXPECT_EQ(rest->num_rows(), rest_rows);  // equal shares
      }
      rest_rows = rest->num_rows();
      auto s = Samples(*rest, split_rows, 0, rest->num_rows());
      got.insert(got.end(), s.begin(), s.end());
    }
    std::sort(got.begin(), got.end());
    if (policy == ShardPolicy::kDrop) {
      EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end());  // each once
      EXPECT_GE(static_cast<int64_t>(got.size()), total - 64 - 32 - 3);  // only equalising drops
    } else {
      got.erase(std::unique(got.begin(), got.end()), got.end());
      EXPECT_EQ(static_cast<int64_t>(got.size()), total);  // every sample, some twice
    }
  }
}

TEST(RemainderOrder, UnitRangesAreMonotoneAndCoverTheirPositions) {
  const std::vector<int64_t> split_rows = {37, 50, 11, 64, 29, 40};
  ElasticBase base{3, 8, {2, 1, 3}, nullptr};
  auto rest =
      MakeRemainderOrder(split_rows, Options(8, 0, 2, true, false, ShardPolicy::kDrop), 2, base);
  int64_t prev_lo = 0, prev_hi = 0;
  for (int64_t first = 0; first < rest->num_rows(); first += 8) {
    const int64_t last = std::min(first + 8, rest->num_rows());
    const auto [lo, hi] = rest->PositionUnitRange(first, last);
    EXPECT_GE(lo, prev_lo);
    EXPECT_GE(hi, prev_hi);
    std::vector<RowRef> refs;
    rest->Resolve(first, last, &refs);
    for (const RowRef& r : refs) {
      EXPECT_GE(r.unit, lo);
      EXPECT_LT(r.unit, hi);
      EXPECT_LT(r.row, rest->units()[r.unit].num_rows());
    }
    prev_lo = lo;
    prev_hi = hi;
  }
}

TEST(RemainderOrder, BadBasesAreRefused) {
  const std::vector<int64_t> rows = {10, 11};
  const PlanOptions o = Options(4, 0, 1, false, false, ShardPolicy::kDrop);
  EXPECT_NE(ValidateElasticBase(ElasticBase{2, 4, {1}, nullptr}, rows, o, 0), "");
  EXPECT_NE(ValidateElasticBase(ElasticBase{0, 4, {}, nullptr}, rows, o, 0), "");
  EXPECT_NE(ValidateElasticBase(ElasticBase{1, 4, {-1}, nullptr}, rows, o, 0), "");
  EXPECT_EQ(ValidateElasticBase(ElasticBase{1, 4, {6}, nullptr}, rows, o, 0), "");  // 21 rows
  EXPECT_NE(ValidateElasticBase(ElasticBase{1, 4, {7}, nullptr}, rows, o, 0), "");
  auto inner = std::make_shared<ElasticBase>(ElasticBase{2, 4, {1, 9}, nullptr});
  EXPECT_NE(ValidateElasticBase(ElasticBase{1, 4, {0}, inner}, rows, o, 0), "");
}

// A base's batch size past 2^62 is refused by name (ceil(rows / batch_size) overflowed: a
// batch size of 2^63 - 1 "had 0 batches" for 21 rows, so 1 consumed was refused falsely
// and 0 passed); 2^62 itself is one batch of every row.
TEST(RemainderOrder, BaseSizesPast2To62AreRefused) {
  const std::vector<int64_t> rows = {10, 11};
  const PlanOptions o = Options(4, 0, 1, false, false, ShardPolicy::kDrop);
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_NE(ValidateElasticBase(ElasticBase{1, max, {0}, nullptr}, rows, o, 0).find("at most 2^62"),
            std::string::npos);
  EXPECT_EQ(ValidateElasticBase(ElasticBase{1, int64_t{1} << 62, {1}, nullptr}, rows, o, 0), "");
  EXPECT_EQ(MakeRemainderOrder(rows, o, 0, ElasticBase{1, int64_t{1} << 62, {1}, nullptr})->num_rows(), 0);
  EXPECT_EQ(MakeRemainderOrder(rows, o, 0, ElasticBase{1, int64_t{1} << 62, {0}, nullptr})->num_rows(), 21);
}

}  // namespace
}  // namespace pqloader
