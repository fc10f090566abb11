// DecodeNdarray (.npy bytes) and DecodeCompressedNdarray (.npz: a zip with one .npy,
// deflated or stored) to tensors in C order and native byte order.
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <vector>

#include "pqloader/error.h"
#include "pqloader/transform/op.h"

namespace pqloader {

namespace {

struct NpyHeader {
  DType dtype = DType::kUInt8;
  bool swap = false;  // big-endian data
  bool fortran = false;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;
};

// The header's Python dict literal: the text after `key` and its ':' ("" if absent).
std::string NpyValueAfter(const std::string& header, const char* key) {
  const size_t k = header.find(key);
  if (k == std::string::npos) return "";
  size_t v = header.find(':', k + std::strlen(key));
  if (v == std::string::npos) return "";
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  return header.substr(v);
}

// The magic and version of a .npy preamble: where the header text starts and its length.
arrow::Status ParseNpyPreamble(const uint8_t* p, int64_t n, int64_t* start, int64_t* header_len) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (n < 10 || std::memcmp(p, kMagic, 6) != 0) {
    return arrow::Status::Invalid("not a .npy array (bad magic)");
  }
  const int major = p[6];
  if (major == 1) {
    *header_len = p[8] | (p[9] << 8);
    *start = 10;
  } else if (major == 2 || major == 3) {
    if (n < 12) return arrow::Status::Invalid("truncated .npy header");
    *header_len = static_cast<int64_t>(p[8]) | (static_cast<int64_t>(p[9]) << 8) |
                  (static_cast<int64_t>(p[10]) << 16) | (static_cast<int64_t>(p[11]) << 24);
    *start = 12;
  } else {
    return arrow::Status::Invalid("unsupported .npy version ", major);
  }
  if (*start + *header_len > n) return arrow::Status::Invalid("truncated .npy header");
  return arrow::Status::OK();
}

// 'descr' of the header: the dtype and whether its bytes must be swapped.
arrow::Status ParseNpyDtype(const std::string& header, NpyHeader* h) {
  const std::string descr = NpyValueAfter(header, "'descr'");
  if (descr.size() < 5 || descr[0] != '\'') {
    return arrow::Status::Invalid("unsupported .npy dtype in header ", Printable(header));
  }
  const size_t close = descr.find('\'', 1);
  const std::string code = descr.substr(1, close == std::string::npos ? 0 : close - 1);
  auto unsupported = [&code] {
    return arrow::Status::Invalid("unsupported .npy dtype '", Printable(code),
                                  "' (bool, int8 to int64, uint8 to uint64, float16, float32 "
                                  "and float64 only)");
  };
  if (code.size() < 3 || std::string("<>|=").find(code[0]) == std::string::npos) {
    return unsupported();
  }
  const char order = code[0], kind = code[1];
  int size = 0;
  auto [ptr, ec] = std::from_chars(code.data() + 2, code.data() + code.size(), size);
  if (ec != std::errc() || ptr != code.data() + code.size()) return unsupported();
  struct Kind {
    char kind;
    int size;
    DType dtype;
  };
  static const Kind kKinds[] = {
      {'b', 1, DType::kBool},    {'i', 1, DType::kInt8},     {'i', 2, DType::kInt16},
      {'i', 4, DType::kInt32},   {'i', 8, DType::kInt64},    {'u', 1, DType::kUInt8},
      {'u', 2, DType::kUInt16},  {'u', 4, DType::kUInt32},   {'u', 8, DType::kUInt64},
      {'f', 2, DType::kFloat16}, {'f', 4, DType::kFloat32},  {'f', 8, DType::kFloat64}};
  for (const auto& k : kKinds) {
    if (k.kind == kind && k.size == size) {
      h->dtype = k.dtype;
      h->swap = order == '>' && size > 1;
      return arrow::Status::OK();
    }
  }
  return unsupported();
}

// 'shape' of the header: a tuple of non-negative integers.
arrow::Status ParseNpyShape(const std::string& header, std::vector<int64_t>* out) {
  const std::string shape = NpyValueAfter(header, "'shape'");
  const size_t end = shape.find(')');
  if (shape.empty() || shape[0] != '(' || end == std::string::npos) {
    return arrow::Status::Invalid("bad .npy header ", Printable(header));
  }
  size_t i = 1;
  while (i < end) {
    if (shape[i] == ' ' || shape[i] == ',') {
      ++i;
      continue;
    }
    int64_t d = 0;
    auto [ptr, ec] = std::from_chars(shape.data() + i, shape.data() + end, d);
    if (ec != std::errc() || d < 0) {
      return arrow::Status::Invalid("bad .npy shape in ", Printable(header));
    }
    out->push_back(d);
    i = static_cast<size_t>(ptr - shape.data());
  }
  return arrow::Status::OK();
}

arrow::Result<NpyHeader> ParseNpyHeader(const uint8_t* p, int64_t n) {
  int64_t start = 0, header_len = 0;
  ARROW_RETURN_NOT_OK(ParseNpyPreamble(p, n, &start, &header_len));
  const std::string header(reinterpret_cast<const char*>(p + start), header_len);
  NpyHeader h;
  h.data_offset = start + header_len;
  ARROW_RETURN_NOT_OK(ParseNpyDtype(header, &h));
  const std::string fortran = NpyValueAfter(header, "'fortran_order'");
  if (fortran.rfind("True", 0) == 0) {
    h.fortran = true;
  } else if (fortran.rfind("False", 0) != 0) {
    return arrow::Status::Invalid("bad .npy header ", Printable(header));
  }
  ARROW_RETURN_NOT_OK(ParseNpyShape(header, &h.shape));
  return h;
}

// The element count of `h`'s shape, or an error if its data would exceed `max_bytes`.
arrow::Result<int64_t> NpyCount(const NpyHeader& h, int64_t max_bytes, const char* what) {
  const int64_t elem = DTypeSize(h.dtype);
  int64_t count = 1;
  for (int64_t d : h.shape) {
    if (d != 0 && count > (max_bytes / elem) / d) {
      return arrow::Status::Invalid(what, ": shape ", ShapeToString(h.shape), " needs more than ",
                                    max_bytes, " bytes");
    }
    count *= d;
  }
  return count;
}

arrow::Result<SampleTensor> DecodeNpy(const uint8_t* p, int64_t n) {
  ARROW_ASSIGN_OR_RAISE(auto h, ParseNpyHeader(p, n));
  const int64_t elem = DTypeSize(h.dtype);
  // Check the header's shape against the bytes present before allocating anything.
  ARROW_ASSIGN_OR_RAISE(const int64_t count,
                        NpyCount(h, n, ".npy data is truncated (fewer bytes than its header says)"));
  if (h.data_offset + count * elem > n) {
    return arrow::Status::Invalid(".npy data is truncated: ", n - h.data_offset, " bytes for ",
                                  count, " elements of ", elem);
  }
  ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(h.dtype, h.shape));
  const uint8_t* src = p + h.data_offset;
  uint8_t* dst = out.data->mutable_data();
  if (!h.fortran || h.shape.size() < 2) {
    if (count > 0) std::memcpy(dst, src, count * elem);
  } else {
    // Fortran order: element (i0, i1, ...) is at sum(i_k * prod(shape[:k])).
    const size_t nd = h.shape.size();
    std::vector<int64_t> idx = h.shape;  // (a copy: gcc 12 misreports idx(nd, 0))
    std::fill(idx.begin(), idx.end(), 0);
    for (int64_t c = 0; c < count; ++c) {
      int64_t f = 0, stride = 1;
      for (size_t k = 0; k < nd; ++k) {
        f += idx[k] * stride;
        stride *= h.shape[k];
      }
      std::memcpy(dst + c * elem, src + f * elem, elem);
      for (size_t k = nd; k-- > 0;) {  // advance the C-order index
        if (++idx[k] < h.shape[k]) break;
        idx[k] = 0;
      }
    }
  }
  if (h.swap) {
    for (int64_t i = 0; i < count; ++i) std::reverse(dst + i * elem, dst + (i + 1) * elem);
  }
  return out;
}

