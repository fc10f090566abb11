// PQLOADER_TARGET_CLONES("avx2", ..., "default"): compile a function once per target and
// let the loader pick the clone the CPU runs (GCC function multiversioning), where that
// is safe: GCC on x86-64, not under ThreadSanitizer, whose instrumented ifunc resolvers
// run while the executable is relocated, before TSan's runtime is up, and crash every
// binary at start. Elsewhere the function is compiled once, for the baseline target.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define PQLOADER_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#else
#define PQLOADER_TARGET_CLONES(...)
#endif
