#include "pqloader/pack/document_lengths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <arrow/api.h>


#include "pqloader/pack/pack_plan.h"
#include "pqloader/plan/epoch_plan.h"
#include "pqloader/test_util.h"

namespace pqloader {

namespace {

// The lower order statistic, computed the slow way: sort, then index floor(q * (n - 1)).
int32_t SortedAt(std::vector<int32_t> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

TEST(SummarizeLengths, EmptyIsAllZero) {
  LengthStats s = SummarizeLengths({});
  EXPECT_EQ(s.rows, 0);
  EXPECT_EQ(s.total, 0);
  EXPECT_EQ(s.min, 0);
  EXPECT_EQ(s.max, 0);
  EXPECT_EQ(s.median, 0);
  EXPECT_EQ(s.p99, 0);
}

TEST(SummarizeLengths, SmallCasesTakeTheLowerOrderStatistic) {
  LengthStats s = SummarizeLengths({7});
  EXPECT_EQ(s.min, 7);
  EXPECT_EQ(s.median, 7);
  EXPECT_EQ(s.p99, 7);
  EXPECT_EQ(s.max, 7);
  // Sorted 1 2 9 40: the median's index is floor(0.5 * 3) = 1, p99's floor(0.99 * 3) = 2.
  s = SummarizeLengths({40, 2, 9, 1});
  EXPECT_EQ(s.rows, 4);
  EXPECT_EQ(s.total, 52);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.median, 2);
  EXPECT_EQ(s.p99, 9);
  EXPECT_EQ(s.max, 40);
}

TEST(SummarizeLengths, MatchesSortingOnRandomLengths) {
  std::mt19937 rng(5);
  std::lognormal_distribution<double> dist(4.0, 1.0);
  std::vector<int32_t> v(10001);
  for (auto& x : v) x = static_cast<int32_t>(dist(rng));
  LengthStats s = SummarizeLengths(v);
  EXPECT_EQ(s.median, SortedAt(v, 0.5));
  EXPECT_EQ(s.p99, SortedAt(v, 0.99));
  EXPECT_EQ(s.min, *std::min_element(v.begin(), v.end()));
  EXPECT_EQ(s.max, *std::max_element(v.begin(), v.end()));
}

TEST(DocumentLengths, ReadsEveryRowOfEveryRowGroupInOrder) {
  const std::string dir = testing::MakeTempDir();
  std::vector<int32_t> a = {3, 0, 5, 1, 1, 8, 2};  // row groups of 3: {3 0 5} {1 1 8} {2}
  std::vector<int32_t> b = {4, 6};
  testing::WriteTokensFile(dir + "/a.parquet", a, 3);
  testing::WriteTokensFile(dir + "/b.parquet", b, 3);
  DatasetOptions options;
  options.columns.columns = {"tokens"};
  auto dataset = Dataset::Open({dir}, options).ValueOrDie();
  ASSERT_EQ(dataset->splits().size(), 4u);
  auto lengths = DocumentLengths::Read(*dataset, 0, false, "", 2, arrow::default_memory_pool());
  ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  EXPECT_EQ((*lengths)->lengths(), all);
  EXPECT_EQ((*lengths)->Length(1, 2), 8);
  EXPECT_EQ((*lengths)->Sum(1, 0, 3), 10);
  EXPECT_EQ((*lengths)->Sum(3, 0, 2), 10);
  LengthStats s = SummarizeLengths((*lengths)->lengths());
  EXPECT_EQ(s.rows, 9);
  EXPECT_EQ(s.total, 30);
  EXPECT_EQ(s.max, 8);
}

// Sum keeps prefix sums every 64 rows only: checked against a plain sum for every range
// of every split, with splits that start and end off and on those checkpoints, and a
// dataset whose row count is a multiple of 64.
TEST(DocumentLengths, SumMatchesAPlainSumOverEveryRange) {
  for (int64_t rows_b : {77, 64}) {
    const std::string dir = testing::MakeTempDir();
    std::mt19937 rng(static_cast<uint32_t>(rows_b));
    std::uniform_int_distribution<int32_t> len(0, 40);
    std::vector<int32_t> a(640), b(static_cast<size_t>(rows_b));
    for (auto& x : a) x = len(rng);
    for (auto& x : b) x = len(rng);
    testing::WriteTokensFile(dir + "/a.parquet", a, 100);  // splits of 100 rows, the last 40
    testing::WriteTokensFile(dir + "/b.parquet", b, 50);
    DatasetOptions options;
    options.columns.columns = {"tokens"};
    auto dataset = Dataset::Open({dir}, options).ValueOrDie();
    auto lengths = DocumentLengths::Read(*dataset, 0, false, "", 2, arrow::default_memory_pool());
    ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
    std::vector<int32_t> all = a;
    all.insert(all.end(), b.begin(), b.end());
    ASSERT_EQ((*lengths)->lengths(), all);
    int64_t first = 0;
    for (size_t s = 0; s < dataset->splits().size(); ++s) {
      const int64_t n = dataset->splits()[s].file_rows;
      for (int64_t begin = 0; begin <= n; ++begin) {
        int64_t want = 0;
        for (int64_t end = begin; end <= n; ++end) {
          ASSERT_EQ((*lengths)->Sum(static_cast<int64_t>(s), begin, end), want)
              << "split " << s << " rows [" << begin << ", " << end << ")";
          if (end < n) want += all[static_cast<size_t>(first + end)];
        }
      }
      first += n;
    }
    EXPECT_EQ(first, static_cast<int64_t>(all.size()));
  }
}

TEST(DocumentLengths, RefusesAColumnThatIsNotAList) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {1, 2}, 2);
  DatasetOptions options;
  options.columns.columns = {"id"};
  auto dataset = Dataset::Open({dir}, options).ValueOrDie();
  auto lengths = DocumentLengths::Read(*dataset, 0, false, "", 1, arrow::default_memory_pool());
  ASSERT_FALSE(lengths.ok());
  EXPECT_NE(lengths.status().message().find("not a list column"), std::string::npos)
      << lengths.status().ToString();
  EXPECT_NE(lengths.status().message().find("a.parquet"), std::string::npos);
}

