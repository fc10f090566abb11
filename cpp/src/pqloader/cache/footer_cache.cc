#include "pqloader/cache/footer_cache.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include <arrow/io/memory.h>

#include "pqloader/cache/split_cache.h"

namespace pqloader {

namespace {

// footer-v3: the file holds the footer's bytes, then the key it is stored under (32 hex
// digits), then the XXH64 of both. A v2 file held no key: one file's footer in another's
// place (swapped, copied over) verified and was used as the other file's (its statistics
// pruned that file's row groups for a filter: rows silently dropped).
constexpr size_t kFooterKeyBytes = 32;

std::string FooterKey(const std::string& file, int64_t size, int64_t mtime_ns) {
  return CacheKey("footer-v3|" + file + "|size=" + std::to_string(size) +
                  "|mtime=" + std::to_string(mtime_ns));
}

std::string FooterPath(const std::string& dir, const std::string& key) {
  return dir + "/footers/" + key + ".thrift";
}

// The bytes of a footer file at `path` without its checksum, or false if it does not
// verify (any version: `cache clear` proves v2 files too). Not a blocking std::ifstream
// following links: a FIFO in place of a footer file hung the loader.
bool ReadFooterFile(const std::string& path, std::string* bytes) {
  if (!ReadCacheFile(path, (int64_t{1} << 32) + kFooterKeyBytes + 8, bytes)) return false;
  if (bytes->size() <= 8) return false;
  uint64_t checksum;
  std::memcpy(&checksum, bytes->data() + bytes->size() - 8, 8);
  bytes->resize(bytes->size() - 8);
  return XXH64(bytes->data(), bytes->size(), 0) == checksum;
}

// The footer stored at `path` for `key`: false unless it verifies and names that key.
bool ReadFooterFileFor(const std::string& path, const std::string& key, std::string* bytes) {
  if (!ReadFooterFile(path, bytes) || bytes->size() <= kFooterKeyBytes ||
      bytes->compare(bytes->size() - kFooterKeyBytes, kFooterKeyBytes, key) != 0) {
    return false;
  }
  bytes->resize(bytes->size() - kFooterKeyBytes);
  return true;
}

}  // namespace

bool IsFooterFile(const std::string& path) {
  std::string bytes;
  return ReadFooterFile(path, &bytes);
}

std::string FooterHash(const std::string& footer) { return CacheKey(footer); }

std::shared_ptr<parquet::FileMetaData> LoadFooter(const std::string& cache_dir,
                                                  const std::string& file, int64_t size,
                                                  int64_t mtime_ns, std::string* footer) {
  std::string& bytes = *footer;
  const std::string key = FooterKey(file, size, mtime_ns);
  if (!ReadFooterFileFor(FooterPath(cache_dir, key), key, &bytes)) {
    return nullptr;  // missing, damaged or another key's: read from the source
  }
  try {
    uint32_t n = static_cast<uint32_t>(bytes.size());
    return parquet::FileMetaData::Make(bytes.data(), &n);
  } catch (const std::exception&) {
    return nullptr;
  }
}

std::string StoreFooter(const std::string& cache_dir, const std::string& file, int64_t size,
                        int64_t mtime_ns, const std::string& footer) {
  const std::string failed = "cannot save the footer of '" + file + "' in '" + cache_dir +
                             "/footers' (";
  const std::string unsaved = "): the next run reads it from the source again";
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) return failed + ec.message() + unsaved;
  MarkCacheDir(cache_dir);
  std::filesystem::create_directories(cache_dir + "/footers", ec);
  if (ec) return failed + ec.message() + unsaved;
  const std::string key = FooterKey(file, size, mtime_ns);
  std::string keyed = footer + key;
  const uint64_t checksum = XXH64(keyed.data(), keyed.size(), 0);
  keyed.append(reinterpret_cast<const char*>(&checksum), 8);
  const std::string why = WriteCacheFile(FooterPath(cache_dir, key), keyed);
  return why.empty() ? "" : failed + why + unsaved;
}

}  // namespace pqloader
