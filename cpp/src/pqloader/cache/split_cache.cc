#include "pqloader/cache/split_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <vector>

#include "pqloader/cache/entry_format.h"
#include "pqloader/cache/footer_cache.h"
#include "pqloader/error.h"
#include "pqloader/tensor/buffer_pool.h"
#include "pqloader/util/fork_gate.h"
#include "pqloader/util/node_lock.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace fs = std::filesystem;

// The most bytes of `records` read: a few dozen "name value" lines (larger: damaged).
constexpr int64_t kMaxRecordsBytes = int64_t{1} << 20;

namespace {

constexpr char kEntrySuffix[] = ".pqc";
constexpr char kTempPrefix[] = ".tmp-";
constexpr char kMarkerSuffix[] = ".fetch";
constexpr char kMarkerFirstLine[] = "pqloader fetch";
// Polling of a split another process is fetching: from 1 ms, doubling, to this.
constexpr auto kMaxWaitPoll = std::chrono::milliseconds(20);
constexpr auto kStaleTempAge = std::chrono::minutes(10);

// Delete `e` if it is a regular file (not a link) not written to for kStaleTempAge.
void RemoveIfStale(const fs::directory_entry& e) {
  std::error_code ec;
  if (e.is_symlink(ec) || !e.is_regular_file(ec)) return;
  const auto age = fs::file_time_type::clock::now() - e.last_write_time(ec);
  if (!ec && age > kStaleTempAge) fs::remove(e.path(), ec);
}
// Entries are read and hashed in pieces of this size (each stays in L2 between the two).
constexpr int64_t kReadPieceBytes = 512 << 10;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

int64_t ReadUsage(const std::string& path) {
  std::string text;
  if (!ReadCacheFile(path, 64, &text)) return -1;  // (a FIFO named .usage hung inserts)
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  int64_t v = 0;
  if (in >> v && v >= 0) return v;
  return -1;
}

// Writes `bytes` to a new file `path`, one there first removed (a temp name: this
// process's own, or one under the lock that writes it). O_EXCL: a symlink planted at the
// name (a group-shared cache's member, a dangling one) is not followed; an ofstream
// truncated and wrote its target, any file the process may write. Returns 0 or the errno
// (the file then removed: nothing half written is left to be published).
int WriteNewFile(const std::string& path, const std::string& bytes) {
  ::unlink(path.c_str());
  // 0666 less the umask, as every file of the cache (docs/cache_format.md, "Permissions").
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) return errno;
  int err = 0;
  for (size_t done = 0; done < bytes.size() && err == 0;) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      err = n == 0 ? EIO : errno;
    }
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) ::unlink(path.c_str());
  return err;
}

// A .usage that cannot be written (a full disk: the stream's bytes go out at close; no
// descriptor or inode for .usage.new) is removed, so that the next insert recounts the
// shard: an empty file was published (read as missing), and where .usage.new could not
// be made the old count stayed, under the entry about to be published.
void WriteUsage(const std::string& path, int64_t v) {
  const std::string tmp = path + ".new";
  if (WriteNewFile(tmp, std::to_string(v) + "\n") == 0 &&
      std::rename(tmp.c_str(), path.c_str()) == 0) {
    return;
  }
  std::remove(tmp.c_str());
  std::remove(path.c_str());
}

bool IsHex(const std::string& s, size_t begin, size_t count) {
  if (begin + count > s.size()) return false;
  for (size_t i = begin; i < begin + count; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i])) || std::isupper(static_cast<unsigned char>(s[i]))) {
      return false;
    }
  }
  return true;
}

bool IsDigits(const std::string& s, size_t begin, size_t end) {
  if (begin >= end || end > s.size()) return false;
  for (size_t i = begin; i < end; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

constexpr size_t kKeyChars = 32;

// "<key>.pqc": an entry file name; sets *key.
bool IsEntryName(const std::string& name, std::string* key) {
  if (name.size() != kKeyChars + 4 || !IsHex(name, 0, kKeyChars) ||
      name.compare(kKeyChars, 4, kEntrySuffix) != 0) {
    return false;
  }
  *key = name.substr(0, kKeyChars);
  return true;
}

bool IsKeyedName(const std::string& name, const std::string& suffix, bool* temp);

// ".tmp-<pid>-<thread>-<key>": an entry being written (see DiskCache::Put); or
// "<key>.fetch.tmp-<pid>-<n>": a claim marker being written (DiskCache::TryClaim).
bool IsTempName(const std::string& name) {
  bool marker_temp = false;
  if (IsKeyedName(name, kMarkerSuffix, &marker_temp) && marker_temp) return true;
  const size_t prefix = sizeof(kTempPrefix) - 1;
  if (name.rfind(kTempPrefix, 0) != 0 || name.size() < prefix + 4 + kKeyChars) return false;
  const size_t key = name.size() - kKeyChars;
  if (!IsHex(name, key, kKeyChars) || name[key - 1] != '-') return false;
  const size_t dash = name.find('-', prefix);
  return dash != std::string::npos && dash < key - 1 && IsDigits(name, prefix, dash) &&
         IsDigits(name, dash + 1, key - 1);
}

// "<key>.fetch": the in-progress marker of a split being fetched; sets *key.
bool IsMarkerName(const std::string& name, std::string* key) {
  constexpr size_t suffix = sizeof(kMarkerSuffix) - 1;
  if (name.size() != kKeyChars + suffix || !IsHex(name, 0, kKeyChars) ||
      name.compare(kKeyChars, suffix, kMarkerSuffix) != 0) {
    return false;
  }
  *key = name.substr(0, kKeyChars);
  return true;
}

// "shard-NN": a fan-out directory (two lowercase hex digits).
bool IsShardName(const std::string& name) {
  return name.size() == 8 && name.rfind("shard-", 0) == 0 && IsHex(name, 6, 2);
}

// Files of a shard directory other than entries and temp files.
bool IsShardFileName(const std::string& name) {
  return name == ".lock" || name == ".usage" || name == ".usage.new";
}

// Files at the top of a cache directory, other than shards and footers/.
bool IsTopFileName(const std::string& name) {
  return name == "records" || name == "records.new" || name == ".records.lock" ||
         name == kCacheMarkerName ||
         name.rfind(std::string(kCacheMarkerName) + ".tmp-", 0) == 0;
}

// "<key><suffix>" or "<key><suffix>.tmp-<pid>-<thread>" (*temp tells which).
bool IsKeyedName(const std::string& name, const std::string& suffix, bool* temp) {
  const size_t n = suffix.size();
  if (name.size() < kKeyChars + n || !IsHex(name, 0, kKeyChars) ||
      name.compare(kKeyChars, n, suffix) != 0) {
    return false;
  }
  *temp = name.size() > kKeyChars + n;
  if (!*temp) return true;
  const std::string rest = name.substr(kKeyChars + n);
  if (rest.rfind(".tmp-", 0) != 0) return false;
  const size_t dash = rest.find('-', 5);
  return dash != std::string::npos && IsDigits(rest, 5, dash) &&
         IsDigits(rest, dash + 1, rest.size());
}

// A footer (footer_cache.cc) or its temp file.
bool IsFooterName(const std::string& name, bool* temp) { return IsKeyedName(name, ".thrift", temp); }

// A filter's selection (filter/row_filter.cc) or its temp file.
bool IsSelectionName(const std::string& name, bool* temp) { return IsKeyedName(name, ".sel", temp); }

// A file's row lengths (pack/length_store.cc) or its temp file.
bool IsLengthsName(const std::string& name, bool* temp) { return IsKeyedName(name, ".len", temp); }

struct EntryFile {
  std::string path;
  std::string key;
  int64_t size;
  std::filesystem::file_time_type mtime;
};

// Read bytes [offset, offset + n) of `fd` into `out`: the count read, less than n only
// where the file ends; -1 on an error (errno says which).
int64_t PreadUpTo(int fd, uint8_t* out, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(n - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += r;
  }
  return done;
}

// The header of the entry file at `path` (not following a symbolic link).
arrow::Result<CacheEntryHeader> ReadEntryHead(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return arrow::Status::IOError(Errno("cannot open '" + path + "'"));
  std::vector<uint8_t> head(kMaxCacheEntryHeadBytes);
  const int64_t n = std::max<int64_t>(0, PreadUpTo(fd, head.data(), kMaxCacheEntryHeadBytes, 0));
  ::close(fd);
  return ParseCacheEntryHeader(head.data(), n);
}

std::string HumanBytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char out[32];
  if (u == 0) {
    std::snprintf(out, sizeof(out), "%lld B", static_cast<long long>(n));
  } else {
    // to_chars: '.' whatever LC_NUMERIC says (printf wrote "3,5 KiB" under de_DE)
    char* end = std::to_chars(out, out + sizeof(out) - 8, v, std::chars_format::fixed, 1).ptr;
    std::snprintf(end, static_cast<size_t>(out + sizeof(out) - end), " %s", units[u]);
  }
  return out;
}

const char* PolicyName(CachePolicy policy) {
  switch (policy) {
    case CachePolicy::kKeep:
      return "keep";
    case CachePolicy::kLru:
      return "lru";
    case CachePolicy::kPlan:
      return "plan";
  }
  return "?";
}

bool MarkerPending(const std::string& shard, const std::string& key);

// Entries of one shard. With `remove_stale`, temp files of writers killed mid-write
// (older than kStaleTempAge) are removed. `markers` counts the claim markers of splits
// still being fetched (MarkerPending).
std::vector<EntryFile> ListShard(const std::string& shard, int64_t* temp_files = nullptr,
                                 bool remove_stale = true, int64_t* markers = nullptr,
                                 std::error_code* error = nullptr) {
  std::vector<EntryFile> out;
  std::error_code ec;
  fs::directory_iterator it(shard, ec);
  if (ec && error != nullptr) *error = ec;
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    if (!e.is_regular_file(ec2) || e.is_symlink(ec2)) continue;
    std::string key;
    if (IsTempName(name)) {
      if (temp_files) ++*temp_files;
      if (remove_stale) RemoveIfStale(e);
      continue;
    }
    if (IsMarkerName(name, &key)) {
      if (markers && MarkerPending(shard, key)) ++*markers;
      continue;
    }
    if (!IsEntryName(name, &key)) continue;
    const auto size = e.file_size(ec2);
    if (ec2) continue;
    out.push_back({e.path().string(), key, static_cast<int64_t>(size), e.last_write_time(ec2)});
  }
  return out;
}

// What identifies one version of an entry file: a rewrite (a new file renamed over it)
// changes the inode, a write in place the ctime, which no user-space call can set back.
struct FileVersion {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
  FileVersion() = default;
  explicit FileVersion(const struct stat& st)
      : dev(st.st_dev), ino(st.st_ino), size(st.st_size),
        mtime_ns(st.st_mtim.tv_sec * int64_t{1000000000} + st.st_mtim.tv_nsec),
        ctime_ns(st.st_ctim.tv_sec * int64_t{1000000000} + st.st_ctim.tv_nsec) {}
  bool operator==(const FileVersion& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns &&
           ctime_ns == o.ctime_ns;
  }
};

