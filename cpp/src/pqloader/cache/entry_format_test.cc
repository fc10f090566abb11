#include "pqloader/cache/entry_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <random>

#include "pqloader/cache/split_cache.h"
#include "pqloader/test_util.h"
#include "pqloader/transform/op.h"

namespace pqloader {

namespace {

std::shared_ptr<arrow::Buffer> Bytes(const std::string& s) { return arrow::Buffer::FromString(s); }

// A unit with every kind of column: fixed tensor, offsets + bytes, samples, lengths, mask.
std::shared_ptr<DecodedUnit> SampleUnit() {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = 3;
  u->row_ok = {1, 0, 1};
  u->skipped_rows = 1;
  ColumnData fixed;
  fixed.row_shape = {2};
  fixed.row_bytes = 8;
  fixed.data = Bytes(std::string(24, 'a'));
  ColumnData var;
  var.data = Bytes("xxhelloworld");
  const int64_t off[] = {2, 7, 7, 12};
  var.offsets = Bytes(std::string(reinterpret_cast<const char*>(off), sizeof(off)));
  ColumnData samples;
  for (int i = 0; i < 3; ++i) {
    SampleTensor s;
    if (i != 1) {
      s.dtype = DType::kFloat32;
      s.shape = {2, 2};
      s.channels_first = i == 2;
      s.data = Bytes(std::string(16, static_cast<char>('0' + i)));
    }
    samples.samples.push_back(s);
  }
  u->columns = {fixed, var, samples};
  return u;
}

const std::string kKey = CacheKey("split 0");

SourceIdentity SampleSource() {
  return SourceIdentity{"/data/train/part-0.parquet", 12345, 1700000000123456789,
                        "0123456789abcdef0123456789abcdef", 7};
}

std::string WriteToFile(const DecodedUnit& u, const std::string& key = kKey,
                        const SourceIdentity& source = SampleSource()) {
  const std::string path = testing::MakeTempDir() + "/entry.pqc";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  EXPECT_GE(fd, 0);
  auto written = WriteCacheEntry(fd, key, source, u);
  EXPECT_TRUE(written.ok()) << written.status().ToString();
  ::close(fd);
  return path;
}

std::string ReadFile(const std::string& path) {
  std::string out;
  char buf[4096];
  const int fd = ::open(path.c_str(), O_RDONLY);
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

// Offset of the metadata words in a format 3 entry: after the header, the source
// identity's length and its bytes padded to 8.
int64_t MetaStart(const std::string& bytes) {
  int64_t source_bytes;
  std::memcpy(&source_bytes, bytes.data() + kCacheEntryHeaderBytes, 8);
  return kCacheEntryHeaderBytes + 8 + (source_bytes + 7) / 8 * 8;
}


// The index (in words from MetaStart) of the first run of metadata words equal to
// `pattern` (-1 for any word), or -1.
int64_t FindWords(const std::string& bytes, const std::vector<int64_t>& pattern) {
  const int64_t start = MetaStart(bytes);
  const int64_t words = (static_cast<int64_t>(bytes.size()) - start) / 8;
  for (int64_t i = 0; i + static_cast<int64_t>(pattern.size()) <= words; ++i) {
    bool match = true;
    for (size_t k = 0; k < pattern.size() && match; ++k) {
      int64_t w;
      std::memcpy(&w, bytes.data() + start + (i + k) * 8, 8);
      match = pattern[k] == -1 || w == pattern[k];
    }
    if (match) return i;
  }
  return -1;
}

void SetWord(std::string* bytes, int64_t index, int64_t value) {
  std::memcpy(&(*bytes)[MetaStart(*bytes) + index * 8], &value, 8);
}

// The message of reading `bytes` (checksum taken as verified), or "ok".
std::string ReadError(const std::string& bytes) {
  auto back = ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true);
  return back.ok() ? "ok" : back.status().message();
}
}  // namespace

TEST(CacheEntry, HeaderNamesTheEntrysSource) {
  const std::string bytes = ReadFile(WriteToFile(*SampleUnit()));
  auto head = ParseCacheEntryHeader(reinterpret_cast<const uint8_t*>(bytes.data()),
                                    static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->version, kCacheFormatVersion);
  EXPECT_EQ(head->key, kKey);
  ASSERT_TRUE(head->source.has_value());
  const SourceIdentity want = SampleSource();
  EXPECT_TRUE(head->source->SameFileVersion(want));
  EXPECT_EQ(head->source->row_group, 7);
  // A head cut inside the source identity is refused, not misread.
  EXPECT_FALSE(ParseCacheEntryHeader(reinterpret_cast<const uint8_t*>(bytes.data()),
                                     kCacheEntryHeaderBytes + 20).ok());
  EXPECT_TRUE(IsCacheEntryHeader(reinterpret_cast<const uint8_t*>(bytes.data()),
                                 kCacheEntryHeaderBytes, kKey));
}

TEST(CacheEntry, SourceIdentityRoundTripsAnyPath) {
  for (const std::string path : {"/a b/c\nd.parquet", "s3://bucket/key with spaces/x.parquet",
                                 "relative/path.parquet", "/p\xc3\xa9/\n"}) {
    SourceIdentity s{path, 1, -5, "", 0};
    auto back = SourceIdentity::Parse(s.Serialize());
    ASSERT_TRUE(back.ok()) << path;
    EXPECT_TRUE(back->SameFileVersion(s));
  }
  EXPECT_FALSE(SourceIdentity::Parse("").ok());
  EXPECT_FALSE(SourceIdentity::Parse("pqloader-source 1\nsize x\n").ok());
  SourceIdentity s = SampleSource();
  SourceIdentity other = s;
  other.mtime_ns += 1;
  EXPECT_FALSE(s.SameFileVersion(other));
  other = s;
  other.footer_hash[0] = 'f';
  EXPECT_FALSE(s.SameFileVersion(other));
  other = s;
  other.row_group = 3;  // another row group of the same file version
  EXPECT_TRUE(s.SameFileVersion(other));
}

TEST(CacheEntry, RoundTripsEveryColumnKind) {
  auto u = SampleUnit();
  const std::string bytes = ReadFile(WriteToFile(*u));
  const auto file = Bytes(bytes);
  auto back = ReadCacheEntry(file, kKey);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const DecodedUnit& b = **back;
  EXPECT_EQ(b.num_rows, 3);
  EXPECT_EQ(b.row_ok, u->row_ok);
  EXPECT_EQ(b.skipped_rows, 1);
  ASSERT_EQ(b.columns.size(), 3u);
  EXPECT_EQ(b.columns[0].data->ToString(), u->columns[0].data->ToString());
  EXPECT_EQ(b.columns[0].row_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(b.columns[1].data->ToString(), "xxhelloworld");
  EXPECT_EQ(b.columns[1].offsets->ToString(), u->columns[1].offsets->ToString());
  ASSERT_EQ(b.columns[2].samples.size(), 3u);
  EXPECT_EQ(b.columns[2].samples[0].data->ToString(), std::string(16, '0'));
  EXPECT_EQ(b.columns[2].samples[1].data, nullptr);
  EXPECT_TRUE(b.columns[2].samples[2].channels_first);
  // Buffers are views of the file's bytes, 64-byte aligned within it.
  const uint8_t* base = file->data();
  EXPECT_EQ((b.columns[0].data->data() - base) % 64, 0);
}

TEST(CacheEntry, EveryTruncationAndByteFlipIsRejected) {
  const std::string bytes = ReadFile(WriteToFile(*SampleUnit()));
  for (size_t n = 0; n < bytes.size(); n += 7) {
    EXPECT_FALSE(ReadCacheEntry(Bytes(bytes.substr(0, n)), kKey).ok()) << "truncated to " << n;
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 500; ++i) {
    std::string damaged = bytes;
    damaged[rng() % damaged.size()] ^= static_cast<char>(1 + rng() % 255);
    EXPECT_FALSE(ReadCacheEntry(Bytes(damaged), kKey).ok()) << "flip " << i;
  }
}

TEST(CacheEntry, AnEntryIsOnlyServedForItsOwnKey) {
  // Two valid entries swapped on disk (or copied by hand) must not serve wrong data.
  const std::string bytes = ReadFile(WriteToFile(*SampleUnit(), kKey));
  EXPECT_TRUE(ReadCacheEntry(Bytes(bytes), kKey).ok());
  auto other = ReadCacheEntry(Bytes(bytes), CacheKey("split 1"));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("another key"), std::string::npos);
}

// The columns of an entry as ReadCacheEntryColumns finds them in `bytes` (the file).
arrow::Result<std::optional<CacheEntryColumns>> ColumnsOf(const std::string& bytes,
                                                          const std::string& key = kKey) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto size = static_cast<int64_t>(bytes.size());
  if (size < kCacheEntryTrailerBytes) return arrow::Status::Invalid("short");
  ARROW_ASSIGN_OR_RAISE(int64_t head, CacheEntryHeadBytes(p, std::min<int64_t>(size, 4096), size));
  return ReadCacheEntryColumns(p, head, p + size - kCacheEntryTrailerBytes, size, key);
}

