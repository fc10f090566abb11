#include "gil.h"

#include <nanobind/nanobind.h>

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <set>
#include <thread>

namespace pqloader {
namespace {

struct ExitState {
  std::mutex* mu = new std::mutex();  // held by every thread while it waits for the GIL
  bool exiting = false;
  std::thread::id exiting_thread;
  int acquired = 0;  // engine threads holding the GIL (ScopedAcquire), by mu
  int active = 0;    // calls into the engine with the GIL released (ScopedRelease), by mu
  std::set<std::atomic<bool>*> cancels;  // of the work ExitCancellable registers, by mu
  std::condition_variable changed;       // acquired, active or cancels went down
};

// How long MarkInterpreterExiting waits for engine threads inside Python (a predicate
// on one batch) and for calls into the engine (a next() returns within its 100 ms poll,
// a Loader being built once cancelled) to end: work still running after it may meet the
// process's static destructors.
constexpr std::chrono::seconds kExitWait{10};
// How long a parked thread waits for finalization to begin before it takes the GIL back
// after all: an atexit handler registered before pqloader's may be waiting for it
// (joining it). It parks for good once the interpreter is finalizing.
constexpr std::chrono::seconds kParkEscape{5};

ExitState& State() {
  static ExitState* state = [] {
    auto* s = new ExitState();  // never destroyed: parked threads outlive static destructors
    // A fork while another thread waited for the GIL (holding the mutex) would leave
    // it locked in the child, whose only thread is the forking one: a fresh one there
    // (the old one leaks), and none of the other threads' calls or work to wait for.
    pthread_atfork(nullptr, nullptr, [] {
      ExitState& child = State();
      child.mu = new std::mutex();
      child.acquired = child.active = 0;
      // Made anew, not cleared: a thread of the parent may have been inserting into it
      // at the fork (its nodes half linked); freeing them could corrupt the heap.
      ::new (&child.cancels) decltype(child.cancels)();
      ::new (&child.changed) std::condition_variable();  // a parent thread may have waited
    });
    return s;
  }();
  return *state;
}

bool ParksHere(const ExitState& s) {
  return s.exiting && std::this_thread::get_id() != s.exiting_thread;
}

// Waits, without the GIL and without the mutex, until the interpreter finalizes (then
// forever: the thread dies with the process) or kParkEscape has passed.
void Park() {
  const auto until = std::chrono::steady_clock::now() + kParkEscape;
  while (!_Py_IsFinalizing() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!_Py_IsFinalizing()) return;
  // The objects this thread's call holds are never freed: not a reference-counting bug
  // for nanobind to report at exit (a plain flag; no GIL needed to set it).
  nanobind::set_leak_warnings(false);
  for (;;) pause();
}

}  // namespace

ScopedRelease::ScopedRelease() : state_(PyEval_SaveThread()) {
  ExitState& s = State();
  std::unique_lock<std::mutex> lock(*s.mu);
  if (ParksHere(s)) {  // no new work for the engine once the interpreter is exiting
    lock.unlock();
    Park();
    lock.lock();
  }
  ++s.active;
}

ScopedRelease::~ScopedRelease() {
  ExitState& s = State();
  std::unique_lock<std::mutex> lock(*s.mu);
  --s.active;
  s.changed.notify_all();
  if (ParksHere(s)) {
    lock.unlock();
    Park();
    lock.lock();
  }
  PyEval_RestoreThread(state_);
}

ScopedAcquire::ScopedAcquire() {
  if (PyGILState_Check()) {  // held already (nested): the mutex would wait on a waiter
    state_ = PyGILState_Ensure();
    ok_ = true;
    return;
  }
  ExitState& s = State();
  std::lock_guard<std::mutex> lock(*s.mu);
  if (ParksHere(s)) return;
  state_ = PyGILState_Ensure();
  ok_ = counted_ = true;
  ++s.acquired;
}

ScopedAcquire::~ScopedAcquire() {
  if (!ok_) return;
  PyGILState_Release(state_);
  if (!counted_) return;
  ExitState& s = State();
  std::lock_guard<std::mutex> lock(*s.mu);
  --s.acquired;
  s.changed.notify_all();
}

ExitCancellable::ExitCancellable(std::atomic<bool>* cancel) : cancel_(cancel) {
  ExitState& s = State();
  std::lock_guard<std::mutex> lock(*s.mu);
  if (s.exiting) cancel_->store(true);
  s.cancels.insert(cancel_);
}

ExitCancellable::~ExitCancellable() {
  ExitState& s = State();
  std::lock_guard<std::mutex> lock(*s.mu);
  s.cancels.erase(cancel_);
  s.changed.notify_all();
}

void MarkInterpreterExiting(bool other_threads) {
  // Objects that other threads' frames hold at exit are never freed: not for nanobind
  // to report as reference-counting bugs.
  if (other_threads) nanobind::set_leak_warnings(false);
  ExitState& s = State();
  PyThreadState* state = PyEval_SaveThread();
  {
    std::unique_lock<std::mutex> lock(*s.mu);
    s.exiting = true;
    s.exiting_thread = std::this_thread::get_id();
    for (std::atomic<bool>* cancel : s.cancels) cancel->store(true);
    // Python code on an engine thread (a predicate) that gives up the GIL inside (a
    // sleep, I/O) would be ended by CPython when it takes it back during finalization,
    // its C++ frames then unwound without the GIL; and engine work still running would
    // meet the static destructors: let both end first.
    s.changed.wait_for(lock, kExitWait, [&s] {
      return s.acquired == 0 && s.active == 0 && s.cancels.empty();
    });
  }
  PyEval_RestoreThread(state);
}

}  // namespace pqloader