TEST(DocumentLengths, NullDocumentsAreEmptyOrRefusedAndOnlyTheKeptRowsCount) {
  const std::string dir = testing::MakeNullDocumentsDir();
  DatasetOptions options;
  options.columns.columns = {"tokens"};
  auto dataset = Dataset::Open({dir}, options).ValueOrDie();
  ASSERT_EQ(dataset->splits().size(), 2u);
  auto all = DocumentLengths::Read(*dataset, 0, true, "", 1, arrow::default_memory_pool());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)->lengths(), (std::vector<int32_t>{2, 0, 3, 0, 0, 0, 0}));
  EXPECT_EQ((*all)->null_rows(), 5);
  auto refused = DocumentLengths::Read(*dataset, 0, false, "use fill_null", 1, arrow::default_memory_pool());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("row 1 is a null list; use fill_null"), std::string::npos)
      << refused.status().ToString();
  // A filter kept a's rows 0 and 2 (no null among them) and b's row 1 (a null one).
  const std::vector<Split> splits = testing::KeepRows(dataset.get(), {{0, 2}, {1}});
  auto kept = DocumentLengths::Read(*dataset, 0, true, "", 2, arrow::default_memory_pool());
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ((*kept)->lengths(), (std::vector<int32_t>{2, 3, 0}));
  EXPECT_EQ((*kept)->null_rows(), 1);  // b's kept row; a's dropped nulls are not counted
  // Without a fill, a null the filter drops is not refused (b's kept null row is).
  dataset->RestrictSplits({splits[0]});
  auto a_only = DocumentLengths::Read(*dataset, 0, false, "", 1, arrow::default_memory_pool());
  ASSERT_TRUE(a_only.ok()) << a_only.status().ToString();
  EXPECT_EQ((*a_only)->lengths(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ((*a_only)->null_rows(), 0);
}

TEST(PackPlan, BlocksTruncationAndSpansFollowTheStreamOfTokens) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {3, 0, 5, 1, 1, 8, 2}, 3);
  DatasetOptions options;
  options.columns.columns = {"tokens"};
  auto dataset = Dataset::Open({dir}, options).ValueOrDie();
  auto lengths = DocumentLengths::Read(*dataset, 0, false, "", 1, arrow::default_memory_pool()).ValueOrDie();
  PlanOptions plan_options;
  plan_options.batch_size = 2;
  const EpochPlan plan = EpochPlan::Make(dataset->SplitRows(), plan_options, 0);
  PackOptions pack;
  pack.seq_len = 4;
  pack.has_eos = true;
  pack.truncate = true;  // each document keeps seq_len - 1 = 3 tokens, then eos
  PackPlan p = PackPlan::Make(plan, *lengths, pack, /*drop_last=*/false);
  // Stream: 4 1 4 2 2 4 3 tokens = 20, exactly 5 blocks (none padded, none partly).
  EXPECT_EQ(p.num_tokens(), 20);
  EXPECT_EQ(p.num_blocks(), 5);
  EXPECT_EQ(p.TokensAt(2), 4);
  EXPECT_EQ(p.DocumentTokensAt(2), 3);
  EXPECT_EQ(PackPlan::Make(plan, *lengths, pack, /*drop_last=*/true).num_blocks(), 5);
  // Block 1 is tokens [4, 8): it starts at position 1 (prefix 4), offset 0, and needs
  // positions up to the one holding token 7 (position 2, prefix 5..9).
  PackPlan::Span s = p.BlocksSpan(1, 2);
  EXPECT_EQ(s.first, 1);
  EXPECT_EQ(s.offset, 0);
  EXPECT_EQ(s.last, 3);
  s = p.BlocksSpan(2, 3);  // tokens [8, 12): position 2 from its 4th token to position 4
  EXPECT_EQ(s.first, 2);
  EXPECT_EQ(s.offset, 3);
  EXPECT_EQ(s.last, 5);  // position 4 (prefix 11..13) holds token 11
  pack.truncate = false;  // 4 1 6 2 2 9 3 = 27 tokens: 6 full blocks and a padded one
  EXPECT_EQ(PackPlan::Make(plan, *lengths, pack, false).num_blocks(), 7);
  const PackPlan dropped = PackPlan::Make(plan, *lengths, pack, true);
  EXPECT_EQ(dropped.num_blocks(), 6);
  // With drop_last the partial block is dropped: a block past the rank's (a "pad" rank's
  // padding) spans no document, and blocks up to it end at token 24, not 27 (the dropped
  // block's documents came back as the first padding block).
  s = dropped.BlocksSpan(6, 7);
  EXPECT_EQ(s.first, s.last);
  EXPECT_EQ(dropped.BlocksSpan(5, 7).last, dropped.BlocksSpan(5, 6).last);
  EXPECT_LT(dropped.BlocksSpan(5, 6).last, PackPlan::Make(plan, *lengths, pack, false).BlocksSpan(5, 7).last);
}