TEST(CacheEntry, APlainEntrysColumnsAreFoundFromItsHeadAndTrailer) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = 4;
  ColumnData a, b;
  a.row_bytes = 4;
  a.data = Bytes(std::string(16, 'a'));
  b.row_shape = {2, 3};
  b.row_bytes = 6;
  b.data = Bytes(std::string(24, 'b'));
  u->columns = {a, b};
  const std::string bytes = ReadFile(WriteToFile(*u));
  auto columns = ColumnsOf(bytes);
  ASSERT_TRUE(columns.ok()) << columns.status().ToString();
  ASSERT_TRUE(columns->has_value());
  const CacheEntryColumns& c = **columns;
  EXPECT_EQ(c.num_rows, 4);
  ASSERT_EQ(c.columns.size(), 2u);
  EXPECT_EQ(c.columns[1].row_shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(bytes.substr(c.columns[0].offset, c.columns[0].bytes), std::string(16, 'a'));
  EXPECT_EQ(bytes.substr(c.columns[1].offset, c.columns[1].bytes), std::string(24, 'b'));
  // Another key's entry, a head cut before the metadata, any truncation: Invalid.
  EXPECT_FALSE(ColumnsOf(bytes, CacheKey("split 1")).ok());
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const int64_t head = *CacheEntryHeadBytes(p, 4096, static_cast<int64_t>(bytes.size()));
  EXPECT_FALSE(ReadCacheEntryColumns(p, head - 8, p + bytes.size() - kCacheEntryTrailerBytes,
                                     static_cast<int64_t>(bytes.size()), kKey)
                   .ok());
  for (size_t n = 0; n < bytes.size(); n += 5) {
    EXPECT_FALSE(ColumnsOf(bytes.substr(0, n)).ok()) << "truncated to " << n;
  }
  // Entries that are not plain (masks, offsets, samples): none.
  auto other = ColumnsOf(ReadFile(WriteToFile(*SampleUnit())));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->has_value());
}

