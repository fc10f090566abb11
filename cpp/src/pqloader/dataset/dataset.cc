#include "pqloader/dataset/dataset.h"

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <iterator>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include <arrow/io/interfaces.h>
#include <arrow/util/compression.h>
#include <arrow/util/key_value_metadata.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include "pqloader/cache/footer_cache.h"
#include "pqloader/cache/split_cache.h"
#include "pqloader/dataset/footer_checks.h"
#include "pqloader/dataset/column_types.h"
#include "pqloader/error.h"
#include "pqloader/util/cancel.h"
#include "pqloader/util/fork_gate.h"
#include "pqloader/util/node_lock.h"
#include "pqloader/util/parallel_for.h"

namespace pqloader {

namespace {

int64_t MtimeNs(const arrow::fs::FileInfo& info) {
  if (info.mtime() == arrow::fs::kNoTime) return 0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(info.mtime().time_since_epoch())
      .count();
}

bool HasGlob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Split "a/b/c" into components.
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) out.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Hidden files (".x", "_SUCCESS", "_metadata") anywhere below the root are skipped,
// as Spark and pyarrow do. A glob's component (`spelled`, the pattern's components
// below the root) that itself starts with '.' or '_' names such names at its depth, as a
// shell's `.*` does (`_*.parquet` matched nothing).
bool IsHidden(const std::vector<std::string>& rel_components,
              const std::vector<std::string>& spelled = {}) {
  for (size_t i = 0; i < rel_components.size(); ++i) {
    const std::string& c = rel_components[i];
    if (c.empty() || (c[0] != '.' && c[0] != '_')) continue;
    if (i < spelled.size() && !spelled[i].empty() && spelled[i][0] == c[0]) continue;
    return true;
  }
  return false;
}

// The glob's component at `depth` below the root (entries of the root: 0) as the only
// one IsHidden looks at, for a name at that depth.
std::vector<std::string> SpelledBelow(const std::vector<std::string>& spelled, size_t depth) {
  if (depth >= spelled.size()) return {};
  return {spelled[depth]};
}

// Whether directory `name`, `depth` below the root (entries of the root: 0), can hold a
// file a glob spelled `spelled` (its components below the root) matches: each of the
// glob's components matches one name of a path (FNM_PATHNAME), so only a directory its
// component at that depth matches can; below a directory the whole glob matches (depth
// past the last component: read whole), every one. A directory source (nothing spelled):
// every one. Not entered, a directory the glob cannot reach is neither read (a glob
// `d/*.parquet` listed every file of the tree below `d`, a stat each) nor can it fail the
// listing (`lost+found`, another user's directory: "Permission denied").
bool MayHoldMatches(const std::vector<std::string>& spelled, size_t depth,
                    const std::string& name) {
  if (depth >= spelled.size()) return true;
  return fnmatch(spelled[depth].c_str(), name.c_str(), 0) == 0;
}

std::string RelativeTo(const std::string& root, const std::string& path) {
  if (root.empty()) return path;
  if (path.compare(0, root.size(), root) == 0) {
    std::string rel = path.substr(root.size());
    while (!rel.empty() && rel[0] == '/') rel.erase(0, 1);
    return rel;
  }
  return path;
}

// Whether a request to `fs` is waited for on its own I/O thread, polling `cancel` (S3:
// each request a round trip); otherwise it is made in one call.
bool PollsCancel(const arrow::fs::FileSystem& fs, const CancelFlag& cancel) {
  // Every filesystem but the local one: a gcs request (retried by google-cloud-cpp) kept
  // Ctrl-C waiting on the thread RunInterruptible joins.
  return cancel != nullptr && fs.type_name() != "local";
}

// Everything under `selector`. On S3, page by page as the store lists them (1,000 keys a
// request: 100 round trips for 10^5 files, tens of seconds on a slow endpoint), so that
// `cancel` ends the wait for the next page at once; Arrow's S3 lister then lists the
// rest in the background (its scheduler keeps the filesystem alive until it is done)
// and drops it: requests wasted, no thread of ours waiting. Other filesystems list in
// one call (a local directory is quick; Arrow's local lister, left running, would use
// a filesystem we drop), after one check of `cancel`.
//
// This thread stays inside the fork gate until the listing ended: Arrow's lister makes
// its requests on Arrow's I/O pool, outside the gate, each holding Arrow's S3 client
// lock, and a child forked meanwhile inherited that lock held: its first S3 client (a
// Loader built in the child) waited for it for good. A fork now waits for the listing
// (up to kForkWait); one left running on Ctrl-C is not waited for.
arrow::Result<std::vector<arrow::fs::FileInfo>> ListPages(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const arrow::fs::FileSelector& selector,
    const CancelFlag& cancel) {
  if (IsCancelled(cancel)) return CancelledStatus();  // before the store is asked for a page
  const fork_gate::Inside inside;
  if (!PollsCancel(*fs, cancel)) return fs->GetFileInfo(selector);
  std::vector<arrow::fs::FileInfo> out;
  arrow::fs::FileInfoGenerator pages = fs->GetFileInfoGenerator(selector);
  while (true) {
    auto next = pages();
    if (!WaitUnlessCancelled(next, cancel)) return CancelledStatus();
    ARROW_ASSIGN_OR_RAISE(arrow::fs::FileInfoVector page, next.MoveResult());
    if (arrow::IsIterationEnd(page)) return out;
    std::move(page.begin(), page.end(), std::back_inserter(out));
    if (IsCancelled(cancel)) return CancelledStatus();
  }
}

// Whether file `path` (below `root`) matches glob `pattern`, or lies below a directory
// that does: a directory a glob names is read whole, as a directory source is (`run*`
// matching `run1/`; `**` is `*`, so `data/**` names data's children, directories too).
// A pattern ending in '/' names directories only (`run*/` not `run-x.parquet`).
bool MatchesOrIsBelowAMatch(std::string pattern, const std::string& root,
                            const std::string& path) {
  const bool dirs_only = pattern.size() > 1 && pattern.back() == '/';
  if (dirs_only) pattern.pop_back();
  if (!dirs_only && fnmatch(pattern.c_str(), path.c_str(), FNM_PATHNAME) == 0) return true;
  for (size_t slash = path.find('/', root.size() + 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    if (fnmatch(pattern.c_str(), path.substr(0, slash).c_str(), FNM_PATHNAME) == 0) return true;
  }
  return false;
}

// The tree below local directory `root`, walked here rather than by Arrow's lister: that
// one follows every link to a directory, so a link back up the tree (`ln -s . self`)
// listed the files once per level until the path was too long, each read as data, and
// two such links 2^40 paths. A link to a directory that the walk is inside of (its own
// path's) is not followed; every other link is, as before. Each entry as Arrow's local
// filesystem describes it (links followed).
arrow::Status WalkLocalInto(arrow::fs::FileSystem& fs, const std::string& dir,
                            std::vector<std::pair<dev_t, ino_t>>* inside,
                            const std::vector<std::string>& spelled,
                            std::vector<arrow::fs::FileInfo>* out, const CancelFlag& cancel) {
  if (IsCancelled(cancel)) return CancelledStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    const int err = errno;  // the exception's errno (EIO, ESTALE, EACCES ...)
    return MakeOsError(err, "cannot open directory '", dir, "'");
  }
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  if (std::find(inside->begin(), inside->end(), id) != inside->end()) return arrow::Status::OK();
  std::error_code ec;
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return MakeOsError(ec.value(), "cannot read directory '", dir, "'");
  inside->push_back(id);
  for (const std::string& name : names) {
    ARROW_ASSIGN_OR_RAISE(arrow::fs::FileInfo info, fs.GetFileInfo(dir + "/" + name));
    if (info.type() == arrow::fs::FileType::NotFound) continue;  // gone since, or a dangling link
    // A hidden directory (`_temporary/`, `.snapshot/`) holds nothing a source reads
    // (IsHidden skips its files) unless a glob spells its prefix at its depth: not
    // entered, so one the user cannot read does not fail the listing.
    const size_t depth = inside->size() - 1;  // of `name` below the root
    const bool is_dir = info.type() == arrow::fs::FileType::Directory &&
                        !IsHidden({name}, SpelledBelow(spelled, depth)) &&
                        MayHoldMatches(spelled, depth, name);
    const std::string path = info.path();
    out->push_back(std::move(info));
    if (is_dir) ARROW_RETURN_NOT_OK(WalkLocalInto(fs, path, inside, spelled, out, cancel));
  }
  inside->pop_back();
  return arrow::Status::OK();
}

// Directories whose names start with '.' or '_' are listed but not entered, unless the
// glob's component at their depth (`spelled`) starts with the same character.
arrow::Result<std::vector<arrow::fs::FileInfo>> WalkLocal(arrow::fs::FileSystem& fs,
                                                          const std::string& root,
                                                          const std::vector<std::string>& spelled,
                                                          const CancelFlag& cancel) {
  std::vector<std::pair<dev_t, ino_t>> inside;  // the directories of the current path
  std::vector<arrow::fs::FileInfo> out;
  ARROW_RETURN_NOT_OK(WalkLocalInto(fs, root, &inside, spelled, &out, cancel));
  return out;
}

// Add the files under `root` (matching `pattern` if not empty) to `out`, sorted. With
// `summaries` and no pattern, a summary at the root (`_metadata`, see summary.h) is
// added there and the files found point to it. Cancelled once `cancel` is set (checked
// while waiting for each page of the listing).
arrow::Status ListTree(const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& root,
                       const std::string& pattern, const std::string& source,
                       const std::string& prefix, std::vector<FoundFile>* out,
                       std::vector<SummaryRef>* summaries, const CancelFlag& cancel) {
  const size_t before = out->size();
  const std::vector<std::string> spelled =
      pattern.empty() ? std::vector<std::string>{} : Components(RelativeTo(root, pattern));
  SummaryRef summary{fs, root, "", -1, false, 0, nullptr, {}};
  arrow::fs::FileSelector selector;
  selector.base_dir = root;
  selector.recursive = true;
  selector.allow_not_found = false;
  auto listed = fs->type_name() == "local"
                    ? WalkLocal(*fs, root, spelled, cancel)
                    : ListPages(fs, selector, cancel);
  if (!listed.ok()) {
    if (listed.status().IsCancelled()) return listed.status();
    // An object store's prefix with no key below it (Arrow: "Path does not exist", ENOENT)
    // or a bucket that does not exist: missing, as a HEAD would have said (DiscoverFiles
    // lists some prefixes without one). Not locally: there a subdirectory that vanished
    // mid-walk is ENOENT too, and the source still exists.
    const arrow::Status& st = listed.status();
    if (fs->type_name() != "local" &&
        (OsErrorOf(st) == ENOENT || st.message().find("NO_SUCH_BUCKET") != std::string::npos)) {
      if (pattern.empty()) return MakeError(ErrorKind::kNotFound, "'", source, "' does not exist");
      return MakeError(ErrorKind::kNotFound, "'", source, "' matches no files: directory '",
                       prefix + root, "' does not exist");
    }
    return MakeIOError(st, "cannot list '", source, "'");
  }
  std::vector<arrow::fs::FileInfo> infos = std::move(listed).ValueUnsafe();
  std::sort(infos.begin(), infos.end(),
            [](const auto& a, const auto& b) { return a.path() < b.path(); });
  // A pqloader cache directory (its marker file) below the root holds the cache's
  // entries and markers, never data: its files appear and vanish as loaders work.
  std::vector<std::string> skipped;
  for (const auto& info : infos) {
    if (info.type() == arrow::fs::FileType::File && info.base_name() == kCacheMarkerName) {
      skipped.push_back(info.dir_name() + "/");
    }
  }
  auto skip = [&](const std::string& path) {
    for (const auto& dir : skipped) {
      if (path.compare(0, dir.size(), dir) == 0) return true;
    }
    return false;
  };
  for (const auto& info : infos) {
    if (info.type() != arrow::fs::FileType::File) continue;
    if (!skipped.empty() && skip(info.path())) continue;
    const std::string rel = RelativeTo(root, info.path());
    const auto comps = Components(rel);
    if (summaries != nullptr && pattern.empty() && comps.size() == 1) {
      if (rel == "_metadata") {
        summary.size = info.size();
        summary.display = prefix + info.path();
      } else if (rel == "_pqloader_index") {
        summary.has_index = true;
        summary.index_size = info.size();
      }
    }
    // A summary (pqloader's, pyarrow's, Dask's, Spark's) holds other files' row groups,
    // never rows of its own: not data, also where a glob spells its '_' prefix (`_*`).
    if (!pattern.empty() && (comps.back() == "_metadata" || comps.back() == "_common_metadata")) {
      continue;
    }
    if (IsHidden(comps, spelled)) continue;
    if (!pattern.empty() && !MatchesOrIsBelowAMatch(pattern, root, info.path())) continue;
    FoundFile f{fs, info.path(), prefix + info.path(), info.size(), MtimeNs(info), {}, true};
    for (size_t i = 0; i + 1 < comps.size(); ++i) {
      if (auto segment = ParseHiveSegment(comps[i])) f.partitions.push_back(std::move(*segment));
    }
    out->push_back(std::move(f));
  }
  if (summary.size >= 0) {
    summaries->push_back(summary);
    const int index = static_cast<int>(summaries->size()) - 1;
    for (size_t i = before; i < out->size(); ++i) (*out)[i].summary = index;
  }
  return arrow::Status::OK();
}

// The files of directory `root` as its `_pqloader_index` lists them (no listing), with
// its summary added to `summaries`.
arrow::Status ListFromIndex(const std::shared_ptr<arrow::fs::FileSystem>& fs,
                            const std::string& root, const std::string& prefix,
                            std::vector<FoundFile>* out, std::vector<SummaryRef>* summaries) {
  const std::string metadata = JoinPath(root, "_metadata");
  auto info = [&] {
    const fork_gate::Inside inside;  // a request: a fork waits for it (see fork_gate.h)
    return fs->GetFileInfo(metadata);
  }();
  if (!info.ok()) {
    return MakeIOError(info.status(), "cannot access '", prefix + metadata, "'");
  }
  if (info->type() != arrow::fs::FileType::File) {
    return MakeError(ErrorKind::kNotFound, "'", prefix + metadata,
                     "' does not exist: use_summary='only' needs the summary `pqloader index` "
                     "writes");
  }
  // The summary travels while the index is read (both are needed; one is not listed).
  auto bytes = PrefetchSummary(fs, root, info->size(), prefix + metadata);
  ARROW_ASSIGN_OR_RAISE(auto read,
                        ReadIndexFile(fs, root, -1, prefix + JoinPath(root, "_pqloader_index")));
  auto indexed = std::make_shared<const DatasetIndex>(std::move(read));
  summaries->push_back(SummaryRef{fs, root, prefix + metadata, info->size(), true, -1, indexed,
                                  std::move(bytes)});
  const int index = static_cast<int>(summaries->size()) - 1;
  for (const auto& f : indexed->files) {
    const std::string path = JoinPath(root, f.path);
    FoundFile found{fs, path, prefix + path, f.size, f.mtime_ns, {}, true, index, true};
    const auto comps = Components(f.path);
    for (size_t i = 0; i + 1 < comps.size(); ++i) {
      if (auto segment = ParseHiveSegment(comps[i])) found.partitions.push_back(std::move(*segment));
    }
    out->push_back(std::move(found));
  }
  return arrow::Status::OK();
}

// Read the footer of `file` and derive its Arrow schema.
arrow::Status ReadFooterFromSource(DataFile* file, std::string* footer);
arrow::Status DeriveSchema(const DataFile& file, arrow::TimeUnit::type int96_unit,
                           std::shared_ptr<arrow::Schema>* schema,
                           parquet::arrow::SchemaManifest* manifest);

// Object stores give modification times in whole seconds (S3), so an object modified
// less than this before its footer would be kept can still be replaced, within its
// second, by one of the same size and time, whose footer a kept one would stand in for
// (and so serve the old object's cached row groups, keyed by the footer's hash). Such a
// footer is read but not kept (git's "racily clean" rule; the second's margin covers
// the clocks of client and store); the next Loader keeps it. No time at all: never kept.
constexpr int64_t kSettledNs = int64_t{2'000'000'000};

bool MayStillChangeUnseen(const DataFile& file) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return file.mtime_ns == 0 || now - file.mtime_ns < kSettledNs;
}

// DataFile::settled, judged now (as the dataset lists the file).
bool IsSettled(const DataFile& file) {
  return file.fs == nullptr || file.fs->type_name() == "local" || !MayStillChangeUnseen(file);
}

// Read the footer of `file` (from the footer cache when there is one) and derive its
// Arrow schema.
arrow::Status ReadFooter(DataFile* file, std::shared_ptr<arrow::Schema>* schema,
                         parquet::arrow::SchemaManifest* manifest,
                         const std::string& footer_cache = "", bool* from_cache = nullptr,
                         arrow::TimeUnit::type int96_unit = arrow::TimeUnit::NANO,
                         std::string* store_error = nullptr) {
  if (file->size == 0) {
    return MakeError(ErrorKind::kInvalidData, "'", file->display,
                     "' is not a Parquet file: it is empty");
  }
  file->settled = IsSettled(*file);
  // Local footers are read from the file (as cheap as a cached copy, and never stale).
  const bool use_cache = !footer_cache.empty() && file->fs->type_name() != "local";
  std::string footer;
  if (use_cache) {
    file->metadata = LoadFooter(footer_cache, file->display, file->size, file->mtime_ns, &footer);
    if (file->metadata != nullptr && from_cache != nullptr) *from_cache = true;
  }
  if (file->metadata == nullptr) {
    ARROW_RETURN_NOT_OK(ReadFooterFromSource(file, &footer));
    if (use_cache && file->settled) {
      std::string why =
          StoreFooter(footer_cache, file->display, file->size, file->mtime_ns, footer);
      if (store_error != nullptr) *store_error = std::move(why);
    }
  }
  file->footer_hash = FooterHash(footer);
  file->footer_hash_is_own = true;
  return DeriveSchema(*file, int96_unit, schema, manifest);
}

// The Arrow schema of `file`'s metadata, INT96 columns as timestamps of `int96_unit`.
arrow::Status DeriveSchema(const DataFile& file, arrow::TimeUnit::type int96_unit,
                           std::shared_ptr<arrow::Schema>* schema,
                           parquet::arrow::SchemaManifest* manifest) {
  parquet::ArrowReaderProperties props;
  props.set_coerce_int96_timestamp_unit(int96_unit);
  auto st = parquet::arrow::FromParquetSchema(file.metadata->schema(), props,
                                              file.metadata->key_value_metadata(), schema);
  if (st.ok()) {
    st = parquet::arrow::SchemaManifest::Make(file.metadata->schema(),
                                              file.metadata->key_value_metadata(), props,
                                              manifest);
  }
  if (!st.ok()) {
    // A type Arrow cannot read in a valid file (Polars writes Int128 as INT(128) on 16
    // fixed bytes; pyarrow cannot read it either): unsupported, not corrupt data. (The
    // column is not named: Parquet's own schema conversion stops without naming it.)
    if (st.message().find("more than 64 bits") != std::string::npos) {
      return MakeError(ErrorKind::kUnsupportedType, "'", file.display,
                       "' has an integer column wider than 64 bits (Int128, as Polars writes "
                       "it), which Arrow (and so pqloader, and pyarrow) cannot read: ",
                       st.message());
    }
    return MakeError(ErrorKind::kInvalidData, "'", file.display,
                     "': cannot derive an Arrow schema from its Parquet schema: ", st.message());
  }
  *schema = SchemaWithoutExtensions(*schema);  // read as their storage (decode: the same)
  return arrow::Status::OK();
}

// Read the footer of `file` from its storage: its bytes as the file holds them into
// `*footer` (what FooterHash hashes), parsed into file->metadata. Like Parquet's own
// reader, one read of the file's last 64 KiB, and a second one only for a larger footer.
arrow::Status ReadFooterFromSource(DataFile* file, std::string* footer) {
  // A fork waits for these reads (they run on the build's threads, outside FetchUnit):
  // Arrow's S3 client holds a reader lock for each request, and a child forked meanwhile
  // inherited it held; its first S3 client (a Loader built in the child) waited for good.
  const fork_gate::Inside inside;
  auto input = file->Open();
  if (!input.ok()) {
    return MakeIOError(input.status(), "cannot open '", file->display, "'");
  }
  auto not_parquet = [&](const std::string& why) {
    return MakeError(ErrorKind::kInvalidData, "'", file->display,
                     "' is not a readable Parquet file (truncated, corrupt footer, or another "
                     "format): ", why);
  };
  auto read = [&](int64_t offset, int64_t length) -> arrow::Result<std::string> {
    auto bytes = (*input)->ReadAt(offset, length);
    if (!bytes.ok()) {
      // An object deleted since it was listed (io/filesystem.cc): not found, as a local
      // file's read says, not a failing storage.
      const ErrorDetail* detail = GetErrorDetail(bytes.status());
      if (detail != nullptr && detail->kind() == ErrorKind::kNotFound) {
        return WithContext(bytes.status(), "cannot read the footer of '" + file->display + "': ");
      }
      return MakeIOError(bytes.status(), "cannot read the footer of '", file->display, "'");
    }
    if ((*bytes)->size() != length) {
      return MakeError(ErrorKind::kIO, "cannot read the footer of '", file->display,
                       "': the file is shorter than its listed size");
    }
    return (*bytes)->ToString();
  };
  constexpr int64_t kTail = 64 << 10;
  if (file->size < 12) return not_parquet("smaller than Parquet's magic bytes and footer length");
  const int64_t tail_length = std::min(file->size, kTail);
  ARROW_ASSIGN_OR_RAISE(std::string tail, read(file->size - tail_length, tail_length));
  const std::string magic = tail.substr(tail.size() - 4);
  if (magic == "PARE") return not_parquet("encrypted footers are not supported");
  if (magic != "PAR1") return not_parquet("no 'PAR1' magic bytes at its end");
  uint32_t length = 0;
  std::memcpy(&length, tail.data() + tail.size() - 8, 4);
  if (static_cast<int64_t>(length) + 12 > file->size) {
    return not_parquet("its footer length (" + std::to_string(length) +
                       " bytes) is larger than the file");
  }
  if (static_cast<int64_t>(length) + 8 <= tail_length) {
    *footer = tail.substr(tail.size() - 8 - length, length);
  } else {
    ARROW_ASSIGN_OR_RAISE(*footer, read(file->size - 8 - length, length));
  }
  try {
    uint32_t n = length;
    file->metadata = parquet::FileMetaData::Make(footer->data(), &n);
  } catch (const std::exception& e) {
    return not_parquet(e.what());
  }
  if (file->metadata == nullptr) return not_parquet("its footer does not parse");
  return arrow::Status::OK();
}

// The smallest a Parquet page can be: a Thrift PageHeader with its required fields (type,
// sizes, and a DataPageHeader's num_values and encodings) takes more than this.
constexpr int64_t kMinPageBytes = 16;
// The most values one page can hold (PageHeader's num_values is an i32).
constexpr int64_t kMaxPageValues = std::numeric_limits<int32_t>::max();

// The splits of `file`'s row groups `row_groups` (valid indices), after checking their
// footer counts and sizes: row counts are not negative and fit in what the engine
// indexes; each selected column chunk lies inside the file, holds as many values as its
// row group has rows (at least as many for repeated columns), and no more than its bytes
// can hold.
// Every check is O(row groups x columns), whatever the counts claim.
arrow::Result<std::vector<Split>> ValidatedSplits(const DataFile& file, int32_t index,
                                                  const std::vector<int>& row_groups) {
  const parquet::SchemaDescriptor& schema = *file.schema();
  auto corrupt = [&](auto&&... parts) {
    if (file.summary != nullptr) {  // the row groups are the summary's, not the file's footer
      return MakeError(ErrorKind::kInvalidData, "'", file.display,
                       "' does not match its row groups in the dataset summary '",
                       file.summary->display, "' (rewritten since?): ",
                       std::forward<decltype(parts)>(parts)...,
                       "; run `pqloader index` again, or load with use_summary=False");
    }
    return MakeError(ErrorKind::kInvalidData, "'", file.display, "' has a corrupt footer: ",
                     std::forward<decltype(parts)>(parts)...);
  };
  std::vector<Split> out;
  try {
    // The file-level row count is not checked against the row groups': readers go by
    // the row groups, and some old writers (parquet-rs 0.3) left it 0.
    for (int rg : row_groups) {
      auto rg_md = file.RowGroup(rg);
      Split s;
      s.file = index;
      s.row_group = rg;
      s.num_rows = rg_md->num_rows();
      s.file_rows = s.num_rows;
      if (s.num_rows < 0) return corrupt("row group ", rg, " claims ", s.num_rows, " rows");
      if (s.num_rows > kMaxRowGroupRows) {
        return corrupt("row group ", rg, " claims ", s.num_rows,
                       " rows, more than one row group can hold here (", kMaxRowGroupRows, ")");
      }
      for (int leaf : file.leaf_indices) {
        auto chunk = rg_md->ColumnChunk(leaf);
        const std::string column = schema.Column(leaf)->path()->ToDotString();
        const int64_t values = chunk->num_values();
        const int64_t bytes = chunk->total_compressed_size();
        const bool repeated = schema.Column(leaf)->max_repetition_level() > 0;
        if (values < 0 || (!repeated && values != s.num_rows) || (repeated && values < s.num_rows)) {
          return corrupt("row group ", rg, ", column '", column, "' holds ", values,
                         " values for ", s.num_rows, " rows");
        }
        int64_t start = chunk->data_page_offset();
        if (chunk->has_dictionary_page() && chunk->dictionary_page_offset() > 0 &&
            chunk->dictionary_page_offset() < start) {
          start = chunk->dictionary_page_offset();
        }
        if (start < 0 || bytes < 0 || start > file.size || bytes > file.size - start) {
          return corrupt("row group ", rg, ", column '", column, "' spans bytes [", start, ", ",
                         start, " + ", bytes, ") of a file of ", file.size, " bytes");
        }
        // (pages needed, rounded up without (values + kMaxPageValues - 1): a signed
        // overflow past 2^63 - 2^31 that let a claim of 2^63 - 1 values pass)
        const int64_t pages = values / kMaxPageValues + (values % kMaxPageValues != 0 ? 1 : 0);
        if (values > 0 && (bytes / kMinPageBytes + 1) < pages) {
          return corrupt("row group ", rg, ", column '", column, "' claims ", values,
                         " values in ", bytes, " bytes");
        }
        s.compressed_bytes += bytes;
        s.uncompressed_bytes += std::max<int64_t>(0, chunk->total_uncompressed_size());
      }
      out.push_back(s);
    }
  } catch (const std::exception& e) {
    return MakeError(ErrorKind::kInvalidData, "'", file.display,
                     "' has corrupt row group metadata: ", e.what());
  }
  return out;
}

}  // namespace