// Read a whole entry file (`st`: its fstat) into a pooled buffer, checking its checksum
// on the way when `verify`. Invalid: the bytes are not an entry's (damaged, truncated);
// any other error (the OS's, out of memory) says nothing of them.
arrow::Result<std::shared_ptr<arrow::Buffer>> ReadEntryFile(int fd, const struct stat& st,
                                                            bool verify) {
  const int64_t size = st.st_size;
  if (size < kCacheEntryTrailerBytes) return arrow::Status::Invalid("cache entry too short");
  // Its trailer first (end magic, stored size): a file named like an entry but grown far
  // past one (a sparse tail, a damaged inode, another program's file) was allocated and
  // read whole before anything was checked: 1 GB of memory for a 1 GB file, a process
  // killed for a larger one.
  uint8_t trailer[kCacheEntryTrailerBytes];
  const int64_t got =
      PreadUpTo(fd, trailer, kCacheEntryTrailerBytes, size - kCacheEntryTrailerBytes);
  if (got < 0) return MakeOsError(errno, "cannot read cache entry");
  if (got != kCacheEntryTrailerBytes || !CacheEntryTrailerMatches(trailer, size)) {
    return arrow::Status::Invalid("not a complete cache entry (bad end magic or size)");
  }
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> buffer,
                        arrow::AllocateBuffer(size, RecyclingPool::Global()));
  uint8_t* out = buffer->mutable_data();
  const int64_t covered = size - kCacheEntryTrailerBytes;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(
      verify ? XXH3_createState() : nullptr, &XXH3_freeState);
  if (verify) {
    if (hash == nullptr) return arrow::Status::OutOfMemory("XXH3_createState");
    XXH3_64bits_reset(hash.get());
  }
  for (int64_t done = 0; done < size;) {
    const int64_t want = std::min<int64_t>(kReadPieceBytes, size - done);
    const int64_t piece = PreadUpTo(fd, out + done, want, done);
    if (piece < 0) return MakeOsError(errno, "cannot read cache entry");
    if (piece != want) {
      return arrow::Status::Invalid("cache entry shorter than its size (truncated?)");
    }
    const int64_t hashed_end = std::min<int64_t>(done + want, covered);
    if (verify && hashed_end > done) {
      XXH3_64bits_update(hash.get(), out + done, static_cast<size_t>(hashed_end - done));
    }
    done += want;
  }
  if (verify && !EntryChecksumMatches(out, size, XXH3_64bits_digest(hash.get()))) {
    return arrow::Status::Invalid("cache entry checksum mismatch");
  }
  return buffer;
}

// An entry file kept open for the columns of a unit not read yet (see GetDeferred), the
// entry of `key`; `open` counts the cache object's open ones, `read_errors` its entries
// that could not be read (both outlive the object: a unit may).
class OpenEntry {
 public:
  OpenEntry(int fd, std::string path, std::string key, std::shared_ptr<std::atomic<int64_t>> open,
            std::shared_ptr<std::atomic<int64_t>> read_errors)
      : fd_(fd), path_(std::move(path)), key_(std::move(key)), open_(std::move(open)),
        read_errors_(std::move(read_errors)) {
    ++*open_;
  }
  ~OpenEntry() {
    ::close(fd_);
    --*open_;
  }
  OpenEntry(const OpenEntry&) = delete;
  OpenEntry& operator=(const OpenEntry&) = delete;
  int fd() const { return fd_; }

  // Bytes [offset, offset + n) of the file into `out`, all of them.
  arrow::Status ReadAt(int64_t offset, int64_t n, uint8_t* out) const {
    const int64_t got = PreadUpTo(fd_, out, n, offset);
    if (got < 0) {
      const int err = errno;  // the exception's errno, as every storage error's
      return MakeOsError(err, "cannot read cache entry '", path_, "'");
    }
    if (got < n) {
      return arrow::Status::IOError("cache entry '", path_, "' ended at byte ", offset + got,
                                    " (", offset + n,
                                    " expected): the file was changed while in use");
    }
    return arrow::Status::OK();
  }

  // The version of the file (verified before) whose head gave the columns' places: set
  // once, before any column is read.
  void set_version(const struct stat& st) {
    MutexLock lock(version_mu_);
    version_ = FileVersion(st);
  }

  // Whether bytes [offset, offset + n) read into `got` are the entry's. The file is still
  // the version whose head was read (one fstat; a write in place moves the ctime before
  // its bytes land, so bytes read before an fstat that shows the old version are the
  // old ones); or else it changed since, written in place (another key's entry copied
  // over it, a byte flipped: served as this entry's rows, unchecked) or only touched or
  // unlinked (another process's LRU hit or eviction: the same new ctime): it is read
  // again whole, and passes if it is still an entry of `key` holding those bytes there.
  arrow::Status CheckRead(int64_t offset, int64_t n, const uint8_t* got) const {
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      return MakeOsError(err, "cannot stat cache entry '", path_, "'");
    }
    {
      MutexLock lock(version_mu_);
      if (FileVersion(st) == version_) return arrow::Status::OK();
    }
    auto whole = ReadEntryFile(fd_, st, /*verify=*/true);
    if (whole.ok() && ReadCacheEntry(*whole, key_, /*checksum_verified=*/true).ok() &&
        offset + n <= (*whole)->size() &&
        std::memcmp((*whole)->data() + offset, got, static_cast<size_t>(n)) == 0) {
      // The new version is this key's entry: the next columns' reads are checked against
      // it (one whole read per change, not per column: ranks sharing an LRU cache touch
      // the entries they hit, which moves their ctime).
      MutexLock lock(version_mu_);
      version_ = FileVersion(st);
      return arrow::Status::OK();
    }
    return arrow::Status::IOError("cache entry '", path_,
                                  "' was changed while in use: its bytes are not the entry's");
  }

  // A column of this hit could not be read: counted once per hit, however many fail.
  void CountReadError() const {
    if (!read_failed_.exchange(true)) ++*read_errors_;
  }

 private:
  const int fd_;
  const std::string path_, key_;
  const std::shared_ptr<std::atomic<int64_t>> open_, read_errors_;
  mutable Mutex version_mu_;  // (a unit's columns are read by the gather's threads)
  mutable FileVersion version_ PQ_GUARDED_BY(version_mu_);
  mutable std::atomic<bool> read_failed_{false};
};

// A column of an open entry file.
class EntryColumnBytes : public DeferredBytes {
 public:
  EntryColumnBytes(std::shared_ptr<const OpenEntry> file, int64_t offset, int64_t size)
      : file_(std::move(file)), offset_(offset), size_(size) {}
  int64_t size() const override { return size_; }
  arrow::Status ReadInto(uint8_t* out) const override {
    arrow::Status st = file_->ReadAt(offset_, size_, out);
    if (st.ok()) st = file_->CheckRead(offset_, size_, out);
    if (!st.ok()) file_->CountReadError();  // its reader falls back to the source
    return st;
  }
  std::shared_ptr<const DeferredBytes> Slice(int64_t offset, int64_t length) const override {
    return std::make_shared<EntryColumnBytes>(file_, offset_ + offset, length);
  }

 private:
  std::shared_ptr<const OpenEntry> file_;
  int64_t offset_, size_;
};

// Entry files a disk cache object keeps open for deferred columns, at most (checked
// before each open, so threads opening at once may pass it by a few); past it, entries
// are read whole.
constexpr int64_t kMaxOpenDeferred = 64;

// ... and at most an eighth of the soft RLIMIT_NOFILE (read once per process, not per
// hit): at `ulimit -n 64` the open entries took every descriptor, and the next data
// file's open failed with EMFILE (a cache that made the loader fail).
int64_t MaxOpenDeferred() {
  static const int64_t max = [] {
    struct rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return kMaxOpenDeferred;
    return std::min<int64_t>(kMaxOpenDeferred, static_cast<int64_t>(rl.rlim_cur) / 8);
  }();
  return max;
}

// An in-progress marker as read from its file.
struct Marker {
  int64_t pid = 0;
  std::string host;
  std::string token;
  std::chrono::system_clock::time_point written;
};

std::string HostName() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// Read the marker at `path`; false if there is none (or it is being written).
bool ReadMarker(const std::string& path, Marker* m) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  char buf[512];
  ssize_t n;
  do {
    n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  } while (n < 0 && errno == EINTR);
  struct stat st;
  const bool stated = ::fstat(fd, &st) == 0;
  ::close(fd);
  if (n < 0 || !stated) return false;
  std::istringstream in(std::string(buf, static_cast<size_t>(n)));
  in.imbue(std::locale::classic());
  std::string first, field;
  std::getline(in, first);
  if (first != kMarkerFirstLine) {
    // Being written (markers of versions that created them empty, then filled them):
    // treat as live and fresh.
    m->pid = 0;
  }
  while (in >> field) {
    if (field == "pid") in >> m->pid;
    else if (field == "host") in >> m->host;
    else if (field == "token") in >> m->token;
  }
  m->written = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  return true;
}

// Whether the claim marker of `key` in the shard directory `shard` is a fetch still in
// progress: its entry is not published, and its process is not known to be dead (a
// process on this host that is gone). A process killed after publishing its entry, before
// deleting its marker, left one that `cache stats` reported as being fetched for good.
bool MarkerPending(const std::string& shard, const std::string& key) {
  struct stat st;
  if (::stat((shard + "/" + key + kEntrySuffix).c_str(), &st) == 0) return false;
  Marker m;
  if (!ReadMarker(shard + "/" + key + kMarkerSuffix, &m)) return false;
  static const std::string host = HostName();
  return !(m.pid > 0 && m.host == host && ::kill(static_cast<pid_t>(m.pid), 0) != 0 &&
           errno == ESRCH);
}

// Delete the marker temp files (PQLOADER_CACHE.tmp-<pid>-<thread>) of processes killed
// while marking `dir`, once older than kStaleTempAge: nothing else ever deleted them.
void SweepMarkerTemps(const std::string& dir) {
  const std::string prefix = std::string(kCacheMarkerName) + ".tmp-";
  SweepStaleTemps(dir, [&](const std::string& name) { return name.rfind(prefix, 0) == 0; });
}

// The highest shard-NN directory of `dir` plus one (0 when there is none).
int ShardDirsSeen(const std::string& dir) {
  int seen = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    if (!IsShardName(name) || e.is_symlink(ec2) || !e.is_directory(ec2)) continue;
    seen = std::max(seen, static_cast<int>(std::stoul(name.substr(6), nullptr, 16)) + 1);
  }
  return seen;
}

bool WriteCacheMarker(const std::string& dir, int shards, bool replace);

// A claim that holds nothing (no coordination).
class NoClaim : public FetchClaim {};

// The claims of one disk cache object, shared with the claims themselves (a claim may be
// released after its cache object is gone).
struct ClaimBook {
  Mutex mu;
  std::unordered_map<std::string, std::weak_ptr<FetchClaim>> claims PQ_GUARDED_BY(mu);
  int64_t next_token PQ_GUARDED_BY(mu) = 0;
};

// The claim books of this process's disk cache objects, by directory (and shard count):
// claims are shared by every object on one directory (CacheOptions::share_claims_in_process), so that a
// loader never waits for another loader of its own process, which may hold a claimed
// split in a read-ahead its consumer does not drain (a paused iterator): it fetches the
// split too. A forked child starts with no books (those it inherits hold its parent's
// claims, and their mutexes may have been held by threads it lacks).
class ProcessBooks {
 public:
  static std::shared_ptr<ClaimBook> Of(const std::string& dir, int shards) {
    std::error_code ec;
    std::string key = fs::weakly_canonical(dir, ec).string();
    if (ec) key = dir;
    // Objects of another shard count write their markers elsewhere: a claim shared with
    // one would leave no marker where this one's other processes look.
    key += "|shards=" + std::to_string(shards);
    ProcessBooks& self = Instance();
    MutexLock lock(self.mu_);
    if (self.pid_ != ::getpid()) {
      self.pid_ = ::getpid();
      self.books_.clear();
    }
    std::shared_ptr<ClaimBook> book = self.books_[key].lock();
    if (book == nullptr) {
      book = std::make_shared<ClaimBook>();
      self.books_[key] = book;
    }
    for (auto it = self.books_.begin(); it != self.books_.end();) {  // forget gone ones
      it = it->second.expired() ? self.books_.erase(it) : std::next(it);
    }
    return book;
  }

