#include "pqloader/cache/entry_format.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <utility>
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

// Where a buffer lies in the entry file (offset -1: absent).
struct Ref {
  int64_t offset = -1;
  int64_t length = 0;
  bool present() const { return offset >= 0; }
};

struct SampleMeta {
  DType dtype = DType::kUInt8;
  bool channels_first = false;
  std::vector<int64_t> shape;
  Ref data;
};

struct ColumnMeta {
  int64_t row_bytes = 0;
  std::vector<int64_t> row_shape;
  Ref data, offsets;
  std::vector<SampleMeta> samples;
};

// An entry's metadata, every size and reference checked against the file's size (but
// not the bytes it references: row mask, offsets).
struct EntryMeta {
  int64_t num_rows = 0;
  int64_t skipped_rows = 0;
  Ref row_ok;
  std::vector<ColumnMeta> columns;
  Ref row_major;
  int64_t stride = 0;
  std::vector<int64_t> row_major_offset;
};

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
  arrow::Result<Ref> NextRef() {
    Ref r;
    ARROW_ASSIGN_OR_RAISE(r.offset, Next());
    ARROW_ASSIGN_OR_RAISE(r.length, Next());
    if (r.offset == -1) return Ref{};
    if (r.offset < 0 || r.length < 0 || r.offset > file_size_ - kTrailerBytes ||
        r.length > file_size_ - kTrailerBytes - r.offset) {
      return arrow::Status::Invalid("cache entry references bytes outside the file");
    }
    // The writer aligns every buffer; typed reads of a misaligned one would be undefined
    // behaviour (found by fuzz_cache_entry).
    if (r.offset % kAlignment != 0) {
      return arrow::Status::Invalid("cache entry references a misaligned buffer");
    }
    return r;
  }

 private:
  const int64_t* words_;
  int64_t count_;
  int64_t file_size_;
  int64_t pos_ = 0;
};

// Where the metadata of an entry of `size` bytes lies, from its first `n` bytes
// (`head`): the magic, format version, source identity length and metadata length
// checked against the room the file leaves.
arrow::Result<std::pair<int64_t, int64_t>> MetaAt(const uint8_t* head, int64_t n, int64_t size) {
  if (size < kHeaderBytes + kTrailerBytes || n < kHeaderBytes || std::memcmp(head, kMagic, 8) != 0) {
    return arrow::Status::Invalid("not a complete cache entry (bad magic or truncated)");
  }
  uint32_t version;
  int64_t meta_bytes;
  std::memcpy(&version, head + 8, 4);
  std::memcpy(&meta_bytes, head + 16, 8);
  if (version != kCacheFormatVersion) {
    return arrow::Status::Invalid("cache entry has format version ", version);
  }
  int64_t source_bytes = -1;
  if (n >= kHeaderBytes + kSourceLengthBytes) {
    std::memcpy(&source_bytes, head + kHeaderBytes, kSourceLengthBytes);
  }
  if (source_bytes < 0 || source_bytes > kMaxSourceIdentityBytes) {
    return arrow::Status::Invalid("cache entry has a bad source identity length");
  }
  const int64_t meta_offset = MetaOffset(version, source_bytes);
  // meta_bytes is checked against the room left, never added to an offset: a claimed
  // size near INT64_MAX must not overflow the check.
  if (meta_bytes < 0 || meta_bytes % 8 != 0 || meta_offset > size - kTrailerBytes ||
      meta_bytes > size - kTrailerBytes - meta_offset) {
    return arrow::Status::Invalid("cache entry length does not match its file");
  }
  return std::make_pair(meta_offset, meta_bytes);
}

// Check an entry's frame: its first `n` bytes (`head`) and its trailer (the last
// kTrailerBytes of a file of `size` bytes). Returns the metadata's offset and bytes.
arrow::Result<std::pair<int64_t, int64_t>> CheckFrame(const uint8_t* head, int64_t n,
                                                      const uint8_t* trailer, int64_t size) {
  if (size < kHeaderBytes + kTrailerBytes ||
      std::memcmp(trailer + kTrailerBytes - 8, kEndMagic, 8) != 0) {
    return arrow::Status::Invalid("not a complete cache entry (bad magic or truncated)");
  }
  ARROW_ASSIGN_OR_RAISE(auto meta_at, MetaAt(head, n, size));
  int64_t length;
  std::memcpy(&length, trailer + 8, 8);
  if (length != size) return arrow::Status::Invalid("cache entry length does not match its file");
  return meta_at;
}

arrow::Status CheckKey(const uint8_t* head, const std::string& key) {
  if (std::memcmp(head + 24, key.data(), std::min<size_t>(key.size(), kKeyBytes)) != 0 ||
      static_cast<int64_t>(key.size()) != kKeyBytes) {
    return arrow::Status::Invalid("cache entry belongs to another key");
  }
  return arrow::Status::OK();
}

