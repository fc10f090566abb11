#include "pqloader/util/container_limits.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

namespace pqloader {

namespace {

constexpr std::string_view kSpaces = " \t\n\r\f\v";

// The text of the file `path`; none when it cannot be opened.
std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// `text`'s lines, or its words (split at runs of white space), or its parts between `sep`s
// ("a,,b": "a", "", "b").
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}
std::vector<std::string> Parts(std::string_view text, char sep) {
  std::vector<std::string> out;
  for (size_t start = 0;;) {
    const size_t end = text.find(sep, start);
    out.emplace_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}
bool Has(const std::vector<std::string>& items, std::string_view item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

// A field of mountinfo as it names a path: the kernel writes a space, a tab, a newline
// and a backslash as three octal digits ("\040" is a space).
std::string UnescapeMountField(const std::string& field) {
  const auto octal = [&](size_t i, char max) { return field[i] >= '0' && field[i] <= max; };
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1, '3') && octal(i + 2, '7') &&
        octal(i + 3, '7')) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// The names of the absolute path `path`, normalized: no empty ones, no "." and each ".."
// taking off the one before it ("/.." is "/").
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  for (std::string& name : Parts(path, '/')) {
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      if (!out.empty()) out.pop_back();
    } else {
      out.push_back(std::move(name));
    }
  }
  return out;
}
std::string Join(const std::vector<std::string>& components) {
  std::string out;
  for (const std::string& name : components) out += "/" + name;
  return out.empty() ? "/" : out;
}

// A decimal integer, all of `text` (a '+' may lead); none if it is anything else or out
// of range.
std::optional<int64_t> ParseInt(std::string_view text) {
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}
std::string_view Strip(std::string_view text) {
  const size_t first = text.find_first_not_of(kSpaces);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpaces) - first + 1);
}

// The CPU quota of the cgroup directory `dir`: v2's cpu.max ("QUOTA PERIOD", "max" for
// none), v1's cpu.cfs_quota_us (-1 for none) over cpu.cfs_period_us; none when it has
// none or it cannot be read.
std::optional<double> ReadCpuQuota(const std::string& dir, bool v2) {
  std::optional<int64_t> quota, period;
  if (v2) {
    const auto text = ReadText(dir + "/cpu.max");
    if (!text) return std::nullopt;
    const std::vector<std::string> words = Words(*text);
    if (words.size() < 2) return std::nullopt;
    quota = ParseInt(words[0]);
    period = ParseInt(words[1]);
  } else {
    const auto quota_text = ReadText(dir + "/cpu.cfs_quota_us");
    const auto period_text = ReadText(dir + "/cpu.cfs_period_us");
    if (!quota_text || !period_text) return std::nullopt;
    quota = ParseInt(Strip(*quota_text));
    period = ParseInt(Strip(*period_text));
  }
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

}  // namespace

std::vector<CgroupDir> CgroupDirs(const std::string& proc, const std::string& controller) {
  std::vector<CgroupDir> found;
  const auto cgroup_text = ReadText(proc + "/cgroup");
  const auto mountinfo_text = ReadText(proc + "/mountinfo");
  if (!cgroup_text || !mountinfo_text) return found;
  // File system type ("cgroup2", v1's "cgroup") -> this process's cgroup in it:
  // "0::PATH" (v2), "ID:CONTROLLERS:PATH" (v1; the one with `controller`).
  std::map<std::string, std::string> paths;
  for (const std::string& line : Lines(*cgroup_text)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    const std::string hierarchy = line.substr(0, first);
    const std::string controllers =
        first == std::string::npos ? "" : line.substr(first + 1, second - first - 1);
    const std::string path = second == std::string::npos ? "" : line.substr(second + 1);
    if (hierarchy == "0" && controllers.empty()) {
      paths["cgroup2"] = path;
    } else if (Has(Parts(controllers, ','), controller)) {
      paths["cgroup"] = path;
    }
  }
  // mountinfo: "ID PARENT MAJOR:MINOR ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE
  // SUPER_OPTIONS"; ROOT is the directory of the hierarchy mounted there.
  for (const std::string& line : Lines(*mountinfo_text)) {
    const std::vector<std::string> fields = Words(line);
    if (fields.size() < 7) continue;
    const auto dash = std::find(fields.begin() + 6, fields.end(), "-");
    if (dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string& type = dash[1];
    const auto path = paths.find(type);
    if (path == paths.end() || (type == "cgroup" && !Has(Parts(dash[3], ','), controller))) {
      continue;
    }
    const std::vector<std::string> root = Components(UnescapeMountField(fields[3]));
    const std::vector<std::string> mount = Components(UnescapeMountField(fields[4]));
    std::vector<std::string> dir = mount;
    // The cgroup below the mount's root; one outside it (another cgroup namespace's) is
    // taken as the root.
    const std::vector<std::string> cgroup = Components(path->second);
    if (cgroup.size() >= root.size() && std::equal(root.begin(), root.end(), cgroup.begin())) {
      dir.insert(dir.end(), cgroup.begin() + root.size(), cgroup.end());
    }
    // The cgroup and its ancestors up to the mount point: a pod's limit is on the pod's
    // cgroup, its containers' say "max".
    for (;; dir.pop_back()) {
      found.push_back({Join(dir), type == "cgroup2"});
      if (dir.size() <= mount.size()) break;
    }
  }
  return found;
}

std::optional<double> CgroupCpuQuota(const std::string& proc) {
  std::optional<double> smallest;
  for (const CgroupDir& dir : CgroupDirs(proc, "cpu")) {
    const auto quota = ReadCpuQuota(dir.path, dir.v2);
    if (quota && (!smallest || *quota < *smallest)) smallest = quota;
  }
  return smallest;
}

std::optional<int64_t> CgroupMemoryLimit(const std::string& proc) {
  std::optional<int64_t> smallest;
  for (const CgroupDir& dir : CgroupDirs(proc, "memory")) {
    // v2 writes no limit as "max" (not a number), v1 as the largest page count in
    // bytes (0x7ffffffffffff000 on 4 KiB pages).
    const auto text = ReadText(dir.path + (dir.v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    const auto limit = text ? ParseInt(Strip(*text)) : std::nullopt;
    if (!limit || *limit <= 0 || *limit >= (int64_t{1} << 62)) continue;
    if (!smallest || *limit < *smallest) smallest = limit;
  }
  return smallest;
}

int64_t DefaultInflightBytes(std::optional<int64_t> memory_limit, int64_t share) {
  constexpr int64_t kDefault = int64_t{256} << 20;
  constexpr int64_t kFloor = int64_t{16} << 20;
  constexpr int64_t kLimitShare = 8;
  if (!memory_limit) return kDefault;
  const int64_t eighth = *memory_limit / kLimitShare / std::max<int64_t>(1, share);
  return std::max(kFloor, std::min(kDefault, eighth));
}

int AvailableCpus() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    cpus = CPU_COUNT(&set);
  } else {  // (EINVAL: more CPUs than a cpu_set_t holds, 1024)
    cpus = static_cast<int>(std::thread::hardware_concurrency());
  }
  const auto quota = CgroupCpuQuota();
  if (quota && std::ceil(*quota) < cpus) cpus = static_cast<int>(std::ceil(*quota));
  return std::max(1, cpus);
}

}  // namespace pqloader