// On S3 asked on Arrow's I/O pool (the task holds the filesystem) while this thread
// polls `cancel`: the directory check before a listing is up to three requests, each a
// round trip, or a run of retries against an endpoint that does not answer.
arrow::Result<arrow::fs::FileInfo> FileInfoOf(const std::shared_ptr<arrow::fs::FileSystem>& fs,
                                              const std::string& path, const CancelFlag& cancel) {
  if (IsCancelled(cancel)) return CancelledStatus();
  if (!PollsCancel(*fs, cancel)) {
    const fork_gate::Inside inside;  // a request: see below
    return fs->GetFileInfo(path);
  }
  // Left running on Ctrl-C, the request stops retrying (else it would hold Arrow's S3
  // client lock for the retry budget: no new client in this process meanwhile, and a
  // child forked meanwhile would inherit the lock held), and a fork waits for it.
  ARROW_ASSIGN_OR_RAISE(auto info, arrow::io::default_io_context().executor()->Submit(
                                       [fs, path, cancel]() -> arrow::Result<arrow::fs::FileInfo> {
                                         const fork_gate::Inside inside;
                                         const RetryStopScope stop_once_cancelled(cancel);
                                         return fs->GetFileInfo(path);
                                       }));
  if (!WaitUnlessCancelled(info, cancel)) return CancelledStatus();
  return info.MoveResult();
}

