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

TEST(NodeLock, ABlockingAcquireWaitsForTheHolder) {
  const std::string path = testing::MakeTempDir() + "/.lock";
  auto held = NodeLock::AcquireBlocking(path);
  ASSERT_NE(held, nullptr);
  std::atomic<bool> released{false}, acquired{false}, saw_release{false};
  std::thread waiter([&] {
    auto lock = NodeLock::AcquireBlocking(path);
    saw_release = released.load();
    acquired = lock != nullptr;
  });
  std::this_thread::sleep_for(milliseconds(50));  // the waiter is blocked in flock by now
  EXPECT_FALSE(acquired.load());
  released = true;
  held.reset();
  waiter.join();
  EXPECT_TRUE(acquired.load());
  EXPECT_TRUE(saw_release.load());  // it got the lock only after the holder let go
}

TEST(NodeLock, ABlockingAcquireCreatesNoDirectories) {
  const std::string dir = testing::MakeTempDir() + "/gone";
  EXPECT_EQ(NodeLock::AcquireBlocking(dir + "/.lock"), nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace pqloader
