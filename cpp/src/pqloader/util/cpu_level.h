// The vector kernels this process may use: the CPU's level (AVX-512, AVX2 or the x86-64
// baseline), capped by the environment variable PQLOADER_CPU_LEVEL ("baseline", "avx2",
// "avx512"), both read once per process. Every vector kernel has a baseline twin that
// gives the same bytes (docs/determinism.md: the output does not depend on the machine);
// the cap lets one machine run each level, so that tests compare them
// (python/tests/test_cpu_level.py), and lets a user rule a kernel out. An unknown value
// caps at the baseline (and says so once on stderr). Not capped: the target_clones of
// transform/image_ops.cc (chosen by the dynamic loader; no FMA, so the same floats).
// Thread-safety: may be called from any thread.
#pragma once

namespace pqloader {

enum class CpuLevel { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

/// The level this process's kernels use (the CPU's, capped by PQLOADER_CPU_LEVEL).
CpuLevel CurrentCpuLevel();

/// Whether AVX2 kernels may run.
inline bool HasAvx2() { return CurrentCpuLevel() >= CpuLevel::kAvx2; }

}  // namespace pqloader
