#include "pqloader/cache_admin.h"

#include <map>
#include <memory>

#include "pqloader/dataset/dataset.h"
#include "pqloader/error.h"
#include "pqloader/util/cancel.h"

namespace pqloader {

namespace {

// Whether `path` lies below the directory (or prefix) `source`.
bool IsBelow(const std::string& path, std::string source) {
  while (source.size() > 1 && source.back() == '/') source.pop_back();
  return path.size() > source.size() + 1 && path.compare(0, source.size(), source) == 0 &&
         path[source.size()] == '/';
}

// The state of sources, each file checked once.
class Checker {
 public:
  Checker(std::string dir, CacheAdminOptions options)
      : dir_(std::move(dir)), options_(std::move(options)) {}

  arrow::Status ListDataset() {
    if (options_.dataset.empty()) return arrow::Status::OK();
    ARROW_ASSIGN_OR_RAISE(auto found, DiscoverFiles(options_.dataset, options_.storage, nullptr,
                                                    false, options_.cancel));
    for (auto& f : found) listed_.emplace(f.display, std::move(f));
    return arrow::Status::OK();
  }

  SourceState operator()(const SourceIdentity& source) {
    // Requests made here stop retrying once Ctrl-C set the flag (as a Loader's footer
    // reads); the callers check it before each entry.
    const RetryStopScope stop_once_cancelled(options_.cancel);
    if (IsCancelled(options_.cancel)) return SourceState::kUnknown;
    auto it = memo_.find(source.path);
    if (it == memo_.end()) it = memo_.emplace(source.path, Look(source.path)).first;
    const Now& now = it->second;
    if (now.state != SourceState::kCurrent) return now.state;
    if (now.file.size != source.size || now.file.mtime_ns != source.mtime_ns) {
      return SourceState::kStale;
    }
    if (!now.footer_read) {  // size and mtime match: the footer decides
      auto hash = ReadFooterHash(now.file, dir_);
      it->second.footer_read = true;
      it->second.footer_ok = hash.ok();
      if (hash.ok()) it->second.footer_hash = *hash;
    }
    if (!it->second.footer_ok) return SourceState::kUnknown;
    return it->second.footer_hash == source.footer_hash ? SourceState::kCurrent
                                                        : SourceState::kStale;
  }

 private:
  // What a path is now: kCurrent with its listing, kStale when gone, kUnknown.
  struct Now {
    SourceState state = SourceState::kUnknown;
    FoundFile file;
    bool footer_read = false;
    bool footer_ok = false;
    std::string footer_hash;
  };

  Now Look(const std::string& path) {
    Now now;
    if (!options_.dataset.empty()) {
      auto it = listed_.find(path);
      if (it != listed_.end()) {
        now.state = SourceState::kCurrent;
        now.file = it->second;
        return now;
      }
      bool below = false;
      for (const auto& source : options_.dataset) below = below || IsBelow(path, source);
      // Below the dataset but not listed: gone, or a file the listing skips (in a hidden
      // folder, given to a Loader by name; its entries were pruned as stale). Looked up:
      // one stat or request each, for these few.
      if (!below) return now;
      return LookUp(path);
    }
    // Without a dataset only local files are looked up: a remote one would cost requests
    // (and, unreachable, the retry budget) per file for a command meant to be quick.
    if (path.find("://") != std::string::npos && path.rfind("file://", 0) != 0) return now;
    return LookUp(path);
  }

  Now LookUp(const std::string& path) {
    Now now;
    auto found = DiscoverFiles({path}, options_.storage, nullptr, false, options_.cancel);
    if (!found.ok()) {
      const ErrorDetail* d = GetErrorDetail(found.status());
      if (d != nullptr && d->kind() == ErrorKind::kNotFound) now.state = SourceState::kStale;
      return now;
    }
    for (const FoundFile& f : *found) {
      if (f.display == path) {
        now.state = SourceState::kCurrent;
        now.file = f;
        return now;
      }
    }
    // Files, none of them this one: the path names a directory now (`x.parquet/part-*`,
    // as Spark writes one, in place of the file x.parquet) or a pattern. The file is
    // gone: its entries are stale (they were counted unverified and never pruned).
    if (!found->empty()) now.state = SourceState::kStale;
    return now;
  }

  std::string dir_;
  CacheAdminOptions options_;
  std::map<std::string, FoundFile> listed_;
  std::map<std::string, Now> memo_;
};

}  // namespace

arrow::Result<SourceChecker> MakeSourceChecker(const std::string& dir,
                                               const CacheAdminOptions& options) {
  auto checker = std::make_shared<Checker>(dir, options);
  ARROW_RETURN_NOT_OK(checker->ListDataset());
  return SourceChecker([checker](const SourceIdentity& s) { return (*checker)(s); });
}

arrow::Result<CacheDirStats> InspectCache(const std::string& dir,
                                          const CacheAdminOptions& options) {
  ARROW_ASSIGN_OR_RAISE(auto checker, MakeSourceChecker(dir, options));
  return InspectCacheDir(dir, checker, options.cancel);
}

arrow::Result<CachePruneReport> PruneCache(const std::string& dir,
                                           const CacheAdminOptions& options) {
  ARROW_ASSIGN_OR_RAISE(auto checker, MakeSourceChecker(dir, options));
  return PruneCacheDir(dir, checker, options.cancel);
}

}  // namespace pqloader
