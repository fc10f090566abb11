#include "pqloader/util/node_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <thread>

namespace pqloader {

namespace {

// Take the flock on `fd` within `timeout` unless `cancel` is set: true once held.
bool Wait(int fd, std::chrono::milliseconds timeout, const CancelFlag& cancel, bool* timed_out) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(100);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (timed_out != nullptr) *timed_out = true;
      return false;
    }
    if (IsCancelled(cancel)) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

std::unique_ptr<NodeLock> NodeLock::Acquire(const std::string& path,
                                            std::chrono::milliseconds timeout,
                                            const CancelFlag& cancel) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  return AcquireExisting(path, timeout, cancel);
}

std::unique_ptr<NodeLock> NodeLock::AcquireToStore(const std::string& path,
                                                   std::chrono::milliseconds timeout,
                                                   const CancelFlag& cancel) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (::access(dir.empty() ? "." : dir.c_str(), W_OK) != 0) return nullptr;
  return AcquireExisting(path, timeout, cancel);
}

std::unique_ptr<NodeLock> NodeLock::AcquireExisting(const std::string& path,
                                                    std::chrono::milliseconds timeout,
                                                    const CancelFlag& cancel, bool* timed_out) {
  if (timed_out != nullptr) *timed_out = false;
  // 0666 less the umask, as every file of the cache (docs/cache_format.md, "Permissions").
  // O_NOFOLLOW: a lock that is a symlink (dangling, into another user's files) is not
  // followed: O_CREAT made its target, a file anywhere the process may write.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0 && (errno == EACCES || errno == EROFS)) {
    // A lock file another user made that this one may read but not write (made 0644 by a
    // loader before 2026-12, or under umask 022 in a group-shared directory): flock(2)
    // takes a read-only descriptor too (over NFS, which emulates it with fcntl locks, an
    // exclusive lock needs write access: there it fails, as the open did before).
    const int open_errno = errno;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) errno = open_errno;
  }
  if (fd < 0) return nullptr;
  if (!Wait(fd, timeout, cancel, timed_out)) {
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<NodeLock>(new NodeLock(fd));
}

NodeLock::~NodeLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace pqloader