TEST(CacheEntry, RoundTripsARowMajorBlock) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = 3;
  for (int c = 0; c < 3; ++c) {
    ColumnData d;
    d.row_bytes = c == 0 ? 8 : 4;
    std::string v;
    for (int r = 0; r < 3; ++r) v += std::string(d.row_bytes, static_cast<char>('a' + 3 * c + r));
    d.data = Bytes(v);
    u->columns.push_back(d);
  }
  auto rm = WithRowMajor(u, 64, arrow::default_memory_pool()).ValueOrDie();
  ASSERT_NE(rm->row_major, nullptr);
  EXPECT_EQ(rm->row_major->stride, 16);
  const std::string bytes = ReadFile(WriteToFile(*rm));
  auto back = ReadCacheEntry(Bytes(bytes), kKey);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_NE((*back)->row_major, nullptr);
  EXPECT_EQ((*back)->row_major->offset, rm->row_major->offset);
  EXPECT_EQ((*back)->row_major->data->ToString(), rm->row_major->data->ToString());
  // Row 1: column 0 (8 bytes) then columns 1 and 2 (4 bytes each).
  EXPECT_EQ((*back)->row_major->data->ToString().substr(16, 16),
            std::string(8, 'b') + std::string(4, 'e') + std::string(4, 'h'));
  for (int c = 0; c < 3; ++c) EXPECT_EQ((*back)->columns[c].data, nullptr);
}

TEST(CacheEntry, OffsetsOutsideTheDataAreRejectedEvenWithAValidChecksum) {
  // A hostile writer can compute checksums: the layout itself is checked too.
  auto u = SampleUnit();
  const int64_t off[] = {2, 7, 100, 12};
  u->columns[1].offsets = Bytes(std::string(reinterpret_cast<const char*>(off), sizeof(off)));
  auto back = ReadCacheEntry(Bytes(ReadFile(WriteToFile(*u))), kKey);
  EXPECT_FALSE(back.ok());
  const int64_t decreasing[] = {2, 7, 5, 12};
  u->columns[1].offsets =
      Bytes(std::string(reinterpret_cast<const char*>(decreasing), sizeof(decreasing)));
  EXPECT_FALSE(ReadCacheEntry(Bytes(ReadFile(WriteToFile(*u))), kKey).ok());
  // Non-decreasing, but the last row ends one byte past the 12 bytes of data.
  const int64_t past_end[] = {2, 7, 7, 13};
  u->columns[1].offsets =
      Bytes(std::string(reinterpret_cast<const char*>(past_end), sizeof(past_end)));
  auto past = ReadCacheEntry(Bytes(ReadFile(WriteToFile(*u))), kKey);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("offsets outside the data"), std::string::npos)
      << past.status().ToString();
}

