#include "gil.h"

#include <nanobind/nanobind.h>

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace pqloader {
namespace {

struct ExitState {
  std::mutex* mu = new std::mutex();  // held by every thread while it waits for the GIL
  bool exiting = false;
  std::thread::id exiting_thread;
  int acquired = 0;  // engine threads holding the GIL (ScopedAcquire), by mu
  std::condition_variable released;
};

// How long MarkInterpreterExiting waits for engine threads inside Python (a predicate
// on one batch) to leave it; one still inside after this may abort the process.
constexpr std::chrono::seconds kExitWait{10};

ExitState& State() {
  static ExitState* state = [] {
    auto* s = new ExitState();  // never destroyed: parked threads outlive static destructors
    // A fork while another thread waited for the GIL (holding the mutex) would leave
    // it locked in the child, whose only thread is the forking one: a fresh one there
    // (the old one leaks).
    pthread_atfork(nullptr, nullptr, [] { State().mu = new std::mutex(); });
    return s;
  }();
  return *state;
}

[[noreturn]] void ParkForever() {
  // The objects this thread's call holds are never freed: not a reference-counting bug
  // for nanobind to report at exit (a plain flag; no GIL needed to set it).
  nanobind::set_leak_warnings(false);
  for (;;) pause();
}

}  // namespace

ScopedRelease::ScopedRelease() : state_(PyEval_SaveThread()) {}

ScopedRelease::~ScopedRelease() {
  ExitState& s = State();
  std::unique_lock<std::mutex> lock(*s.mu);
  if (s.exiting && std::this_thread::get_id() != s.exiting_thread) {
    lock.unlock();
    ParkForever();
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
  if (s.exiting && std::this_thread::get_id() != s.exiting_thread) return;
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
  s.released.notify_all();
}

void MarkInterpreterExiting() {
  ExitState& s = State();
  PyThreadState* state = PyEval_SaveThread();
  {
    std::unique_lock<std::mutex> lock(*s.mu);
    s.exiting = true;
    s.exiting_thread = std::this_thread::get_id();
    // Python code on an engine thread (a predicate) that gives up the GIL inside (a
    // sleep, I/O) would be ended by CPython when it takes it back during finalization,
    // its C++ frames then unwound without the GIL: let such calls finish first.
    s.released.wait_for(lock, kExitWait, [&s] { return s.acquired == 0; });
  }
  PyEval_RestoreThread(state);
}

}  // namespace pqloader
