#pragma once

#include <sched.h>

#include <algorithm>
#include <system_error>
#include <thread>
#include <vector>

namespace pqloader {

/// What a refused thread start says about its cause.
inline constexpr char kThreadLimitHint[] =
    " (the process or its user is at its limit of threads: ulimit -u / RLIMIT_NPROC, a "
    "cgroup's pids.max, or no memory left for a thread's stack: ulimit -v)";

/// The CPUs this process may run on (its affinity mask: taskset, a cpuset), at least 1:
/// the default thread count. std::thread::hardware_concurrency counts the machine's
/// (glibc's get_nprocs), so a process pinned to 1 CPU of 64 started 64 workers. (The
/// Python Loader also caps its default at the cgroup's CPU quota, _env.available_cpus.)
inline int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  // (EINVAL: more CPUs than a cpu_set_t holds, 1024)
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Start up to `n` threads running `fn`, appended to `*threads`; stop at the first the OS
/// refuses (std::thread throws std::system_error, EAGAIN) and return how many this call
/// started, `*errnum` set to the refusal's errno. Never throws: a vector of started
/// threads destroyed while an exception unwinds holds joinable threads, std::terminate.
template <typename Fn>
int StartThreads(int n, const Fn& fn, std::vector<std::thread>* threads, int* errnum = nullptr) {
  int started = 0;
  for (; started < n; ++started) {
    try {
      threads->emplace_back(fn);
    } catch (const std::system_error& e) {
      if (errnum != nullptr) *errnum = e.code().value();
      break;
    }
  }
  return started;
}

}  // namespace pqloader
