#pragma once

#include <system_error>
#include <thread>
#include <vector>

namespace pqloader {

/// What a refused thread start says about its cause.
inline constexpr char kThreadLimitHint[] =
    " (the process or its user is at its limit of threads: ulimit -u / RLIMIT_NPROC, a "
    "cgroup's pids.max, or no memory left for a thread's stack: ulimit -v)";

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