 private:
  static ProcessBooks& Instance() {
    static ProcessBooks* books = [] {
      // Held across fork(): the child never inherits it locked by a thread it lacks.
      fork_gate::AddLock(&LockForFork, &UnlockAfterFork);
      return new ProcessBooks();  // never destroyed: caches may outlive static destruction
    }();
    return *books;
  }
  // Taken in one fork handler and released in another: outside what the analysis follows.
  static void LockForFork() PQ_NO_THREAD_SAFETY_ANALYSIS { Instance().mu_.Lock(); }
  static void UnlockAfterFork() PQ_NO_THREAD_SAFETY_ANALYSIS { Instance().mu_.Unlock(); }

  Mutex mu_;
  pid_t pid_ PQ_GUARDED_BY(mu_) = ::getpid();
  std::unordered_map<std::string, std::weak_ptr<ClaimBook>> books_ PQ_GUARDED_BY(mu_);
};

// How long a claim released after its claimer stopped still waits for the shard's lock.
constexpr std::chrono::milliseconds kReleaseAfterStop{250};

// A claim of this process: its marker is deleted on destruction (if it is still ours).
class DiskClaim : public FetchClaim {
 public:
  DiskClaim(std::shared_ptr<ClaimBook> book, std::string key, std::string marker,
            std::string lock, std::string token, std::chrono::milliseconds lock_timeout,
            CancelFlag cancel)
      : book_(std::move(book)), key_(std::move(key)), marker_(std::move(marker)),
        lock_(std::move(lock)), token_(std::move(token)), lock_timeout_(lock_timeout),
        cancel_(std::move(cancel)) {}
  ~DiskClaim() override {
    {
      // Under the shard lock, as a breaker deletes: never another process's marker (one
      // not deleted for want of the lock, or because the claimer stops, ages out: see
      // Abandoned).
      bool timed_out = false;
      auto lock = NodeLock::AcquireExisting(lock_, lock_timeout_, cancel_, &timed_out);
      // A .lock this process cannot open (another user's node cache): the marker is
      // still ours to delete. Left, every later wait of this live process (whose markers
      // never count as abandoned) took the whole wait timeout. (Unlocked, a breaker could
      // replace it between the read and the unlink: a second fetch, not other data.)
      const bool unusable = lock == nullptr && !timed_out && !IsCancelled(cancel_);
      if (lock == nullptr && IsCancelled(cancel_)) {
        // Stopped: still a short wait, as the lock is mostly held for a few file
        // operations (a sibling's insert); only a stalled holder keeps it longer.
        lock = NodeLock::AcquireExisting(lock_, std::min(lock_timeout_, kReleaseAfterStop));
      }
      Marker m;
      if ((lock != nullptr || unusable) && ReadMarker(marker_, &m) && m.token == token_) {
        ::unlink(marker_.c_str());
      }
    }
    MutexLock lock(book_->mu);
    auto it = book_->claims.find(key_);
    if (it != book_->claims.end() && it->second.expired()) book_->claims.erase(it);
  }
  void Touch() override {
    // Only our own marker: one broken meanwhile (and perhaps claimed anew by another
    // process) is not ours to date. Without the shard's lock (a worker must not wait for
    // it here): a marker broken and claimed anew between the read and the touch was
    // written just now, so the touch does not change its age; a breaker that read ours
    // as too old and deletes it after the touch makes a second fetch, as before.
    Marker m;
    if (ReadMarker(marker_, &m) && m.token == token_) {
      (void)::utimensat(AT_FDCWD, marker_.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
    }
  }

 private:
  std::shared_ptr<ClaimBook> book_;
  std::string key_, marker_, lock_, token_;
  std::chrono::milliseconds lock_timeout_;
  CancelFlag cancel_;
};

class DiskCache : public SplitCache {
 public:
  explicit DiskCache(const CacheOptions& options) : options_(options) {
    options_.shards = std::clamp(options_.shards, 1, kMaxCacheShards);
    std::error_code ec;
    fs::create_directories(options_.dir, ec);
    if (!ec) {
      // Before the shards: it looks for foreign files.
      MarkCacheDir(options_.dir, options_.shards);
      AdoptDirectoryShards();
      if (IsMarkedCacheDir(options_.dir)) SweepMarkerTemps(options_.dir);
    }
    full_scan_usage_.assign(options_.shards, -1);
    shard_refuses_.assign(options_.shards, false);
    swept_.assign(options_.shards, false);
    if (options_.share_claims_in_process) book_ = ProcessBooks::Of(options_.dir, options_.shards);
    for (int i = 0; i < options_.shards && !ec; ++i) fs::create_directories(ShardDir(i), ec);
    if (ec) {
      broken_ = true;
      Warn(WarningKind::kWriteFailure, "cache directory '" + options_.dir + "' is not usable (" +
                                           ec.message() + "); continuing without the cache");
    }
  }

  std::shared_ptr<const DecodedUnit> Get(const std::string& key) override {
    if (broken_) {
      ++misses_;
      return nullptr;
    }
    const std::string path = EntryPath(key);
    // Entries are regular files, never links: a FIFO named like one blocked the open
    // (and its reads) for good, a link to a large file was read whole.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
      // An entry there that cannot be opened (EIO, ESTALE, EMFILE ...) is not read either.
      if (errno != ENOENT && errno != ENOTDIR && errno != ELOOP) ++*read_errors_;
      ++misses_;
      return nullptr;
    }
    // Read into a recycled buffer (not mmap: a file truncated while mapped would raise
    // SIGBUS), hashing each piece while it is still in the CPU caches.
    // The checksum is checked on the first read of each version of an entry file in
    // this process (hashing was ~8 % of a shuffled epoch of hits); the layout on every
    // read (ReadCacheEntry), so that no version of the bytes reads outside its buffers.
    std::shared_ptr<DecodedUnit> unit;
    struct stat st;
    arrow::Status failed;  // why there is no unit: Invalid when the bytes are bad
    bool verify = true;
    if (::fstat(fd, &st) != 0) {
      failed = MakeOsError(errno, "fstat");
    } else if (!S_ISREG(st.st_mode)) {
      failed = arrow::Status::Invalid("not a regular file");
    } else {
      {
        MutexLock lock(memo_mu_);
        auto it = verified_.find(path);
        verify = it == verified_.end() || !(it->second == FileVersion(st));
      }
      auto buffer = ReadEntryFile(fd, st, verify);
      auto parsed = buffer.ok() ? ReadCacheEntry(*buffer, key, /*checksum_verified=*/true)
                                : arrow::Result<std::shared_ptr<DecodedUnit>>(buffer.status());
      if (parsed.ok()) {
        unit = *parsed;
      } else {
        failed = parsed.status();
      }
    }
    const bool touched = unit != nullptr && TouchIfLru(fd, &st);
    ::close(fd);
    if (unit != nullptr && (verify || touched)) RememberVerified(path, st);
    if (unit == nullptr) {
      ++misses_;
      if (failed.IsInvalid()) {
        // Corrupt or truncated (e.g. bytes damaged on disk): drop it; it will be refetched.
        ++corrupt_;
        Remove(key, path);
      } else {
        // Not read (EIO, ESTALE on NFS, ENOMEM ...): nothing says its bytes are bad. Kept
        // (a later read may pass); its row group is read from the source this time.
        ++*read_errors_;
      }
      return nullptr;
    }
    ++hits_;
    return unit;
  }

  // With kLru, mark the entry open as `fd` as recently used (its mtime), and set `st` to
  // the version that makes: the checksum checked for the version before holds for it
  // (only the times changed), so the memo of verified versions follows the touch —
  // touching by path afterwards made every hit of an LRU cache hash its entry again.
  bool TouchIfLru(int fd, struct stat* st) const {
    return options_.policy == CachePolicy::kLru && ::futimens(fd, nullptr) == 0 &&
           ::fstat(fd, st) == 0;
  }

  // The version `st` of the entry file at `path` passed its checksum in this process.
  void RememberVerified(const std::string& path, const struct stat& st) {
    MutexLock lock(memo_mu_);
    verified_.insert_or_assign(path, FileVersion(st));
  }

  // A verified version of a plain entry: its head and trailer only; the columns are
  // read from the open file when a window gather needs them (straight into its scratch:
  // the entry's bytes are copied once, not into an entry buffer first). Anything else
  // (not verified in this process yet, not plain, too many files open, any error) is
  // read as Get reads it.
  std::shared_ptr<const DecodedUnit> GetDeferred(const std::string& key) override {
    if (broken_ || open_deferred_->load() >= MaxOpenDeferred()) return Get(key);
    const std::string path = EntryPath(key);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return Get(key);
    auto file = std::make_shared<OpenEntry>(fd, path, key, open_deferred_, read_errors_);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return Get(key);
    bool verified = false;
    {
      MutexLock lock(memo_mu_);
      auto it = verified_.find(path);
      verified = it != verified_.end() && it->second == FileVersion(st);
    }
    if (!verified) return Get(key);
    const int64_t size = st.st_size;
    if (size < kCacheEntryHeaderBytes + 8 + kCacheEntryTrailerBytes) return Get(key);
    std::vector<uint8_t> head(static_cast<size_t>(std::min<int64_t>(size, 8192)));
    uint8_t trailer[kCacheEntryTrailerBytes];
    if (!file->ReadAt(0, static_cast<int64_t>(head.size()), head.data()).ok() ||
        !file->ReadAt(size - kCacheEntryTrailerBytes, kCacheEntryTrailerBytes, trailer).ok()) {
      return Get(key);
    }
    const auto need = CacheEntryHeadBytes(head.data(), static_cast<int64_t>(head.size()), size);
    if (!need.ok()) return Get(key);
    if (*need > static_cast<int64_t>(head.size())) {
      const int64_t had = static_cast<int64_t>(head.size());
      head.resize(static_cast<size_t>(*need));
      if (!file->ReadAt(had, *need - had, head.data() + had).ok()) return Get(key);
    }
    const auto columns = ReadCacheEntryColumns(head.data(), static_cast<int64_t>(head.size()),
                                               trailer, size, key);
    if (!columns.ok() || !columns->has_value()) return Get(key);
    if (TouchIfLru(file->fd(), &st)) RememberVerified(path, st);
    file->set_version(st);  // what its columns' reads are checked against
    auto unit = std::make_shared<DecodedUnit>();
    unit->num_rows = (*columns)->num_rows;
    for (const auto& c : (*columns)->columns) {
      ColumnData d;
      d.row_bytes = c.row_bytes;
      d.row_shape = c.row_shape;
      d.deferred = std::make_shared<EntryColumnBytes>(file, c.offset, c.bytes);
      unit->columns.push_back(std::move(d));
    }
    ++hits_;
    return unit;
  }

  bool Contains(const std::string& key) override {
    struct stat st;
    return !broken_ && ::stat(EntryPath(key).c_str(), &st) == 0;
  }