arrow::Result<std::vector<FoundFile>> DiscoverFiles(const std::vector<std::string>& sources,
                                                    const StorageOptions& storage,
                                                    std::vector<SummaryRef>* summaries,
                                                    bool summary_only, const CancelFlag& cancel) {
  ARROW_ASSIGN_OR_RAISE(auto resolver, FileSystemResolver::Make(storage));
  if (sources.empty()) return MakeError(ErrorKind::kNotFound, "no source given");
  std::vector<FoundFile> out;
  for (const std::string& source : sources) {
    ARROW_ASSIGN_OR_RAISE(auto resolved, resolver->Resolve(source, cancel));
    const auto& fs = resolved.fs;
    const std::string& path = resolved.path;
    const std::string& prefix = resolved.prefix;
    const size_t before = out.size();
    // A name with wildcards that exists is itself, not a pattern ("run[1]", "q?x.parquet":
    // as a glob it also read "qax.parquet"). Locally for any wildcard (a stat); on object
    // stores for brackets only (the wildcard most likely in a real key: checking '*' and
    // '?' first would cost each glob a request or three).
    bool literal = false;
    if (HasGlob(path) &&
        (path.find('[') != std::string::npos || fs->type_name() == "local")) {
      auto info = FileInfoOf(fs, path, cancel);
      if (info.status().IsCancelled()) return info.status();
      literal = info.ok() && info->type() != arrow::fs::FileType::NotFound;
    }
    if (HasGlob(path) && !literal) {
      // List from the deepest directory without wildcards, then match the whole path.
      const size_t glob = path.find_first_of("*?[");
      const size_t slash = path.rfind('/', glob);
      const std::string root = slash == std::string::npos ? "." : path.substr(0, slash);
      // The root is followed by '/': on an object store it names the keys below it, also
      // where an object of that name exists (as `s3://b/p/` does), so a prefix within a
      // bucket is listed without a HEAD of its key first (see prefix_only below; a
      // missing one is told by the listing, ListTree).
      if (fs->type_name() == "local" || root.find('/') == std::string::npos) {
        auto info = FileInfoOf(fs, root.empty() ? "/" : root, cancel);
        if (info.status().IsCancelled()) return info.status();
        if (!info.ok()) {
          return MakeIOError(info.status(), "cannot access '", source, "'");
        }
        const bool keys_below =
            info->type() == arrow::fs::FileType::File && fs->type_name() != "local";
        if (info->type() != arrow::fs::FileType::Directory && !keys_below) {
          return MakeError(ErrorKind::kNotFound, "'", source, "' matches no files: directory '",
                           prefix + root, "' does not exist");
        }
      }
      // (A trailing '/' of the source, which resolving drops, keeps its meaning: directories.)
      const std::string pattern =
          path + (!source.empty() && source.back() == '/' && path.back() != '/' ? "/" : "");
      ARROW_RETURN_NOT_OK(
          ListTree(fs, root.empty() ? "/" : root, pattern, source, prefix, &out, nullptr, cancel));
      if (out.size() == before) {
        return MakeError(ErrorKind::kNotFound, "'", source, "' matches no files");
      }
      continue;
    }
    // On an object store `s3://b/p/` names the keys below `p/`, also where an object `p`
    // exists (the resolved path has lost the slash; Arrow then finds the object): listed
    // without a HEAD of `p` first, which AWS refuses (403) where a policy lets the caller
    // read only the keys below `p/` (`arn:aws:s3:::b/p/*`), existing or not. A missing
    // prefix or bucket is told by the listing (ListTree).
    const bool prefix_only =
        fs->type_name() != "local" && !source.empty() && source.back() == '/';
    arrow::fs::FileInfo info(path, arrow::fs::FileType::Directory);
    if (!prefix_only) {
      auto got = FileInfoOf(fs, path, cancel);
      if (got.status().IsCancelled()) return got.status();
      if (!got.ok()) {
        return MakeIOError(got.status(), "cannot access '", source, "'");
      }
      info = std::move(got).ValueUnsafe();
    }
    switch (info.type()) {
      case arrow::fs::FileType::NotFound:
        return MakeError(ErrorKind::kNotFound, "'", source, "' does not exist");
      case arrow::fs::FileType::Directory:
        if (summary_only && summaries != nullptr) {
          ARROW_RETURN_NOT_OK(ListFromIndex(fs, path, prefix, &out, summaries));
        } else {
          ARROW_RETURN_NOT_OK(ListTree(fs, path, "", source, prefix, &out, summaries, cancel));
        }
        if (out.size() == before) {
          return MakeError(ErrorKind::kNotFound, "directory '", source,
                           "' contains no data files");
        }
        break;
      default:
        // A FIFO or a device would block or never end in its footer's read.
        if (info.type() != arrow::fs::FileType::File) {
          return MakeError(ErrorKind::kInvalidData, "'", source, "' is not a regular file "
                           "(a FIFO, socket or device): give Parquet files or directories");
        }
        out.push_back(FoundFile{fs, path, source, info.size(), MtimeNs(info), {}, false});
    }
  }
  return out;
}

