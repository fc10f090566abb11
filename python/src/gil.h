// Taking the GIL back safely while the interpreter exits.
//
// CPython (3.10-3.13) ends a thread that waits for or takes the GIL once the
// interpreter is finalizing with pthread_exit(). Its forced unwinding through C++
// frames reaches a noexcept destructor (the guard that took the GIL back) or
// nanobind's catch (...), and std::terminate aborts the process: a daemon thread still
// inside a Loader call (next(), a Loader being built) when the main thread returned made
// the whole program exit with SIGABRT.
//
// So every wait for the GIL in the bindings goes through this file, under one mutex.
// MarkInterpreterExiting() (an atexit handler, which CPython runs before it starts
// finalizing) releases the GIL, takes that mutex (so no thread is left waiting for the
// GIL when it returns) and marks the exit, then waits (up to 10 s) for engine threads
// inside Python (a predicate) to leave it; from then on, a thread other than the one
// exiting that would take the GIL back parks forever instead (a daemon thread dies with
// the process), and engine threads skip their Python work (ScopedAcquire::ok() false).
// The exiting thread itself (running atexit handlers and finalizers) is never parked.
#pragma once

#include <Python.h>

namespace pqloader {

/// Releases the GIL for its lifetime; takes it back on destruction, or parks the thread
/// forever if the interpreter is exiting (see above). For Python threads calling in.
class ScopedRelease {
 public:
  ScopedRelease();
  ~ScopedRelease();
  ScopedRelease(const ScopedRelease&) = delete;
  ScopedRelease& operator=(const ScopedRelease&) = delete;

 private:
  PyThreadState* state_;
};

/// Takes the GIL on a thread of the engine (PyGILState_Ensure), unless the interpreter
/// is exiting: then ok() is false and the caller must not touch Python objects.
class ScopedAcquire {
 public:
  ScopedAcquire();
  ~ScopedAcquire();
  bool ok() const { return ok_; }
  ScopedAcquire(const ScopedAcquire&) = delete;
  ScopedAcquire& operator=(const ScopedAcquire&) = delete;

 private:
  bool ok_ = false;
  bool counted_ = false;  // not taken while the thread held the GIL already
  PyGILState_STATE state_{};
};

/// The atexit handler (GIL held): see above. Idempotent.
void MarkInterpreterExiting();

}  // namespace pqloader