  std::shared_ptr<FetchClaim> TryClaim(const std::string& key, CancelFlag cancel,
                                       bool needed_now) override {
    if (broken_ || options_.wait_timeout_ms <= 0) return std::make_shared<NoClaim>();
    // An entry this cache would refuse: claimed, its split made the other processes wait
    // for an entry that never comes (up to the wait timeout, while this process's consumer
    // had not reached it). Fetched without a claim, as they then fetch it.
    if (WillRefuse(key)) return std::make_shared<NoClaim>();
    const std::string marker = MarkerPath(key);
    const std::string lock = ShardDir(Shard(key)) + "/.lock";
    MutexLock guard(book_->mu);
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (auto held = book_->claims[key].lock()) return held;  // this process's: shared
      // The marker appears whole or not at all: written under a temp name (swept like
      // an entry's temp file if this process dies first), then linked to its name, which fails if
      // it exists. A marker created empty and then filled would, if its process died in
      // between, name no process to check and hold every other one for the wait timeout.
      const int64_t n = ++book_->next_token;
      std::ostringstream token;
      token.imbue(std::locale::classic());
      token << ::getpid() << "-" << n << "-"
            << std::chrono::steady_clock::now().time_since_epoch().count();
      std::ostringstream text;
      text.imbue(std::locale::classic());
      text << kMarkerFirstLine << "\npid " << ::getpid() << "\nhost " << host_ << "\ntoken "
           << token.str() << "\n";
      const std::string body = text.str();
      const std::string tmp = marker + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(n);
      const int fd = OpenInShard(Shard(key), tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC);
      if (fd < 0) return std::make_shared<NoClaim>();  // unwritable directory ...
      const bool written = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size());
      ::close(fd);
      const int linked = written ? ::link(tmp.c_str(), marker.c_str()) : -1;
      const int link_errno = errno;
      ::unlink(tmp.c_str());
      if (linked == 0) {
        auto claim = std::make_shared<DiskClaim>(book_, key, marker, lock, token.str(),
                                                 LockTimeout(), cancel);
        book_->claims[key] = claim;
        return claim;
      }
      // A full disk, a filesystem without hard links ...: fetch without coordinating.
      if (!written || link_errno != EEXIST) return std::make_shared<NoClaim>();
      bool no_lock = false, too_old = false, undeletable = false;
      // Without the book's mutex: the wait for the shard's lock may be long, and other
      // threads' claims and releases need the mutex.
      guard.Unlock();
      const bool broken =
          BreakIfAbandoned(marker, lock, &too_old, &no_lock, cancel, &undeletable);
      guard.Lock();
      if (undeletable) {  // abandoned, but stays (another user's): fetched without a claim
        if (auto held = book_->claims[key].lock()) return held;
        return std::make_shared<NoClaim>();
      }
      if (broken && too_old && needed_now) {
        // Another process's claim, taken over: its split is fetched a second time, as
        // after a wait that timed out. Counted so (before, in neither counter).
        ++waits_;
        ++wait_timeouts_;
      }
      // Another thread may have broken it meanwhile, and claimed it: shared.
      if (auto held = book_->claims[key].lock()) return held;
      if (!broken) {
        if (IsCancelled(cancel)) return nullptr;  // stopping: no fetch
        // Another process fetches it; or its claim is abandoned and the shard's lock is
        // held past the timeout: fetch without coordinating.
        if (no_lock) return std::make_shared<NoClaim>();
        return nullptr;
      }
    }
    return nullptr;
  }

  FetchWait WaitForFetch(const std::string& key, const std::atomic<bool>* cancel) override {
    if (broken_ || options_.wait_timeout_ms <= 0) return FetchWait::kFree;
    const std::string marker = MarkerPath(key);
    const std::string lock = ShardDir(Shard(key)) + "/.lock";
    const auto t0 = std::chrono::steady_clock::now();
    const auto timeout = std::chrono::milliseconds(options_.wait_timeout_ms);
    auto poll = std::chrono::milliseconds(1);
    FetchWait out;
    while (true) {
      Marker m;
      if (!ReadMarker(marker, &m)) {  // released: published, refused or failed
        out = Contains(key) ? FetchWait::kCached : FetchWait::kFree;
        break;
      }
      if (Contains(key)) {  // published, marker not yet deleted
        out = FetchWait::kCached;
        break;
      }
      bool too_old = false, no_lock = false;
      if (BreakIfAbandoned(marker, lock, &too_old, &no_lock, BorrowedCancelFlag(cancel))) {
        out = FetchWait::kFree;  // its holder died or gave no sign for the wait timeout
        if (too_old) ++wait_timeouts_;
        break;
      }
      if (cancel != nullptr && cancel->load()) {  // (also ends the wait for the lock)
        out = FetchWait::kCancelled;
        break;
      }
      if (no_lock) {  // abandoned, but the shard's lock is held past the timeout
        out = FetchWait::kTimedOut;
        ++wait_timeouts_;
        break;
      }
      if (std::chrono::steady_clock::now() - t0 >= timeout) {
        out = FetchWait::kTimedOut;
        ++wait_timeouts_;
        break;
      }
      std::this_thread::sleep_for(poll);
      poll = std::min<std::chrono::milliseconds>(poll * 2, kMaxWaitPoll);
    }
    ++waits_;
    wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  CacheRefusal Put(const std::string& key, const std::shared_ptr<const DecodedUnit>& unit,
                   const SourceIdentity& source, double now = 0,
                   const std::atomic<bool>* cancel = nullptr) override {
    if (broken_) {
      ++write_errors_;
      return CacheRefusal::kNone;
    }
    const int shard = Shard(key);
    const std::string final_path = EntryPath(key);
    std::ostringstream tmp_name;
    tmp_name.imbue(std::locale::classic());
    tmp_name << ShardDir(shard) << "/" << kTempPrefix << ::getpid() << "-"
             << std::hash<std::thread::id>{}(std::this_thread::get_id()) << "-" << key;
    const std::string tmp = tmp_name.str();
    ::unlink(tmp.c_str());  // (this thread's own name; O_EXCL: a planted symlink not followed)
    const int fd = OpenInShard(shard, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      Failed(Errno("cannot create a cache file in '" + ShardDir(shard) + "'"));
      return CacheRefusal::kNone;
    }
    auto written = WriteCacheEntry(fd, key, source, *unit);
    bool ok = written.ok();
    std::string error = ok ? "" : written.status().message();
    if (ok && options_.fsync && ::fsync(fd) != 0) {
      ok = false;
      error = Errno("fsync");
    }
    if (::close(fd) != 0 && ok) {
      ok = false;
      error = Errno("close");
    }
    if (!ok) {
      ::unlink(tmp.c_str());
      Failed("cannot write cache entry in '" + options_.dir + "': " + error);
      return CacheRefusal::kNone;
    }
    const int64_t size = *written;
    CacheRefusal refusal = CacheRefusal::kNone;
    {
      bool timed_out = false;
      const auto lock = NodeLock::AcquireExisting(ShardDir(shard) + "/.lock", LockTimeout(),
                                                  BorrowedCancelFlag(cancel), &timed_out);
      if (lock == nullptr && cancel != nullptr && cancel->load()) {  // stopping: not a failure
        ::unlink(tmp.c_str());
        return CacheRefusal::kNone;
      }
      if (lock == nullptr) {
        const std::string what = "cannot lock cache shard '" + ShardDir(shard) + "'";
        const std::string why =
            timed_out ? what + ": another process or thread held its lock for more than " +
                            std::to_string(options_.lock_timeout_ms) + " ms"
                      : Errno(what);
        ::unlink(tmp.c_str());
        Failed(why);
        return CacheRefusal::kNone;
      }
      struct stat st;
      if (::stat(final_path.c_str(), &st) == 0) {  // another writer published it first
        ::unlink(tmp.c_str());
        return CacheRefusal::kNone;
      }
      const std::string usage_path = ShardDir(shard) + "/.usage";
      int64_t usage = ReadUsage(usage_path);
      if (usage < 0) {  // missing or damaged: recount
        usage = 0;
        for (const auto& e : ListShard(ShardDir(shard))) usage += e.size;
      }
      if (options_.size_limit > 0 && usage + size > budget()) {
        refusal = MakeRoom(shard, key, size, now, &usage);
      }
      if (refusal != CacheRefusal::kNone) {
        ::unlink(tmp.c_str());
        WriteUsage(usage_path, usage);
      } else {
        // Counted before it is published: a process killed between the two leaves .usage
        // over the entries (the next insert that does not fit recounts the listing), never
        // under them (published first, a kill there left the entry uncounted: the shard then
        // held more than its budget, by one entry per such kill, until it filled up).
        WriteUsage(usage_path, usage + size);
        if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
          const int rename_errno = errno;
          const std::string why = Errno("cannot publish cache entry '" + final_path + "'");
          ::unlink(tmp.c_str());
          WriteUsage(usage_path, usage);
          // The temp file is gone: a `pqloader cache clear` beside this loader deleted it
          // (it deletes temp files, as it deletes entries; the clear came just after the
          // insert, as it were). Not a write failure: this loader's cache works.
          if (rename_errno != ENOENT) Failed(why);
          return CacheRefusal::kNone;
        }
      }
    }
    SweepShardOnce(shard);
    NoteAdmission(key, shard, refusal);
    if (refusal != CacheRefusal::kNone) {
      CountRefusal(refusal, source, size);
      return refusal;
    }
    ++inserts_;
    bytes_written_ += size;
    return CacheRefusal::kNone;
  }

 protected:
  std::string Describe() const override {
    std::string d = "cache '" + options_.dir + "' (cache_size_limit " +
                    HumanBytes(options_.size_limit);
    if (options_.shards > 1) {
      d += ": " + std::to_string(options_.shards) + " shards of " + HumanBytes(budget());
    }
    return d + ", policy '" + PolicyName(options_.policy) + "')";
  }

 private:
  int64_t budget() const { return options_.size_limit / options_.shards; }

  // A directory keeps one shard count, recorded in its marker: a key maps to one shard
  // directory whichever loader asks. Objects of two counts on one directory stored each
  // entry twice (the total past cache_size_limit), and entries in the shards past the
  // smaller count were never found nor evicted by its loaders. A marker recording none (of
  // before 2026-12, or of a footer or filter store) gets the count its shard directories
  // show (this object's when there are none), under the records lock: one count wins.
  void AdoptDirectoryShards() {
    if (!IsMarkedCacheDir(options_.dir)) return;  // the user's files: nothing is shared
    int recorded = CacheDirShards(options_.dir);
    if (recorded == 0) {
      const auto lock = NodeLock::Acquire(options_.dir + "/.records.lock", LockTimeout());
      recorded = CacheDirShards(options_.dir);
      if (recorded == 0) {
        const int seen = ShardDirsSeen(options_.dir);
        recorded = seen > 0 ? seen : options_.shards;
        if (lock != nullptr) WriteCacheMarker(options_.dir, recorded, /*replace=*/true);
      }
    }
    if (recorded == options_.shards) return;
    Warn(WarningKind::kShards,
         "cache directory '" + options_.dir + "' was made with cache_shards=" +
             std::to_string(recorded) + "; using " + std::to_string(recorded) +
             ", not cache_shards=" + std::to_string(options_.shards) +
             ": its entries are found and its size limit kept only with its own count (to "
             "change the count, delete the directory or use another cache_dir)");
    options_.shards = recorded;
  }

  // Once per shard and object, after its first insert there (outside the shard's lock):
  // delete the temp files of writers killed mid-write (older than kStaleTempAge) and the
  // claim markers no one waits on (their entry is published or their process is dead,
  // and they are abandoned: that process dead, or older than the wait timeout). Only a writer that listed a shard (a recount, a full shard)
  // deleted such temp files: a cache that never filled kept them, outside its budget; and
  // a marker of a process killed after publishing its entry stayed for good.
  void SweepShardOnce(int shard) {
    {
      MutexLock lock(memo_mu_);
      if (swept_[shard]) return;
      swept_[shard] = true;
    }
    const std::string dir = ShardDir(shard);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      std::string key;
      if (IsTempName(name)) {
        RemoveIfStale(e);
      } else if (IsMarkerName(name, &key) && options_.wait_timeout_ms > 0 &&
                 !MarkerPending(dir, key)) {
        // (Only a marker whose entry is published or whose process is gone: a live
        // process's claim of a split still being fetched is taken over, and counted,
        // by the worker that needs it, not here.)
        BreakIfAbandoned(e.path().string(), dir + "/.lock");
      }
    }
  }

  // The most keys remembered as refused for their size (see WillRefuse): 64 K keys,
  // about 6 MB at most; past it, further ones are claimed as before.
  static constexpr size_t kMaxRefusedKeys = 1 << 16;

  // Remember what an insert of `key` into `shard` told of the next ones (see WillRefuse).
  void NoteAdmission(const std::string& key, int shard, CacheRefusal refusal) {
    MutexLock lock(memo_mu_);
    if (refusal == CacheRefusal::kTooLarge) {
      if (refused_keys_.size() < kMaxRefusedKeys) refused_keys_.insert(key);
    } else if (refusal == CacheRefusal::kFull && options_.policy == CachePolicy::kKeep) {
      shard_refuses_[shard] = true;
    } else if (refusal == CacheRefusal::kNone) {
      shard_refuses_[shard] = false;
    }
  }
  // Whether an insert of `key` is known to be refused: it was refused as larger than a
  // shard's budget (an entry's key fixes its content, so its size), or its shard refused
  // an insert for want of room under kKeep (which evicts nothing) and none went in since
  // (the next insert there is tried all the same: one that goes in clears it).
  bool WillRefuse(const std::string& key) {
    if (options_.size_limit <= 0) return false;
    MutexLock lock(memo_mu_);
    return shard_refuses_[Shard(key)] || refused_keys_.count(key) > 0;
  }

  // Requires the shard's lock, with *usage + size over the shard's budget: delete what
  // the policy evicts (stale entries first) and return whether the entry may go in.
  CacheRefusal MakeRoom(int shard, const std::string& key, int64_t size, double now,
                        int64_t* usage) {
    const bool plan = options_.policy == CachePolicy::kPlan && schedule_ != nullptr;
    std::vector<EntryFile> files;
    std::vector<HeldEntry> held;
    // Under kKeep a listing only finds stale entries; it is skipped while the shard's
    // usage is what it was when the last one found none.
    bool list = size <= budget();
    if (list && options_.policy == CachePolicy::kKeep) {
      MutexLock lock(memo_mu_);
      list = full_scan_usage_[shard] != *usage;
    }
    if (list) {
      files = ListShard(ShardDir(shard));
      *usage = 0;  // the listing is the truth (.usage may have drifted)
      for (const auto& f : files) {
        held.push_back(HeldEntry{f.size, static_cast<int64_t>(f.mtime.time_since_epoch().count()),
                                 IsStaleEntry(f),
                                 plan ? schedule_->NextUse(f.key, now) : kNeverUsed});
        *usage += f.size;
      }
    }
    const double next_use = plan ? schedule_->NextUse(key, now) : kNeverUsed;
    const Admission a = Admit(options_.policy, held, *usage, budget(), size, next_use);
    for (size_t i : a.evict) {
      if (::unlink(files[i].path.c_str()) != 0) continue;
      *usage -= files[i].size;
      ++evictions_;
      if (held[i].stale) ++evicted_stale_;
    }
    if (a.refusal != CacheRefusal::kNone && options_.policy == CachePolicy::kKeep) {
      MutexLock lock(memo_mu_);
      full_scan_usage_[shard] = *usage;
    }
    return a.refusal;
  }

  // Whether the entry `f` is stale for this cache's owner (see CacheSchedule). Entries of
  // an older format are stale: no reader of this version asks for their keys.
  bool IsStaleEntry(const EntryFile& f) {
    if (schedule_ == nullptr || schedule_->Owns(f.key)) return false;
    {
      MutexLock lock(memo_mu_);
      auto it = stale_memo_.find(f.key);
      if (it != stale_memo_.end()) return it->second;
    }
    auto head = ReadEntryHead(f.path);
    if (!head.ok()) return false;  // unreadable: not known to be stale
    const bool stale = head->version < 3 || (head->source && schedule_->IsStale(*head->source));
    MutexLock lock(memo_mu_);
    stale_memo_[f.key] = stale;
    return stale;
  }

  int Shard(const std::string& key) const {
    return static_cast<int>(std::stoul(key.substr(0, 2), nullptr, 16) % options_.shards);
  }
  std::chrono::milliseconds LockTimeout() const {
    return std::chrono::milliseconds(std::max<int64_t>(0, options_.lock_timeout_ms));
  }
  std::string ShardDir(int shard) const {
    char name[16];
    std::snprintf(name, sizeof(name), "shard-%02x", shard);
    return options_.dir + "/" + name;
  }
  // open(2) `path` in shard `shard`'s directory, making the directory again if it is gone
  // (removed by hand, or by a `pqloader cache clear` before the thirty-fourth session,
  // while this loader ran: it cached nothing more). Only the shard's: a cache directory
  // deleted whole stays deleted (made again, it would lack its marker).
  // Created 0666 less the umask (docs/cache_format.md, "Permissions"; before 2026-12
  // 0644 whatever the umask).
  int OpenInShard(int shard, const std::string& path, int flags) const {
    int fd = ::open(path.c_str(), flags, 0666);
    if (fd < 0 && errno == ENOENT) {
      std::error_code ec;
      fs::create_directory(ShardDir(shard), ec);
      if (!ec) {
        fd = ::open(path.c_str(), flags, 0666);
      } else {
        errno = ENOENT;  // what the caller reports: the cache directory is gone
      }
    }
    return fd;
  }
  std::string EntryPath(const std::string& key) const {
    return ShardDir(Shard(key)) + "/" + key + kEntrySuffix;
  }
  std::string MarkerPath(const std::string& key) const {
    return ShardDir(Shard(key)) + "/" + key + kMarkerSuffix;
  }
  // Whether the marker `m` is abandoned: its process is dead (same host) or it is older
  // than the wait timeout (then *too_old is set).
  bool Abandoned(const Marker& m, bool* too_old) const {
    if (m.pid > 0 && m.host == host_ && ::kill(static_cast<pid_t>(m.pid), 0) != 0 &&
        errno == ESRCH) {
      return true;
    }
    // Dated further in the future than the timeout: a clock set back, or another host's
    // clock ahead on a shared directory. Such a marker was never old: every read of its
    // split waited the whole timeout (every epoch while inserts were refused) and the
    // marker stayed. Judged by how far its date is from now, either way.
    const auto age = std::chrono::system_clock::now() - m.written;
    const auto timeout = std::chrono::milliseconds(options_.wait_timeout_ms);
    *too_old = age > timeout || age < -timeout;
    return *too_old;
  }
  // Delete the marker at `path` if it is abandoned (true), or if it is gone already.
  // Only under the shard's lock: without it (held past the lock timeout) the marker is
  // left and *no_lock set, and the caller fetches without coordinating (a claim marker
  // that cannot be broken now would cost every later try the lock timeout again).
  bool BreakIfAbandoned(const std::string& path, const std::string& lock_path,
                        bool* too_old = nullptr, bool* no_lock = nullptr,
                        const CancelFlag& cancel = nullptr, bool* undeletable = nullptr) {
    bool old = false;
    Marker m;
    if (!ReadMarker(path, &m)) return true;
    if (!Abandoned(m, &old)) return false;
    // Owners release under it too: never a fresh marker.
    const auto lock =
        NodeLock::AcquireExisting(lock_path, LockTimeout(), cancel);
    if (lock == nullptr) {
      if (no_lock != nullptr) *no_lock = true;
      return false;
    }
    Marker again;
    if (!ReadMarker(path, &again)) return true;
    if (again.token != m.token || again.written != m.written || !Abandoned(again, &old)) {
      return false;
    }
    if (too_old != nullptr) *too_old = old;
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) return true;
    // Abandoned, but another user's in a shard directory this one may not delete it from
    // (the sticky bit): the split is free, fetched without a claim (*undeletable). (Before
    // 2026-12 the worker that needed it waited the whole wait timeout, split after split.)
    const bool denied = errno == EPERM || errno == EACCES;
    if (denied && undeletable != nullptr) *undeletable = true;
    return denied;
  }
  void Remove(const std::string& key, const std::string& path) {
    {
      MutexLock lock(memo_mu_);
      verified_.erase(path);
    }
    const int shard = Shard(key);
    const auto lock = NodeLock::AcquireExisting(ShardDir(shard) + "/.lock", LockTimeout());
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return;
    // Without the lock (held past the lock timeout) the entry still goes (an unlink is
    // atomic; at worst it is another writer's fresh one, fetched again), but the usage is
    // not rewritten: a read-modify-write beside a writer could lose its addition. It then
    // overstates the shard by this entry until a writer finds the shard full and recounts.
    if (::unlink(path.c_str()) == 0 && lock != nullptr) {
      {
        MutexLock memo(memo_mu_);
        shard_refuses_[shard] = false;  // room made: its next claims may be kept
      }
      const std::string usage_path = ShardDir(shard) + "/.usage";
      const int64_t usage = ReadUsage(usage_path);
      if (usage >= 0) WriteUsage(usage_path, std::max<int64_t>(0, usage - st.st_size));
    }
  }
  void Failed(const std::string& message) {
    ++write_errors_;
    Warn(WarningKind::kWriteFailure, message + "; continuing without caching this data");
  }

  CacheOptions options_;
  bool broken_ = false;
  const std::string host_ = HostName();
  std::shared_ptr<ClaimBook> book_ = std::make_shared<ClaimBook>();
  // Entry files open for deferred columns (see GetDeferred).
  std::shared_ptr<std::atomic<int64_t>> open_deferred_ = std::make_shared<std::atomic<int64_t>>(0);
  Mutex memo_mu_;
  // Per key of an entry this cache's owner does not read: whether it is stale (an
  // entry's key and content never change, so neither does the answer).
  std::unordered_map<std::string, bool> stale_memo_ PQ_GUARDED_BY(memo_mu_);
  // Per entry path: the version of the file whose checksum a read in this process
  // checked (see Get).
  std::unordered_map<std::string, FileVersion> verified_ PQ_GUARDED_BY(memo_mu_);
  // Per shard: its usage when a kKeep listing last found it full with nothing to delete.
  std::vector<int64_t> full_scan_usage_ PQ_GUARDED_BY(memo_mu_);
  // Keys whose inserts were refused as too large, and per shard whether its last insert
  // was refused for want of room under kKeep: their splits are not claimed (WillRefuse).
  std::unordered_set<std::string> refused_keys_ PQ_GUARDED_BY(memo_mu_);
  std::vector<bool> shard_refuses_ PQ_GUARDED_BY(memo_mu_);
  // Per shard: whether this object swept it (SweepShardOnce).
  std::vector<bool> swept_ PQ_GUARDED_BY(memo_mu_);
};