uint32_t Le32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }
uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Decompressed .npz members are read only as far as their .npy header says, and never
// beyond these bounds: a small archive may inflate to any size (a "zip bomb").
constexpr int64_t kMaxNpyHeaderBytes = int64_t{1} << 20;
constexpr int64_t kMaxNdarrayBytes = int64_t{1} << 31;
constexpr int64_t kNpyPreambleBytes = 12;  // magic, version, header length (v2/v3)
constexpr int64_t kInflateStep = int64_t{1} << 16;

// Inflates a raw deflate stream into `out`, a little at a time.
class Inflater {
 public:
  Inflater() { std::memset(&z_, 0, sizeof(z_)); }
  ~Inflater() {
    if (initialized_) inflateEnd(&z_);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  arrow::Status Init(const uint8_t* p, int64_t n) {
    if (inflateInit2(&z_, -MAX_WBITS) != Z_OK) return arrow::Status::OutOfMemory("inflateInit failed");
    initialized_ = true;
    z_.next_in = const_cast<Bytef*>(p);
    z_.avail_in = static_cast<uInt>(std::min<int64_t>(n, std::numeric_limits<uInt>::max()));
    return arrow::Status::OK();
  }

  /// Inflate until `out` holds `target` bytes or the stream ends (then ended() is true).
  /// `out` grows geometrically with what actually comes out, not to `target` at once.
  arrow::Status InflateTo(std::vector<uint8_t>* out, int64_t target) {
    while (static_cast<int64_t>(out->size()) < target && !ended_) {
      const auto before = static_cast<int64_t>(out->size());
      const int64_t want = std::min<int64_t>(target, std::max<int64_t>(2 * before, kInflateStep));
      out->resize(static_cast<size_t>(want));
      z_.next_out = out->data() + before;
      z_.avail_out = static_cast<uInt>(want - before);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      out->resize(static_cast<size_t>(want - z_.avail_out));
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc == Z_BUF_ERROR) {
        return arrow::Status::Invalid("truncated .npz data");  // input used up
      } else if (rc != Z_OK) {
        return arrow::Status::Invalid("corrupt .npz data");
      }
    }
    return arrow::Status::OK();
  }
  bool ended() const { return ended_; }