TEST(CacheEntry, MisalignedBuffersAreRejectedEvenWithAValidChecksum) {
  // Regression (fuzz_cache_entry): an entry whose ref points one byte past an aligned
  // offset made the reader load int64 offsets from a misaligned address.
  std::string bytes = ReadFile(WriteToFile(*SampleUnit()));
  ASSERT_TRUE(ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true).ok());
  const int64_t kRowOkOffsetWord = MetaStart(bytes) + 2 * 8;  // after num_rows, skipped
  int64_t offset;
  std::memcpy(&offset, bytes.data() + kRowOkOffsetWord, 8);
  ASSERT_EQ(offset % 64, 0);
  offset += 1;
  std::memcpy(&bytes[kRowOkOffsetWord], &offset, 8);
  auto back = ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("misaligned"), std::string::npos);
}

TEST(CacheEntry, AnEntryWithoutMetadataIsRejected) {
  // Regression (fuzz_cache_entry): metadata length 0 made the reader memcpy into the
  // null data() of an empty vector (undefined behaviour, caught by UBSan).
  std::string bytes = ReadFile(WriteToFile(*SampleUnit()));
  std::string empty = bytes.substr(0, MetaStart(bytes)) + bytes.substr(bytes.size() - 24);
  const int64_t zero = 0, total = static_cast<int64_t>(empty.size());
  std::memcpy(&empty[16], &zero, 8);                   // metadata length
  std::memcpy(&empty[empty.size() - 16], &total, 8);   // file length
  auto back = ReadCacheEntry(Bytes(empty), kKey, /*checksum_verified=*/true);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("metadata is truncated"), std::string::npos)
      << back.status().ToString();
}

TEST(CacheEntry, SizesThatOverflowAreRejected) {
  // Regression (fuzz_cache_entry): num_rows x row_bytes, each within its own bound,
  // overflowed int64 in the size check (undefined behaviour, caught by UBSan).
  DecodedUnit u;
  u.num_rows = 3;
  ColumnData fixed;
  fixed.row_shape = {2};
  fixed.row_bytes = 8;
  fixed.data = Bytes(std::string(24, 'a'));
  u.columns = {fixed};
  std::string bytes = ReadFile(WriteToFile(u));
  ASSERT_TRUE(ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true).ok());
  // Metadata words: num_rows, skipped_rows, ref(row_ok) x2, num_columns, row_bytes, ...
  const int64_t huge = int64_t{1} << 40;
  std::memcpy(&bytes[MetaStart(bytes) + 0 * 8], &huge, 8);
  std::memcpy(&bytes[MetaStart(bytes) + 5 * 8], &huge, 8);
  auto back = ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("bad data size"), std::string::npos)
      << back.status().ToString();
}

TEST(CacheEntry, AMetadataSizeNearTheInt64LimitIsRejected) {
  // Regression (fuzz_cache_entry in a clean-clone CI run): a header claiming
  // INT64_MAX - 7 metadata bytes overflowed the bounds check (undefined behaviour); in
  // a release build the sum wrapped negative, passed, and the reader tried to allocate
  // 2^60 words.
  DecodedUnit u;
  u.num_rows = 1;
  std::string bytes = ReadFile(WriteToFile(u));
  ASSERT_TRUE(ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true).ok());
  const int64_t huge = std::numeric_limits<int64_t>::max() - 7;
  std::memcpy(&bytes[16], &huge, 8);  // the header's metadata size
  auto back = ReadCacheEntry(Bytes(bytes), kKey, /*checksum_verified=*/true);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("does not match its file"), std::string::npos)
      << back.status().ToString();
}

TEST(CacheEntry, ColumnsThatDoNotMatchTheSpecsAreNeverGathered) {
  // Regression (fuzz_cache_entry): an entry whose float32[3] column had offsets (and a
  // 16 MB row size) passed the layout check, and the gather read far outside its data.
  ColumnSpec spec;
  spec.name = "x";
  spec.dtype = DType::kFloat32;
  spec.row_shape = {3};
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = 2;
  ColumnData ragged;
  ragged.row_shape = {3};
  ragged.row_bytes = 16777740;
  ragged.data = Bytes(std::string(36, 'x'));
  const int64_t off[] = {0, 12, 24};
  ragged.offsets = Bytes(std::string(reinterpret_cast<const char*>(off), sizeof(off)));
  unit->columns = {ragged};
  EXPECT_FALSE(CheckUnitLayout(*unit, {spec}).ok());
  const std::vector<RowRef> rows = {{0, 1}, {0, 0}};
  auto batch = AssembleBatch({spec}, {unit}, 0, rows, {}, arrow::default_memory_pool());
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.status().message().find("different lengths"), std::string::npos);
  // A fixed column of another shape than the spec's.
  ColumnData wide;
  wide.row_shape = {4};
  wide.row_bytes = 16;
  wide.data = Bytes(std::string(32, 'y'));
  unit->columns = {wide};
  auto st = CheckUnitLayout(*unit, {spec});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rows of shape (4,) for a column of shape (3,)"), std::string::npos)
      << st.ToString();
}

