// Fuzz cache entries as a loader reads them: ReadCacheEntryColumns (a deferred read's
// parse), ReadCacheEntry (with the checksum taken as
// verified, so the fuzzer reaches the layout checks; the key is the one the entry
// names), then the loader's checks against its column specs and the gathers a hit goes
// through (row-major transposition, natural and shuffled batches). The specs are those
// of the seed entries (fuzz/make_corpus.py): id int64, x float32[3], s string, b binary.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <arrow/memory_pool.h>

#include "pqloader/cache/entry_format.h"
#include "pqloader/tensor/batch.h"

namespace {

std::vector<pqloader::ColumnSpec> Specs() {
  using pqloader::ColumnKind;
  using pqloader::DType;
  std::vector<pqloader::ColumnSpec> specs(4);
  specs[0].name = "id";
  specs[0].dtype = DType::kInt64;
  specs[0].arrow_type = "int64";
  specs[1].name = "x";
  specs[1].dtype = DType::kFloat32;
  specs[1].row_shape = {3};
  specs[1].arrow_type = "fixed_size_list<item: float>[3]";
  specs[2].name = "s";
  specs[2].kind = ColumnKind::kString;
  specs[2].arrow_type = "string";
  specs[3].name = "b";
  specs[3].kind = ColumnKind::kBytes;
  specs[3].arrow_type = "binary";
  return specs;
}

void Gather(const std::vector<pqloader::ColumnSpec>& specs,
            const std::shared_ptr<const pqloader::DecodedUnit>& unit, bool reverse) {
  std::vector<pqloader::RowRef> rows;
  const int64_t n = std::min<int64_t>(unit->num_rows, 4096);
  for (int64_t r = 0; r < n; ++r) rows.push_back({0, reverse ? n - 1 - r : r});
  auto batch = pqloader::AssembleBatch(specs, {unit}, 0, rows, {}, arrow::default_memory_pool());
  (void)batch;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<pqloader::ColumnSpec> specs = Specs();
  std::string key(32, '0');
  if (size >= 56) key.assign(reinterpret_cast<const char*>(data) + 24, 32);
  // A copy in its own allocation, so that ASan sees reads past the entry's end.
  auto buffer = arrow::AllocateBuffer(static_cast<int64_t>(size));
  if (!buffer.ok()) return 0;
  if (size > 0) std::memcpy((*buffer)->mutable_data(), data, size);
  std::shared_ptr<arrow::Buffer> file = std::move(*buffer);
  // The deferred read's parse (a verified entry's head and trailer; its columns read on
  // demand): every column it finds must lie inside the file.
  if (size >= pqloader::kCacheEntryTrailerBytes) {
    const auto n = static_cast<int64_t>(size);
    auto head = pqloader::CacheEntryHeadBytes(file->data(), n, n);
    if (head.ok() && *head <= n) {
      auto columns = pqloader::ReadCacheEntryColumns(
          file->data(), *head, file->data() + n - pqloader::kCacheEntryTrailerBytes, n, key);
      if (columns.ok() && columns->has_value()) {
        for (const auto& c : (*columns)->columns) {
          if (c.offset < 0 || c.bytes < 0 || c.offset + c.bytes > n) __builtin_trap();
        }
      }
    }
  }
  auto unit = pqloader::ReadCacheEntry(file, key, /*checksum_verified=*/true);
  if (!unit.ok()) return 0;
  if (!pqloader::CheckUnitLayout(**unit, specs).ok()) return 0;
  std::shared_ptr<const pqloader::DecodedUnit> u = *unit;
  Gather(specs, u, false);
  Gather(specs, u, true);
  auto row_major = pqloader::WithRowMajor(u, 64, arrow::default_memory_pool());
  if (row_major.ok()) Gather(specs, *row_major, true);
  return 0;
}
