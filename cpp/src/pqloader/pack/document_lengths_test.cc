#include "pqloader/pack/document_lengths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <arrow/api.h>

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

}  // namespace

}  // namespace pqloader
