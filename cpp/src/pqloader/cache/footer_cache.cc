#include "pqloader/cache/footer_cache.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <arrow/io/memory.h>

#include "pqloader/cache/split_cache.h"

namespace pqloader {

namespace {

std::string FooterPath(const std::string& dir, const std::string& file, int64_t size,
                       int64_t mtime_ns) {
  const std::string key = CacheKey("footer-v2|" + file + "|size=" + std::to_string(size) +
                                   "|mtime=" + std::to_string(mtime_ns));
  return dir + "/footers/" + key + ".thrift";
}

// The bytes of a footer file at `path` without its checksum, or false if it does not
// verify.
bool ReadFooterFile(const std::string& path, std::string* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes->size() <= 8) return false;
  uint64_t checksum;
  std::memcpy(&checksum, bytes->data() + bytes->size() - 8, 8);
  bytes->resize(bytes->size() - 8);
  return XXH64(bytes->data(), bytes->size(), 0) == checksum;
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
  if (!ReadFooterFile(FooterPath(cache_dir, file, size, mtime_ns), &bytes)) {
    return nullptr;  // missing or damaged: read from the source
  }
  try {
    uint32_t n = static_cast<uint32_t>(bytes.size());
    return parquet::FileMetaData::Make(bytes.data(), &n);
  } catch (const std::exception&) {
    return nullptr;
  }
}

void StoreFooter(const std::string& cache_dir, const std::string& file, int64_t size,
                 int64_t mtime_ns, const std::string& footer) {
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) return;
  MarkCacheDir(cache_dir);
  std::filesystem::create_directories(cache_dir + "/footers", ec);
  if (ec) return;
  const uint64_t checksum = XXH64(footer.data(), footer.size(), 0);
  const std::string path = FooterPath(cache_dir, file, size, mtime_ns);
  std::ostringstream tmp;
  tmp.imbue(std::locale::classic());
  tmp << path << ".tmp-" << ::getpid() << "-" << std::hash<std::thread::id>{}(std::this_thread::get_id());
  {
    std::ofstream out(tmp.str(), std::ios::binary | std::ios::trunc);
    out.write(footer.data(), static_cast<std::streamsize>(footer.size()));
    out.write(reinterpret_cast<const char*>(&checksum), 8);
    if (!out) {
      out.close();
      std::remove(tmp.str().c_str());
      return;
    }
  }
  if (std::rename(tmp.str().c_str(), path.c_str()) != 0) std::remove(tmp.str().c_str());
}

}  // namespace pqloader
