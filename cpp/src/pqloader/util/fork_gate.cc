#include "pqloader/util/fork_gate.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace pqloader::fork_gate {

namespace {

// Never destroyed: a fork (or a task) may come during the process's exit.
struct Gate {
  std::mutex mu;
  std::condition_variable left;   // a task left
  std::condition_variable forked;  // the fork is done (in the parent)
  bool forking = false;
  int inside = 0;
  std::vector<std::pair<void (*)(), void (*)()>> locks;
};

// The fork's prepare handler locks `mu` and holds it through the fork; the handlers after
// it release it, so these functions take and release it across calls.
void Prepare();
void AfterInParent();
void AfterInChild();

Gate& TheGate() {
  static Gate* gate = [] {
    auto* g = new Gate();
    pthread_atfork(&Prepare, &AfterInParent, &AfterInChild);
    return g;
  }();
  return *gate;
}

void Prepare() {
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  g.forking = true;
  g.left.wait_for(lock, kForkWait, [&] { return g.inside == 0; });
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
  g.inside = 0;  // their threads are not in this process
  // Threads of the parent may have been waiting on them: new ones.
  new (&g.left) std::condition_variable();
  new (&g.forked) std::condition_variable();
  g.mu.unlock();
}

}  // namespace

void Enter() {
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  g.forked.wait(lock, [&] { return !g.forking; });
  ++g.inside;
}

void Leave() {
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

int TasksInside() {
  Gate& g = TheGate();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.inside;
}

}  // namespace pqloader::fork_gate
