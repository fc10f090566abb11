#include "pqloader/util/fork_gate.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include <arrow/util/thread_pool.h>

namespace pqloader::fork_gate {

namespace {

// Never destroyed: a fork (or a task) may come during the process's exit.
struct Gate {
  std::mutex mu;
  std::condition_variable left;   // a task left
  std::condition_variable forked;  // the fork is done (in the parent)
  bool forking = false;
  int inside = 0;
  int threads_at_fork = 0;  // the process's threads when it forked (0: unknown)
  std::vector<std::pair<void (*)(), void (*)()>> locks;
};

// The fork's prepare handler locks `mu` and holds it through the fork; the handlers after
// it release it, so these functions take and release it across calls.
void Prepare();
void AfterInParent();
void AfterInChild();

// Makes Arrow register its own fork handlers now, before ours. Arrow's prepare handler
// locks the mutex of every live Arrow thread pool until the fork is done, and a task
// inside the gate spawns work on such a pool (FetchUnit's PreBuffer on the loader's I/O
// pool). Prepare handlers run in the reverse order of their registration, and Arrow
// registers its handlers when its first pool is made, which came after the library
// loaded (and called Install): Arrow's ran first, so such a task waited for the pool's
// mutex and Prepare for the task, until kForkWait, and an os.fork() while a loader read
// took 10 s. Registered after Arrow's, Prepare runs first: the tasks leave, then Arrow
// locks its pools. A pool of one thread, made and dropped at once (Arrow's registration
// stays).
void RegisterArrowForkHandlersFirst() {
  auto pool = arrow::internal::ThreadPool::Make(1);
  (void)pool;
}

Gate& TheGate() {
  static Gate* gate = [] {
    auto* g = new Gate();
    RegisterArrowForkHandlersFirst();
    pthread_atfork(&Prepare, &AfterInParent, &AfterInChild);
    return g;
  }();
  return *gate;
}

// The process's threads now, from /proc/self/stat (its 20th field); 0 if unknown.
int ThreadsInProcess() {
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the name (field 2) may hold spaces
  if (p == nullptr) return 0;
  for (int field = 2; field < 20 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
  return p == nullptr ? 0 : std::atoi(p + 1);
}

#if defined(__SANITIZE_THREAD__)
constexpr bool kUnderThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kUnderThreadSanitizer = true;
#else
constexpr bool kUnderThreadSanitizer = false;
#endif
#else
constexpr bool kUnderThreadSanitizer = false;
#endif

// In a forked child, clear what threads made on the stacks of the parent's other threads
// would inherit. glibc's child moves those stacks into its cache and clears their
// thread-specific values only where the thread had any pending; a thread that was
// running its key destructors at the fork has none pending (the flag is reset at each
// round's start) while the keys not yet reached still hold values. The next thread made
// on that stack started with them, and at its exit their destructors ran on the dead
// thread's data: jemalloc's, which every thread that forks has (its fork handlers fetch
// it), on a TLS block glibc had freed and handed out again, corrupting the heap (seen in
// DataLoader workers forked while a thread that had forked others was exiting). So as
// many threads as the parent had others are made at once (each takes a cached stack of
// the default size, then larger ones), clear every value they started with, and exit;
// glibc clears them properly on exit. `threads_at_fork` counts the forking thread; 0 if
// unknown. Eight more are made for threads that /proc did not count (made between the
// count and the fork; exited but not joined). Signals are blocked in them (one sent to
// the child must not land on a thread about to end). Not under ThreadSanitizer, whose
// runtime ends a child that makes threads after a multi-threaded fork.
void ClearInheritedThreadData(int threads_at_fork) {
  if (kUnderThreadSanitizer || threads_at_fork == 1) return;  // 1: no other thread
  const int n = threads_at_fork > 1 ? threads_at_fork - 1 + 8 : 64;
  std::mutex mu;
  std::condition_variable cv;
  int cleared = 0;
  bool go = false;
  std::vector<std::thread> threads;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the threads made inherit it
  try {
    threads.reserve(n);
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&] {
        for (pthread_key_t k = 0; k < PTHREAD_KEYS_MAX; ++k) {
          if (pthread_getspecific(k) != nullptr) pthread_setspecific(k, nullptr);
        }
        std::unique_lock<std::mutex> lock(mu);
        ++cleared;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });  // alive until all took their stacks
      });
    }
  } catch (...) {
    // No more threads (a limit on tasks): those made still clear theirs.
    static constexpr char kWarning[] =
        "pqloader: warning: a forked child could not make the threads that clear what "
        "the parent's exiting threads left (see docs/design.md, 'Threads made in a "
        "forked child start clean')\n";
    ssize_t ignored = ::write(2, kWarning, sizeof(kWarning) - 1);
    (void)ignored;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return cleared == static_cast<int>(threads.size()); });
    go = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
}

// This thread's depth inside the gate: a scope inside another (a listed object's read
// inside FetchUnit's) counts once. Entering again waited while the process forked, and
// the fork waited kForkWait for this thread, which was already inside.
thread_local int depth = 0;

// The tasks inside the gate that a fork by this thread waits for: all but itself. A
// thread that forks from inside (a storage request calling back into code that forks)
// waited kForkWait for itself, and its child, which kept its depth but counted nobody
// inside, went to -1 when it left.
int OthersInside(const Gate& g) { return g.inside - (depth > 0 ? 1 : 0); }

void Prepare() {
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  g.forking = true;
  g.left.wait_for(lock, kForkWait, [&] { return OthersInside(g) == 0; });
  g.threads_at_fork = ThreadsInProcess();
  for (const auto& l : g.locks) l.first();
  lock.release();  // held through the fork
}

void AfterInParent() {
  Gate& g = TheGate();
  for (auto it = g.locks.rbegin(); it != g.locks.rend(); ++it) it->second();
  g.forking = false;
  g.mu.unlock();
  g.forked.notify_all();
}

void AfterInChild() {
  Gate& g = TheGate();
  for (auto it = g.locks.rbegin(); it != g.locks.rend(); ++it) it->second();
  g.forking = false;
  g.inside = depth > 0 ? 1 : 0;  // the other threads are not in this process
  // Threads of the parent may have been waiting on them: new ones.
  new (&g.left) std::condition_variable();
  new (&g.forked) std::condition_variable();
  const int threads_at_fork = g.threads_at_fork;
  g.mu.unlock();
  ClearInheritedThreadData(threads_at_fork);
}

}  // namespace

void Enter() {
  if (depth++ > 0) return;
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  g.forked.wait(lock, [&] { return !g.forking; });
  ++g.inside;
}

void Leave() {
  if (--depth > 0) return;
  Gate& g = TheGate();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    --g.inside;
  }
  g.left.notify_all();
}

void AddLock(void (*lock)(), void (*unlock)()) {
  Gate& g = TheGate();
  std::lock_guard<std::mutex> guard(g.mu);
  g.locks.emplace_back(lock, unlock);
}

void Install() { TheGate(); }

int TasksInside() {
  Gate& g = TheGate();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.inside;
}

}  // namespace pqloader::fork_gate
