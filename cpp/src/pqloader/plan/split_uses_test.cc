#include "pqloader/plan/split_uses.h"

#include <gtest/gtest.h>

namespace pqloader {

TEST(EpochSplitUses, ReadsAreAtEachRanksPositionInLockstep) {
  // 6 splits of 10 rows, 2 ranks, natural order: rank 0 reads splits 0-2, rank 1 3-5.
  const std::vector<int64_t> rows(6, 10);
  PlanOptions o;
  o.world_size = 2;
  o.rank = 1;  // ignored
  const auto uses = EpochSplitUses::Make(rows, o, 4);
  EXPECT_EQ(uses.epoch(), 4);
  EXPECT_EQ(uses.Reads(0), std::vector<double>{4.0});
  EXPECT_EQ(uses.Reads(3), std::vector<double>{4.0});  // both ranks start together
  EXPECT_DOUBLE_EQ(uses.Reads(5)[0], 4.0 + 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(uses.NextRead(4, 4.0), 4.0 + 1.0 / 3.0);
  EXPECT_EQ(uses.NextRead(4, 4.5), kNeverRead);
  EXPECT_EQ(uses.NextRead(99, 0), kNeverRead);
}

TEST(EpochSplitUses, ASplitSharedByTwoRanksIsReadByBoth) {
  // 3 splits of 10 rows over 2 ranks: split 1 is read by rank 0 (second) and rank 1 (first).
  const std::vector<int64_t> rows(3, 10);
  PlanOptions o;
  o.world_size = 2;
  const auto uses = EpochSplitUses::Make(rows, o, 0);
  EXPECT_EQ(uses.Reads(1), (std::vector<double>{0.0, 0.5}));
  EXPECT_DOUBLE_EQ(uses.NextRead(1, 0.0), 0.5);
}

TEST(EpochSplitUses, EveryReadOfAShuffledEpochIsCounted) {
  std::vector<int64_t> rows;
  for (int i = 0; i < 37; ++i) rows.push_back(5 + i % 7);
  PlanOptions o;
  o.shuffle = true;
  o.seed = 3;
  o.world_size = 3;
  const auto uses = EpochSplitUses::Make(rows, o, 2);
  size_t reads = 0, units = 0;
  for (int64_t s = 0; s < 37; ++s) reads += uses.Reads(s).size();
  for (int64_t r = 0; r < 3; ++r) {
    o.rank = r;
    units += EpochPlan::Make(rows, o, 2).units().size();
  }
  EXPECT_EQ(reads, units);
  for (int64_t s = 0; s < 37; ++s) {
    for (double t : uses.Reads(s)) EXPECT_TRUE(t >= 2.0 && t < 3.0);
  }
}

}  // namespace pqloader
