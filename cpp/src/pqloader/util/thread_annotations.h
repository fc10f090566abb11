// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html)
// and the annotated mutex and lock that let `make lint` check them: clang with
// -Wthread-safety -Werror=thread-safety proves that every PQ_GUARDED_BY member is only
// touched with its mutex held and that every PQ_REQUIRES function is only called so.
// Under gcc the macros expand to nothing and Mutex/MutexLock are std::mutex and
// std::unique_lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define PQ_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PQ_THREAD_ANNOTATION(x)
#endif

#define PQ_CAPABILITY(x) PQ_THREAD_ANNOTATION(capability(x))
#define PQ_SCOPED_CAPABILITY PQ_THREAD_ANNOTATION(scoped_lockable)
#define PQ_GUARDED_BY(x) PQ_THREAD_ANNOTATION(guarded_by(x))
#define PQ_PT_GUARDED_BY(x) PQ_THREAD_ANNOTATION(pt_guarded_by(x))
#define PQ_REQUIRES(...) PQ_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define PQ_ACQUIRE(...) PQ_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define PQ_RELEASE(...) PQ_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define PQ_EXCLUDES(...) PQ_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define PQ_NO_THREAD_SAFETY_ANALYSIS PQ_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace pqloader {

/// A std::mutex the analysis knows as a capability.
class PQ_CAPABILITY("mutex") Mutex {
 public:
  void Lock() PQ_ACQUIRE() { mu_.lock(); }
  void Unlock() PQ_RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

/// Holds a Mutex for its scope (like std::unique_lock), and waits on condition variables
/// with it. Unlock()/Lock() release and retake it inside the scope; the analysis follows.
/// Waits are written as loops at the call site (`while (!ready) lock.Wait(cv);`) so that
/// the condition is read where the analysis sees the lock held.
class PQ_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) PQ_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() PQ_RELEASE() {}

  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Lock() PQ_ACQUIRE() { lock_.lock(); }
  void Unlock() PQ_RELEASE() { lock_.unlock(); }

  void Wait(std::condition_variable& cv) { cv.wait(lock_); }
  std::cv_status WaitUntil(std::condition_variable& cv,
                           std::chrono::steady_clock::time_point deadline) {
    return cv.wait_until(lock_, deadline);
  }
  template <typename Rep, typename Period>
  std::cv_status WaitFor(std::condition_variable& cv,
                         const std::chrono::duration<Rep, Period>& d) {
    return cv.wait_for(lock_, d);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace pqloader
