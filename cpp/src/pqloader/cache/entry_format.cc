#include "pqloader/cache/entry_format.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <vector>

namespace pqloader {

namespace {

constexpr char kMagic[8] = {'P', 'Q', 'L', 'C', 'A', 'C', 'H', 'E'};
constexpr char kEndMagic[8] = {'P', 'Q', 'L', 'C', 'E', 'N', 'D', '\0'};
constexpr int64_t kKeyBytes = 32;      // the entry's own key (CacheKey: 32 hex digits)
constexpr int64_t kHeaderBytes = 24 + kKeyBytes;  // magic, version, reserved, meta length, key
static_assert(kHeaderBytes == kCacheEntryHeaderBytes);
constexpr int64_t kTrailerBytes = kCacheEntryTrailerBytes;  // checksum, file length, end magic
constexpr int64_t kAlignment = 64;
constexpr int64_t kMaxBytes = int64_t{1} << 40;  // of any one buffer or sample

int64_t AlignUp(int64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }
int64_t AlignUp8(int64_t x) { return (x + 7) / 8 * 8; }

// Format 3: after the fixed header, an i64 source identity length S, the identity's
// S bytes and zero padding to a multiple of 8; the metadata follows.
constexpr int64_t kSourceLengthBytes = 8;
constexpr char kSourceFirstLine[] = "pqloader-source 1\n";

// Offset of the metadata in an entry of `version` whose source identity has `source_bytes`.
int64_t MetaOffset(uint32_t version, int64_t source_bytes) {
  return version < 3 ? kHeaderBytes : kHeaderBytes + kSourceLengthBytes + AlignUp8(source_bytes);
}

bool ParseDecimal(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Collects the metadata words and the buffers they reference.
struct Layout {
  std::vector<int64_t> meta;
  std::vector<std::shared_ptr<arrow::Buffer>> buffers;
  std::vector<size_t> ref_slots;  // index in meta of each buffer's offset word

  void Ref(const std::shared_ptr<arrow::Buffer>& b) {
    if (b == nullptr) {
      meta.push_back(-1);
      meta.push_back(0);
      return;
    }
    ref_slots.push_back(meta.size());
    buffers.push_back(b);
    meta.push_back(0);  // offset, patched once the layout is known
    meta.push_back(b->size());
  }
  void Shape(const std::vector<int64_t>& shape) {
    meta.push_back(static_cast<int64_t>(shape.size()));
    meta.insert(meta.end(), shape.begin(), shape.end());
  }
};

std::shared_ptr<arrow::Buffer> VectorBuffer(const void* data, int64_t size) {
  return arrow::Buffer::FromString(std::string(static_cast<const char*>(data), size));
}

arrow::Status WriteAll(int fd, const void* data, int64_t size, XXH3_state_t* hash) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (hash != nullptr) XXH3_64bits_update(hash, p, static_cast<size_t>(size));
  while (size > 0) {
    const ssize_t n = ::write(fd, p, static_cast<size_t>(size));
    if (n < 0) {
      if (errno == EINTR) continue;
      return arrow::Status::IOError("cache write failed: ", std::strerror(errno));
    }
    p += n;
    size -= n;
  }
  return arrow::Status::OK();
}

// Reads metadata words with bounds checks.
class MetaReader {
 public:
  MetaReader(const int64_t* words, int64_t count, int64_t file_size)
      : words_(words), count_(count), file_size_(file_size) {}