 private:
  z_stream z_;
  bool initialized_ = false;
  bool ended_ = false;
};

// The CRC-32 of `n` bytes (zlib's crc32 takes at most 4 GiB at a time).
uint32_t Crc32(const uint8_t* p, int64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt k = static_cast<uInt>(std::min<int64_t>(n, int64_t{1} << 30));
    crc = crc32(crc, p, k);
    p += k;
    n -= k;
  }
  return static_cast<uint32_t>(crc);
}

// The first member's CRC-32 and sizes (-1: unknown): from its local header, where a
// size of 0xFFFFFFFF is in the zip64 extra field 0x0001 (uncompressed first, where both
// are), or from its central directory entry where the local header defers them to a data
// descriptor (general purpose bit 3: a zip written to a stream).
struct ZipMemberInfo {
  bool has_crc = false;
  uint32_t crc = 0;
  int64_t compressed = -1, uncompressed = -1;
};

ZipMemberInfo FirstMemberInfo(const uint8_t* p, int64_t n, int64_t end_record) {
  ZipMemberInfo m;
  auto size = [](uint32_t v) -> int64_t { return v == 0xFFFFFFFFu ? -1 : int64_t{v}; };
  if ((Le16(p + 6) & 0x08) != 0) {
    if (end_record < 0) return m;
    const int64_t cd = Le32(p + end_record + 16);
    if (cd + 46 > n || Le32(p + cd) != 0x02014b50) return m;
    m.has_crc = true;
    m.crc = Le32(p + cd + 16);
    m.compressed = size(Le32(p + cd + 20));
    m.uncompressed = size(Le32(p + cd + 24));
    return m;
  }
  m.has_crc = true;
  m.crc = Le32(p + 14);
  const uint32_t compressed = Le32(p + 18), uncompressed = Le32(p + 22);
  m.compressed = size(compressed);
  m.uncompressed = size(uncompressed);
  if (compressed != 0xFFFFFFFFu && uncompressed != 0xFFFFFFFFu) return m;
  const int64_t extra_begin = 30 + Le16(p + 26), extra_end = 30 + Le16(p + 26) + Le16(p + 28);
  for (int64_t at = extra_begin; at + 4 <= extra_end;) {
    const int64_t id = Le16(p + at), len = Le16(p + at + 2);
    if (at + 4 + len > extra_end) break;
    if (id == 0x0001) {
      int64_t field = at + 4;
      auto le64 = [&](int64_t f) -> int64_t {
        const uint64_t v = uint64_t{Le32(p + f)} | (uint64_t{Le32(p + f + 4)} << 32);
        return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1
                                                                              : static_cast<int64_t>(v);
      };
      if (uncompressed == 0xFFFFFFFFu && field + 8 <= at + 4 + len) {
        m.uncompressed = le64(field);
        field += 8;
      }
      if (compressed == 0xFFFFFFFFu && field + 8 <= at + 4 + len) m.compressed = le64(field);
      break;
    }
    at += 4 + len;
  }
  return m;
}

