#include "pqloader/util/container_limits.h"

#include <sched.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "pqloader/test_util.h"

namespace pqloader {
namespace {

namespace fs = std::filesystem;

// Write `files` ({name: text}) into the directory `dir`, made with its parents.
void Write(const fs::path& dir, const std::map<std::string, std::string>& files) {
  fs::create_directories(dir);
  for (const auto& [name, text] : files) std::ofstream(dir / name) << text << "\n";
}

// A fake /proc/self below `tmp`: its cgroup file holds `cgroups`, its mountinfo one line
// per mount {root, mount point, file system type, super options} (both as the kernel
// writes them: escaped).
using Mount = std::tuple<std::string, std::string, std::string, std::string>;
std::string FakeProc(const fs::path& tmp, const std::vector<std::string>& cgroups,
                     const std::vector<Mount>& mounts) {
  const fs::path proc = tmp / "proc";
  fs::create_directories(proc);
  std::ofstream cgroup(proc / "cgroup");
  for (const std::string& line : cgroups) cgroup << line << "\n";
  std::ofstream mountinfo(proc / "mountinfo");
  int id = 30;
  for (const auto& [root, point, type, options] : mounts) {
    mountinfo << id << " 1 0:" << id << " " << root << " " << point << " rw,nosuid shared:9 - "
              << type << " " << type << " " << options << "\n";
    ++id;
  }
  return proc.string();
}

// cgroup v2 (a Kubernetes pod): the pod's cgroup holds the limit, its container's says
// max; a mount's root other than / (no cgroup namespace) is taken off the path.
TEST(CgroupCpuQuota, IsTheSmallestOfTheCgroupAndItsAncestorsV2) {
  const fs::path tmp = testing::MakeTempDir();
  const fs::path mount = tmp / "fs" / "cgroup";
  Write(tmp / "fs", {{"cpu.max", "100000 100000"}});  // above the mount point: not read
  Write(mount / "pod", {{"cpu.max", "250000 100000"}});
  Write(mount / "pod" / "c1", {{"cpu.max", "max 100000"}});
  const std::string proc =
      FakeProc(tmp, {"0::/kubepods/pod/c1"}, {{"/kubepods", mount.string(), "cgroup2", "rw"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), 2.5);
  Write(mount / "pod" / "c1", {{"cpu.max", "50000 100000"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), 0.5);
}

// cgroup v1: the hierarchy with the cpu controller only (a quota in another is not
// the process's); -1 is no quota.
TEST(CgroupCpuQuota, OfCgroupV1AndNoneWithoutOne) {
  const fs::path tmp = testing::MakeTempDir();
  const fs::path mount = tmp / "fs" / "cpu,cpuacct";
  Write(mount, {{"cpu.cfs_quota_us", "-1"}, {"cpu.cfs_period_us", "100000"}});
  Write(mount / "job", {{"cpu.cfs_quota_us", "-1"}, {"cpu.cfs_period_us", "100000"}});
  Write(tmp / "fs" / "memory" / "job",
        {{"cpu.cfs_quota_us", "10000"}, {"cpu.cfs_period_us", "100000"}});
  const std::string proc =
      FakeProc(tmp, {"12:memory:/job", "4:cpu,cpuacct:/job", "0::/"},
               {{"/", mount.string(), "cgroup", "rw,cpu,cpuacct"},
                {"/", (tmp / "fs" / "memory").string(), "cgroup", "rw,memory"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), -1);
  Write(mount / "job", {{"cpu.cfs_quota_us", "300000"}, {"cpu.cfs_period_us", "200000"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), 1.5);
}

// mountinfo writes a space in a path as "\040" (a mount point "my cgroup").
TEST(CgroupCpuQuota, ReadsAMountPointWhoseNameTheKernelEscaped) {
  const fs::path tmp = testing::MakeTempDir();
  const fs::path mount = tmp / "my cgroup";
  Write(mount / "job", {{"cpu.max", "200000 100000"}});
  const std::string escaped = (tmp / "my\\040cgroup").string();
  const std::string proc = FakeProc(tmp, {"0::/job"}, {{"/", escaped, "cgroup2", "rw"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), 2.0);
}

// A cgroup outside the mount's root (the mount made in another cgroup namespace) is
// taken as the mount's root.
TEST(CgroupCpuQuota, TakesACgroupOutsideTheMountsRootAsItsRoot) {
  const fs::path tmp = testing::MakeTempDir();
  const fs::path mount = tmp / "fs" / "cgroup";
  Write(mount, {{"cpu.max", "300000 100000"}});
  Write(mount / "other", {{"cpu.max", "100000 100000"}});
  const std::string proc =
      FakeProc(tmp, {"0::/other"}, {{"/pods/a", mount.string(), "cgroup2", "rw"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), 3.0);
}

TEST(CgroupCpuQuota, IsNoneWithoutTheProcFilesOrACpuQuota) {
  const fs::path tmp = testing::MakeTempDir();
  EXPECT_EQ(CgroupCpuQuota((tmp / "missing").string()).value_or(-1), -1);
  const fs::path mount = tmp / "fs" / "cgroup";
  Write(mount, {{"cpu.max", "max 100000"}});
  Write(mount / "job", {{"cpu.max", "0 100000"}});  // (not a quota: 0 CPUs)
  const std::string proc = FakeProc(tmp, {"0::/job"}, {{"/", mount.string(), "cgroup2", "rw"}});
  EXPECT_EQ(CgroupCpuQuota(proc).value_or(-1), -1);
}

// The memory limit: v2's memory.max and v1's memory controller (not the cpu one's
// files), the smallest over the cgroup and its ancestors; "max" and v1's page-count
// maximum are no limit.
TEST(CgroupMemoryLimit, IsTheSmallestOfTheMemoryCgroupsAndTheirAncestors) {
  const fs::path tmp = testing::MakeTempDir();
  const fs::path v2 = tmp / "fs" / "unified";
  Write(v2 / "pod", {{"memory.max", "1073741824"}});
  Write(v2 / "pod" / "c1", {{"memory.max", "max"}});
  const fs::path memory = tmp / "fs" / "memory";
  Write(memory, {{"memory.limit_in_bytes", "9223372036854771712"}});
  Write(memory / "job", {{"memory.limit_in_bytes", "9223372036854771712"}});
  Write(tmp / "fs" / "cpu" / "job", {{"memory.limit_in_bytes", "1000"}});
  const std::string proc =
      FakeProc(tmp, {"4:cpu,cpuacct:/job", "12:memory:/job", "0::/pod/c1"},
               {{"/", v2.string(), "cgroup2", "rw"},
                {"/", memory.string(), "cgroup", "rw,memory"},
                {"/", (tmp / "fs" / "cpu").string(), "cgroup", "rw,cpu,cpuacct"}});
  EXPECT_EQ(CgroupMemoryLimit(proc).value_or(-1), 1073741824);
  Write(memory / "job", {{"memory.limit_in_bytes", "536870912"}});
  EXPECT_EQ(CgroupMemoryLimit(proc).value_or(-1), 536870912);
  Write(v2 / "pod" / "c1", {{"memory.max", "268435456"}});
  EXPECT_EQ(CgroupMemoryLimit(proc).value_or(-1), 268435456);
  EXPECT_FALSE(CgroupMemoryLimit((tmp / "no-proc").string()).has_value());
  EXPECT_FALSE(CgroupCpuQuota(proc).has_value());  // no cpu files anywhere
}

// The default max_inflight_bytes: 256 MiB, at most an eighth of the limit shared among
// `share` loaders, at least 16 MiB (the rule Python's Loader and LoaderOptions both use).
TEST(DefaultInflightBytes, IsAnEighthOfTheLimitSharedWithin16And256MiB) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(DefaultInflightBytes(std::nullopt), 256 * kMiB);
  EXPECT_EQ(DefaultInflightBytes(std::nullopt, 4), 256 * kMiB);
  EXPECT_EQ(DefaultInflightBytes(int64_t{64} << 30), 256 * kMiB);
  EXPECT_EQ(DefaultInflightBytes(int64_t{1} << 30), 128 * kMiB);
  EXPECT_EQ(DefaultInflightBytes(int64_t{1} << 30, 4), 32 * kMiB);
  EXPECT_EQ(DefaultInflightBytes(int64_t{1} << 30, 16), 16 * kMiB);  // (8 MiB: the floor)
  EXPECT_EQ(DefaultInflightBytes(100 * kMiB), 16 * kMiB);
  EXPECT_EQ(DefaultInflightBytes(400 * kMiB, 0), 50 * kMiB);  // (a share below 1 is 1)
}

TEST(AvailableCpus, IsAtLeastOneAndAtMostTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_GE(AvailableCpus(), 1);
  EXPECT_LE(AvailableCpus(), CPU_COUNT(&set));
}

}  // namespace
}  // namespace pqloader