  arrow::Result<int64_t> Next() {
    if (pos_ >= count_) return arrow::Status::Invalid("cache entry metadata is truncated");
    return words_[pos_++];
  }
  arrow::Result<int64_t> NextCount(int64_t max) {
    ARROW_ASSIGN_OR_RAISE(int64_t v, Next());
    if (v < 0 || v > max) return arrow::Status::Invalid("cache entry has a bad count ", v);
    return v;
  }
  arrow::Result<std::vector<int64_t>> NextShape() {
    ARROW_ASSIGN_OR_RAISE(int64_t nd, NextCount(32));
    std::vector<int64_t> shape(nd);
    for (auto& d : shape) {
      ARROW_ASSIGN_OR_RAISE(d, Next());
      if (d < -1 || d > kMaxBytes) return arrow::Status::Invalid("cache entry has a bad shape");
    }
    return shape;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> NextRef(const std::shared_ptr<arrow::Buffer>& file) {
    ARROW_ASSIGN_OR_RAISE(int64_t offset, Next());
    ARROW_ASSIGN_OR_RAISE(int64_t length, Next());
    if (offset == -1) return std::shared_ptr<arrow::Buffer>();
    if (offset < 0 || length < 0 || offset > file_size_ - kTrailerBytes ||
        length > file_size_ - kTrailerBytes - offset) {
      return arrow::Status::Invalid("cache entry references bytes outside the file");
    }
    // The writer aligns every buffer; typed reads of a misaligned one would be undefined
    // behaviour (found by fuzz_cache_entry).
    if (offset % kAlignment != 0) {
      return arrow::Status::Invalid("cache entry references a misaligned buffer");
    }
    return arrow::SliceBuffer(file, offset, length);
  }

 private:
  const int64_t* words_;
  int64_t count_;
  int64_t file_size_;
  int64_t pos_ = 0;
};

}  // namespace

arrow::Result<int64_t> WriteCacheEntry(int fd, const std::string& key,
                                       const SourceIdentity& source, const DecodedUnit& unit) {
  if (static_cast<int64_t>(key.size()) != kKeyBytes) {
    return arrow::Status::Invalid("cache keys have ", kKeyBytes, " characters, got '", key, "'");
  }
  const std::string source_text = source.Serialize();
  const auto source_bytes = static_cast<int64_t>(source_text.size());
  if (source_bytes > kMaxSourceIdentityBytes) {
    return arrow::Status::Invalid("the source identity of a cache entry is longer than ",
                                  kMaxSourceIdentityBytes, " bytes (path '", source.path, "')");
  }
  const int64_t meta_offset = MetaOffset(kCacheFormatVersion, source_bytes);
  Layout l;
  l.meta.push_back(unit.num_rows);
  l.meta.push_back(unit.skipped_rows);
  l.Ref(unit.row_ok.empty() ? nullptr : VectorBuffer(unit.row_ok.data(), unit.row_ok.size()));
  l.meta.push_back(static_cast<int64_t>(unit.columns.size()));
  for (const ColumnData& c : unit.columns) {
    l.meta.push_back(c.row_bytes);
    l.Shape(c.row_shape);
    l.Ref(c.data);
    l.Ref(c.offsets);
    l.meta.push_back(static_cast<int64_t>(c.samples.size()));
    for (const SampleTensor& s : c.samples) {
      l.meta.push_back(static_cast<int64_t>(s.dtype));
      l.meta.push_back(s.channels_first ? 1 : 0);
      l.Shape(s.shape);
      l.Ref(s.data);
    }
  }
  // The row-major block of small fixed-size columns (see WithRowMajor), if any.
  const RowMajorBlock* rm = unit.row_major.get();
  l.Ref(rm ? rm->data : nullptr);
  l.meta.push_back(rm ? rm->stride : 0);
  for (size_t c = 0; c < unit.columns.size(); ++c) l.meta.push_back(rm ? rm->offset[c] : -1);
  // Lay out the buffers after the metadata, each 64-byte aligned.
  const int64_t meta_bytes = static_cast<int64_t>(l.meta.size() * sizeof(int64_t));
  int64_t offset = AlignUp(meta_offset + meta_bytes);
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < l.buffers.size(); ++i) {
    offsets.push_back(offset);
    l.meta[l.ref_slots[i]] = offset;
    offset = AlignUp(offset + l.buffers[i]->size());
  }
  const int64_t total = offset + kTrailerBytes;

  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  auto finish = [&](arrow::Status st) -> arrow::Result<int64_t> {
    XXH3_freeState(hash);
    if (!st.ok()) return st;
    return total;
  };
  static const uint8_t kZeros[kAlignment] = {0};
  uint8_t header[kHeaderBytes];
  std::memcpy(header, kMagic, 8);
  const uint32_t version = kCacheFormatVersion, reserved = 0;
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &reserved, 4);
  std::memcpy(header + 16, &meta_bytes, 8);
  std::memcpy(header + 24, key.data(), kKeyBytes);
  arrow::Status st = WriteAll(fd, header, kHeaderBytes, hash);
  if (st.ok()) st = WriteAll(fd, &source_bytes, kSourceLengthBytes, hash);
  if (st.ok()) st = WriteAll(fd, source_text.data(), source_bytes, hash);
  if (st.ok()) {
    st = WriteAll(fd, kZeros, meta_offset - kHeaderBytes - kSourceLengthBytes - source_bytes, hash);
  }
  if (st.ok()) st = WriteAll(fd, l.meta.data(), meta_bytes, hash);
  int64_t written = meta_offset + meta_bytes;
  for (size_t i = 0; st.ok() && i < l.buffers.size(); ++i) {
    st = WriteAll(fd, kZeros, offsets[i] - written, hash);
    if (st.ok()) st = WriteAll(fd, l.buffers[i]->data(), l.buffers[i]->size(), hash);
    written = offsets[i] + l.buffers[i]->size();
  }
  if (st.ok()) st = WriteAll(fd, kZeros, offset - written, hash);
  if (!st.ok()) return finish(st);
  uint8_t trailer[kTrailerBytes];
  const uint64_t checksum = XXH3_64bits_digest(hash);
  std::memcpy(trailer, &checksum, 8);
  std::memcpy(trailer + 8, &total, 8);
  std::memcpy(trailer + 16, kEndMagic, 8);
  return finish(WriteAll(fd, trailer, kTrailerBytes, nullptr));
}

