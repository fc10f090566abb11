#include "pqloader/util/fork_gate.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace pqloader {
namespace {

std::atomic<int> lock_calls{0}, unlock_calls{0};
void CountLock() { ++lock_calls; }
void CountUnlock() { ++unlock_calls; }

// A fork waits for a task inside the gate to leave (a storage request must not be in
// flight: the child would inherit its locks), then the locks added are taken and
// released; in the child the gate works as before, with nobody inside.
TEST(ForkGate, AForkWaitsForTheTasksInsideAndTheChildStartsWithNone) {
  fork_gate::AddLock(&CountLock, &CountUnlock);
  std::atomic<bool> entered{false}, done{false};
  std::thread task([&] {
    const fork_gate::Inside inside;
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    done = true;
  });
  while (!entered) std::this_thread::yield();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: one thread, nobody inside; entering and leaving do not block.
    const bool ok = fork_gate::TasksInside() == 0;
    fork_gate::Enter();
    fork_gate::Leave();
    _exit(ok && done.load() ? 0 : 1);
  }
  EXPECT_TRUE(done.load());  // the fork waited for the task
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  task.join();
  EXPECT_EQ(lock_calls.load(), 1);
  EXPECT_EQ(unlock_calls.load(), 1);  // in this process (the child's call is its own)
  EXPECT_EQ(fork_gate::TasksInside(), 0);
}

}  // namespace
}  // namespace pqloader
