// Fuzz dataset summaries as a loader reads them: a directory holds two small Parquet
// files and the `_metadata` + `_pqloader_index` that `pqloader index` writes for them;
// the input edits one of those two (byte sets, inserts, truncations) and a Dataset is
// opened with the summary (listed, or `use_summary="only"`), its splits' row groups read
// from it, each file's own metadata made from it, and optionally one epoch loaded. Any
// error status is fine; a crash, a sanitizer report, a leak or a hang is not.
//
// Input: byte 0 = mode (bit 0: summary_only, bit 1: edit the index instead of
// `_metadata`, bit 2: also read an epoch), then 4-byte edits (position: 2 bytes, value,
// operation: set / insert / truncate).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/writer.h>

#include "pqloader/dataset/summary.h"
#include "pqloader/loader.h"
#include "temp_dir.h"

namespace {

struct Fixture {
  std::string dir;  // a directory of its own, removed at exit
  std::string metadata, index;  // as `pqloader index` wrote them
};

void WriteFile(const std::string& path, int64_t first, std::vector<int64_t> row_groups) {
  auto schema = arrow::schema({arrow::field("id", arrow::int64()), arrow::field("x", arrow::float32())});
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  auto writer = parquet::arrow::FileWriter::Open(*schema, arrow::default_memory_pool(), out).ValueOrDie();
  for (int64_t rows : row_groups) {
    arrow::Int64Builder ids;
    arrow::FloatBuilder xs;
    for (int64_t i = 0; i < rows; ++i, ++first) {
      (void)ids.Append(first);
      (void)xs.Append(static_cast<float>(first));
    }
    auto batch = arrow::RecordBatch::Make(schema, rows, {ids.Finish().ValueOrDie(), xs.Finish().ValueOrDie()});
    (void)writer->NewBufferedRowGroup();
    (void)writer->WriteRecordBatch(*batch);
  }
  (void)writer->Close();
  (void)out->Close();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const Fixture& Get() {
  static const pqloader_fuzz::TempDir tmp("pqloader-fuzz-summary-");
  static const Fixture f = [] {
    Fixture x;
    x.dir = tmp.path();
    std::filesystem::create_directories(x.dir + "/part=1");
    WriteFile(x.dir + "/a.parquet", 0, {5, 3});
    WriteFile(x.dir + "/part=1/b.parquet", 8, {4});
    if (!pqloader::WriteDatasetIndex(x.dir, pqloader::StorageOptions{}).ok()) std::abort();
    x.metadata = Slurp(x.dir + "/_metadata");
    x.index = Slurp(x.dir + "/_pqloader_index");
    return x;
  }();
  return f;
}

std::string Edit(std::string s, const uint8_t* edits, size_t n) {
  for (size_t i = 0; i + 4 <= n; i += 4) {
    const size_t pos = s.empty() ? 0 : (static_cast<size_t>(edits[i]) << 8 | edits[i + 1]) % s.size();
    const uint8_t value = edits[i + 2];
    switch (edits[i + 3] % 3) {
      case 0: if (!s.empty()) s[pos] = static_cast<char>(value); break;
      case 1: s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<char>(value)); break;
      case 2: s.resize(pos); break;
    }
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = Get();
  const uint8_t mode = size > 0 ? data[0] : 0;
  const uint8_t* edits = size > 0 ? data + 1 : data;
  const size_t n = size > 0 ? size - 1 : 0;
  const bool edit_index = (mode & 2) != 0;
  Spit(f.dir + "/_metadata", edit_index ? f.metadata : Edit(f.metadata, edits, n));
  Spit(f.dir + "/_pqloader_index", edit_index ? Edit(f.index, edits, n) : f.index);
  pqloader::DatasetOptions options;
  options.use_summary = true;
  options.summary_only = (mode & 1) != 0;
  auto ds = pqloader::Dataset::Open({f.dir}, options);
  if (!ds.ok()) return 0;
  for (const auto& split : (*ds)->splits()) {
    const auto& file = (*ds)->files()[split.file];
    try {
      (void)file.RowGroup(split.row_group)->num_rows();
      (void)file.Metadata()->num_row_groups();
    } catch (const std::exception&) {
    }
  }
  if ((mode & 4) != 0) {
    pqloader::LoaderOptions o;
    o.dataset = options;
    o.plan.batch_size = 3;
    o.num_workers = 1;
    o.io_threads = 1;
    o.default_fill.enabled = true;
    auto loader = pqloader::Loader::Make({f.dir}, o);
    if (loader.ok() && (*loader)->StartEpoch(0).ok()) {
      for (int i = 0; i < 100; ++i) {
        auto batch = (*loader)->Next();
        if (!batch.ok() || *batch == nullptr) break;
      }
    }
  }
  return 0;
}
