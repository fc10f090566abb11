#include "pqloader/util/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace pqloader {
namespace {

TEST(ParallelFor, RunsEveryIndexOnceWhateverTheThreads) {
  for (int threads : {0, 1, 2, 7, 100}) {
    for (int64_t n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      ParallelFor(n, threads, [&](int64_t i) { ++runs[static_cast<size_t>(i)]; });
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "threads " << threads << " n " << n;
      }
    }
  }
}

TEST(ParallelFor, UsesUpToTheThreadsAskedForTheCallerIncluded) {
  std::atomic<int> inside{0}, most{0};
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> caller_worked{false};
  ParallelFor(8, 3, [&](int64_t) {
    const int now = ++inside;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    if (std::this_thread::get_id() == caller) caller_worked = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --inside;
  });
  EXPECT_LE(most.load(), 3);
  EXPECT_TRUE(caller_worked.load());
}

// The lowest failing index's error, whatever the timing: whether the higher index
// fails first (7 at once, 2 after a while) or last (2 at once while 7 runs, 7 after).
TEST(ParallelForStatus, ReturnsTheLowestFailingIndexsError) {
  for (bool high_first : {true, false}) {
    for (int round = 0; round < 10; ++round) {
      std::atomic<bool> seven_started{false};
      auto st = ParallelForStatus(10, 10, [&](int64_t i) -> arrow::Status {
        if (i == 7) {
          seven_started = true;
          if (!high_first) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return arrow::Status::Invalid("seven");
        }
        if (i == 2) {
          if (high_first) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          } else {
            // Fail only once 7 runs (bounded: a refused thread start leaves 7 for later).
            for (int k = 0; k < 1000 && !seven_started; ++k) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
          }
          return arrow::Status::Invalid("two");
        }
        return arrow::Status::OK();
      });
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.message(), "two") << (high_first ? "7 failed first" : "2 failed first");
    }
  }
  EXPECT_TRUE(ParallelForStatus(10, 4, [](int64_t) { return arrow::Status::OK(); }).ok());
  EXPECT_TRUE(ParallelForStatus(0, 4, [](int64_t) { return arrow::Status::Invalid("x"); }).ok());
}

// On one thread nothing after a failure runs.
TEST(ParallelForStatus, StopsClaimingAfterAFailure) {
  std::vector<int64_t> ran;
  auto st = ParallelForStatus(10, 1, [&](int64_t i) -> arrow::Status {
    ran.push_back(i);
    return i == 3 ? arrow::Status::IOError("three") : arrow::Status::OK();
  });
  EXPECT_EQ(st.message(), "three");
  EXPECT_EQ(ran, (std::vector<int64_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace pqloader
