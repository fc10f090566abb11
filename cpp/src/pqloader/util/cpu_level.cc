#include "pqloader/util/cpu_level.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pqloader {

namespace {

CpuLevel DetectedLevel() {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx512f")) return CpuLevel::kAvx512;
  if (__builtin_cpu_supports("avx2")) return CpuLevel::kAvx2;
#endif
  return CpuLevel::kBaseline;
}

CpuLevel CappedLevel() {
  const CpuLevel cpu = DetectedLevel();
  const char* cap = std::getenv("PQLOADER_CPU_LEVEL");
  if (cap == nullptr || *cap == '\0') return cpu;
  CpuLevel limit = CpuLevel::kBaseline;
  if (std::strcmp(cap, "avx512") == 0) {
    limit = CpuLevel::kAvx512;
  } else if (std::strcmp(cap, "avx2") == 0) {
    limit = CpuLevel::kAvx2;
  } else if (std::strcmp(cap, "baseline") != 0) {
    std::fprintf(stderr,
                 "pqloader: PQLOADER_CPU_LEVEL=%s is not baseline, avx2 or avx512; "
                 "using the baseline kernels\n",
                 cap);
  }
  return cpu < limit ? cpu : limit;
}

}  // namespace

CpuLevel CurrentCpuLevel() {
  static const CpuLevel level = CappedLevel();
  return level;
}

}  // namespace pqloader
