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
// GIL when it returns), marks the exit, cancels the Loaders being built
// (ExitCancellable), then waits (up to 10 s) for engine threads inside Python (a
// predicate) and for calls into the engine to end. From then on, a thread other than
// the one exiting that would call into the engine or take the GIL back parks instead
// (a daemon thread dies with the process), and engine threads skip their Python work
// (ScopedAcquire::ok() false). A parked thread waits for finalization to begin; if it
// has not begun after 5 s (an atexit handler registered before pqloader's may be
// joining that thread), it goes on. The exiting thread itself (running atexit handlers
// and finalizers) is never parked.
#pragma once

#include <Python.h>

#include <atomic>

namespace pqloader {

/// Releases the GIL for its lifetime (a call into the engine); takes it back on
/// destruction. Parks the thread if the interpreter is exiting (see above). For Python
/// threads calling in.
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

/// Registers work on a thread of its own that checks `*cancel` (a Loader being built):
/// set when the interpreter exits, which then waits for the work to end. For the
/// lifetime of the object; `cancel` must outlive it.
class ExitCancellable {
 public:
  explicit ExitCancellable(std::atomic<bool>* cancel);
  ~ExitCancellable();
  ExitCancellable(const ExitCancellable&) = delete;
  ExitCancellable& operator=(const ExitCancellable&) = delete;

 private:
  std::atomic<bool>* cancel_;
};

/// The atexit handler (GIL held): see above. `other_threads`: Python threads other than
/// the caller are alive (the objects they hold are never freed: nanobind's leak report
/// at exit is turned off). Idempotent.
void MarkInterpreterExiting(bool other_threads);

}  // namespace pqloader