arrow::Status CheckFooterUnchanged(const DataFile& file) {
  if (file.footer_check == nullptr) return arrow::Status::OK();
  FooterCheck& check = *file.footer_check;
  MutexLock lock(check.mu);  // the first reader checks; the others wait for its answer
  if (check.done) return check.status;
  DataFile copy;
  copy.fs = file.fs;
  copy.path = file.path;
  copy.display = file.display;
  copy.size = file.size;
  std::string footer;
  const arrow::Status read = ReadFooterFromSource(&copy, &footer);
  // Read at the indexed size: a file now shorter, or longer (no footer where the index
  // puts it), or with another footer, changed.
  const bool shorter = read.message().find("shorter than its listed size") != std::string::npos;
  if ((read.ok() && FooterHash(footer) != file.footer_hash) || shorter ||
      read.message().find("not a readable Parquet file") != std::string::npos) {
    check.status = MakeError(ErrorKind::kInvalidData, "'", file.display,
                             "' changed since it was indexed (its footer is not the one in "
                             "_pqloader_index",
                             read.ok() ? "" : ": " + read.message(),
                             "): run `pqloader index` again, or load with use_summary=True "
                             "to list the files");
  } else {
    check.status = read;
  }
  check.done = true;
  return check.status;
}

arrow::Result<std::string> ReadFooterHash(const FoundFile& found,
                                          const std::string& footer_cache_dir) {
  DataFile file;
  file.fs = found.fs;
  file.path = found.path;
  file.display = found.display;
  file.size = found.size;
  file.mtime_ns = found.mtime_ns;
  std::shared_ptr<arrow::Schema> schema;
  parquet::arrow::SchemaManifest manifest;
  ARROW_RETURN_NOT_OK(ReadFooter(&file, &schema, &manifest, footer_cache_dir));
  return file.footer_hash;
}

