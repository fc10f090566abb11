#include "pqloader/pack/length_store.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "pqloader/cache/split_cache.h"

namespace pqloader {

namespace {

// PQLEN001, the key (32 hex digits), the row-group count n, n row groups, n row counts
// (int64 each), the lengths (int32 each), then the XXH3-64 of all of it.
constexpr char kLengthsMagic[8] = {'P', 'Q', 'L', 'E', 'N', '0', '0', '1'};
constexpr size_t kLengthsKeyBytes = 32;
constexpr size_t kLengthsHeaderBytes = sizeof kLengthsMagic + kLengthsKeyBytes + 8;

std::string LengthsDir(const std::string& dir) {
  return (std::filesystem::path(dir) / "lengths").string();
}

std::string LengthsPath(const std::string& dir, const std::string& key) {
  return (std::filesystem::path(LengthsDir(dir)) / (key + ".len")).string();
}

template <typename T>
void AppendRaw(std::string* out, const T* values, size_t n) {
  out->append(reinterpret_cast<const char*>(values), n * sizeof(T));
}

}  // namespace

int64_t FileLengths::Find(int64_t row_group, int64_t num_rows) const {
  const auto it = std::lower_bound(row_groups.begin(), row_groups.end(), row_group);
  if (it == row_groups.end() || *it != row_group) return -1;
  const auto i = static_cast<size_t>(it - row_groups.begin());
  if (rows[i] != num_rows) return -1;
  int64_t first = 0;
  for (size_t k = 0; k < i; ++k) first += rows[k];
  return first;
}

std::string LengthsKey(const DataFile& file, const ColumnSource& src) {
  // The file as split cache entries name it; the column by its place in the file (the
  // footer hash fixes the schema those indices point into).
  std::string id = "lengths-v1|file=" + file.display + "|size=" + std::to_string(file.size) +
                   "|mtime=" + std::to_string(file.mtime_ns) + "|footer=" + file.footer_hash +
                   "|field=" + std::to_string(src.field) + "|path=";
  for (const auto& p : src.path) id.append(std::to_string(p.size())).append(":").append(p);
  id += "|leaves=";
  for (int leaf : src.leaves) id.append(std::to_string(leaf)).append(",");
  return CacheKey(id);
}

std::string LengthsLockPath(const std::string& dir) {
  return (std::filesystem::path(LengthsDir(dir)) / ".lock").string();
}

std::optional<FileLengths> LoadLengths(const std::string& dir, const std::string& key,
                                       int64_t max_row_groups, int64_t max_rows) {
  // Not a blocking stream following links (ReadCacheFile): a FIFO in its place is not
  // waited on; nor is a file grown past what this file's rows can need read whole.
  const int64_t max_bytes = static_cast<int64_t>(kLengthsHeaderBytes) + 16 * max_row_groups +
                            4 * max_rows + 8;
  std::string in;
  if (!ReadCacheFile(LengthsPath(dir, key), max_bytes, &in)) return std::nullopt;
  if (in.size() < kLengthsHeaderBytes + 8 ||
      std::memcmp(in.data(), kLengthsMagic, sizeof kLengthsMagic) != 0 ||
      in.compare(sizeof kLengthsMagic, kLengthsKeyBytes, key) != 0) {
    return std::nullopt;  // not a lengths file, or another key's copied in its place
  }
  const size_t body = in.size() - 8;
  uint64_t checksum = 0;
  std::memcpy(&checksum, in.data() + body, 8);
  if (XXH3_64bits(in.data(), body) != checksum) return std::nullopt;
  int64_t n = 0;
  std::memcpy(&n, in.data() + sizeof kLengthsMagic + kLengthsKeyBytes, 8);
  if (n < 0 || n > max_row_groups) return std::nullopt;
  size_t pos = kLengthsHeaderBytes;
  FileLengths out;
  out.row_groups.resize(static_cast<size_t>(n));
  out.rows.resize(static_cast<size_t>(n));
  if (body < pos + 16 * static_cast<size_t>(n)) return std::nullopt;
  std::memcpy(out.row_groups.data(), in.data() + pos, 8 * n);
  pos += 8 * n;
  std::memcpy(out.rows.data(), in.data() + pos, 8 * n);
  pos += 8 * n;
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (out.rows[i] < 0 || out.row_groups[i] < 0 ||
        (i > 0 && out.row_groups[i] <= out.row_groups[i - 1])) {
      return std::nullopt;
    }
    total += out.rows[i];
    if (total > max_rows) return std::nullopt;
  }
  if (body - pos != 4 * static_cast<size_t>(total)) return std::nullopt;
  out.lengths.resize(static_cast<size_t>(total));
  std::memcpy(out.lengths.data(), in.data() + pos, 4 * total);
  for (int32_t v : out.lengths) {
    if (v < -1) return std::nullopt;
  }
  return out;
}

std::string PrepareLengthsStore(const std::string& dir) {
  const std::string failed = "cannot save row lengths in '" + LengthsDir(dir) + "' (";
  const std::string unsaved = "): the next run reads them from the source again";
  std::error_code ec;
  // The directory is marked before lengths/ is made (as the cache's shards are).
  std::filesystem::create_directories(dir, ec);
  if (ec) return failed + ec.message() + unsaved;
  MarkCacheDir(dir);
  std::filesystem::create_directories(LengthsDir(dir), ec);
  if (ec) return failed + ec.message() + unsaved;
  // A lengths/ there already, on a read-only disk or another user's: nothing can be
  // stored (no store is tried; the lock, NodeLock::AcquireToStore, is not taken either).
  if (::access(LengthsDir(dir).c_str(), W_OK) != 0) return failed + std::strerror(errno) + unsaved;
  // Temp files of writers killed mid-write ("<key>.len.tmp-<pid>-<thread>"), never read.
  SweepStaleTemps(LengthsDir(dir), [](const std::string& name) {
    return name.find(".len.tmp-") == kLengthsKeyBytes;
  });
  return "";
}

std::string StoreLengths(const std::string& dir, const std::string& key,
                         const FileLengths& lengths) {
  const std::string path = LengthsPath(dir, key);
  const size_t n = lengths.row_groups.size();
  std::string bytes(kLengthsMagic, sizeof kLengthsMagic);
  bytes.reserve(kLengthsHeaderBytes + 16 * n + 4 * lengths.lengths.size() + 8);
  bytes += key;
  const auto count = static_cast<int64_t>(n);
  AppendRaw(&bytes, &count, 1);
  AppendRaw(&bytes, lengths.row_groups.data(), n);
  AppendRaw(&bytes, lengths.rows.data(), n);
  AppendRaw(&bytes, lengths.lengths.data(), lengths.lengths.size());
  const uint64_t checksum = XXH3_64bits(bytes.data(), bytes.size());
  AppendRaw(&bytes, &checksum, 1);
  const std::string why = WriteCacheFile(path, bytes);  // "<key>.len.tmp-..." first
  return why.empty() ? ""
                     : "cannot save row lengths as '" + path + "' (" + why +
                           "): the next run reads them from the source again";
}

}  // namespace pqloader