class MemoryCache : public SplitCache {
 public:
  explicit MemoryCache(const CacheOptions& options) : options_(options) {}

  std::shared_ptr<const DecodedUnit> Get(const std::string& key) override {
    MutexLock lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    lru_.splice(lru_.end(), lru_, it->second);  // most recently used last
    ++hits_;
    return it->second->unit;
  }
  bool KeepsUnits() const override { return true; }

  bool Contains(const std::string& key) override {
    MutexLock lock(mu_);
    return index_.count(key) > 0;
  }

  // One process: nothing to coordinate.
  std::shared_ptr<FetchClaim> TryClaim(const std::string&, CancelFlag, bool) override {
    return std::make_shared<NoClaim>();
  }
  FetchWait WaitForFetch(const std::string&, const std::atomic<bool>*) override {
    return FetchWait::kFree;
  }

  CacheRefusal Put(const std::string& key, const std::shared_ptr<const DecodedUnit>& unit,
                   const SourceIdentity& source, double now = 0,
                   const std::atomic<bool>* = nullptr) override {
    const int64_t size = unit->ByteSize();
    const bool plan = options_.policy == CachePolicy::kPlan && schedule_ != nullptr;
    CacheRefusal refusal = CacheRefusal::kNone;
    {
      MutexLock lock(mu_);
      if (index_.count(key)) return CacheRefusal::kNone;
      if (options_.size_limit > 0 && used_ + size > options_.size_limit) {
        // Entries of this process are never stale: its loader's files are fixed.
        std::vector<std::list<Entry>::iterator> entries;
        std::vector<HeldEntry> held;
        int64_t order = 0;
        for (auto it = lru_.begin(); it != lru_.end(); ++it) {  // least recently used first
          entries.push_back(it);
          held.push_back(HeldEntry{it->size, order++, false,
                                   plan ? schedule_->NextUse(it->key, now) : kNeverUsed});
        }
        const Admission a = Admit(options_.policy, held, used_, options_.size_limit, size,
                                  plan ? schedule_->NextUse(key, now) : kNeverUsed);
        for (size_t i : a.evict) {
          used_ -= entries[i]->size;
          index_.erase(entries[i]->key);
          lru_.erase(entries[i]);
          ++evictions_;
        }
        refusal = a.refusal;
      }
      if (refusal == CacheRefusal::kNone) {
        lru_.push_back({key, unit, size});
        index_[key] = std::prev(lru_.end());
        used_ += size;
        ++inserts_;
        bytes_written_ += size;
      }
    }
    if (refusal != CacheRefusal::kNone) CountRefusal(refusal, source, size);
    return refusal;
  }

