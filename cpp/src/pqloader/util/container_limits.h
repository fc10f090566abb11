// The CPUs and memory this process may use: the engine's default number of threads (and
// pqloader.available_cpus() in Python), and the memory limit the default
// max_inflight_bytes is sized by (DefaultInflightBytes, for C++ and Python alike). A process in a container may run on fewer CPUs
// than its node has: its affinity mask (taskset, a cpuset) says which, its cgroup's CPU
// quota (a Kubernetes `limits: cpu`) how much of their time. std::thread's
// hardware_concurrency counts the node's (glibc's get_nprocs): a process pinned to 1 CPU
// of 64, or a pod limited to 2 CPUs of a 64-core node, started 64 workers.
//
// Thread-safe: each call reads the mask and the cgroup files again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pqloader {

/// Count the CPUs this process may use: those of its affinity mask, at most its cgroup's
/// CPU quota rounded up (CgroupCpuQuota), at least 1.
int AvailableCpus();

/// Return the smallest CPU quota, in CPUs (2.5: 250 ms of CPU time each 100 ms), of the
/// process's cgroups, v2 (`cpu.max`) and v1's `cpu` controller (`cpu.cfs_quota_us` over
/// `cpu.cfs_period_us`), and of their ancestors up to the root each mount shows; none
/// when there is none (`max`, -1) or it cannot be read. `proc` is the process's /proc
/// directory, whose `cgroup` and `mountinfo` say where its cgroups are mounted (tests
/// give a fake one).
std::optional<double> CgroupCpuQuota(const std::string& proc = "/proc/self");

/// Return the smallest memory limit in bytes of the process's cgroups, v2
/// (`memory.max`) and v1's `memory` controller (`memory.limit_in_bytes`), and of their
/// ancestors, found as CgroupCpuQuota finds them (a container's memory limit); none when
/// there is none (`max`, v1's page-count maximum) or it cannot be read.
std::optional<int64_t> CgroupMemoryLimit(const std::string& proc = "/proc/self");

/// Return the default max_inflight_bytes (LoaderOptions, and Python's Loader): 256 MiB,
/// at most an eighth of `memory_limit` (CgroupMemoryLimit(); none: no limit) divided
/// among the `share` loaders that hold it at once (a torch DataLoader's worker
/// processes), at least 16 MiB (any budget runs: one row group is always allowed). The
/// budget and the freed blocks kept for reuse, up to twice it, take at most 3/8 of the
/// limit; the rest is for the process, the shuffle window and the row groups being
/// decoded, which the budget does not bound (docs/design.md, "The memory limit").
int64_t DefaultInflightBytes(std::optional<int64_t> memory_limit, int64_t share = 1);

/// A cgroup directory of the process (or an ancestor), and whether it is v2's.
struct CgroupDir {
  std::string path;
  bool v2 = false;
};

/// List the directories of the process's cgroups that have `controller` ("cpu",
/// "memory"; every v2 cgroup does) and their ancestors up to the root each mount shows,
/// innermost first per mount; empty when `proc`'s `cgroup` or `mountinfo` cannot be read.
std::vector<CgroupDir> CgroupDirs(const std::string& proc, const std::string& controller);

}  // namespace pqloader
