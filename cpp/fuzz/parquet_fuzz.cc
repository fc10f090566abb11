// Fuzz the Parquet open/plan/read path: the input is written to a file, a Loader is
// opened on it (footer validation, schema, plan) and one epoch is read (fetch, decode,
// convert, gather), natural and shuffled. Any error status is fine; a crash, a sanitizer
// report, a leak or a hang is not.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "pqloader/loader.h"
#include "temp_dir.h"

namespace {

// The input's file, in a directory of its own that goes at exit.
const std::string& InputPath() {
  static const pqloader_fuzz::TempDir dir("pqloader-fuzz-");
  static const std::string path = dir.path() + "/input.parquet";
  return path;
}

void ReadEpoch(bool shuffle) {
  pqloader::LoaderOptions o;
  o.plan.batch_size = 7;
  o.plan.shuffle = shuffle;
  o.plan.seed = 3;
  o.plan.shuffle_window = 2;
  o.num_workers = 1;
  o.io_threads = 1;
  o.max_inflight_bytes = int64_t{64} << 20;
  o.default_fill.enabled = true;  // nulls become 0 / "" rather than stop the epoch
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
  ReadEpoch(/*shuffle=*/false);
  ReadEpoch(/*shuffle=*/true);
  return 0;
}
