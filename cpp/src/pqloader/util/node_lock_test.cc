#include "pqloader/util/node_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "pqloader/test_util.h"

namespace pqloader {
namespace {

using std::chrono::milliseconds;

TEST(NodeLock, ATimedAcquireGivesUpWhileAnotherHoldsTheLock) {
  const std::string path = testing::MakeTempDir() + "/sub/dir/.lock";
  auto held = NodeLock::Acquire(path, milliseconds(0));  // creates the directories
  ASSERT_NE(held, nullptr);
  // Each Acquire opens its own file description: threads of one process exclude each
  // other as processes do.
  std::unique_ptr<NodeLock> other;
  std::thread([&] { other = NodeLock::Acquire(path, milliseconds(50)); }).join();
  EXPECT_EQ(other, nullptr);
  held.reset();
  std::thread([&] { other = NodeLock::Acquire(path, milliseconds(0)); }).join();
  EXPECT_NE(other, nullptr);
}

TEST(NodeLock, ATimedAcquireStopsWaitingOnceCancelled) {
  const std::string path = testing::MakeTempDir() + "/.lock";
  auto held = NodeLock::Acquire(path, milliseconds(0));
  ASSERT_NE(held, nullptr);
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<NodeLock> other;
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    other = NodeLock::Acquire(path, std::chrono::minutes(30), cancel);
    returned = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned.load());  // still waiting for the holder
  cancel->store(true);
  waiter.join();  // within a poll (20 ms), not 30 minutes
  EXPECT_EQ(other, nullptr);
}

TEST(NodeLock, AWaitForAnExistingLockEndsWhenTheHolderLetsGo) {
  const std::string path = testing::MakeTempDir() + "/.lock";
  auto held = NodeLock::AcquireExisting(path, milliseconds(0));
  ASSERT_NE(held, nullptr);
  std::atomic<bool> released{false}, acquired{false}, saw_release{false}, timed_out{true};
  std::thread waiter([&] {
    bool ran_out = true;
    auto lock = NodeLock::AcquireExisting(path, std::chrono::minutes(30), nullptr, &ran_out);
    saw_release = released.load();
    acquired = lock != nullptr;
    timed_out = ran_out;
  });
  std::this_thread::sleep_for(milliseconds(50));  // the waiter is polling by now
  EXPECT_FALSE(acquired.load());
  released = true;
  held.reset();
  waiter.join();
  EXPECT_TRUE(acquired.load());
  EXPECT_TRUE(saw_release.load());  // it got the lock only after the holder let go
  EXPECT_FALSE(timed_out.load());
}

TEST(NodeLock, AWaitForAnExistingLockRunsOutAndSaysSo) {
  const std::string path = testing::MakeTempDir() + "/.lock";
  auto held = NodeLock::AcquireExisting(path, milliseconds(0));
  ASSERT_NE(held, nullptr);
  bool timed_out = false;
  std::unique_ptr<NodeLock> other;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread([&] {
    other = NodeLock::AcquireExisting(path, milliseconds(80), nullptr, &timed_out);
  }).join();
  EXPECT_EQ(other, nullptr);
  EXPECT_TRUE(timed_out);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(80));  // it waited its time
  held.reset();
  std::thread([&] {
    other = NodeLock::AcquireExisting(path, milliseconds(0), nullptr, &timed_out);
  }).join();
  EXPECT_NE(other, nullptr);
  EXPECT_FALSE(timed_out);
}

TEST(NodeLock, AWaitForAnExistingLockCreatesNoDirectories) {
  const std::string dir = testing::MakeTempDir() + "/gone";
  bool timed_out = true;
  EXPECT_EQ(
      NodeLock::AcquireExisting(dir + "/.lock", std::chrono::minutes(30), nullptr, &timed_out),
      nullptr);
  EXPECT_FALSE(timed_out);  // no file: at once, not after the timeout
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace pqloader
