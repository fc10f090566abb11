// A gate that work must not be inside when the process forks. A task between Enter()
// and Leave() (a storage request: Arrow's S3 client holds a reader lock for each
// request, and a child, which lacks the thread, would wait for that lock forever on its
// first S3 access) delays a fork until it leaves, up to kForkWait; no task enters while
// the process forks. Locks that must be held across fork() (so that the child never
// inherits one held by a thread it lacks) are taken after the tasks left (AddLock). In
// the child, the thread-specific values that glibc leaves on the cached stacks of the
// parent's threads are cleared by the child fork handler (fork_gate.cc), before the
// forking code goes on.
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <chrono>

namespace pqloader::fork_gate {

/// How long a fork waits for the tasks inside the gate; past it, it forks anyway.
inline constexpr std::chrono::seconds kForkWait{10};

/// Enter the gate (waits while the process forks) / leave it. A thread already inside
/// enters again at once (only its outermost Leave leaves).
void Enter();
void Leave();

/// Enter() now, Leave() at the end of the scope.
class Inside {
 public:
  Inside() { Enter(); }
  ~Inside() { Leave(); }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
};

/// Call `lock` when the process forks, after the tasks left the gate, and `unlock` in
/// both processes after the fork (in the reverse order of the calls to AddLock).
void AddLock(void (*lock)(), void (*unlock)());

/// Register the fork handlers now (they are registered at the first use of any function
/// here otherwise). The library calls it when it is loaded.
void Install();

/// Tasks inside the gate now (for tests).
int TasksInside();

}  // namespace pqloader::fork_gate
