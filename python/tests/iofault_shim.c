// An LD_PRELOAD library for test_local_io_faults.py: makes the file system calls of one
// path fail with a chosen errno, or read short, as a failing disk or network mount would.
// Built by the test with the system's gcc. Settings (environment):
//   IOFAULT_PATH   a substring of the path (fd calls look it up in /proc/self/fd); required
//   IOFAULT_CALLS  which calls: "pread" (pread, pread64; the default), "open" (open,
//                  openat and their 64 forms), "opendir" (those opens with O_DIRECTORY)
//   IOFAULT_ERRNO  the errno to fail with (default EIO)
//   IOFAULT_SHORT  1: a read returns half the bytes asked for (at least one) instead
//   IOFAULT_LEN    only reads of exactly this many bytes (default: any)
//   IOFAULT_AT     only reads whose bytes include this offset of the file (default: any)
//   IOFAULT_AFTER  matching calls that pass before the faults start (default 0)
//   IOFAULT_COUNT  faults to make, after which calls pass again (default: no limit)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static const char* path_part;
static const char* calls = "pread";
static int fault_errno = EIO, short_reads;
static long only_len = -1, only_at = -1, after, count = -1;
static atomic_long seen, made;
static atomic_int ready;

static void Init(void) {
  if (atomic_load(&ready)) return;
  const char* s;
  path_part = getenv("IOFAULT_PATH");
  if ((s = getenv("IOFAULT_CALLS"))) calls = s;
  if ((s = getenv("IOFAULT_ERRNO"))) fault_errno = atoi(s);
  if ((s = getenv("IOFAULT_SHORT"))) short_reads = atoi(s);
  if ((s = getenv("IOFAULT_LEN"))) only_len = atol(s);
  if ((s = getenv("IOFAULT_AT"))) only_at = atol(s);
  if ((s = getenv("IOFAULT_AFTER"))) after = atol(s);
  if ((s = getenv("IOFAULT_COUNT"))) count = atol(s);
  atomic_store(&ready, 1);
}

static int PathMatches(const char* path) {
  return path_part != NULL && path != NULL && strstr(path, path_part) != NULL;
}

static int FdMatches(int fd) {
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  return PathMatches(target);
}

// Whether this matching call is to fail (or read short).
static int Take(void) {
  if (atomic_fetch_add(&seen, 1) < after) return 0;
  return count < 0 || atomic_fetch_add(&made, 1) < count;
}

static ssize_t Pread(ssize_t (*real)(int, void*, size_t, off_t), int fd, void* buf, size_t n,
                     off_t off) {
  Init();
  if (strcmp(calls, "pread") == 0 && n > 0 && (only_len < 0 || (long)n == only_len) &&
      (only_at < 0 || (off <= only_at && only_at < off + (off_t)n)) && FdMatches(fd) && Take()) {
    if (short_reads) return real(fd, buf, n > 1 ? n / 2 : 1, off);
    errno = fault_errno;
    return -1;
  }
  return real(fd, buf, n, off);
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  static ssize_t (*real)(int, void*, size_t, off_t);
  if (real == NULL) real = (ssize_t(*)(int, void*, size_t, off_t))dlsym(RTLD_NEXT, "pread");
  return Pread(real, fd, buf, n, off);
}

ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
  static ssize_t (*real)(int, void*, size_t, off_t);
  if (real == NULL) real = (ssize_t(*)(int, void*, size_t, off_t))dlsym(RTLD_NEXT, "pread64");
  return Pread(real, fd, buf, n, off);
}

static int OpenFails(const char* path, int flags) {
  Init();
  const int match = strcmp(calls, "open") == 0 ||
                    (strcmp(calls, "opendir") == 0 && (flags & O_DIRECTORY) != 0);
  if (match && PathMatches(path) && Take()) {
    errno = fault_errno;
    return 1;
  }
  return 0;
}

static mode_t ModeOf(int flags, va_list ap) {
  return (flags & (O_CREAT | O_TMPFILE)) != 0 ? va_arg(ap, mode_t) : 0;
}

#define OPEN_AT(name)                                                              \
  int name(int dir, const char* path, int flags, ...) {                            \
    static int (*real)(int, const char*, int, ...);                                \
    if (real == NULL) real = (int (*)(int, const char*, int, ...))dlsym(RTLD_NEXT, #name); \
    va_list ap;                                                                    \
    va_start(ap, flags);                                                           \
    const mode_t mode = ModeOf(flags, ap);                                         \
    va_end(ap);                                                                    \
    if (OpenFails(path, flags)) return -1;                                         \
    return real(dir, path, flags, mode);                                           \
  }
#define OPEN(name)                                                                 \
  int name(const char* path, int flags, ...) {                                     \
    static int (*real)(const char*, int, ...);                                     \
    if (real == NULL) real = (int (*)(const char*, int, ...))dlsym(RTLD_NEXT, #name); \
    va_list ap;                                                                    \
    va_start(ap, flags);                                                           \
    const mode_t mode = ModeOf(flags, ap);                                         \
    va_end(ap);                                                                    \
    if (OpenFails(path, flags)) return -1;                                         \
    return real(path, flags, mode);                                                \
  }
OPEN(open)
OPEN(open64)
OPEN_AT(openat)
OPEN_AT(openat64)