namespace {

// Whether a file found by listing, without a Parquet extension, is Parquet: "PAR1" at
// both ends (what every Parquet writer puts there).
arrow::Result<bool> HasMagic(const DataFile& file) {
  constexpr int64_t kMagic = 4;
  if (file.size < kMagic) return false;
  // A local file that vanished since the listing (another program's temporary file) is
  // not data: left out, as a file that is not Parquet is. (An object store is not asked
  // again after a failure: it may be what failed.)
  auto gone = [&] {
    if (file.fs->type_name() != "local") return false;
    auto now = file.fs->GetFileInfo(file.path);
    return now.ok() && now->type() == arrow::fs::FileType::NotFound;
  };
  const fork_gate::Inside inside;  // requests: see ReadFooterFromSource
  auto input = file.Open();
  if (!input.ok()) {
    if (gone()) return false;
    return MakeIOError(input.status(), "cannot open '", file.display, "'");
  }
  auto head = (*input)->ReadAt(0, kMagic);
  if (!head.ok()) {
    if (gone()) return false;
    return MakeIOError(head.status(), "cannot read '", file.display, "'");
  }
  return HasParquetMagic((*head)->ToString());
}

// The footers of `found`, read in parallel. Files found by listing that are not Parquet
// (by extension and magic bytes) are left out and listed in `skipped`.
struct OpenedFiles {
  std::vector<FoundFile> found;
  std::vector<DataFile> files;
  std::vector<std::shared_ptr<arrow::Schema>> schemas;
  // Shared by the files of one summary (one schema, derived once).
  std::vector<std::shared_ptr<const parquet::arrow::SchemaManifest>> manifests;
  std::vector<SkippedFile> skipped;
  int64_t from_cache = 0;
  int64_t from_summary = 0;
  // Remote footers that could not be saved into the footer cache, and why the first did.
  int64_t unsaved = 0;
  std::string store_error;
};

// Read the footers of `found`, or take them from the summaries of their directories
// (FoundFile::summary indexes `summaries`; an empty one is not used).
// How long a rank waits for another of its node to fetch the footers before it reads
// them itself.
constexpr std::chrono::milliseconds kFooterLockTimeout{std::chrono::minutes(10)};

arrow::Result<OpenedFiles> ReadFooters(
    std::vector<FoundFile> found, int max_threads, const std::string& footer_cache,
    const std::vector<std::shared_ptr<DatasetSummaryFile>>& summaries = {},
    Progress* progress = nullptr, const CancelFlag& cancel = nullptr,
    arrow::TimeUnit::type int96_unit = arrow::TimeUnit::NANO) {
  const auto n = static_cast<int64_t>(found.size());
  if (progress != nullptr) progress->total = n;
  std::vector<DataFile> files(n);
  std::vector<std::shared_ptr<arrow::Schema>> schemas(n);
  std::vector<std::shared_ptr<const parquet::arrow::SchemaManifest>> manifests(n);
  std::vector<arrow::Status> statuses(n);
  std::vector<std::string> store_errors(n);  // (each file's own: no lock)
  std::vector<uint8_t> skip(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    DataFile& f = files[i];
    f.fs = found[i].fs;
    f.path = found[i].path;
    f.display = found[i].display;
    f.size = found[i].size;
    f.mtime_ns = found[i].mtime_ns;
    for (const auto& p : found[i].partitions) {
      f.partition_values.push_back(p.value);
      f.partition_null.push_back(p.is_null ? 1 : 0);
    }
  }
  // One rank of a node fetches the remote footers into the footer cache while the
  // node's others wait, then find them there (see util/node_lock.h).
  std::unique_ptr<NodeLock> node_lock;
  if (!footer_cache.empty()) {
    bool remote = false;
    for (const auto& f : found) remote = remote || f.fs->type_name() != "local";
    if (remote) {
      // Marked before footers/ is made: a process killed in between left a directory that
      // `pqloader cache stats`, `clear` and `prune` refused as no cache.
      std::error_code mark_ec;
      std::filesystem::create_directories(footer_cache, mark_ec);
      if (!mark_ec) MarkCacheDir(footer_cache);
      node_lock = NodeLock::AcquireToStore(footer_cache + "/footers/.lock", kFooterLockTimeout, cancel);
    }
  }
  std::atomic<int64_t> footers_cached{0}, from_summary{0};
  ParallelFor(n, max_threads, [&](int64_t i) {
    const RetryStopScope no_retry_once_cancelled(cancel);
    struct Done {  // counts this file when its turn ends, whichever way
      Progress* p;
      ~Done() {
        if (p != nullptr) ++p->done;
      }
    } done{progress};
    if (IsCancelled(cancel)) {
      statuses[i] = CancelledStatus();
      done.p = nullptr;  // not read
      return;
    }
    const int s = found[i].summary;
    if (s >= 0 && static_cast<size_t>(s) < summaries.size() && summaries[s] != nullptr) {
      const auto* entry = summaries[s]->Find(found[i].path, found[i].size, found[i].mtime_ns);
      if (entry != nullptr) {
        auto rgs = std::make_shared<SummaryRowGroups>();
        rgs->summary = summaries[s]->metadata;
        rgs->row_groups = entry->row_groups;
        rgs->display = summaries[s]->display;
        files[i].summary = std::move(rgs);
        files[i].footer_hash = entry->footer_hash;
        files[i].footer_hash_is_own = entry->has_identity;
        files[i].settled = IsSettled(files[i]);
        if (found[i].from_index) files[i].footer_check = std::make_shared<FooterCheck>();
        schemas[i] = summaries[s]->arrow_schema;
        manifests[i] = summaries[s]->manifest;
        ++from_summary;
        return;
      }
    }
    if (found[i].listed && !HasParquetExtension(found[i].path)) {
      auto magic = HasMagic(files[i]);
      if (!magic.ok()) {
        statuses[i] = magic.status();
        return;
      }
      if (!*magic) {
        skip[i] = 1;
        return;
      }
    }
    bool cached = false;
    auto manifest = std::make_shared<parquet::arrow::SchemaManifest>();
    statuses[i] = ReadFooter(&files[i], &schemas[i], manifest.get(), footer_cache, &cached,
                             int96_unit, &store_errors[i]);
    manifests[i] = std::move(manifest);
    if (cached) ++footers_cached;
  });
  for (const auto& st : statuses) ARROW_RETURN_NOT_OK(st);
  OpenedFiles out;
  out.from_cache = footers_cached.load();
  out.from_summary = from_summary.load();
  for (auto& why : store_errors) {
    if (why.empty()) continue;
    if (out.unsaved++ == 0) out.store_error = std::move(why);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (skip[i]) {
      out.skipped.push_back({files[i].display, files[i].size < 4
                                                   ? "not Parquet (too short)"
                                                   : "not Parquet (no .parquet extension, does "
                                                     "not start with PAR1)"});
      continue;
    }
    out.found.push_back(std::move(found[i]));
    out.files.push_back(std::move(files[i]));
    out.schemas.push_back(std::move(schemas[i]));
    out.manifests.push_back(std::move(manifests[i]));
  }
  if (out.files.empty()) {
    std::string names;
    for (size_t i = 0; i < out.skipped.size() && i < 5; ++i) {
      names += (i ? ", '" : "'") + out.skipped[i].path + "'";
    }
    return MakeError(ErrorKind::kNotFound, "no Parquet files found: every file found (", names,
                     out.skipped.size() > 5 ? ", ..." : "", ") is not Parquet");
  }
  return out;
}

// The partition keys of `found`: every file must lie under the same keys, in order.
arrow::Result<std::vector<PartitionKey>> PartitionKeysOf(const std::vector<FoundFile>& found) {
  std::vector<PartitionKey> keys;
  for (const auto& p : found[0].partitions) keys.push_back(PartitionKey{p.key, {}, {}});
  for (const auto& f : found) {
    bool same = f.partitions.size() == keys.size();
    for (size_t k = 0; same && k < keys.size(); ++k) same = f.partitions[k].key == keys[k].name;
    if (!same) {
      return MakeError(ErrorKind::kSchemaMismatch, "files '", found[0].display, "' and '",
                       f.display, "' lie under different partition keys");
    }
    for (size_t k = 0; k < keys.size(); ++k) {
      keys[k].values.push_back(f.partitions[k].value);
      keys[k].null.push_back(f.partitions[k].is_null ? 1 : 0);
    }
  }
  return keys;
}

std::vector<FileColumns> FileColumnsOf(const OpenedFiles& opened) {
  std::vector<FileColumns> out;
  for (size_t i = 0; i < opened.files.size(); ++i) {
    out.push_back(FileColumns{opened.files[i].display, opened.schemas[i], opened.manifests[i].get(),
                              opened.schemas[i]->metadata()});
  }
  return out;
}

}  // namespace

arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> DataFile::Open(
    arrow::MemoryPool* pool) const {
  return OpenListedFile(fs, path, size, display, pool);
}

std::shared_ptr<parquet::FileMetaData> DataFile::Metadata() const {
  if (summary == nullptr) return metadata;
  std::call_once(summary->once, [this] {
    try {
      summary->subset = summary->summary->Subset(summary->row_groups);
    } catch (const std::exception& e) {
      summary->error = e.what();
    }
  });
  if (summary->subset == nullptr) {
    throw parquet::ParquetException("'" + display + "': its part of the dataset summary is corrupt: " +
                                    summary->error);
  }
  return summary->subset;
}

std::unique_ptr<parquet::RowGroupMetaData> DataFile::RowGroup(int rg) const {
  if (summary == nullptr) return metadata->RowGroup(rg);
  if (rg < 0 || rg >= static_cast<int>(summary->row_groups.size())) {
    throw parquet::ParquetException("'" + display + "' has no row group " + std::to_string(rg));
  }
  return summary->summary->RowGroup(summary->row_groups[rg]);
}

int DataFile::num_row_groups() const {
  return summary == nullptr ? metadata->num_row_groups()
                            : static_cast<int>(summary->row_groups.size());
}

int64_t DataFile::num_rows() const {
  if (summary == nullptr) return metadata->num_rows();
  int64_t rows = 0;
  for (int rg : summary->row_groups) rows += summary->summary->RowGroup(rg)->num_rows();
  return rows;
}

std::shared_ptr<const arrow::KeyValueMetadata> DataFile::key_value_metadata() const {
  return summary == nullptr ? metadata->key_value_metadata() : summary->summary->key_value_metadata();
}

parquet::ArrowReaderProperties Dataset::ArrowProperties() const {
  parquet::ArrowReaderProperties props;
  props.set_coerce_int96_timestamp_unit(int96_unit_);
  return props;
}

const parquet::SchemaDescriptor* DataFile::schema() const {
  return summary == nullptr ? metadata->schema() : summary->summary->schema();
}

arrow::Result<std::vector<DataFile>> ReadFileFooters(std::vector<FoundFile> found,
                                                     int max_threads, Progress* progress,
                                                     const CancelFlag& cancel) {
  ARROW_ASSIGN_OR_RAISE(auto opened,
                        ReadFooters(std::move(found), max_threads, "", {}, progress, cancel));
  return std::move(opened.files);
}