TEST(Ndarray, MutatedNpyBytesNeverCrash) {
  // np.save(np.arange(6, dtype='<i4').reshape(2, 3)) header + data, built by hand.
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  header.resize(118, ' ');
  header += '\n';
  std::string npy = std::string("\x93NUMPY\x01\x00", 8);
  npy += static_cast<char>(header.size() & 0xff);
  npy += static_cast<char>(header.size() >> 8);
  npy += header;
  for (int32_t i = 0; i < 6; ++i) npy.append(reinterpret_cast<const char*>(&i), 4);
  auto op = MakeOp("DecodeNdarray", {}).ValueOrDie();
  SampleTensor in;
  in.data = Bytes(npy);
  in.shape = {static_cast<int64_t>(npy.size())};
  auto ok = op->Apply(in, SampleContext{}, 0);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->shape, (std::vector<int64_t>{2, 3}));
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string m = npy.substr(0, rng() % (npy.size() + 1));
    if (!m.empty() && rng() % 2) m[rng() % m.size()] = static_cast<char>(rng());
    in.data = Bytes(m);
    in.shape = {static_cast<int64_t>(m.size())};
    (void)op->Apply(in, SampleContext{}, 0);  // must not crash; errors are fine
  }
}

TEST(CacheEntry, BufferSizesThatDisagreeWithTheLayoutAreRejectedEvenWithAValidChecksum) {
  // A hostile writer can compute checksums: each ref and size is checked against the
  // file and the layout, not only that the metadata words parse.
  const std::string bytes = ReadFile(WriteToFile(*SampleUnit()));
  ASSERT_EQ(ReadError(bytes), "ok");
  // The var column: data ref (offset, 12 bytes), offsets ref (offset, 4 x 8 bytes).
  const int64_t var = FindWords(bytes, {-1, 12, -1, 32});
  ASSERT_GE(var, 0);
  std::string bad = bytes;
  SetWord(&bad, var + 1, static_cast<int64_t>(bytes.size()));  // data past the file's end
  EXPECT_NE(ReadError(bad).find("outside the file"), std::string::npos) << ReadError(bad);
  bad = bytes;
  SetWord(&bad, var + 3, 8);  // one offset for three rows
  EXPECT_NE(ReadError(bad).find("bad offsets size"), std::string::npos) << ReadError(bad);
  // Sample 0: shape (2 dims: 2, 2), then its data ref (offset, 16 bytes of float32).
  const int64_t shape = FindWords(bytes, {2, 2, 2, -1, 16});
  ASSERT_GE(shape, 0);
  bad = bytes;
  SetWord(&bad, shape + 1, 4);  // 4 x 2 floats in 16 bytes
  EXPECT_NE(ReadError(bad).find("bad sample size"), std::string::npos) << ReadError(bad);
}

TEST(CacheEntry, ARowMajorColumnPastItsRowIsRejectedEvenWithAValidChecksum) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = 3;
  for (int c = 0; c < 3; ++c) {
    ColumnData d;
    d.row_bytes = c == 0 ? 8 : 4;
    d.data = Bytes(std::string(3 * d.row_bytes, static_cast<char>('a' + c)));
    u->columns.push_back(d);
  }
  auto rm = WithRowMajor(u, 64, arrow::default_memory_pool()).ValueOrDie();
  ASSERT_NE(rm->row_major, nullptr);
  const std::string bytes = ReadFile(WriteToFile(*rm));
  ASSERT_EQ(ReadError(bytes), "ok");
  // The block's stride (16), then each column's offset in a row: 0, 8, 12.
  const int64_t at = FindWords(bytes, {16, 0, 8, 12});
  ASSERT_GE(at, 0);
  std::string bad = bytes;
  SetWord(&bad, at + 3, 13);  // column 2's 4 bytes at 13..17 of a 16-byte row
  EXPECT_NE(ReadError(bad).find("bad row-major layout"), std::string::npos) << ReadError(bad);
}

}  // namespace pqloader
