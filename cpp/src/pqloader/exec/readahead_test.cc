#include "pqloader/exec/readahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace pqloader {

namespace {

// Items [0, n) whose start records the order of starts; item `fail` fails to start.
struct Recorder {
  std::vector<int64_t> started;
  ReadAhead<int64_t> Make(int64_t begin, int64_t end, ReadAheadOptions o, int64_t fail = -1,
                          int64_t cost = 1) {
    return ReadAhead<int64_t>(
        begin, end,
        [this, fail](int64_t i) -> arrow::Result<int64_t> {
          started.push_back(i);
          if (i == fail) return arrow::Status::IOError("item ", i, " failed");
          return i * 10;
        },
        [cost](int64_t) { return cost; }, o);
  }
};

}  // namespace

TEST(ReadAhead, StartsTheWindowAheadOfTheItemTaken) {
  Recorder r;
  auto ra = r.Make(2, 20, ReadAheadOptions{4});
  ASSERT_EQ(*ra.Take(2), 20);
  EXPECT_EQ(r.started, (std::vector<int64_t>{2, 3, 4, 5, 6}));
  ASSERT_EQ(*ra.Take(3), 30);
  EXPECT_EQ(r.started.back(), 7);  // one taken, one more started
}

TEST(ReadAhead, CostBoundLimitsTheWindowButAlwaysAllowsOneItem) {
  Recorder r;
  auto ra = r.Make(0, 10, ReadAheadOptions{8, 250}, -1, 100);
  ASSERT_EQ(*ra.Take(0), 0);
  EXPECT_EQ(r.started, (std::vector<int64_t>{0, 1, 2}));  // 2 held: 200 <= 250 < 300
  Recorder big;
  auto rb = big.Make(0, 10, ReadAheadOptions{8, 50}, -1, 100);
  ASSERT_EQ(*rb.Take(0), 0);
  EXPECT_EQ(big.started, (std::vector<int64_t>{0, 1}));  // one item over the bound
}

TEST(ReadAhead, ItemsNeverGoPastTheEnd) {
  Recorder r;
  auto ra = r.Make(0, 3, ReadAheadOptions{16});
  for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(*ra.Take(i), i * 10);
  EXPECT_EQ(r.started, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_FALSE(ra.Take(3).ok());
}

TEST(ReadAhead, AFailedStartReachesOnlyTheTakerOfThatItem) {
  Recorder r;
  auto ra = r.Make(0, 6, ReadAheadOptions{4}, /*fail=*/2);
  ASSERT_TRUE(ra.Take(0).ok());
  ASSERT_TRUE(ra.Take(1).ok());
  auto failed = ra.Take(2);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("item 2"), std::string::npos);
  ASSERT_EQ(*ra.Take(3), 30);
}

TEST(ReadAhead, TakingOutOfOrderStartsEverythingBefore) {
  Recorder r;
  auto ra = r.Make(0, 10, ReadAheadOptions{1});
  ASSERT_EQ(*ra.Take(3), 30);
  EXPECT_EQ(r.started, (std::vector<int64_t>{0, 1, 2, 3}));
  for (int64_t i : {1, 0, 2}) ASSERT_EQ(*ra.Take(i), i * 10);
  EXPECT_FALSE(ra.Take(2).ok());  // taken twice
}

TEST(ReadAhead, ConcurrentTakersEachGetTheirItemOnce) {
  constexpr int64_t kItems = 2000;
  std::atomic<int64_t> next{0};
  ReadAhead<int64_t> ra(
      0, kItems, [](int64_t i) -> arrow::Result<int64_t> { return i * 7; },
      [](int64_t) { return int64_t{1}; }, ReadAheadOptions{8});
  std::atomic<int64_t> sum{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int64_t i = next++; i < kItems; i = next++) {
        auto v = ra.Take(i);
        if (!v.ok() || *v != i * 7) {
          ++bad;
        } else {
          sum += *v;  // what was taken, not which index was asked for
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(sum.load(), 7 * kItems * (kItems - 1) / 2);
  EXPECT_EQ(ra.started(), kItems);
}

}  // namespace pqloader