bool IsCacheEntryHeader(const uint8_t* head, int64_t n, const std::string& key) {
  if (n < kHeaderBytes || std::memcmp(head, kMagic, 8) != 0) return false;
  uint32_t version;
  std::memcpy(&version, head + 8, 4);
  if (version == 0) return false;
  if (version < 2) return true;  // format 1 entries did not store their key
  return static_cast<int64_t>(key.size()) == kKeyBytes &&
         std::memcmp(head + 24, key.data(), kKeyBytes) == 0;
}

std::string SourceIdentity::Serialize() const {
  // The path last: it runs to the end of the text (it may hold any byte but NUL).
  return std::string(kSourceFirstLine) + "size " + std::to_string(size) + "\nmtime_ns " +
         std::to_string(mtime_ns) + "\nfooter " + footer_hash + "\nrow_group " +
         std::to_string(row_group) + "\npath " + path;
}

arrow::Result<SourceIdentity> SourceIdentity::Parse(const std::string& text) {
  auto bad = [] { return arrow::Status::Invalid("malformed source identity in a cache entry"); };
  if (text.rfind(kSourceFirstLine, 0) != 0) return bad();
  SourceIdentity out;
  size_t pos = sizeof(kSourceFirstLine) - 1;
  auto field = [&](const char* name, std::string* value) {
    const std::string prefix = std::string(name) + " ";
    if (text.compare(pos, prefix.size(), prefix) != 0) return false;
    const size_t start = pos + prefix.size();
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) return false;
    *value = text.substr(start, end - start);
    pos = end + 1;
    return true;
  };
  std::string size, mtime, row_group;
  if (!field("size", &size) || !field("mtime_ns", &mtime) || !field("footer", &out.footer_hash) ||
      !field("row_group", &row_group) || !ParseDecimal(size, &out.size) ||
      !ParseDecimal(mtime, &out.mtime_ns) || !ParseDecimal(row_group, &out.row_group) ||
      text.compare(pos, 5, "path ") != 0) {
    return bad();
  }
  out.path = text.substr(pos + 5);
  if (out.path.empty() || out.path.find('\0') != std::string::npos) return bad();
  return out;
}

arrow::Result<CacheEntryHeader> ParseCacheEntryHeader(const uint8_t* head, int64_t n) {
  if (n < kHeaderBytes || std::memcmp(head, kMagic, 8) != 0) {
    return arrow::Status::Invalid("not a cache entry (no entry header)");
  }
  CacheEntryHeader h;
  std::memcpy(&h.version, head + 8, 4);
  if (h.version == 0) return arrow::Status::Invalid("not a cache entry (version 0)");
  if (h.version >= 2) h.key.assign(reinterpret_cast<const char*>(head) + 24, kKeyBytes);
  if (h.version >= 3) {
    int64_t source_bytes = -1;
    if (n >= kHeaderBytes + kSourceLengthBytes) {
      std::memcpy(&source_bytes, head + kHeaderBytes, kSourceLengthBytes);
    }
    if (source_bytes < 0 || source_bytes > kMaxSourceIdentityBytes ||
        n < kHeaderBytes + kSourceLengthBytes + source_bytes) {
      return arrow::Status::Invalid("cache entry header has no complete source identity");
    }
    ARROW_ASSIGN_OR_RAISE(
        h.source, SourceIdentity::Parse(std::string(
                      reinterpret_cast<const char*>(head) + kHeaderBytes + kSourceLengthBytes,
                      static_cast<size_t>(source_bytes))));
  }
  return h;
}