// Parse the metadata words of an entry of `size` bytes.
arrow::Result<EntryMeta> ParseMeta(const int64_t* words, int64_t count, int64_t size) {
  MetaReader m(words, count, size);
  EntryMeta e;
  ARROW_ASSIGN_OR_RAISE(e.num_rows, m.NextCount(int64_t{1} << 40));
  ARROW_ASSIGN_OR_RAISE(e.skipped_rows, m.NextCount(e.num_rows));
  ARROW_ASSIGN_OR_RAISE(e.row_ok, m.NextRef());
  if (e.row_ok.present() && e.row_ok.length != e.num_rows) {
    return arrow::Status::Invalid("bad row mask size");
  }
  ARROW_ASSIGN_OR_RAISE(int64_t num_columns, m.NextCount(1 << 20));
  for (int64_t i = 0; i < num_columns; ++i) {
    ColumnMeta c;
    ARROW_ASSIGN_OR_RAISE(c.row_bytes, m.NextCount(kMaxBytes));
    ARROW_ASSIGN_OR_RAISE(c.row_shape, m.NextShape());
    ARROW_ASSIGN_OR_RAISE(c.data, m.NextRef());
    ARROW_ASSIGN_OR_RAISE(c.offsets, m.NextRef());
    if (c.offsets.present() && (c.offsets.length != (e.num_rows + 1) * 8 || !c.data.present())) {
      return arrow::Status::Invalid("bad offsets size");
    }
    int64_t data_bytes = 0;
    if (!c.offsets.present() && c.data.present() &&
        (__builtin_mul_overflow(e.num_rows, c.row_bytes, &data_bytes) ||
         c.data.length != data_bytes)) {
      return arrow::Status::Invalid("bad data size");
    }
    ARROW_ASSIGN_OR_RAISE(int64_t num_samples, m.NextCount(e.num_rows));
    if (num_samples != 0 && num_samples != e.num_rows) {
      return arrow::Status::Invalid("cache entry has ", num_samples, " samples for ", e.num_rows,
                                    " rows");
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
      ARROW_ASSIGN_OR_RAISE(s.data, m.NextRef());
      if (s.data.present() && s.data.length != elements * DTypeSize(s.dtype)) {
        return arrow::Status::Invalid("bad sample size");
      }
    }
    e.columns.push_back(std::move(c));
  }
  ARROW_ASSIGN_OR_RAISE(e.row_major, m.NextRef());
  ARROW_ASSIGN_OR_RAISE(e.stride, m.NextCount(int64_t{1} << 30));
  for (int64_t i = 0; i < num_columns; ++i) {
    ARROW_ASSIGN_OR_RAISE(int64_t offset, m.Next());
    e.row_major_offset.push_back(offset);
    if (offset < 0) continue;
    const ColumnMeta& c = e.columns[i];
    if (!e.row_major.present() || offset > e.stride || c.row_bytes > e.stride - offset ||
        c.row_bytes <= 0 || c.data.present() || c.offsets.present() || !c.samples.empty()) {
      return arrow::Status::Invalid("bad row-major layout");
    }
  }
  if (e.row_major.present()) {
    int64_t rm_bytes = 0;
    if (__builtin_mul_overflow(e.num_rows, e.stride, &rm_bytes) || e.row_major.length != rm_bytes) {
      return arrow::Status::Invalid("bad row-major size");
    }
  }
  for (int64_t i = 0; i < num_columns && e.num_rows > 0; ++i) {
    const ColumnMeta& c = e.columns[i];
    const bool in_block = e.row_major.present() && e.row_major_offset[i] >= 0;
    if (c.samples.empty() && !c.offsets.present() && c.row_bytes > 0 && !c.data.present() &&
        !in_block) {
      return arrow::Status::Invalid("cache entry column ", i, " has no data");
    }
  }
  return e;
}

// Parse the `meta_bytes` metadata bytes at `meta` of an entry of `size` bytes (copied
// into words first: the file's bytes need not be 8-byte aligned).
arrow::Result<EntryMeta> ParseMetaAt(const uint8_t* meta, int64_t meta_bytes, int64_t size) {
  std::vector<int64_t> words(meta_bytes / 8);
  if (meta_bytes > 0) std::memcpy(words.data(), meta, meta_bytes);
  return ParseMeta(words.data(), static_cast<int64_t>(words.size()), size);
}

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
  // Appended piece by piece (GCC 12 warns of a false out-of-bounds copy in the chain
  // of operator+ on temporaries).
  std::string out = kSourceFirstLine;
  out.append("size ").append(std::to_string(size));
  out.append("\nmtime_ns ").append(std::to_string(mtime_ns));
  out.append("\nfooter ").append(footer_hash);
  out.append("\nrow_group ").append(std::to_string(row_group));
  out.append("\npath ").append(path);
  return out;
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

