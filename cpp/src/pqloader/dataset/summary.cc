#include "pqloader/dataset/summary.h"

#include <unistd.h>

#include <charconv>
#include <cstring>
#include <exception>
#include <future>
#include <sstream>
#include <system_error>

#include <arrow/io/interfaces.h>
#include <arrow/io/memory.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_writer.h>

#include "pqloader/cache/footer_cache.h"
#include "pqloader/dataset/columns.h"
#include "pqloader/dataset/dataset.h"
#include "pqloader/error.h"
#include "pqloader/util/fork_gate.h"

namespace pqloader {

namespace {

// Format 2 adds a line "summary\t<hash of _metadata's bytes>" after the header: the
// pair is written in two moves (and two runs may overlap), so an index beside another
// _metadata than its own is told apart. Format 1 (no such line) is still read.
constexpr const char* kIndexHeader = "pqloader-index 2";
constexpr const char* kIndexHeaderV1 = "pqloader-index 1";

arrow::Result<std::string> ReadWhole(const std::shared_ptr<arrow::fs::FileSystem>& fs,
                                     const std::string& path, int64_t size,
                                     const std::string& display) {
  // Requests: a fork waits for them (Arrow's S3 client holds a lock for each, which a
  // child forked meanwhile inherited held: its first S3 client waited for good).
  const fork_gate::Inside inside;
  auto input = OpenListedFile(fs, path, size, display);
  if (!input.ok()) {
    return MakeIOError(input.status(), "cannot open '", display, "'");
  }
  auto bytes = (*input)->ReadAt(0, size);
  if (!bytes.ok()) {
    return MakeIOError(bytes.status(), "cannot read '", display, "'");
  }
  if ((*bytes)->size() != size) {
    return MakeError(ErrorKind::kIO, "cannot read '", display,
                     "': the file is shorter than its listed size");
  }
  return (*bytes)->ToString();
}

// A relative path of the summary's own making: '/'-separated, no '.' or '..' parts.
bool IsPlainRelative(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  size_t start = 0;
  while (start <= p.size()) {
    const size_t end = std::min(p.find('/', start), p.size());
    const std::string part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

// `path` relative to directory `root`, or "" when it is not below it.
std::string Below(const std::string& root, const std::string& path) {
  if (path.compare(0, root.size(), root) != 0) return "";
  std::string rel = path.substr(root.size());
  if (!root.empty() && root.back() != '/' && !rel.empty() && rel[0] != '/') return "";
  while (!rel.empty() && rel[0] == '/') rel.erase(0, 1);
  return rel;
}

std::string Join(const std::string& root, const std::string& rel) {
  if (root.empty()) return rel;
  return root.back() == '/' ? root + rel : root + "/" + rel;
}

// `_pqloader_index`: header line, "summary\t<hash of _metadata>" (format 2), then
// "size\tmtime_ns\thash\tpath" per file, in path order.
arrow::Result<DatasetIndex> ParseIndex(const std::string& text, const std::string& display) {
  auto bad = [&](const std::string& why) {
    return MakeError(ErrorKind::kInvalidData, "'", display,
                     "' (a dataset index) is not readable: ", why,
                     "; rewrite it with `pqloader index`, delete it, or pass use_summary=False");
  };
  DatasetIndex index;
  std::vector<IndexedFile>& out = index.files;
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  std::string line;
  if (!std::getline(in, line) || (line != kIndexHeader && line != kIndexHeaderV1)) {
    return bad("it does not start with '" + std::string(kIndexHeader) + "'");
  }
  int64_t number = 1;
  if (line == kIndexHeader) {
    constexpr std::string_view kSummary = "summary\t";
    if (!std::getline(in, line) || line.compare(0, kSummary.size(), kSummary) != 0 ||
        line.size() == kSummary.size()) {
      return bad("line 2 does not name the summary's hash");
    }
    index.summary_hash = line.substr(kSummary.size());
    ++number;
  }
  std::string previous;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1),
                 t3 = line.find('\t', t2 + 1);
    if (t1 == std::string::npos || t2 == std::string::npos || t3 == std::string::npos) {
      return bad("line " + std::to_string(number) + " has fewer than 4 fields");
    }
    IndexedFile id;
    auto num = [&](size_t from, size_t to, int64_t* v) {
      auto [ptr, ec] = std::from_chars(line.data() + from, line.data() + to, *v);
      return ec == std::errc() && ptr == line.data() + to && *v >= 0;
    };
    if (!num(0, t1, &id.size) || !num(t1 + 1, t2, &id.mtime_ns)) {
      return bad("line " + std::to_string(number) + " has a bad size or time");
    }
    id.footer_hash = line.substr(t2 + 1, t3 - t2 - 1);
    id.path = line.substr(t3 + 1);
    if (!IsPlainRelative(id.path)) {
      return bad("line " + std::to_string(number) + " has a bad path");
    }
    // `pqloader index` writes the listing's order, each file once: another order would
    // change the rows' order (use_summary="only" lists the files from here), a repeat
    // read a file twice.
    if (!out.empty() && !(previous < id.path)) {
      return bad("line " + std::to_string(number) + " repeats a path or is out of order ('" +
                 id.path + "')");
    }
    previous = id.path;
    out.push_back(std::move(id));
  }
  return index;
}

}  // namespace

std::string JoinPath(const std::string& root, const std::string& rel) { return Join(root, rel); }

std::shared_future<arrow::Result<std::string>> PrefetchSummary(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& root, int64_t size,
    const std::string& display) {
  auto read = [fs, path = Join(root, "_metadata"), size, display] {
    return ReadWhole(fs, path, size, display);
  };
  try {
    return std::async(std::launch::async, read).share();
  } catch (const std::system_error&) {
    // The OS refused a thread (a limit of tasks): read when the bytes are asked for, on
    // the caller's thread (the std::system_error reached Python as a bare
    // "Resource temporarily unavailable").
    return std::async(std::launch::deferred, std::move(read)).share();
  }
}

arrow::Result<DatasetIndex> ReadIndexFile(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& root, int64_t size,
    const std::string& display) {
  const std::string path = Join(root, "_pqloader_index");
  if (size < 0) {
    auto info = [&] {
      const fork_gate::Inside inside;  // a request (see ReadWhole)
      return fs->GetFileInfo(path);
    }();
    if (!info.ok()) {
      return MakeIOError(info.status(), "cannot access '", display, "'");
    }
    if (info->type() != arrow::fs::FileType::File) {
      return MakeError(ErrorKind::kNotFound, "'", display,
                       "' does not exist: use_summary='only' lists the files from the index "
                       "`pqloader index` writes");
    }
    size = info->size();
  }
  ARROW_ASSIGN_OR_RAISE(std::string text, ReadWhole(fs, path, size, display));
  return ParseIndex(text, display);
}

const DatasetSummaryFile::Entry* DatasetSummaryFile::Find(const std::string& path, int64_t size,
                                                          int64_t mtime_ns) const {
  const auto it = files.find(Below(root, path));
  if (it == files.end()) return nullptr;
  const Entry& e = it->second;
  if (e.has_identity && (e.size != size || (e.mtime_ns != 0 && mtime_ns != 0 &&
                                            e.mtime_ns != mtime_ns))) {
    return nullptr;  // changed since it was indexed: its own footer is read
  }
  return &e;
}

arrow::Result<std::shared_ptr<DatasetSummaryFile>> ReadSummary(const SummaryRef& ref) {
  auto bad = [&](const std::string& why) {
    return MakeError(ErrorKind::kInvalidData, "'", ref.display,
                     "' (a dataset summary) is not readable: ", why,
                     "; rewrite it with `pqloader index`, delete it, or pass use_summary=False");
  };
  const std::string path = Join(ref.root, "_metadata");
  ARROW_ASSIGN_OR_RAISE(std::string bytes, ref.bytes.valid()
                                               ? ref.bytes.get()
                                               : ReadWhole(ref.fs, path, ref.size, ref.display));
  if (bytes.size() < 12 || bytes.compare(bytes.size() - 4, 4, "PAR1") != 0 ||
      bytes.compare(0, 4, "PAR1") != 0) {
    return bad("no 'PAR1' magic bytes at both ends");
  }
  uint32_t length = 0;
  std::memcpy(&length, bytes.data() + bytes.size() - 8, 4);
  if (length == 0 || length > bytes.size() - 12) return bad("bad footer length");
  std::shared_ptr<parquet::FileMetaData> md;
  auto summary = std::make_shared<DatasetSummaryFile>();
  summary->root = ref.root;
  summary->display = ref.display;
  std::map<std::string, std::vector<int>> groups;
  try {
    uint32_t len = length;
    md = parquet::FileMetaData::Make(bytes.data() + bytes.size() - 8 - length, &len);
    for (int rg = 0; rg < md->num_row_groups(); ++rg) {
      auto group = md->RowGroup(rg);
      if (group->num_columns() <= 0) return bad("row group " + std::to_string(rg) + " has no columns");
      // A row group's file is its first column chunk's, as pyarrow and Dask read it (every
      // chunk's offsets are then checked against that file's size before any read).
      const std::string file = group->ColumnChunk(0)->file_path();
      if (!IsPlainRelative(file)) {
        return bad("row group " + std::to_string(rg) + " names no file, or not a relative path ('" +
                   file + "')");
      }
      groups[file].push_back(rg);
    }
    // A file's row groups lie one after the other: a summary listing one twice (a
    // metadata collector that held a file twice, summaries merged by hand) or out of
    // order would serve its rows twice, or in another order than the file's own footer.
    for (const auto& [file, rgs] : groups) {
      int64_t previous = -1;
      for (const int rg : rgs) {
        auto group = md->RowGroup(rg);
        if (group->num_rows() == 0) continue;  // no rows to serve twice
        auto chunk = group->ColumnChunk(0);
        int64_t start = chunk->data_page_offset();
        if (chunk->has_dictionary_page() && chunk->dictionary_page_offset() > 0) {
          start = std::min(start, chunk->dictionary_page_offset());
        }
        if (start <= previous) {
          return bad("row group " + std::to_string(rg) + " lists the rows at byte " +
                     std::to_string(start) + " of '" + file +
                     "' twice, or that file's row groups out of order");
        }
        previous = start;
      }
    }
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  std::map<std::string, IndexedFile> identities;
  // Without an index, a file's cache identity is its place in this summary.
  const std::string summary_hash = FooterHash(bytes);
  if (ref.has_index) {
    const std::string index_display =
        ref.display.substr(0, ref.display.size() - std::strlen("_metadata")) + "_pqloader_index";
    std::shared_ptr<const DatasetIndex> indexed = ref.index;
    if (indexed == nullptr) {
      ARROW_ASSIGN_OR_RAISE(auto read, ReadIndexFile(ref.fs, ref.root, ref.index_size, index_display));
      indexed = std::make_shared<const DatasetIndex>(std::move(read));
    }
    // An index beside another _metadata than the one it was written with (a run that
    // stopped between the two moves, or two runs that overlapped): its identities would
    // pass a file rewritten since with the other summary's row groups. None is taken:
    // every file's own footer is read. "only" lists the files from the index: refused.
    const bool paired = indexed->summary_hash.empty() || indexed->summary_hash == summary_hash;
    if (!paired && ref.index != nullptr) {
      return MakeError(ErrorKind::kInvalidData, "'", index_display, "' does not describe '",
                       ref.display, "' (another `pqloader index` run wrote one of them): run "
                       "`pqloader index` again, or load with use_summary=True or False");
    }
    if (paired) {
      for (const auto& f : indexed->files) identities[f.path] = f;
    }
  }
  summary->metadata = md;
  for (auto& [file, rgs] : groups) {
    DatasetSummaryFile::Entry e;
    e.row_groups = rgs;  // the file's own metadata is made when it is read (DataFile::Metadata)
    const auto id = identities.find(file);
    if (id != identities.end()) {
      e.has_identity = true;
      e.size = id->second.size;
      e.mtime_ns = id->second.mtime_ns;
      e.footer_hash = id->second.footer_hash;
    } else if (ref.has_index) {
      continue;  // in _metadata but not in the index: written since; read its footer
    } else {
      e.footer_hash = FooterHash(summary_hash + "\n" + file);
    }
    summary->files.emplace(file, std::move(e));
  }
  return summary;
}

arrow::Result<IndexResult> WriteDatasetIndex(const std::string& source,
                                             const StorageOptions& storage, int metadata_threads,
                                             Progress* progress, const CancelFlag& cancel) {
  ARROW_ASSIGN_OR_RAISE(auto resolver, FileSystemResolver::Make(storage));
  ARROW_ASSIGN_OR_RAISE(auto resolved, resolver->Resolve(source, cancel));
  const auto fs = resolved.fs;
  std::string root = resolved.path;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const std::string display_root = resolved.prefix + root;
  auto info = FileInfoOf(fs, root, cancel);  // (Ctrl-C: a refusing endpoint retries a minute)
  if (info.status().IsCancelled()) return info.status();
  if (!info.ok()) {
    return MakeIOError(info.status(), "cannot access '", source, "'");
  }
  if (info->type() == arrow::fs::FileType::NotFound) {  // (Arrow says so by the type)
    return MakeError(ErrorKind::kNotFound, "'", source, "' does not exist");
  }
  if (info->type() != arrow::fs::FileType::Directory) {
    return arrow::Status::Invalid("an index is written for a directory; '", source,
                                  "' is not a directory");
  }
  ARROW_ASSIGN_OR_RAISE(auto found, DiscoverFiles({source}, storage, nullptr, false, cancel));
  ARROW_ASSIGN_OR_RAISE(auto files, ReadFileFooters(std::move(found), metadata_threads, progress, cancel));
  IndexResult result;
  std::shared_ptr<parquet::FileMetaData> combined;
  std::shared_ptr<arrow::Schema> first_arrow;
  std::vector<std::string> first_index;  // the first file's pandas index columns
  std::string index;
  try {
    for (const auto& f : files) {
      if (IsCancelled(cancel)) return CancelledStatus();  // 10^5 subsets: seconds
      const std::string rel = Below(root, f.path);
      if (rel.find_first_of("\t\n") != std::string::npos || !IsPlainRelative(rel)) {
        return arrow::Status::Invalid("cannot index '", f.display,
                                      "': its path has a tab, a newline or an empty part");
      }
      if (!IsValidUtf8(rel)) {  // (indexed, every Loader of the directory refused it)
        return MakeError(ErrorKind::kInvalidData, "cannot index '", display_root,
                         "': it holds a file whose name is not UTF-8 (b'", Printable(rel, 200),
                         "'); pqloader reads UTF-8 names only: rename or move it");
      }
      if (combined != nullptr && !f.schema()->Equals(*combined->schema())) {
        return MakeError(ErrorKind::kSchemaMismatch, "cannot index '", source, "': '",
                         f.display, "' has another Parquet schema than '", files[0].display,
                         "' (a summary holds one schema)");
      }
      // The Arrow types too (time zones, string vs large_string: the same Parquet schema):
      // every file is read with the summary's, which loaders refusing such files together
      // would otherwise take for the first file's.
      std::shared_ptr<arrow::Schema> arrow_schema;
      ARROW_RETURN_NOT_OK(parquet::arrow::FromParquetSchema(
          f.schema(), parquet::ArrowReaderProperties(), f.metadata->key_value_metadata(),
          &arrow_schema));
      if (first_arrow == nullptr) {
        first_arrow = arrow_schema;
      } else if (!arrow_schema->Equals(*first_arrow, /*check_metadata=*/false)) {
        std::string column;
        for (int i = 0; i < arrow_schema->num_fields() && i < first_arrow->num_fields(); ++i) {
          if (!arrow_schema->field(i)->type()->Equals(*first_arrow->field(i)->type())) {
            column = " (column '" + arrow_schema->field(i)->name() + "': " +
                     arrow_schema->field(i)->type()->ToString() + " against " +
                     first_arrow->field(i)->type()->ToString() + ")";
            break;
          }
        }
        return MakeError(ErrorKind::kSchemaMismatch, "cannot index '", source, "': '",
                         f.display, "' has other Arrow types than '", files[0].display, "'",
                         column, " (a summary holds one schema)");
      }
      // The summary holds the first file's key-value metadata for all: a pandas index
      // column of one file that another stores as data would be left out of every file.
      auto own_index = PandasIndexColumns(f.metadata->key_value_metadata().get());
      if (combined == nullptr) {
        first_index = std::move(own_index);
      } else if (own_index != first_index) {
        auto shown = [](const std::vector<std::string>& v) {
          std::string text;
          for (const auto& n : v) text += (text.empty() ? "'" : ", '") + n + "'";
          return text.empty() ? std::string("none") : text;
        };
        return MakeError(ErrorKind::kSchemaMismatch, "cannot index '", source, "': '",
                         f.display, "' has other pandas index columns (", shown(own_index),
                         ") than '", files[0].display, "' (", shown(first_index),
                         "): a summary holds one file's pandas metadata, so loaders would "
                         "leave a column out of every file or of none; rewrite one of them");
      }
      std::vector<int> all(f.num_row_groups());
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
      auto sub = f.metadata->Subset(all);
      sub->set_file_path(rel);
      if (combined == nullptr) {
        combined = sub;
      } else {
        combined->AppendRowGroups(*sub);
      }
      index += std::to_string(f.size) + "\t" + std::to_string(f.mtime_ns) + "\t" +
               f.footer_hash + "\t" + rel + "\n";
      ++result.files;
      result.row_groups += f.num_row_groups();
      result.rows += f.num_rows();
    }
  } catch (const std::exception& e) {
    return MakeError(ErrorKind::kInvalidData, "cannot index '", source, "': ", e.what());
  }
  // The summary's bytes first: the index records their hash (see kIndexHeader).
  std::shared_ptr<arrow::Buffer> summary_bytes;
  try {
    ARROW_ASSIGN_OR_RAISE(auto sink, arrow::io::BufferOutputStream::Create());
    parquet::WriteMetaDataFile(*combined, sink.get());
    ARROW_ASSIGN_OR_RAISE(summary_bytes, sink->Finish());
  } catch (const std::exception& e) {
    return MakeError(ErrorKind::kInvalidData, "cannot index '", source, "': ", e.what());
  }
  index = std::string(kIndexHeader) + "\nsummary\t" + FooterHash(summary_bytes->ToString()) +
          "\n" + index;
  // Each file to a temporary name first, then moved into place: a reader sees the old
  // summary or the new one. _metadata goes first; an index beside a _metadata other than
  // its own is not used (ReadSummary). A cancel is checked before, not between, the two:
  // once the summary is written the index follows (the caller still raises
  // KeyboardInterrupt).
  if (IsCancelled(cancel)) return CancelledStatus();
  const fork_gate::Inside inside;  // the writes, moves and deletes below (see ReadWhole)
  const std::string tmp_suffix = ".tmp-" + std::to_string(::getpid());
  // Both written before either is moved: a disk that had room for _metadata and not for
  // _pqloader_index left the new _metadata alone in place (the old index beside it no
  // longer its own), and loaders took every layout from it without the index's check of
  // each file's size, time and footer hash, after an error said the index was not written.
  const std::string names[2] = {"_metadata", "_pqloader_index"};
  std::string tmps[2];
  auto drop_temps = [&](int count) {
    for (int i = 0; i < count; ++i) (void)fs->DeleteFile(tmps[i]);
  };
  auto write = [&](int i, auto&& fill) -> arrow::Status {
    tmps[i] = Join(root, names[i]) + tmp_suffix;
    auto out = fs->OpenOutputStream(tmps[i]);
    if (!out.ok()) {
      drop_temps(i);
      return MakeIOError(out.status(), "cannot write '", Join(display_root, names[i]), "'");
    }
    arrow::Status st = fill(out->get());
    if (st.ok()) st = (*out)->Close();
    if (!st.ok()) {
      (void)(*out)->Abort();  // (an S3 stream's destructor would complete the upload)
      drop_temps(i + 1);
      return MakeIOError(st, "cannot write '", Join(display_root, names[i]), "'");
    }
    return arrow::Status::OK();
  };
  ARROW_RETURN_NOT_OK(write(0, [&](arrow::io::OutputStream* out) {
    result.bytes = summary_bytes->size();
    return out->Write(summary_bytes);
  }));
  ARROW_RETURN_NOT_OK(write(1, [&](arrow::io::OutputStream* out) {
    return out->Write(index.data(), static_cast<int64_t>(index.size()));
  }));
  // _metadata first: an index beside a _metadata other than its own is not used
  // (ReadSummary), so a failure between the two moves leaves the old index unused.
  for (int i = 0; i < 2; ++i) {
    arrow::Status st = fs->Move(tmps[i], Join(root, names[i]));
    if (!st.ok()) {
      for (int j = i; j < 2; ++j) (void)fs->DeleteFile(tmps[j]);
      return MakeIOError(st, "cannot write '", Join(display_root, names[i]), "'");
    }
  }
  result.metadata_path = Join(display_root, "_metadata");
  return result;
}

}  // namespace pqloader