// zipfile's check, which np.load makes: a member that fails its CRC-32 is corrupt (a
// flipped bit in a stored member changed a value silently; raw deflate has no checksum
// of its own, so one in a deflated member could too).
arrow::Status CheckMemberCrc(const std::vector<uint8_t>& member, uint32_t want) {
  const uint32_t got = Crc32(member.data(), static_cast<int64_t>(member.size()));
  if (got != want) {
    return arrow::Status::Invalid("corrupt .npz archive: its array fails its CRC-32 check (",
                                  got, " for ", want, ")");
  }
  return arrow::Status::OK();
}

// Return the .npy bytes of the first member of a zip archive (local header; deflate or
// stored), inflating only the header and the data it declares.
arrow::Result<std::vector<uint8_t>> FirstZipMember(const uint8_t* p, int64_t n) {
  if (n < 30 || Le32(p) != 0x04034b50) return arrow::Status::Invalid("not a .npz (zip) archive");
  // One array only: numpy writes the count in the end record (a zip64 one says 0xFFFF);
  // the first of several was decoded silently (Petastorm's codec reads the one named arr).
  int64_t end_record = -1;
  for (int64_t at = n - 22; at >= 0 && at >= n - 22 - 65535; --at) {
    // The record's comment reaches the end exactly (a signature inside the comment is
    // not the record: zip readers check this too).
    if (Le32(p + at) == 0x06054b50 && at + 22 + Le16(p + at + 20) == n) {
      const uint16_t entries = Le16(p + at + 10);
      if (entries != 1 && entries != 0xFFFF) {
        return arrow::Status::Invalid(".npz archive holds ", entries,
                                      " arrays; DecodeCompressedNdarray decodes archives of one");
      }
      end_record = at;
      break;
    }
  }
  // Without its end record the archive is cut short (np.load refuses it: "File is not a
  // zip file"), and the count of its arrays is unknown: the first of two was taken.
  if (end_record < 0) {
    return arrow::Status::Invalid("truncated .npz archive (", n,
                                  " bytes): its end of central directory record is missing");
  }
  const uint16_t method = Le16(p + 8);
  const int64_t offset = 30 + Le16(p + 26) + Le16(p + 28);
  if (offset > n) return arrow::Status::Invalid("truncated .npz archive");
  const ZipMemberInfo info = FirstMemberInfo(p, n, end_record);
  std::vector<uint8_t> out;
  if (method == 0) {
    const int64_t size = info.compressed;
    if (size < 0 || size > n - offset) {
      return arrow::Status::Invalid("unsupported or truncated stored .npz member");
    }
    out.assign(p + offset, p + offset + size);
    if (info.has_crc) ARROW_RETURN_NOT_OK(CheckMemberCrc(out, info.crc));
    return out;
  }
  if (method != 8) return arrow::Status::Invalid("unsupported .npz compression method ", method);
  Inflater z;
  ARROW_RETURN_NOT_OK(z.Init(p + offset, n - offset));
  // The preamble gives the header's length, the header the data's.
  ARROW_RETURN_NOT_OK(z.InflateTo(&out, kNpyPreambleBytes));
  const int64_t header_start = !out.empty() && out[0] == 0x93 && out.size() > 6 && out[6] == 1
                                   ? 10 : kNpyPreambleBytes;
  if (static_cast<int64_t>(out.size()) < header_start) {
    return arrow::Status::Invalid("truncated .npy in .npz archive");
  }
  const int64_t header_len = header_start == 10 ? Le16(out.data() + 8) : Le32(out.data() + 8);
  if (header_len > kMaxNpyHeaderBytes) {
    return arrow::Status::Invalid(".npy header of ", header_len, " bytes in .npz archive (at most ",
                                  kMaxNpyHeaderBytes, ")");
  }
  const int64_t header_end = header_start + header_len;
  ARROW_RETURN_NOT_OK(z.InflateTo(&out, header_end));
  ARROW_ASSIGN_OR_RAISE(auto h, ParseNpyHeader(out.data(), static_cast<int64_t>(out.size())));
  ARROW_ASSIGN_OR_RAISE(
      const int64_t count,
      NpyCount(h, kMaxNdarrayBytes, ".npy array in .npz archive is too large"));
  const int64_t npy_size = h.data_offset + count * DTypeSize(h.dtype);
  ARROW_RETURN_NOT_OK(z.InflateTo(&out, npy_size));
  // A member that is exactly the array (as numpy writes every one) is inflated to its end,
  // at most one byte more, and its CRC-32 checked. One whose header declares more (or no
  // size) is read only as far as its array, as np.load reads it: a zip bomb stays bounded.
  if (info.has_crc && info.uncompressed == npy_size &&
      static_cast<int64_t>(out.size()) == npy_size) {
    ARROW_RETURN_NOT_OK(z.InflateTo(&out, npy_size + 1));
    if (!z.ended() || static_cast<int64_t>(out.size()) != npy_size) {
      return arrow::Status::Invalid("corrupt .npz archive: its array inflates past the ", npy_size,
                                    " bytes its header declares");
    }
    ARROW_RETURN_NOT_OK(CheckMemberCrc(out, info.crc));
  }
  return out;  // if the stream ended early, DecodeNpy reports the truncation
}