bool EntryChecksumMatches(const uint8_t* entry, int64_t size, uint64_t hash) {
  if (size < kTrailerBytes) return false;
  uint64_t stored;
  std::memcpy(&stored, entry + size - kTrailerBytes, 8);
  return stored == hash;
}

arrow::Result<std::shared_ptr<DecodedUnit>> ReadCacheEntry(
    const std::shared_ptr<arrow::Buffer>& file, const std::string& key,
    bool checksum_verified) {
  const int64_t size = file->size();
  const uint8_t* p = file->data();
  if (size < kHeaderBytes + kTrailerBytes || std::memcmp(p, kMagic, 8) != 0 ||
      std::memcmp(p + size - 8, kEndMagic, 8) != 0) {
    return arrow::Status::Invalid("not a complete cache entry (bad magic or truncated)");
  }
  uint32_t version;
  int64_t meta_bytes, length;
  uint64_t checksum;
  std::memcpy(&version, p + 8, 4);
  std::memcpy(&meta_bytes, p + 16, 8);
  std::memcpy(&checksum, p + size - kTrailerBytes, 8);
  std::memcpy(&length, p + size - 16, 8);
  if (version != kCacheFormatVersion) {
    return arrow::Status::Invalid("cache entry has format version ", version);
  }
  int64_t source_bytes = -1;
  if (size >= kHeaderBytes + kSourceLengthBytes) {
    std::memcpy(&source_bytes, p + kHeaderBytes, kSourceLengthBytes);
  }
  if (source_bytes < 0 || source_bytes > kMaxSourceIdentityBytes) {
    return arrow::Status::Invalid("cache entry has a bad source identity length");
  }
  const int64_t meta_offset = MetaOffset(version, source_bytes);
  // meta_bytes is checked against the room left, never added to an offset: a claimed
  // size near INT64_MAX must not overflow the check.
  if (length != size || meta_bytes < 0 || meta_bytes % 8 != 0 ||
      meta_offset > size - kTrailerBytes || meta_bytes > size - kTrailerBytes - meta_offset) {
    return arrow::Status::Invalid("cache entry length does not match its file");
  }
  if (!checksum_verified && XXH3_64bits(p, static_cast<size_t>(size - kTrailerBytes)) != checksum) {
    return arrow::Status::Invalid("cache entry checksum mismatch");
  }
  if (std::memcmp(p + 24, key.data(), std::min<size_t>(key.size(), kKeyBytes)) != 0 ||
      static_cast<int64_t>(key.size()) != kKeyBytes) {
    return arrow::Status::Invalid("cache entry belongs to another key");
  }
  std::vector<int64_t> words(meta_bytes / 8);
  if (meta_bytes > 0) std::memcpy(words.data(), p + meta_offset, meta_bytes);
  MetaReader m(words.data(), static_cast<int64_t>(words.size()), size);
  auto unit = std::make_shared<DecodedUnit>();
  ARROW_ASSIGN_OR_RAISE(unit->num_rows, m.NextCount(int64_t{1} << 40));
  ARROW_ASSIGN_OR_RAISE(unit->skipped_rows, m.NextCount(unit->num_rows));
  ARROW_ASSIGN_OR_RAISE(auto row_ok, m.NextRef(file));
  if (row_ok != nullptr) {
    if (row_ok->size() != unit->num_rows) return arrow::Status::Invalid("bad row mask size");
    unit->row_ok.assign(row_ok->data(), row_ok->data() + row_ok->size());
  }
  ARROW_ASSIGN_OR_RAISE(int64_t num_columns, m.NextCount(1 << 20));
  for (int64_t i = 0; i < num_columns; ++i) {
    ColumnData c;
    ARROW_ASSIGN_OR_RAISE(c.row_bytes, m.NextCount(kMaxBytes));
    ARROW_ASSIGN_OR_RAISE(c.row_shape, m.NextShape());
    ARROW_ASSIGN_OR_RAISE(c.data, m.NextRef(file));
    ARROW_ASSIGN_OR_RAISE(c.offsets, m.NextRef(file));
    if (c.offsets != nullptr) {
      if (c.offsets->size() != (unit->num_rows + 1) * 8 || c.data == nullptr) {
        return arrow::Status::Invalid("bad offsets size");
      }
      // Offsets index into data: non-decreasing and inside it (need not start at 0).
      const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
      if (off[0] < 0 || off[unit->num_rows] > c.data->size()) {
        return arrow::Status::Invalid("offsets outside the data");
      }
      for (int64_t r = 0; r < unit->num_rows; ++r) {
        if (off[r + 1] < off[r]) return arrow::Status::Invalid("decreasing offsets");
      }
    }
    int64_t data_bytes = 0;
    if (c.offsets == nullptr && c.data != nullptr &&
        (__builtin_mul_overflow(unit->num_rows, c.row_bytes, &data_bytes) ||
         c.data->size() != data_bytes)) {
      return arrow::Status::Invalid("bad data size");
    }
    ARROW_ASSIGN_OR_RAISE(int64_t num_samples, m.NextCount(unit->num_rows));
    if (num_samples != 0 && num_samples != unit->num_rows) {
      return arrow::Status::Invalid("cache entry has ", num_samples, " samples for ",
                                    unit->num_rows, " rows");
    }
    c.samples.resize(num_samples);
    for (auto& s : c.samples) {
      ARROW_ASSIGN_OR_RAISE(int64_t dtype, m.NextCount(static_cast<int64_t>(DType::kFloat64)));
      s.dtype = static_cast<DType>(dtype);
      ARROW_ASSIGN_OR_RAISE(int64_t chw, m.NextCount(1));
      s.channels_first = chw == 1;
      ARROW_ASSIGN_OR_RAISE(s.shape, m.NextShape());
      int64_t elements = 1;
      for (int64_t d : s.shape) {
        if (d < 0 || (d > 0 && elements > kMaxBytes / d)) {
          return arrow::Status::Invalid("bad sample shape");
        }
        elements *= d;
      }
      ARROW_ASSIGN_OR_RAISE(s.data, m.NextRef(file));
      if (s.data != nullptr && s.data->size() != s.num_elements() * DTypeSize(s.dtype)) {
        return arrow::Status::Invalid("bad sample size");
      }
    }
    unit->columns.push_back(std::move(c));
  }
  ARROW_ASSIGN_OR_RAISE(auto rm_data, m.NextRef(file));
  ARROW_ASSIGN_OR_RAISE(int64_t stride, m.NextCount(int64_t{1} << 30));
  auto rm = std::make_shared<RowMajorBlock>();
  rm->stride = stride;
  rm->data = rm_data;
  for (int64_t i = 0; i < num_columns; ++i) {
    ARROW_ASSIGN_OR_RAISE(int64_t offset, m.Next());
    rm->offset.push_back(offset);
    if (offset < 0) continue;
    const ColumnData& c = unit->columns[i];
    if (rm_data == nullptr || offset > stride || c.row_bytes > stride - offset ||
        c.row_bytes <= 0 || c.data != nullptr || c.offsets != nullptr || !c.samples.empty()) {
      return arrow::Status::Invalid("bad row-major layout");
    }
  }
  if (rm_data != nullptr) {
    int64_t rm_bytes = 0;
    if (__builtin_mul_overflow(unit->num_rows, stride, &rm_bytes) || rm_data->size() != rm_bytes) {
      return arrow::Status::Invalid("bad row-major size");
    }
    unit->row_major = std::move(rm);
  }
  for (int64_t i = 0; i < num_columns && unit->num_rows > 0; ++i) {
    const ColumnData& c = unit->columns[i];
    const bool in_block = unit->row_major != nullptr && unit->row_major->offset[i] >= 0;
    if (c.samples.empty() && c.offsets == nullptr && c.row_bytes > 0 && c.data == nullptr &&
        !in_block) {
      return arrow::Status::Invalid("cache entry column ", i, " has no data");
    }
  }
  return unit;
}

}  // namespace pqloader
