// Fuzz the Parquet open/plan/read path: the input is written to a file, a Loader is
// opened on it (footer validation, schema, plan) and one epoch is read (fetch, decode,
// convert, gather), natural and shuffled, then once more under a filter on its first
// column (statistics, the mask pass's reads), INT96 read as microseconds. Any error
// status is fine; a crash, a sanitizer report, a leak or a hang is not.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <arrow/compute/expression.h>

#include "pqloader/loader.h"
#include "temp_dir.h"

namespace {

// The input's file, in a directory of its own that goes at exit.
const std::string& InputPath() {
  static const pqloader_fuzz::TempDir dir("pqloader-fuzz-");
  static const std::string path = dir.path() + "/input.parquet";
  return path;
}

pqloader::LoaderOptions Options() {
  pqloader::LoaderOptions o;
  o.plan.batch_size = 7;
  o.plan.seed = 3;
  o.plan.shuffle_window = 2;
  o.num_workers = 1;
  o.io_threads = 1;
  o.max_inflight_bytes = int64_t{64} << 20;
  o.default_fill.enabled = true;  // nulls become 0 / "" rather than stop the epoch
  return o;
}

void ReadEpoch(const pqloader::LoaderOptions& o) {
  auto loader = pqloader::Loader::Make({InputPath()}, o);
  if (!loader.ok()) return;
  if (!(*loader)->StartEpoch(0).ok()) return;
  for (int i = 0; i < 10000; ++i) {
    auto batch = (*loader)->Next();
    if (!batch.ok() || *batch == nullptr) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FILE* f = std::fopen(InputPath().c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  pqloader::LoaderOptions o = Options();
  ReadEpoch(o);
  o.plan.shuffle = true;
  ReadEpoch(o);
  // Under a filter on the first column ("c is null or c > 0": statistics of any type, a
  // comparison that binds for numbers), INT96 as microseconds.
  auto plain = pqloader::Loader::Make({InputPath()}, Options());
  if (!plain.ok() || (*plain)->specs().empty()) return 0;
  namespace cp = arrow::compute;
  const cp::Expression column = cp::field_ref((*plain)->specs()[0].name);
  auto serialized = cp::Serialize(cp::or_(cp::is_null(column), cp::greater(column, cp::literal(int64_t{0}))));
  if (!serialized.ok()) return 0;
  o.filter.serialized_expression = (*serialized)->ToString();
  o.filter.threads = 1;
  o.dataset.int96_unit = arrow::TimeUnit::MICRO;
  ReadEpoch(o);
  return 0;
}