class DecodeNdarrayOp : public Op {
 public:
  explicit DecodeNdarrayOp(bool compressed) : compressed_(compressed) {}
  std::string ToString() const override {
    return compressed_ ? "DecodeCompressedNdarray()" : "DecodeNdarray()";
  }
  // "@v2": an .npz of several arrays is refused since the fortieth session (its first
  // array was decoded silently): entries written before may hold such rows' first array.
  // "@v3": a member failing its CRC-32, or an archive without its end record, is refused
  // (entries written before may hold such rows' altered or first array).
  std::string Fingerprint() const override {
    return compressed_ ? ToString() + "@v3" : ToString();
  }
  arrow::Status CheckInput(const SampleSignature& in) const override {
    return CheckEncodedInput(in, ToString());
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    if (in.dtype != DType::kUInt8 || in.shape.size() != 1) {
      return arrow::Status::Invalid(ToString(), " needs encoded bytes (a binary column)");
    }
    if (!compressed_) return DecodeNpy(in.data->data(), in.shape[0]);
    ARROW_ASSIGN_OR_RAISE(auto member, FirstZipMember(in.data->data(), in.shape[0]));
    return DecodeNpy(member.data(), static_cast<int64_t>(member.size()));
  }

 private:
  bool compressed_;
};

}  // namespace

arrow::Result<std::shared_ptr<const Op>> MakeDecodeNdarray(const OpParams&, bool compressed) {
  return std::make_shared<DecodeNdarrayOp>(compressed);
}

}  // namespace pqloader