bool CacheEntryTrailerMatches(const uint8_t* trailer, int64_t size) {
  int64_t length;
  std::memcpy(&length, trailer + 8, 8);
  return std::memcmp(trailer + kTrailerBytes - 8, kEndMagic, 8) == 0 && length == size;
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
  if (size < kHeaderBytes + kTrailerBytes) {
    return arrow::Status::Invalid("not a complete cache entry (bad magic or truncated)");
  }
  ARROW_ASSIGN_OR_RAISE(auto meta_at, CheckFrame(p, size, p + size - kTrailerBytes, size));
  const auto [meta_offset, meta_bytes] = meta_at;
  uint64_t checksum;
  std::memcpy(&checksum, p + size - kTrailerBytes, 8);
  if (!checksum_verified && XXH3_64bits(p, static_cast<size_t>(size - kTrailerBytes)) != checksum) {
    return arrow::Status::Invalid("cache entry checksum mismatch");
  }
  ARROW_RETURN_NOT_OK(CheckKey(p, key));
  ARROW_ASSIGN_OR_RAISE(EntryMeta e, ParseMetaAt(p + meta_offset, meta_bytes, size));
  auto slice = [&](const Ref& r) {
    return r.present() ? arrow::SliceBuffer(file, r.offset, r.length)
                       : std::shared_ptr<arrow::Buffer>();
  };
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = e.num_rows;
  unit->skipped_rows = e.skipped_rows;
  if (e.row_ok.present()) {
    unit->row_ok.assign(p + e.row_ok.offset, p + e.row_ok.offset + e.row_ok.length);
  }
  for (const ColumnMeta& m : e.columns) {
    ColumnData c;
    c.row_bytes = m.row_bytes;
    c.row_shape = m.row_shape;
    c.data = slice(m.data);
    c.offsets = slice(m.offsets);
    if (c.offsets != nullptr) {
      // Offsets index into data: non-decreasing and inside it (need not start at 0).
      const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
      if (off[0] < 0 || off[unit->num_rows] > c.data->size()) {
        return arrow::Status::Invalid("offsets outside the data");
      }
      for (int64_t r = 0; r < unit->num_rows; ++r) {
        if (off[r + 1] < off[r]) return arrow::Status::Invalid("decreasing offsets");
      }
    }
    c.samples.resize(m.samples.size());
    for (size_t i = 0; i < m.samples.size(); ++i) {
      SampleTensor& s = c.samples[i];
      s.dtype = m.samples[i].dtype;
      s.channels_first = m.samples[i].channels_first;
      s.shape = m.samples[i].shape;
      s.data = slice(m.samples[i].data);
    }
    unit->columns.push_back(std::move(c));
  }
  if (e.row_major.present()) {
    auto rm = std::make_shared<RowMajorBlock>();
    rm->stride = e.stride;
    rm->data = slice(e.row_major);
    rm->offset = e.row_major_offset;
    unit->row_major = std::move(rm);
  }
  return unit;
}

arrow::Result<int64_t> CacheEntryHeadBytes(const uint8_t* head, int64_t n, int64_t size) {
  if (n < kHeaderBytes + kSourceLengthBytes) {
    return arrow::Status::Invalid("not a complete cache entry (bad magic or truncated)");
  }
  ARROW_ASSIGN_OR_RAISE(auto meta_at, MetaAt(head, n, size));
  return meta_at.first + meta_at.second;
}

arrow::Result<std::optional<CacheEntryColumns>> ReadCacheEntryColumns(
    const uint8_t* head, int64_t n, const uint8_t* trailer, int64_t size,
    const std::string& key) {
  ARROW_ASSIGN_OR_RAISE(auto meta_at, CheckFrame(head, n, trailer, size));
  const auto [meta_offset, meta_bytes] = meta_at;
  if (n < meta_offset + meta_bytes) {
    return arrow::Status::Invalid("the head read of a cache entry ends before its metadata");
  }
  ARROW_RETURN_NOT_OK(CheckKey(head, key));
  ARROW_ASSIGN_OR_RAISE(EntryMeta e, ParseMetaAt(head + meta_offset, meta_bytes, size));
  if (e.row_ok.present() || e.row_major.present()) return std::nullopt;
  CacheEntryColumns out;
  out.num_rows = e.num_rows;
  for (const ColumnMeta& m : e.columns) {
    if (m.offsets.present() || !m.samples.empty() || m.row_bytes <= 0 || !m.data.present()) {
      return std::nullopt;
    }
    out.columns.push_back(CacheEntryColumns::Column{m.row_bytes, m.row_shape, m.data.offset,
                                                    m.data.length});
  }
  return out;
}

}  // namespace pqloader
