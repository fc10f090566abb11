#include "pqloader/util/node_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

namespace pqloader {

std::unique_ptr<NodeLock> NodeLock::Acquire(const std::string& path,
                                            std::chrono::milliseconds timeout,
                                            const CancelFlag& cancel) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() >= deadline ||
        IsCancelled(cancel)) {
      ::close(fd);
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::unique_ptr<NodeLock>(new NodeLock(fd));
}

std::unique_ptr<NodeLock> NodeLock::AcquireBlocking(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      ::close(fd);
      return nullptr;
    }
  }
  return std::unique_ptr<NodeLock>(new NodeLock(fd));
}

NodeLock::~NodeLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace pqloader
