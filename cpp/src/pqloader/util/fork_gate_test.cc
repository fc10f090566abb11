#include "pqloader/util/fork_gate.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <arrow/util/thread_pool.h>

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

// A task inside the gate that spawns work on an Arrow thread pool (FetchUnit's PreBuffer
// on the loader's I/O pool) while the process forks. Arrow's own prepare handler locks
// every pool's mutex until the fork is done; it ran before the gate's (registered when
// Arrow made its first pool, after the gate's), so the task waited for that mutex and
// the fork for the task, until kForkWait: an os.fork() while a loader read took 10 s,
// and then forked with the task inside. The gate's prepare handler must run first.
std::atomic<bool> fork_started{false};
void NoteForkStarted() { fork_started = true; }

TEST(ForkGate, AForkWaitsForATaskThatSpawnsOnAnArrowPool) {
  fork_gate::Install();
  // A pool made after the gate's handlers, as a Loader's I/O pool is.
  auto pool = arrow::internal::ThreadPool::Make(2);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  // Registered last, so run first of the prepare handlers: the task spawns only once
  // the fork has begun (before the gate's handler, and before Arrow's with the fix).
  fork_started = false;
  ASSERT_EQ(pthread_atfork(&NoteForkStarted, nullptr, nullptr), 0);
  std::atomic<bool> entered{false}, spawned{false};
  std::thread task([&] {
    const fork_gate::Inside inside;
    entered = true;
    for (int i = 0; i < 60000 && !fork_started; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    auto done = (*pool)->Submit([] {});
    if (done.ok()) done->Wait();
    spawned = true;
  });
  while (!entered) std::this_thread::yield();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(0);
  // The fork waited for the task to leave the gate, which it could: its spawn was not
  // blocked by a pool mutex the forking thread held.
  EXPECT_TRUE(spawned.load()) << "the fork went on after kForkWait with the task inside the gate";
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  task.join();
  fork_started = false;
  EXPECT_EQ(fork_gate::TasksInside(), 0);
}

// A thread that forks from inside the gate (a storage request calling back into code
// that forks) does not wait for itself: the fork waited kForkWait for it, and the child,
// which kept the thread's depth but counted nobody inside, went to -1 when it left.
TEST(ForkGate, AThreadInsideTheGateForksWithoutWaitingForItself) {
  fork_gate::Install();
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  {
    const fork_gate::Inside inside;
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: this thread, inside; nobody once it left; entering works.
      const bool inside_counted = fork_gate::TasksInside() == 1;
      fork_gate::Leave();
      const bool left = fork_gate::TasksInside() == 0;
      fork_gate::Enter();
      fork_gate::Leave();
      _exit(inside_counted && left && fork_gate::TasksInside() == 0 ? 0 : 1);
    }
    EXPECT_EQ(fork_gate::TasksInside(), 1);
  }
  // (A stall guard, not a speed claim: the wait it checks for is kForkWait, 10 s.)
  EXPECT_LT(std::chrono::steady_clock::now() - start, fork_gate::kForkWait / 2)
      << "the fork waited for the thread that forked";
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(fork_gate::TasksInside(), 0);
}

// The stale thread-specific data of a thread that was exiting when the process forked:
// glibc's child moves the thread's stack into its cache without clearing the values its
// destructors had not reached yet, and a thread made on that stack in the child started
// with them (seen: jemalloc's per-thread data of a freed TLS block, whose destructor then
// corrupted the heap at that thread's exit). After the fork, no new thread has a value,
// also the one made on the exiting thread's stack (checked: one of them is).
std::atomic<bool> in_first_destructor{false}, forked{false};
void WaitForTheFork(void*) {
  in_first_destructor = true;
  while (!forked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
void Ignore(void*) {}

void* StackOfThisThread() {
  pthread_attr_t attr;
  void* addr = nullptr;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return nullptr;
  pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  return addr;
}

#if defined(__SANITIZE_THREAD__)
#define PQ_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PQ_UNDER_TSAN 1
#endif
#endif

TEST(ForkGate, AThreadMadeInTheChildHasNoValueOfAThreadThatWasExitingAtTheFork) {
#if defined(PQ_UNDER_TSAN)
  GTEST_SKIP() << "ThreadSanitizer ends a child that makes threads after a "
                  "multi-threaded fork; the clearing is off under it";
#endif
  fork_gate::Install();
  in_first_destructor = false;
  forked = false;
  pthread_key_t first, second;  // destructors run in key order: first, then second
  ASSERT_EQ(pthread_key_create(&first, &WaitForTheFork), 0);
  ASSERT_EQ(pthread_key_create(&second, &Ignore), 0);
  static int value = 0;
  std::atomic<void*> exiting_stack{nullptr};
  std::thread exiting([&] {
    exiting_stack = StackOfThisThread();
    pthread_setspecific(first, &value);
    pthread_setspecific(second, &value);
  });
  while (!in_first_destructor) std::this_thread::yield();
  const pid_t pid = fork();  // the thread is inside its first key's destructor
  if (pid == 0) {
    alarm(60);  // a hang fails the test rather than stalling it
    // Threads alive at once take distinct stacks: one of them gets the stack of the
    // thread that was exiting.
    std::atomic<int> stale{0}, started{0}, on_its_stack{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&] {
        if (pthread_getspecific(second) != nullptr) ++stale;
        if (StackOfThisThread() == exiting_stack.load()) ++on_its_stack;
        ++started;
        while (started.load() < 8) std::this_thread::yield();
      });
    }
    for (auto& t : threads) t.join();
    _exit(on_its_stack.load() != 1 ? 2 : stale.load() == 0 ? 0 : 1);
  }
  forked = true;
  exiting.join();
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_NE(WEXITSTATUS(status), 2) << "no thread in the child got the exiting thread's stack";
  EXPECT_NE(WEXITSTATUS(status), 1) << "a thread in the child started with its value";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  pthread_key_delete(first);
  pthread_key_delete(second);
}

}  // namespace
}  // namespace pqloader