TEST(PackPlan, EqualBlocksAreTheFewestOrTheMostAnyRankFills) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {9, 1, 1, 1, 9, 9, 1, 1}, 2);
  DatasetOptions options;
  options.columns.columns = {"tokens"};
  auto dataset = Dataset::Open({dir}, options).ValueOrDie();
  auto lengths = DocumentLengths::Read(*dataset, 0, false, "", 1, arrow::default_memory_pool()).ValueOrDie();
  PlanOptions o;
  o.batch_size = 1;
  o.world_size = 2;
  o.shard_policy = ShardPolicy::kNone;
  PackOptions pack;
  pack.seq_len = 2;
  int64_t fewest = -1, most = 0;
  const auto order = EpochOrder::Make(dataset->SplitRows(), o, 0);
  for (int64_t r = 0; r < 2; ++r) {
    PlanOptions ro = o;
    ro.rank = r;
    const int64_t blocks = PackPlan::Make(EpochPlan::Make(ro, 0, order), *lengths, pack, false).num_blocks();
    fewest = fewest < 0 ? blocks : std::min(fewest, blocks);
    most = std::max(most, blocks);
  }
  ASSERT_LT(fewest, most);  // the ranks' documents differ in tokens
  EXPECT_EQ(PackPlan::EqualBlocks(dataset->SplitRows(), o, 0, *lengths, pack, ShardPolicy::kDrop), fewest);
  EXPECT_EQ(PackPlan::EqualBlocks(dataset->SplitRows(), o, 0, *lengths, pack, ShardPolicy::kPad), most);
}

}  // namespace

}  // namespace pqloader