arrow::Result<std::shared_ptr<Dataset>> Dataset::Open(const std::vector<std::string>& given,
                                                      const DatasetOptions& options) {
  // Relative paths as absolute ones: files are named (messages, cache keys) as from Python.
  std::vector<std::string> sources;
  for (const std::string& s : given) sources.push_back(AbsoluteLocalSource(s));
  std::vector<SummaryRef> summary_refs;
  ARROW_ASSIGN_OR_RAISE(auto found, DiscoverFiles(sources, options.storage,
                                                  options.use_summary ? &summary_refs : nullptr,
                                                  options.summary_only, options.cancel));
  std::vector<std::shared_ptr<DatasetSummaryFile>> summaries;
  for (const auto& ref : summary_refs) {
    ARROW_ASSIGN_OR_RAISE(auto summary, ReadSummary(ref));
    // One schema for all its files: derived once (per file it was half the open time).
    DataFile whole;
    whole.metadata = summary->metadata;
    whole.display = summary->display;
    auto manifest = std::make_shared<parquet::arrow::SchemaManifest>();
    ARROW_RETURN_NOT_OK(
        DeriveSchema(whole, options.int96_unit, &summary->arrow_schema, manifest.get()));
    summary->manifest = std::move(manifest);
    summaries.push_back(std::move(summary));
  }
  std::shared_ptr<Dataset> ds(new Dataset());
  ARROW_ASSIGN_OR_RAISE(auto opened, ReadFooters(std::move(found), options.metadata_threads,
                                                 options.footer_cache_dir, summaries, nullptr,
                                                 options.cancel, options.int96_unit));
  ds->footers_from_cache_ = opened.from_cache;
  ds->footers_from_summary_ = opened.from_summary;
  ds->footers_unsaved_ = opened.unsaved;
  ds->footer_store_error_ = opened.store_error;
  ds->skipped_ = opened.skipped;
  ARROW_ASSIGN_OR_RAISE(auto keys, PartitionKeysOf(opened.found));
  ARROW_ASSIGN_OR_RAISE(auto resolved,
                        ResolveColumns(FileColumnsOf(opened), keys, options.columns));
  ds->files_ = std::move(opened.files);
  std::vector<std::string> key_names;
  for (const auto& k : keys) key_names.push_back(k.name);
  ds->SetColumns(std::move(resolved), key_names);
  ds->declared_schema_ = options.columns.schema;
  ds->int96_unit_ = options.int96_unit;
  ARROW_RETURN_NOT_OK(ds->ListSplits(options));
  return ds;
}

void Dataset::SetColumns(ResolvedColumns resolved, const std::vector<std::string>& partition_keys) {
  for (size_t i = 0; i < files_.size(); ++i) {
    DataFile& f = files_[i];
    f.columns = std::move(resolved.sources[i]);
    for (const auto& c : f.columns) {
      f.leaf_indices.insert(f.leaf_indices.end(), c.leaves.begin(), c.leaves.end());
    }
    std::sort(f.leaf_indices.begin(), f.leaf_indices.end());
    f.leaf_indices.erase(std::unique(f.leaf_indices.begin(), f.leaf_indices.end()),
                         f.leaf_indices.end());
  }
  specs_ = std::move(resolved.specs);
  partition_index_ = std::move(resolved.partition_index);
  key_loads_ = std::move(resolved.key_loads);
  key_errors_ = std::move(resolved.key_errors);
  column_types_ = std::move(resolved.types);
  arrow::FieldVector fields;
  for (size_t c = 0; c < specs_.size(); ++c) {
    const ColumnSpec& spec = specs_[c];
    std::shared_ptr<arrow::DataType> type = column_types_[c];
    if (type == nullptr) {
      type = spec.mask_of >= 0                        ? arrow::boolean()
             : spec.kind == ColumnKind::kTensor       ? arrow::int64()
                                                      : arrow::utf8();
    }
    // A struct's leaf says which one it is (a top-level column may have its dotted name).
    std::shared_ptr<arrow::KeyValueMetadata> metadata;
    if (!resolved.leaf_paths[c].empty()) {
      metadata = arrow::key_value_metadata({kLeafPathKey}, {resolved.leaf_paths[c]});
    }
    fields.push_back(arrow::field(spec.name, std::move(type), resolved.nullable[c], metadata));
  }
  schema_ = arrow::schema(std::move(fields));
  partition_keys_ = partition_keys;
}

namespace {

// The row groups of `file` that `row_groups` selects (all when it does not name the
// file), sorted and unique; *listed tells whether it named the file.
arrow::Result<std::vector<int>> SelectedRowGroups(
    const DataFile& file, const std::map<std::string, std::vector<int>>& row_groups,
    bool* listed) {
  const int num = file.num_row_groups();
  std::vector<int> selected;
  const auto it = row_groups.find(file.display);
  *listed = it != row_groups.end();
  if (!*listed) {
    for (int rg = 0; rg < num; ++rg) selected.push_back(rg);
    return selected;
  }
  selected = it->second;
  std::sort(selected.begin(), selected.end());
  selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
  if (!selected.empty() && (selected.front() < 0 || selected.back() >= num)) {
    return MakeError(ErrorKind::kInvalidData, "row_groups selects row group ",
                     selected.front() < 0 ? selected.front() : selected.back(), " of '",
                     file.display, "', which has ", num, " row groups (indices from 0)");
  }
  return selected;
}

}  // namespace

// Splits: every row group of every file (or those options.row_groups selects), with the
// bytes of the selected columns; the footer's counts and sizes are checked against each
// other and the file first, so that nothing is planned (or allocated) from a corrupt count.
arrow::Status Dataset::ListSplits(const DatasetOptions& options) {
  int64_t files_selected = 0;
  int64_t first = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    bool listed = false;
    ARROW_ASSIGN_OR_RAISE(auto selected, SelectedRowGroups(files_[i], options.row_groups, &listed));
    files_selected += listed ? 1 : 0;
    ARROW_ASSIGN_OR_RAISE(auto splits,
                          ValidatedSplits(files_[i], static_cast<int32_t>(i), selected));
    for (const Split& s : splits) {
      if (s.num_rows > std::numeric_limits<int64_t>::max() - first) {
        return MakeError(ErrorKind::kInvalidData, "'", files_[i].display,
                         "': the dataset's row count overflows (corrupt footer?)");
      }
      split_first_row_.push_back(first);
      first += s.num_rows;
      splits_.push_back(s);
    }
  }
  if (files_selected == static_cast<int64_t>(options.row_groups.size())) {
    return arrow::Status::OK();
  }
  for (const auto& [name, groups] : options.row_groups) {
    bool found = false;
    for (const auto& f : files_) found = found || f.display == name;
    if (!found) {
      return MakeError(ErrorKind::kNotFound, "row_groups names '", name,
                       "', which is not a file of the dataset (files are named as given, "
                       "e.g. '", files_[0].display, "')");
    }
  }
  return arrow::Status::OK();
}

int64_t Dataset::num_rows() const {
  int64_t total = 0;
  for (const auto& s : splits_) total += s.num_rows;
  return total;
}

void Dataset::RestrictSplits(std::vector<Split> splits) {
  splits_ = std::move(splits);
  split_first_row_.clear();
  int64_t first = 0;
  for (const Split& s : splits_) {
    split_first_row_.push_back(first);
    first += s.num_rows;
  }
}

std::vector<int64_t> Dataset::SplitRows() const {
  std::vector<int64_t> rows;
  rows.reserve(splits_.size());
  for (const auto& s : splits_) rows.push_back(s.num_rows);
  return rows;
}

}  // namespace pqloader