 protected:
  std::string Describe() const override {
    return "in-memory cache (cache_size_limit " + HumanBytes(options_.size_limit) + ", policy '" +
           PolicyName(options_.policy) + "')";
  }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const DecodedUnit> unit;
    int64_t size;
  };
  CacheOptions options_;
  Mutex mu_;
  std::list<Entry> lru_ PQ_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ PQ_GUARDED_BY(mu_);
  int64_t used_ PQ_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<SplitCache> SplitCache::Open(const CacheOptions& options) {
  if (options.dir == ":memory:") return std::make_shared<MemoryCache>(options);
  return std::make_shared<DiskCache>(options);
}

CacheCounters SplitCache::counters() const {
  CacheCounters c;
  c.hits = hits_;
  c.misses = misses_;
  c.inserts = inserts_;
  c.bytes_written = bytes_written_;
  c.refused_full = refused_full_;
  c.refused_too_large = refused_too_large_;
  c.refused_later = refused_later_;
  c.refused_stale = refused_stale_;
  c.evictions = evictions_;
  c.evicted_stale = evicted_stale_;
  c.corrupt = corrupt_;
  c.read_errors = *read_errors_;
  c.write_errors = write_errors_;
  c.waits = waits_;
  c.wait_timeouts = wait_timeouts_;
  c.wait_ns = wait_ns_;
  return c;
}

std::string SplitCache::TakeWarning() {
  MutexLock lock(warn_mu_);
  if (warnings_.empty()) return "";
  std::string w = std::move(warnings_.front());
  warnings_.erase(warnings_.begin());
  return w;
}

void SplitCache::Warn(WarningKind kind, const std::string& message) {
  MutexLock lock(warn_mu_);
  bool& warned = warned_[static_cast<int>(kind)];
  if (warned) return;  // one warning of each kind per cache object is enough
  warned = true;
  warnings_.push_back(message);
}

void SplitCache::CountWriteFailure(const std::string& message) {
  ++write_errors_;
  Warn(WarningKind::kWriteFailure, message);
}

void SplitCache::Refuse(CacheRefusal reason, const SourceIdentity& source) {
  CountRefusal(reason, source, 0);
}

void SplitCache::CountRefusal(CacheRefusal reason, const SourceIdentity& source, int64_t size) {
  const std::string entry = "row group " + std::to_string(source.row_group) + " of '" +
                            source.path + "'";
  switch (reason) {
    case CacheRefusal::kNone:
      return;
    case CacheRefusal::kFull:
      ++refused_full_;
      Warn(WarningKind::kFull,
           Describe() + " is full: row groups that do not fit are not cached, so every epoch "
           "reads them from the source again (stats()['cache_refused_full'] counts them). Raise "
           "cache_size_limit, or use cache_policy='plan' to keep the row groups needed soonest; "
           "`pqloader cache stats DIR` shows what the cache holds and how much of it is stale");
      return;
    case CacheRefusal::kTooLarge:
      ++refused_too_large_;
      Warn(WarningKind::kTooLarge,
           entry + " decodes to " + HumanBytes(size) + ", more than one shard of " + Describe() +
               " may hold: it is never cached (stats()['cache_refused_too_large']). Raise "
               "cache_size_limit or lower cache_shards");
      return;
    case CacheRefusal::kLater:
      ++refused_later_;
      Warn(WarningKind::kLater,
           Describe() + " is full: it keeps the row groups the plans of this epoch and the "
           "next read soonest, and does not cache those read later than all it holds "
           "(stats()['cache_refused_later'] counts them); they are read from the source "
           "again. Raise cache_size_limit to hold more");
      return;
    case CacheRefusal::kStale:
      ++refused_stale_;
      Warn(WarningKind::kStale,
           "'" + source.path + "' changed while the loader read it (its size or modification "
           "time differ from when the loader opened it): its row groups are not cached "
           "(stats()['cache_refused_stale']), and what was read may mix both versions. Make a "
           "new Loader to read the file as it is now; `pqloader cache prune DIR` deletes "
           "entries of old versions");
      return;
  }
}

Admission Admit(CachePolicy policy, const std::vector<HeldEntry>& held, int64_t usage,
                int64_t budget, int64_t size, double next_use) {
  Admission a;
  if (budget <= 0 || usage + size <= budget) return a;
  if (size > budget) {
    a.refusal = CacheRefusal::kTooLarge;
    return a;
  }
  // Stale entries go first, all of them: no reader asks for them.
  int64_t used = usage;
  for (size_t i = 0; i < held.size(); ++i) {
    if (!held[i].stale) continue;
    a.evict.push_back(i);
    used -= held[i].size;
  }
  if (used + size <= budget) return a;
  if (policy == CachePolicy::kKeep) {
    a.refusal = CacheRefusal::kFull;
    return a;
  }
  std::vector<size_t> live;
  for (size_t i = 0; i < held.size(); ++i) {
    if (!held[i].stale) live.push_back(i);
  }
  if (policy == CachePolicy::kPlan) {
    // Belady: the entries read furthest in the future go first, but only those read
    // later than the newcomer; if they do not make room, it is the one to leave out.
    std::stable_sort(live.begin(), live.end(), [&](size_t x, size_t y) {
      return held[x].next_use > held[y].next_use;
    });
    // With entries of different sizes, making room may take several: each one read again
    // is a hit given up for the newcomer's one, so more than one such is a bad trade.
    const size_t stale = a.evict.size();
    int64_t read_again = 0;
    for (size_t i : live) {
      if (used + size <= budget || held[i].next_use <= next_use) break;
      a.evict.push_back(i);
      used -= held[i].size;
      read_again += held[i].next_use != kNeverUsed;
    }
    if (used + size > budget || read_again > 1) {
      a.evict.resize(stale);  // the stale entries still go
      a.refusal = CacheRefusal::kLater;
    }
    return a;
  }
  std::stable_sort(live.begin(), live.end(),
                   [&](size_t x, size_t y) { return held[x].last_use < held[y].last_use; });
  for (size_t i : live) {
    if (used + size <= budget) break;
    a.evict.push_back(i);
    used -= held[i].size;
  }
  if (used + size > budget) a.refusal = CacheRefusal::kFull;
  return a;
}

std::string CacheKey(const std::string& identity) {
  const XXH128_hash_t h = XXH3_128bits(identity.data(), identity.size());
  char out[33];
  std::snprintf(out, sizeof(out), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return out;
}

void SweepStaleTemps(const std::string& dir, const std::function<bool(const std::string&)>& is_temp) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (is_temp(e.path().filename().string())) RemoveIfStale(e);
  }
}

bool ReadCacheFile(const std::string& path, int64_t max_bytes, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= max_bytes;
  if (ok) {
    out->resize(static_cast<size_t>(st.st_size));
    ok = PreadUpTo(fd, reinterpret_cast<uint8_t*>(out->data()), st.st_size, 0) == st.st_size;
  }
  ::close(fd);
  return ok;
}

std::string WriteCacheFile(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  std::error_code ec;
  // (Checked to its close: a full disk showed no error and an empty file was published.)
  if (const int err = WriteNewFile(tmp, bytes); err != 0) return std::strerror(err);
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    return why;
  }
  return "";
}

namespace {

// The counts of a loaders' records file (RecordCacheCounters writes it): lines "<name>
// <count>", the name of lowercase letters and '_', the count an int64. nullopt where
// `path` is missing, unreadable, empty or anything else (a user's file, or a damaged one:
// its counts start again). One parser for `cache stats`, the loaders' writes and
// HoldsOnlyCacheFiles. (Not a blocking std::ifstream: a FIFO named records hung every
// loader at its end.)
std::optional<std::map<std::string, int64_t>> ReadRecords(const std::string& path) {
  std::string text;
  if (!ReadCacheFile(path, kMaxRecordsBytes, &text) || text.empty() || text.back() != '\n') {
    return std::nullopt;
  }
  std::map<std::string, int64_t> out;
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    const size_t space = text.find(' ', start);
    if (space == start || space >= end) return std::nullopt;
    for (size_t i = start; i < space; ++i) {
      if ((text[i] < 'a' || text[i] > 'z') && text[i] != '_') return std::nullopt;  // (any locale)
    }
    int64_t value = 0;
    const char* last = text.data() + end;
    const auto [ptr, ec] = std::from_chars(text.data() + space + 1, last, value);
    if (ec != std::errc() || ptr != last) return std::nullopt;
    out[text.substr(start, space - start)] = value;
    start = end + 1;
  }
  return out;
}

}  // namespace

bool IsMarkedCacheDir(const std::string& dir) {
  // Not a blocking std::ifstream: a FIFO named PQLOADER_CACHE hung every loader and
  // `pqloader cache` command on the directory.
  std::string text;
  if (!ReadCacheFile(dir + "/" + kCacheMarkerName, 4096, &text)) return false;
  std::istringstream in(text);
  std::string first;
  return std::getline(in, first) && first == kCacheMarkerFirstLine;
}

namespace {

// Whether the file `path` reads as loaders' records (ReadRecords). A file of the user's
// named `records` is not: a directory holding only one was taken for a cache, which `cache
// clear` deleted it from and a loader given it as cache_dir marked and wrote over it.
bool IsRecordsFile(const std::string& path) { return ReadRecords(path).has_value(); }

// Whether `dir` holds nothing but what a cache holds (see MarkCacheDir): the names of
// docs/cache_format.md, shard directories holding only entry, marker, temp, lock and
// usage files, and records that read as records. An empty directory does.
bool HoldsOnlyCacheFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    const bool is_dir = e.is_directory(ec2) && !e.is_symlink(ec2);
    if (IsTopFileName(name) && e.is_regular_file(ec2) && !e.is_symlink(ec2) &&
        ((name != "records" && name != "records.new") || IsRecordsFile(e.path().string()))) {
      continue;
    }
    if (!is_dir || (!IsShardName(name) && name != "footers" && name != "filters" &&
                    name != "lengths")) {
      return false;
    }
    for (const auto& f : fs::directory_iterator(e.path(), ec2)) {
      const std::string fname = f.path().filename().string();
      std::string key;
      bool temp = false;
      const bool ours = name == "footers"   ? fname == ".lock" || IsFooterName(fname, &temp)
                        : name == "filters" ? fname == ".lock" || IsSelectionName(fname, &temp)
                        : name == "lengths" ? fname == ".lock" || IsLengthsName(fname, &temp)
                                            : IsEntryName(fname, &key) || IsTempName(fname) ||
                                                  IsShardFileName(fname) ||
                                                  IsMarkerName(fname, &key);
      if (!ours) return false;
    }
    if (ec2) return false;
  }
  return !ec;
}

// A directory pqloader may treat as its cache: marked, or holding only what a cache holds
// (a process killed after it wrote footers/ or filters/ but before it marked the
// directory left one that `cache stats`, `clear` and `prune` refused).
bool IsCacheDir(const std::string& dir) { return IsMarkedCacheDir(dir) || HoldsOnlyCacheFiles(dir); }

// Why `dir`, not IsCacheDir, is refused: its marker is missing, or there but unreadable or
// damaged (an empty or damaged marker was reported as none: "it has no PQLOADER_CACHE
// marker file").
std::string MarkerProblem(const std::string& dir) {
  const std::string marker = dir + "/" + kCacheMarkerName;
  const std::string name = kCacheMarkerName;
  struct stat st;
  if (::lstat(marker.c_str(), &st) != 0) {
    if (errno == ENOENT) return "it has no " + name + " marker file";
    return Errno("its " + name + " marker cannot be read");
  }
  if (!S_ISREG(st.st_mode)) return "its " + name + " marker is not a regular file (damaged)";
  if (st.st_size == 0) return "its " + name + " marker file is empty (damaged)";
  std::string text;
  if (!ReadCacheFile(marker, 4096, &text)) {
    return st.st_size > 4096 ? "its " + name + " marker file is damaged (over 4096 bytes)"
                             : Errno("its " + name + " marker file cannot be read");
  }
  return "its " + name + " marker file is damaged (its first line is not '" +
         kCacheMarkerFirstLine + "')";
}

// Write the marker of `dir` (recording `shards` when it is not 0): over the one there
// with `replace`, else only where there is none (linked to its name, as a claim marker
// is: a marker another process wrote meanwhile stays, with its shard count).
bool WriteCacheMarker(const std::string& dir, int shards, bool replace) {
  std::ostringstream tmp;
  tmp.imbue(std::locale::classic());
  tmp << dir << "/" << kCacheMarkerName << ".tmp-" << ::getpid() << "-"
      << std::hash<std::thread::id>{}(std::this_thread::get_id());
  {
    std::ostringstream out;
    out.imbue(std::locale::classic());
    out << kCacheMarkerFirstLine << "\nformat " << kCacheFormatVersion << "\n";
    if (shards > 0) out << "shards " << shards << "\n";
    out << "This directory is a pqloader cache (docs/cache_format.md); "
           "`pqloader cache clear DIR` deletes its entries.\n";
    // (Checked to its close: a full disk published an empty marker.)
    if (WriteNewFile(tmp.str(), out.str()) != 0) return false;
  }
  const std::string marker = dir + "/" + kCacheMarkerName;
  bool done = false;
  if (!replace) {
    done = ::link(tmp.str().c_str(), marker.c_str()) == 0 || errno == EEXIST;
    // A filesystem without hard links: renamed, as before 2026-12.
    replace = !done && (errno == EPERM || errno == ENOTSUP || errno == EXDEV || errno == EMLINK);
  }
  if (replace) done = std::rename(tmp.str().c_str(), marker.c_str()) == 0;
  std::remove(tmp.str().c_str());  // (after a rename: gone already)
  return done;
}

}  // namespace

int CacheDirShards(const std::string& dir) {
  std::string text;
  if (!ReadCacheFile(dir + "/" + kCacheMarkerName, 4096, &text)) return 0;
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  std::string line;
  if (!std::getline(in, line) || line != kCacheMarkerFirstLine) return 0;
  while (std::getline(in, line)) {
    if (line.rfind("shards ", 0) != 0 || !IsDigits(line, 7, line.size()) || line.size() > 10) {
      continue;
    }
    const int n = std::stoi(line.substr(7));
    return n >= 1 && n <= kMaxCacheShards ? n : 0;
  }
  return 0;
}

bool MarkCacheDir(const std::string& dir, int shards) {
  if (IsMarkedCacheDir(dir)) return true;
  // Only a directory holding nothing but what a cache holds is marked: never a
  // directory of the user's files given as cache_dir by mistake.
  if (!HoldsOnlyCacheFiles(dir)) return false;
  return WriteCacheMarker(dir, shards, /*replace=*/false) && IsMarkedCacheDir(dir);
}

namespace {

// The state of the entry at `path` (its header read) under `checker`.
SourceState EntryState(const std::string& path, const std::string& key,
                       const SourceChecker& checker, bool* is_entry) {
  auto head = ReadEntryHead(path);
  *is_entry = head.ok() && (head->version < 2 || head->key == key);
  if (!*is_entry) return SourceState::kUnknown;
  if (head->version < 3 || !head->source) return SourceState::kStale;  // an older format
  return checker(*head->source);
}

// What RemoveOrReport did with a file.
enum class Removal { kRemoved, kGone, kDenied };

// Remove the file `path` (kGone: it was gone already). One this user may not remove
// (another user's file in a shard directory with the sticky bit: EPERM, EACCES) is kDenied,
// listed in `report`'s not_removed (at most kMaxReportedForeign; not_removed_count counts
// all), and the caller goes on past it (prune and clear stopped at the first before
// 2026-12); any other failure (a read-only filesystem, an I/O error) is returned, naming
// the path. `Report`: CachePruneReport or CacheClearReport.
template <typename Report>
arrow::Result<Removal> RemoveOrReport(const std::string& path, Report* report) {
  if (::unlink(path.c_str()) == 0) return Removal::kRemoved;
  const int unlink_errno = errno;
  if (unlink_errno == ENOENT) return Removal::kGone;
  if (unlink_errno != EPERM && unlink_errno != EACCES) {
    return MakeOsError(unlink_errno, "cannot remove '", path, "'");
  }
  if (report->not_removed_count++ < kMaxReportedForeign) {
    report->not_removed.push_back(path + ": " + std::strerror(unlink_errno));
  }
  return Removal::kDenied;
}

}  // namespace

arrow::Result<CacheDirStats> InspectCacheDir(const std::string& dir, const SourceChecker& checker,
                                             const CancelFlag& cancel) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return arrow::Status::IOError("'", dir, "' is not a cache directory");
  }
  // What it cannot read, or a directory that is not a cache, is an error: never a
  // report of an empty cache.
  fs::directory_iterator top(dir, ec);
  if (ec) return MakeOsError(ec.value(), "cannot list cache directory '", dir, "'");
  if (!IsCacheDir(dir)) {
    return arrow::Status::Invalid("'", dir, "' is not a pqloader cache directory: ",
                                  MarkerProblem(dir));
  }
  CacheDirStats s;
  // The footers and selections are counted after the shards: checking entries against a
  // dataset (the checker) stores its remote files' footers as it goes, which a count
  // before or after it, by the directory's order, took in or not.
  std::vector<fs::path> later;
  auto count_kept = [&s](const fs::path& path) {
    const std::string dir_name = path.filename().string();
    const auto is_ours = dir_name == "filters"   ? IsSelectionName
                         : dir_name == "lengths" ? IsLengthsName
                                                 : IsFooterName;
    int64_t* count = dir_name == "filters"   ? &s.selections
                     : dir_name == "lengths" ? &s.lengths
                                             : &s.footers;
    int64_t* bytes = dir_name == "filters"   ? &s.selection_bytes
                     : dir_name == "lengths" ? &s.lengths_bytes
                                             : &s.footer_bytes;
    std::error_code ec2;
    for (const auto& f : fs::directory_iterator(path, ec2)) {
      bool temp = false;
      const std::string name = f.path().filename().string();
      std::error_code ec3;
      if (!is_ours(name, &temp) || !f.is_regular_file(ec3)) continue;
      if (temp) {  // of a writer killed mid-write, or writing now (as a shard's)
        ++s.temp_files;
        continue;
      }
      const auto size = f.file_size(ec3);
      if (ec3) continue;  // deleted meanwhile
      ++*count;
      *bytes += static_cast<int64_t>(size);
    }
  };
  for (const auto& e : top) {
    std::error_code ec2;
    const std::string top_name = e.path().filename().string();
    if ((top_name == "filters" || top_name == "footers" || top_name == "lengths") &&
        e.is_directory(ec2) &&
        !e.is_symlink(ec2)) {
      later.push_back(e.path());
      continue;
    }
    if (!IsShardName(top_name) || !e.is_directory(ec2) || e.is_symlink(ec2)) {
      continue;
    }
    std::error_code unlisted;
    const auto entries = ListShard(e.path().string(), &s.temp_files, /*remove_stale=*/false,
                                   &s.fetch_markers, &unlisted);
    // (A shard deleted meanwhile, by a `cache clear` beside this, holds nothing.)
    if (unlisted && unlisted != std::errc::no_such_file_or_directory) {
      return MakeOsError(unlisted.value(), "cannot list cache shard '", e.path().string(), "'");
    }
    for (const auto& entry : entries) {
      if (IsCancelled(cancel)) return CancelledStatus();
      ++s.entries;
      s.bytes += entry.size;
      if (!checker) continue;
      bool is_entry = false;
      const SourceState state = EntryState(entry.path, entry.key, checker, &is_entry);
      if (!is_entry) continue;  // named like an entry, but not one
      switch (state) {
        case SourceState::kStale:
          ++s.stale_entries;
          s.stale_bytes += entry.size;
          break;
        case SourceState::kUnknown:
          ++s.unverified_entries;
          break;
        case SourceState::kCurrent:
          break;
      }
    }
  }
  for (const auto& path : later) count_kept(path);
  s.recorded = ReadRecords(dir + "/records").value_or(std::map<std::string, int64_t>{});
  return s;
}

arrow::Result<CachePruneReport> PruneCacheDir(const std::string& dir,
                                              const SourceChecker& checker,
                                              const CancelFlag& cancel,
                                              std::chrono::milliseconds lock_timeout) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return arrow::Status::IOError("'", dir, "' is not a cache directory (not a directory)");
  }
  CachePruneReport report;
  if (!IsCacheDir(dir)) {
    if (fs::is_empty(dir, ec) && !ec) return report;  // nothing to prune
    return arrow::Status::Invalid(
        "'", dir, "' is not a pqloader cache directory: ", MarkerProblem(dir),
        ", so nothing in it can be proven to be pqloader's; nothing was deleted");
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    const auto st = e.symlink_status(ec2);
    if (ec2 || !IsShardName(e.path().filename().string()) || !fs::is_directory(st)) continue;
    const std::string shard = e.path().string();
    std::error_code unlisted;
    const auto entries = ListShard(shard, nullptr, /*remove_stale=*/false, nullptr, &unlisted);
    // A shard it cannot list (another user's, made 0700): an error, as for stats and clear
    // (its stale entries were not looked at, and the prune said status 0, "0 deleted").
    // One deleted meanwhile, by a `cache clear` beside this, holds nothing.
    if (unlisted && unlisted != std::errc::no_such_file_or_directory) {
      return arrow::Status::FromDetailAndArgs(
          arrow::StatusCode::IOError,
          std::make_shared<ErrorDetail>(ErrorKind::kIO, unlisted.value()),
          "cannot list cache shard '", shard, "': ", std::strerror(unlisted.value()), "; ",
          report.entries, " stale entries were deleted before it");
    }
    for (const auto& entry : entries) {
      if (IsCancelled(cancel)) return CancelledStatus();
      std::error_code ec3;
      if (!fs::is_regular_file(fs::symlink_status(entry.path, ec3)) || ec3) continue;
      bool is_entry = false;
      const SourceState state = EntryState(entry.path, entry.key, checker, &is_entry);
      if (!is_entry) continue;  // not provably an entry: left alone
      if (state != SourceState::kStale) {
        ++report.kept;
        if (state == SourceState::kUnknown) ++report.unverified_entries;
        continue;
      }
      // Under the shard's lock, as writers delete, so that .usage stays right.
      bool timed_out = false;
      const auto lock =
          NodeLock::AcquireExisting(shard + "/.lock", lock_timeout, cancel, &timed_out);
      if (lock == nullptr) {
        const int lock_errno = timed_out ? 0 : errno;
        if (IsCancelled(cancel)) return CancelledStatus();  // while it waited
        const std::string what = "cannot lock cache shard '" + shard + "'";
        // (With the OS's error number, as every storage error: the exception's errno.)
        return arrow::Status::FromDetailAndArgs(
            arrow::StatusCode::IOError, std::make_shared<ErrorDetail>(ErrorKind::kIO, lock_errno),
            timed_out ? what + ": another process held its lock for more than " +
                            std::to_string(lock_timeout.count()) + " ms"
                      : what + ": " + std::strerror(lock_errno),
            "; ", report.entries, " stale entries were deleted before it");
      }
      struct stat sb;
      if (::lstat(entry.path.c_str(), &sb) != 0) continue;
      ARROW_ASSIGN_OR_RAISE(const Removal removal, RemoveOrReport(entry.path, &report));
      if (removal != Removal::kRemoved) continue;
      ++report.entries;
      report.bytes += sb.st_size;
      const std::string usage_path = shard + "/.usage";
      const int64_t usage = ReadUsage(usage_path);
      if (usage >= 0) WriteUsage(usage_path, std::max<int64_t>(0, usage - sb.st_size));
    }
  }
  if (ec) return MakeOsError(ec.value(), "cannot list '", dir, "'");
  return report;
}