namespace pqloader {

namespace {

// A list column whose rows may differ in length: a batch of it needs Loader(lists=...)
// or pack= (unless every row turns out to have one length).
bool IsRagged(const ColumnSpec& spec) {
  return spec.kind == ColumnKind::kTensor && !spec.row_shape.empty() && spec.row_shape[0] < 0;
}

// What a column becomes in a batch. The text of ragged columns ("ragged <dtype>[ (n,
// ...)]: ...") is parsed by pqloader.inspect(lengths=...) and pqloader.petastorm: keep it.
std::string LoadsAs(const ColumnSpec& spec) {
  switch (spec.kind) {
    case ColumnKind::kString: return "list[str]";
    case ColumnKind::kBytes: return "list[bytes]";
    case ColumnKind::kStringList: return "list[list[str]]";
    case ColumnKind::kBytesList: return "list[list[bytes]]";
    case ColumnKind::kTensor: break;
  }
  if (IsRagged(spec)) {
    // Rows of n values each, n varying: what the loader can make of them.
    std::string inner;
    for (size_t i = 1; i < spec.row_shape.size(); ++i) {
      inner += (i == 1 ? " (n, " : ", ") + std::to_string(spec.row_shape[i]);
    }
    if (!inner.empty()) inner += ")";
    // Packing concatenates lists of numbers (tokens) only.
    return "ragged " + std::string(DTypeName(spec.dtype)) + inner +
           ": lists='ragged' (values + offsets) or Pad()" +
           (inner.empty() ? ", or pack=Pack()" : "");
  }
  std::string shape = "(batch";
  for (int64_t d : spec.row_shape) shape += d < 0 ? ", n" : ", " + std::to_string(d);
  return std::string(DTypeName(spec.dtype)) + shape + ")";
}

}  // namespace

arrow::Result<DatasetSummary> InspectDataset(const std::vector<std::string>& sources,
                                             const StorageOptions& storage, Progress* progress,
                                             const CancelFlag& cancel,
                                             arrow::TimeUnit::type int96_unit) {
  ARROW_ASSIGN_OR_RAISE(auto found, DiscoverFiles(sources, storage, nullptr, false, cancel));
  ARROW_ASSIGN_OR_RAISE(auto opened, ReadFooters(std::move(found), 8, "", {}, progress, cancel,
                                                 int96_unit));
  DatasetSummary out;
  out.skipped = opened.skipped;
  std::vector<Split> splits;
  for (size_t i = 0; i < opened.files.size(); ++i) {
    const DataFile& file = opened.files[i];
    FileSummary s;
    s.path = file.display;
    s.size = file.size;
    // The rows of its row groups, as a Loader counts them (FileMetaData.num_rows is not
    // checked against them: old writers left it 0; a patched one showed rows no Loader reads)
    s.num_rows = 0;
    s.num_row_groups = file.metadata->num_row_groups();
    s.created_by = file.metadata->created_by();
    s.compression = "none";
    try {
      if (s.num_row_groups > 0 && file.metadata->num_columns() > 0) {
        // Each codec of the first row group's chunks, in column order ("uncompressed+zstd"
        // where columns differ: the first column's alone was reported).
        std::vector<std::string> codecs;
        const auto rg = file.metadata->RowGroup(0);
        for (int c = 0; c < file.metadata->num_columns(); ++c) {
          std::string codec = arrow::util::Codec::GetCodecAsString(rg->ColumnChunk(c)->compression());
          if (std::find(codecs.begin(), codecs.end(), codec) == codecs.end()) codecs.push_back(codec);
        }
        s.compression.clear();
        for (const auto& codec : codecs) s.compression += (s.compression.empty() ? "" : "+") + codec;
      }
      for (int rg = 0; rg < s.num_row_groups; ++rg) {
        const int64_t rows = file.metadata->RowGroup(rg)->num_rows();
        if (rows < 0) {
          return MakeError(ErrorKind::kInvalidData, "'", file.display,
                           "' has a corrupt footer: row group ", rg, " claims ", rows, " rows");
        }
        // (saturated: hostile footers' claims; a Loader refuses such a row group)
        if (__builtin_add_overflow(s.num_rows, rows, &s.num_rows)) {
          s.num_rows = std::numeric_limits<int64_t>::max();
        }
        splits.push_back(Split{static_cast<int32_t>(i), rg, rows, 0, 0, rows, nullptr});
      }
    } catch (const std::exception& e) {
      s.compression = "unknown";
    }
    out.files.push_back(s);
  }
  // Each column as the Loader would resolve it when selected alone.
  ARROW_ASSIGN_OR_RAISE(auto keys, PartitionKeysOf(opened.found));
  const auto file_columns = FileColumnsOf(opened);
  // (A pandas index as the Loader leaves it out: only where no file stores it as data.)
  // (Sets, not scans of the lists: a scan per column was O(columns^2), 5 s of string
  // compares for 20,000 columns.)
  std::vector<std::string> names;
  std::unordered_set<std::string> named;
  PandasIndexes indexes;
  for (size_t i = 0; i < opened.files.size(); ++i) {
    for (const auto& field : opened.schemas[i]->fields()) {
      if (named.insert(field->name()).second) names.push_back(field->name());
    }
    indexes.Add(*opened.schemas[i], opened.schemas[i]->metadata().get());
  }
  for (const auto& k : keys) {
    if (named.insert(k.name).second) names.push_back(k.name);
  }
  std::unordered_map<std::string, size_t> column_index;  // out.columns by name
  for (const auto& name : names) {
    ColumnsOptions options;
    options.columns = {name};
    auto resolved = ResolveColumns(file_columns, keys, options);
    std::string first_type;
    for (const auto& schema : opened.schemas) {
      const auto fields = schema->GetAllFieldsByName(name);  // (two fields of one name too)
      if (!fields.empty()) {
        first_type = fields[0]->type()->ToString();
        break;
      }
    }
    if (!resolved.ok()) {
      column_index.emplace(name, out.columns.size());  // (the first entry of a name wins)
      out.columns.push_back({name, first_type.empty() ? "partition" : first_type,
                             "unsupported: " + resolved.status().message()});
      continue;
    }
    const bool is_key = std::any_of(keys.begin(), keys.end(),
                                    [&](const auto& k) { return k.name == name; });
    const bool is_index = !is_key && indexes.LeftOut(name);
    std::vector<DataFile> files(opened.files.size());
    for (size_t i = 0; i < files.size(); ++i) {
      files[i].display = opened.files[i].display;
      files[i].metadata = opened.files[i].metadata;
      files[i].summary = opened.files[i].summary;
      files[i].columns = resolved->sources[i];
      files[i].partition_values = opened.files[i].partition_values;
      files[i].partition_null = opened.files[i].partition_null;
    }
    // Notes follow the description, each after "; " (parsers read what precedes them).
    for (size_t c = 0; c < resolved->specs.size(); ++c) {
      const ColumnSpec& spec = resolved->specs[c];
      std::string loads_as = LoadsAs(spec);
      const int key = resolved->partition_index[c];
      const bool ragged = key < 0 && IsRagged(spec);
      if (key >= 0) {
        loads_as = spec.kind == ColumnKind::kTensor ? "int64(batch)" : "list[str]";
        loads_as += " (partition key)";
      } else if (ragged) {
        const auto layout = ListLayoutFromFooters(files, splits, static_cast<int>(c));
        if (layout.lengths == ListLayout::Lengths::kRagged) {
          loads_as += "; rows differ in length (the footers show it)";
        }
      }
      const auto nulls = NullsFromFooters(files, splits, static_cast<int>(c), key);
      int64_t total = 0;
      bool unknown = false;
      for (int64_t n : nulls) {
        if (n < 0) unknown = true;
        else total += n;
      }
      if (total > 0) loads_as += "; " + std::to_string(total) + " null(s): needs fill_null or null_mask";
      else if (unknown) loads_as += "; nulls unknown (no statistics)";
      if (is_index) loads_as += "; pandas index: left out unless selected";
      DatasetSummary::Column entry{spec.name,
                                   key >= 0 ? "partition"
                                            : (resolved->types[c] ? resolved->types[c]->ToString()
                                                                  : spec.arrow_type),
                                   loads_as, ragged};
      const auto [at, added] = column_index.emplace(spec.name, out.columns.size());
      if (added) {
        out.columns.push_back(std::move(entry));
        continue;
      }
      DatasetSummary::Column* same = &out.columns[at->second];
      // Two columns of one output name (a column 'a.b' and field 'b' of struct 'a'): the
      // dict kept the later one, whichever columns=['a.b'] loads, and no word of the clash
      // that refuses a Loader of every column. Shown: the one selected by its own name.
      if (name == spec.name) *same = std::move(entry);
      same->loads_as += "; '" + spec.name + "' is also the dotted name of a struct's field: " +
                        "a Loader of every column refuses the two (select one by columns=)";
    }
  }
  return out;
}

}  // namespace pqloader