namespace {

// Whether the regular file `path` starts with the header of the entry for `key`.
bool IsEntryFile(const std::string& path, const std::string& key) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  uint8_t head[kCacheEntryHeaderBytes];
  ssize_t n;
  do {
    n = ::pread(fd, head, sizeof(head), 0);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof(head)) && IsCacheEntryHeader(head, n, key);
}

// Whether the regular file `path` is an in-progress marker (by its first line).
bool IsMarkerFile(const std::string& path) {
  std::string text;
  if (!ReadCacheFile(path, 4096, &text)) return false;
  std::istringstream in(text);
  std::string first;
  return std::getline(in, first) && first == kMarkerFirstLine;
}

class Clearer {
 public:
  Clearer(CacheClearReport* report, CancelFlag cancel)
      : report_(report), cancel_(std::move(cancel)) {}

  void Foreign(const fs::path& p) {
    if (report_->foreign_count++ < kMaxReportedForeign) report_->foreign.push_back(p.string());
  }
  // Whether `p` was removed (or was gone already); see RemoveOrReport.
  arrow::Result<bool> Remove(const fs::path& p) {
    ARROW_ASSIGN_OR_RAISE(const Removal removal, RemoveOrReport(p.string(), report_));
    return removal != Removal::kDenied;
  }

  // A shard's files, under its lock (as writers and prune change them), which stays with
  // the directory: deleted, a lock a writer held let the next writer lock a new file
  // beside it, and loaders running meanwhile found no directory to write entries or claim
  // markers in (they cached nothing more).
  arrow::Status ClearShard(const fs::path& shard) {
    bool timed_out = false;
    const auto lock = NodeLock::AcquireExisting((shard / ".lock").string(), kCacheLockTimeout,
                                                cancel_, &timed_out);
    if (lock == nullptr && IsCancelled(cancel_)) return CancelledStatus();
    if (lock == nullptr && timed_out) {
      return arrow::Status::IOError("cannot lock cache shard '", shard.string(),
                                    "': another process or thread held its lock for more than ",
                                    kCacheLockTimeout.count(), " ms");
    }
    // (A .lock that cannot be opened: not one a writer holds either.)
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(shard, ec)) {
      if (IsCancelled(cancel_)) return CancelledStatus();
      const std::string name = e.path().filename().string();
      std::error_code ec2;
      const auto st = e.symlink_status(ec2);
      std::string key;
      if (name == ".lock" && !ec2 && fs::is_regular_file(st)) {
        continue;  // kept: see above
      } else if (ec2 || !fs::is_regular_file(st)) {
        Foreign(e.path());
      } else if (IsEntryName(name, &key) && IsEntryFile(e.path().string(), key)) {
        const auto size = e.file_size(ec2);
        ARROW_ASSIGN_OR_RAISE(const bool removed, Remove(e.path()));
        if (!removed) continue;
        ++report_->entries;
        report_->bytes += ec2 ? 0 : static_cast<int64_t>(size);
      } else if (IsTempName(name) || IsShardFileName(name) ||
                 (IsMarkerName(name, &key) && IsMarkerFile(e.path().string()))) {
        ARROW_ASSIGN_OR_RAISE(const bool removed, Remove(e.path()));
        if (removed) ++report_->other_files;
      } else {
        Foreign(e.path());
      }
    }
    if (ec) return MakeOsError(ec.value(), "cannot list '", shard.string(), "'");
    return arrow::Status::OK();
  }

  // footers/: footer files whose checksum verifies, their temp files, the fetch lock.
  arrow::Status ClearFooters(const fs::path& dir) {
    return ClearOwnFiles(dir, [](const fs::path& p) {
      const std::string name = p.filename().string();
      bool temp = false;
      return IsFooterName(name, &temp) && (temp || IsFooterFile(p.string()));
    });
  }

  // filters/: stored selections, their temp files, the lock of their computation.
  arrow::Status ClearSelections(const fs::path& dir) {
    return ClearOwnFiles(dir, [](const fs::path& p) {
      bool temp = false;
      return IsSelectionName(p.filename().string(), &temp);
    });
  }

  // lengths/: stored row lengths, their temp files, the lock of their reading.
  arrow::Status ClearLengths(const fs::path& dir) {
    return ClearOwnFiles(dir, [](const fs::path& p) {
      bool temp = false;
      return IsLengthsName(p.filename().string(), &temp);
    });
  }

  // Remove the regular files of `dir` that `ours` claims; report the others as foreign.
  // Its `.lock` stays, and so does the directory (see ClearShard).
  template <typename Ours>
  arrow::Status ClearOwnFiles(const fs::path& dir, Ours ours) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      std::error_code ec2;
      const auto st = e.symlink_status(ec2);
      if (!ec2 && fs::is_regular_file(st) && e.path().filename() == ".lock") continue;
      if (!ec2 && fs::is_regular_file(st) && ours(e.path())) {
        ARROW_ASSIGN_OR_RAISE(const bool removed, Remove(e.path()));
        if (removed) ++report_->other_files;
      } else {
        Foreign(e.path());
      }
    }
    if (ec) return MakeOsError(ec.value(), "cannot list '", dir.string(), "'");
    return arrow::Status::OK();
  }

 private:
  CacheClearReport* report_;
  CancelFlag cancel_;
};

}  // namespace

arrow::Result<CacheClearReport> ClearCacheDir(const std::string& dir, const CancelFlag& cancel) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return arrow::Status::IOError("'", dir, "' is not a cache directory (not a directory)");
  }
  CacheClearReport report;
  if (!IsCacheDir(dir)) {
    if (fs::is_empty(dir, ec) && !ec) return report;  // nothing to clear
    return arrow::Status::Invalid(
        "'", dir, "' is not a pqloader cache directory: ", MarkerProblem(dir),
        ", so nothing in it can be proven to be pqloader's; nothing was deleted "
        "(pqloader marks a cache directory when it creates it or finds it empty)");
  }
  Clearer clearer(&report, cancel);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (IsCancelled(cancel)) return CancelledStatus();
    const std::string name = e.path().filename().string();
    std::error_code ec2;
    const auto st = e.symlink_status(ec2);
    if (ec2) {
      clearer.Foreign(e.path());
    } else if (name == kCacheMarkerName) {
      continue;  // the directory stays a cache
    } else if (IsShardName(name) && fs::is_directory(st)) {
      ARROW_RETURN_NOT_OK(clearer.ClearShard(e.path()));
    } else if (name == "footers" && fs::is_directory(st)) {
      ARROW_RETURN_NOT_OK(clearer.ClearFooters(e.path()));
    } else if (name == "filters" && fs::is_directory(st)) {
      ARROW_RETURN_NOT_OK(clearer.ClearSelections(e.path()));
    } else if (name == "lengths" && fs::is_directory(st)) {
      ARROW_RETURN_NOT_OK(clearer.ClearLengths(e.path()));
    } else if (name == ".records.lock" && fs::is_regular_file(st)) {
      continue;  // a lock stays (see Clearer::ClearShard)
    } else if (IsTopFileName(name) && fs::is_regular_file(st)) {
      ARROW_ASSIGN_OR_RAISE(const bool removed, clearer.Remove(e.path()));
      if (removed) ++report.other_files;
    } else {
      clearer.Foreign(e.path());
    }
  }
  if (ec) return MakeOsError(ec.value(), "cannot list '", dir, "'");
  return report;
}

CacheCounters CountersSince(const CacheCounters& now, const CacheCounters& then) {
  CacheCounters d;
  d.hits = now.hits - then.hits;
  d.misses = now.misses - then.misses;
  d.inserts = now.inserts - then.inserts;
  d.bytes_written = now.bytes_written - then.bytes_written;
  d.refused_full = now.refused_full - then.refused_full;
  d.refused_too_large = now.refused_too_large - then.refused_too_large;
  d.refused_later = now.refused_later - then.refused_later;
  d.refused_stale = now.refused_stale - then.refused_stale;
  d.evictions = now.evictions - then.evictions;
  d.evicted_stale = now.evicted_stale - then.evicted_stale;
  d.corrupt = now.corrupt - then.corrupt;
  d.read_errors = now.read_errors - then.read_errors;
  d.write_errors = now.write_errors - then.write_errors;
  d.waits = now.waits - then.waits;
  d.wait_timeouts = now.wait_timeouts - then.wait_timeouts;
  d.wait_ns = now.wait_ns - then.wait_ns;
  return d;
}

bool CacheCounters::any() const {
  return hits || misses || inserts || refused_full || refused_too_large || refused_later ||
         refused_stale || waits ||
         evictions || corrupt || read_errors || write_errors;
}

bool RecordCacheCounters(const std::string& dir, const CacheCounters& c) {
  if (dir == ":memory:") return true;
  // Only in a marked directory: one of the user's files, used but never marked, lost its
  // own `records` (or `records.new`) to the counts, which no `cache stats` shows there.
  if (!IsMarkedCacheDir(dir)) return true;
  const auto lock = NodeLock::AcquireExisting(dir + "/.records.lock", kCacheLockTimeout);
  if (lock == nullptr) return false;
  std::map<std::string, int64_t> r =
      ReadRecords(dir + "/records").value_or(std::map<std::string, int64_t>{});
  for (auto& [name, value] : r) value = std::max<int64_t>(value, 0);  // damaged: not < 0
  // Saturating: a damaged file's huge count must not overflow (undefined behaviour).
  auto add = [&r](const char* name, int64_t value) {
    int64_t& total = r[name];
    total = value > std::numeric_limits<int64_t>::max() - total
                ? std::numeric_limits<int64_t>::max()
                : total + value;
  };
  add("hits", c.hits);
  add("misses", c.misses);
  add("inserts", c.inserts);
  add("evictions", c.evictions);
  add("corrupt", c.corrupt);
  add("write_errors", c.write_errors);
  // Refusals and stale evictions: written once they happened (older records lack them).
  const std::pair<const char*, int64_t> optional[] = {
      {"refused_full", c.refused_full},
      {"refused_too_large", c.refused_too_large},
      {"refused_later", c.refused_later},
      {"waits", c.waits},
      {"wait_timeouts", c.wait_timeouts},
      {"refused_stale", c.refused_stale},
      {"evicted_stale", c.evicted_stale},
      {"read_errors", c.read_errors}};
  for (const auto& [name, value] : optional) {
    if (value != 0 || r.count(name)) add(name, value);
  }
  const std::string tmp = dir + "/records.new";
  std::string text;
  for (const auto& [k, v] : r) text += k + " " + std::to_string(v) + "\n";
  if (WriteNewFile(tmp, text) != 0) return false;
  return std::rename(tmp.c_str(), (dir + "/records").c_str()) == 0;
}

}  // namespace pqloader
