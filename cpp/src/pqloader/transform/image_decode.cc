// DecodeImage: JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng) to uint8 HWC.
#include <png.h>
#include <turbojpeg.h>

#include <cmath>
#include <csetjmp>
#include <cstring>
#include <vector>
#include <sstream>
#include <string>
#include <string_view>

#include "pqloader/error.h"
#include "pqloader/transform/op.h"
#include "pqloader/util/exact_text.h"

namespace pqloader {

namespace {

enum class ImageMode { kRGB, kGray };

// A JPEG is DCT-scaled for a Resize to s only to a shorter side of at least 1.25 s. A
// scaled decode that lands on s itself is the decoder's low-pass alone, not Resize's
// antialiased bilinear: mean |diff| against a full decode + Resize up to 2.6 on the
// tested photographs, against at most 1.36 with the margin (docs/design.md, "DCT scaling").
constexpr tjscalingfactor kDctScaleMargin = {5, 4};
// Nor for a Resize to under 128 pixels: at 1/4 and 1/8 scale and targets of 32-96 the
// margin was not enough (mean |diff| 1.54-2.2 on photographs a helper tried).
constexpr int64_t kMinDctScaleTarget = 128;

bool IsJpeg(const uint8_t* p, int64_t n) { return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF; }
bool IsPng(const uint8_t* p, int64_t n) {
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return n >= 8 && std::memcmp(p, kSig, 8) == 0;
}

// What encoded bytes that are neither JPEG nor PNG are, by their leading bytes ("" if
// unknown), for the refusal, which otherwise gave only a size.
std::string OtherImageFormat(const uint8_t* p, int64_t n) {
  auto starts = [&](const char* magic, int64_t k) {
    return n >= k && std::memcmp(p, magic, static_cast<size_t>(k)) == 0;
  };
  if (starts("II*\0", 4) || starts("MM\0*", 4)) {
    return "; it is a TIFF image: Hugging Face's Image feature writes a PIL image of a mode "
           "other than 1, L, LA, RGB and RGBA (P, I, F, I;16, CMYK) as TIFF";
  }
  if (n >= 12 && starts("RIFF", 4) && std::memcmp(p + 8, "WEBP", 4) == 0) {
    return "; it is a WebP image";
  }
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return "; it is a GIF image";
  if (n >= 26 && starts("BM", 2)) return "; it looks like a BMP image";
  return "";
}

// PIL's RGB → L conversion (ITU-R 601-2 luma, 16-bit fixed point, rounded).
void RgbToGray(const uint8_t* rgb, int64_t pixels, uint8_t* gray) {
  for (int64_t i = 0; i < pixels; ++i) {
    const uint32_t r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
    gray[i] = static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
  }
}

// PIL's CMYK JPEG → RGB: PIL reads a CMYK JPEG as Adobe's inverted CMYK (rawmode
// "CMYK;I": ink = 255 - the decoded value; Photoshop writes them so, and so do PIL and
// libjpeg-turbo), then converts with cmyk2rgb: nk = 255 - K, out = nk - MULDIV255(ink, nk)
// per channel, MULDIV255(a, b) = ((t >> 8) + t) >> 8 with t = a * b + 128. `cmyk` holds
// libjpeg's decoded values (YCCK files already converted to CMYK by libjpeg).
void InvertedCmykToRgb(const uint8_t* cmyk, int64_t pixels, uint8_t* rgb) {
  for (int64_t i = 0; i < pixels; ++i) {
    const uint32_t nk = cmyk[4 * i + 3];  // 255 - K, K = 255 - the decoded value
    for (int c = 0; c < 3; ++c) {
      const uint32_t t = (255u - cmyk[4 * i + c]) * nk + 128;
      rgb[3 * i + c] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
    }
  }
}

// The orientation (1-8) in an EXIF block `t` of `tn` bytes (a TIFF structure: byte
// order, 42, the offset of IFD0): IFD0's tag 0x0112, a SHORT; 1 when it is missing or
// cannot be read. The bytes are untrusted: every read is bounds-checked, and a malformed
// block counts as a missing one.
int TiffOrientation(const uint8_t* t, int64_t tn) {
  if (tn < 8) return 1;
  const bool little = t[0] == 'I' && t[1] == 'I';
  if (!little && !(t[0] == 'M' && t[1] == 'M')) return 1;
  auto u16 = [&](int64_t at) -> uint32_t {
    return little ? t[at] | (t[at + 1] << 8) : (t[at] << 8) | t[at + 1];
  };
  auto u32 = [&](int64_t at) -> uint32_t {
    return little ? u16(at) | (u16(at + 2) << 16) : (u16(at) << 16) | u16(at + 2);
  };
  if (u16(2) != 42) return 1;
  const int64_t ifd = u32(4);
  if (ifd < 8 || ifd + 2 > tn) return 1;
  const int64_t entries = u16(ifd);
  for (int64_t e = 0; e < entries; ++e) {
    const int64_t at = ifd + 2 + 12 * e;
    if (at + 12 > tn) return 1;
    if (u16(at) == 0x0112) {
      const uint32_t value = u16(at + 2) == 3 ? u16(at + 8) : 0;  // SHORT, inline
      return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
    }
  }
  return 1;
}

// The EXIF orientation of a JPEG: in its first APP1 "Exif" segment before the image data.
int JpegExifOrientation(const uint8_t* p, int64_t n) {
  int64_t i = 2;  // after SOI
  while (i + 4 <= n) {
    if (p[i] != 0xFF) {  // stray bytes between markers: libjpeg and PIL skip them
      ++i;
      continue;
    }
    const uint8_t marker = p[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return 1;  // image data or end: no EXIF before it
    const int64_t len = (int64_t{p[i + 2]} << 8) | p[i + 3];
    if (len < 2 || i + 2 + len > n) return 1;
    const uint8_t* seg = p + i + 4;
    const int64_t seg_len = len - 2;
    if (marker == 0xE1 && seg_len >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      return TiffOrientation(seg + 6, seg_len - 6);
    }
    i += 2 + len;
  }
  return 1;
}

// The EXIF orientation of a PNG's eXIf chunk (a TIFF block; libpng drops a chunk that
// does not start with one).
int PngExifOrientation(const std::vector<uint8_t>& exif) {
  return TiffOrientation(exif.data(), static_cast<int64_t>(exif.size()));
}

// `img` (H x W x C) turned upright for EXIF orientation `o`, as PIL's
// ImageOps.exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90
// clockwise, 7 transverse, 8 rotate 90 counter-clockwise. A DCT-scaled decode's full size
// is turned with it. Resize maps a scaled image's pixels from its top-left corner, where
// the rounded-up last row and column are partly outside the image: turned, they would
// come first, so a JPEG to be turned is scaled only by a factor dividing both its sides
// (photographs' sides are multiples of 8 or 16 as a rule). PNGs are never scaled.
arrow::Result<SampleTensor> Orient(SampleTensor img, int o) {
  if (o <= 1) return img;
  const int64_t h = img.shape[0], w = img.shape[1], c = img.shape[2];
  const bool transposed = o >= 5;
  const int64_t oh = transposed ? w : h, ow = transposed ? h : w;
  ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(DType::kUInt8, {oh, ow, c}));
  const uint8_t* src = img.data->data();
  uint8_t* dst = out.data->mutable_data();
  for (int64_t y = 0; y < oh; ++y) {
    for (int64_t x = 0; x < ow; ++x) {
      int64_t sy = y, sx = x;
      switch (o) {
        case 2: sx = w - 1 - x; break;
        case 3: sy = h - 1 - y; sx = w - 1 - x; break;
        case 4: sy = h - 1 - y; break;
        case 5: sy = x; sx = y; break;
        case 6: sy = h - 1 - x; sx = y; break;
        case 7: sy = h - 1 - x; sx = w - 1 - y; break;
        default: sy = x; sx = w - 1 - y; break;  // 8
      }
      const uint8_t* from = src + (sy * w + sx) * c;
      uint8_t* to = dst + (y * ow + x) * c;
      for (int64_t k = 0; k < c; ++k) to[k] = from[k];
    }
  }
  out.full_height = transposed ? img.full_width : img.full_height;
  out.full_width = transposed ? img.full_height : img.full_width;
  out.decode_scale = img.decode_scale;
  return out;
}

// A TurboJPEG decompressor, one per image. Never reused: libjpeg keeps the Huffman (DHT)
// and quantization (DQT) tables of one image for the next on purpose (abbreviated
// streams), so a file lacking them (a Motion-JPEG frame implies the standard Huffman
// tables; libjpeg-turbo fills those only into empty slots) was decoded with the tables
// of whatever JPEG the thread decoded before: pixels that depended on the order, the
// threads, a filter or a resume point. And after a failed tjDecompressHeader3 TurboJPEG
// 2.x leaves it mid-header, with the failed image's component table, on top of which the
// next image was parsed: a heap overflow (issue 12, item 1). A fresh one costs ~1 us
// against a decode's ~1 ms.
class TjHandle {
 public:
  TjHandle() : h_(tjInitDecompress()) {}
  ~TjHandle() {
    if (h_) tjDestroy(h_);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle get() const { return h_; }

 private:
  tjhandle h_;
};

// Decode with the fresh decompressor `h`.
arrow::Result<SampleTensor> DecodeJpegWith(tjhandle h, const uint8_t* data, int64_t size,
                                           ImageMode mode, int64_t min_short_side,
                                           bool exact_scale);

// `exact_scale`: DCT-scale only by a factor that divides both sides (see Orient).
arrow::Result<SampleTensor> DecodeJpeg(const uint8_t* data, int64_t size, ImageMode mode,
                                       int64_t min_short_side, bool exact_scale = false) {
  TjHandle handle;
  if (handle.get() == nullptr) return arrow::Status::OutOfMemory("cannot create a JPEG decoder");
  return DecodeJpegWith(handle.get(), data, size, mode, min_short_side, exact_scale);
}

// Whether TurboJPEG's message is one of libjpeg's warnings (JWRN_* of jerror.h) that
// PIL decodes through. TurboJPEG reports TJERR_WARNING once any warning was emitted,
// also when a fatal error followed it (a truncated progressive file warns of its
// premature end, then fails on the bogus scan after it, leaving the output unwritten):
// the message, a fatal error's where one came, tells them apart. A premature end of the
// file is not taken: the data is truncated. The message is the first warning otherwise
// (libjpeg shows only that one), so a premature end after a harmless warning is not in
// it: see JpegReachesEoi.
bool HarmlessJpegWarning(tjhandle h) {
  if (tjGetErrorCode(h) != TJERR_WARNING) return false;
  const std::string msg = tjGetErrorStr2(h);
  static constexpr const char* kWarnings[] = {
      "Corrupt JPEG data:",  // extraneous bytes, bad Huffman/arithmetic code, a resync
      "Inconsistent progression sequence",
      "Unknown Adobe color transform code",
      "unknown JFIF revision number",
      "Invalid SOS parameters for sequential JPEG",
  };
  for (const char* w : kWarnings) {
    if (msg.find(w) != std::string::npos) return true;
  }
  return false;
}

// Whether the JPEG stream reaches its EOI marker within `n` bytes, as libjpeg reads it:
// marker segments skipped by their length (an EXIF thumbnail's EOI inside APP1 does not
// count), entropy-coded data and stray bytes scanned for the next marker (FF00 stuffing,
// RSTn, TEM and fill bytes are no markers). A file whose first warning is harmless
// (stray bytes between header markers) and which is then cut short warns of its
// "Premature end" unseen, and libjpeg fills its missing rows with gray: this tells it.
bool JpegReachesEoi(const uint8_t* p, int64_t n) {
  int64_t i = 2;  // after SOI
  while (i < n) {
    if (p[i] != 0xFF) {
      ++i;
      continue;
    }
    if (i + 1 >= n) return false;
    const uint8_t m = p[i + 1];
    if (m == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // stuffing, TEM, RSTn
      i += 2;
      continue;
    }
    if (m == 0xD9) return true;
    if (i + 4 > n) return false;
    const int64_t len = (int64_t{p[i + 2]} << 8) | p[i + 3];
    if (len < 2) return false;
    i += 2 + len;
  }
  return false;
}

// Whether the JPEG's marker segments run past its `n` bytes before its image data (SOS):
// a file cut inside its header, or a segment length past the end. (libjpeg then reports
// no error, only a size of 0x0.)
bool JpegHeaderRunsPastEnd(const uint8_t* p, int64_t n) {
  int64_t i = 2;  // after SOI
  while (i < n) {
    if (p[i] != 0xFF) {  // stray bytes: skipped, as libjpeg does
      ++i;
      continue;
    }
    if (i + 1 >= n) return true;
    const uint8_t m = p[i + 1];
    if (m == 0xFF) {
      ++i;
      continue;
    }
    if (m == 0xDA || m == 0xD9) return false;  // the image data, or the end, is there
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
      i += 2;
      continue;
    }
    if (i + 4 > n) return true;
    const int64_t len = (int64_t{p[i + 2]} << 8) | p[i + 3];
    if (len < 2) return false;
    if (i + 2 + len > n) return true;
    i += 2 + len;
  }
  return true;
}

arrow::Result<SampleTensor> DecodeJpegWith(tjhandle h, const uint8_t* data, int64_t size,
                                           ImageMode mode, int64_t min_short_side,
                                           bool exact_scale) {
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    // A warning (extraneous bytes between markers, as PIL accepts them) comes after the
    // whole header was read: decoded on. So does a sampling TurboJPEG 2.x has no name for
    // (a CMYK file whose first component alone is subsampled, as Pillow writes them): it
    // reads the size and colour space and ends the decompression cleanly before that
    // error, and tjDecompress2 reads the header anew without naming it (3.x reports
    // TJSAMP_UNKNOWN instead). Any other error is the header's end.
    const bool unnamed_sampling = std::string_view(tjGetErrorStr2(h)).find(
                                      "Could not determine subsampling type") !=
                                  std::string_view::npos;
    if (!HarmlessJpegWarning(h) && !unnamed_sampling) {
      const std::string_view why = tjGetErrorStr2(h);
      // A valid file libjpeg-turbo does not decode (12-bit, lossless, hierarchical); not
      // "Unsupported marker type", a corrupt header's stray byte.
      const bool unsupported = why.substr(0, 16) == "Unsupported JPEG" ||
                               why.substr(0, 28) == "Unsupported color conversion";
      return arrow::Status::Invalid(unsupported ? "unsupported JPEG: " : "corrupt JPEG header: ", why);
    }
  }
  if (width <= 0 || height <= 0) {
    if (JpegHeaderRunsPastEnd(data, size)) {
      return arrow::Status::Invalid("corrupt JPEG header: the file ends inside its header (",
                                    size, " bytes: cut short, or a segment length past its end)");
    }
    return arrow::Status::Invalid("corrupt JPEG header: image of ", width, "x", height);
  }
  // CMYK and YCCK files (prepress photographs, ~20 of ImageNet's) are decoded to CMYK
  // and converted as PIL converts them.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  // Gray from a colour file: decoded to RGB and converted with PIL's "L" weights, as PIL
  // does. TurboJPEG's gray output is the luma channel as stored (no chroma upsampling,
  // no clamping of the RGB): up to 13-28 levels off PIL on 4:2:0 files.
  const bool via_rgb = mode == ImageMode::kGray && !cmyk && colorspace != TJCS_GRAY;
  // DCT scaling: the smallest scale whose shorter side still reaches kDctScaleMargin x
  // min_short_side, among 1/2, 1/4 and 1/8: libjpeg-turbo has SIMD code for those only
  // (a 6/8 decode of a 500x375 photograph takes 1.5x as long as a full one).
  tjscalingfactor chosen = {1, 1};
  if (min_short_side >= kMinDctScaleTarget) {
    int n = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&n);
    for (int i = 0; i < n; ++i) {
      const tjscalingfactor f = factors[i];
      if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8)) continue;
      if (exact_scale && (width % f.denom != 0 || height % f.denom != 0)) continue;
      const int64_t sw = TJSCALED(width, f), sh = TJSCALED(height, f);
      const bool better = static_cast<int64_t>(f.num) * chosen.denom <
                          static_cast<int64_t>(chosen.num) * f.denom;
      if (std::min(sw, sh) * kDctScaleMargin.denom >= min_short_side * kDctScaleMargin.num &&
          better) {
        chosen = f;
      }
    }
  }
  const int64_t w = TJSCALED(width, chosen), hgt = TJSCALED(height, chosen);
  const int64_t channels = mode == ImageMode::kGray ? 1 : 3;
  if (w * hgt * (cmyk ? 4 : via_rgb ? 3 : channels) > kMaxImageBytes) {
    return arrow::Status::Invalid("JPEG image of ", width, "x", height, " is too large");
  }
  // A progressive JPEG's decoder holds every DCT coefficient of the full-size image
  // (2 bytes per sample of each component in the file), whatever the scaling: a header
  // claiming 65444x64223 made libjpeg-turbo take 6+ GB (make fuzz). The header does not
  // say whether the file is progressive, so the full size is bounded for all.
  const int64_t file_components = colorspace == TJCS_GRAY ? 1 : cmyk ? 4 : 3;
  if (int64_t{width} * height * file_components * 2 > kMaxImageBytes) {
    return arrow::Status::Invalid("JPEG image of ", width, "x", height,
                                  " is too large (its full-size coefficients exceed 2 GiB)");
  }
  ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(DType::kUInt8, {hgt, w, channels}));
  if (chosen.num != chosen.denom) {
    out.full_height = height;
    out.full_width = width;
    out.decode_scale = static_cast<double>(chosen.num) / chosen.denom;
  }
  // CMYK: decoded into `ink`, gray of a colour file into `rgb`; then converted into `out`.
  std::vector<uint8_t> ink(cmyk ? static_cast<size_t>(w * hgt * 4) : 0);
  std::vector<uint8_t> rgb(via_rgb ? static_cast<size_t>(w * hgt * 3) : 0);
  const int format = cmyk      ? TJPF_CMYK
                     : via_rgb ? TJPF_RGB
                     : mode == ImageMode::kGray ? TJPF_GRAY
                                                : TJPF_RGB;
  uint8_t* into = cmyk ? ink.data() : via_rgb ? rgb.data() : out.data->mutable_data();
  // TJFLAG_LIMITSCANS: a progressive file of thousands of scans (a 57 KB one took 5-10 s
  // to decode, growing with its size) is refused rather than decoded; real files have
  // at most tens.
  if (tjDecompress2(h, data, static_cast<unsigned long>(size), into, static_cast<int>(w), 0,
                    static_cast<int>(hgt), format, TJFLAG_LIMITSCANS) != 0) {
    if (!HarmlessJpegWarning(h)) {
      return arrow::Status::Invalid("corrupt JPEG data: ", tjGetErrorStr2(h));
    }
    if (!JpegReachesEoi(data, size)) {  // (the first warning hides a premature end)
      return arrow::Status::Invalid("corrupt JPEG data: Premature end of JPEG file (after: ",
                                    tjGetErrorStr2(h), ")");
    }
  }
  uint8_t* dst = out.data->mutable_data();
  if (cmyk) {
    if (mode == ImageMode::kGray) {  // PIL: CMYK → RGB → L
      std::vector<uint8_t> from_ink(static_cast<size_t>(w * hgt * 3));
      InvertedCmykToRgb(ink.data(), w * hgt, from_ink.data());
      RgbToGray(from_ink.data(), w * hgt, dst);
    } else {
      InvertedCmykToRgb(ink.data(), w * hgt, dst);
    }
  } else if (via_rgb) {
    RgbToGray(rgb.data(), w * hgt, dst);
  }
  return out;
}

struct PngErrorState {
  std::jmp_buf jump;
  char message[512] = {0};
  char warning[200] = {0};  // libpng's last warning: the reason some errors leave out
};

void PngError(png_structp png, png_const_charp msg) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  // ("Invalid IHDR data" says why only in the warning before it: "Image width is zero
  // in IHDR", ...)
  if (state->warning[0] != '\0') {
    std::snprintf(state->message, sizeof(state->message), "%s (libpng's last warning: %s)", msg,
                  state->warning);
  } else {
    std::snprintf(state->message, sizeof(state->message), "%s", msg);
  }
  std::longjmp(state->jump, 1);
}
void PngWarning(png_structp png, png_const_charp msg) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  std::snprintf(state->warning, sizeof(state->warning), "%s", msg);
}

struct PngSource {
  const uint8_t* data;
  int64_t size;
  int64_t pos;
  bool ran_out = false;  // a read past the end (the file is cut)
};

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->pos + static_cast<int64_t>(n) > src->size) {
    src->ran_out = true;
    png_error(png, "unexpected end of PNG data");
  }
  std::memcpy(out, src->data + src->pos, n);
  src->pos += static_cast<int64_t>(n);
}

// The state of one PNG decode. Everything the setjmp'd part writes lives here, behind a
// pointer, and not in that function's locals: after png_error's longjmp, non-volatile
// locals modified since setjmp have indeterminate values.
struct PngDecode {
  PngErrorState error;
  PngSource source{nullptr, 0, 0};
  png_structp png = nullptr;
  png_infop info = nullptr;
  bool direct_gray = false;
  int64_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> exif;  // the eXIf chunk, when asked for (`want_exif`)
  bool want_exif = false;
  bool pixels_read = false;  // every row decoded: an error after this is in the file's tail
  bool too_large = false;    // over kMaxImageBytes of pixels
  std::vector<uint8_t> pixels;  // only gray of a colour PNG: its RGB, converted after
  std::vector<png_bytep> rows;

  PngDecode() = default;
  PngDecode(const PngDecode&) = delete;
  PngDecode& operator=(const PngDecode&) = delete;
  ~PngDecode() {
    if (png != nullptr) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

// Run libpng on d->source up to the image data: the size, channels and (when asked) an
// eXIf chunk before the data; false after a libpng error (its message in d->error).
// libpng may longjmp back here from any call below, so this function (as RunPngRows)
// creates no object with a destructor and reads nothing it wrote before a call that may
// jump.
bool RunPngHeader(PngDecode* d, ImageMode mode) {
  if (setjmp(d->error.jump)) return false;
  png_set_read_fn(d->png, &d->source, PngRead);
  png_read_info(d->png, d->info);
  png_uint_32 exif_size = 0;
  png_bytep exif = nullptr;
  if (d->want_exif && png_get_eXIf_1(d->png, d->info, &exif_size, &exif) != 0 && exif != nullptr) {
    d->exif.assign(exif, exif + exif_size);
  }
  const int color = png_get_color_type(d->png, d->info);
  const bool gray_source = (color & PNG_COLOR_MASK_COLOR) == 0;
  png_set_expand(d->png);
  png_set_strip_16(d->png);
  png_set_strip_alpha(d->png);
  d->direct_gray = gray_source && mode == ImageMode::kGray;
  if (!d->direct_gray) png_set_gray_to_rgb(d->png);
  png_read_update_info(d->png, d->info);
  d->width = png_get_image_width(d->png, d->info);
  d->height = png_get_image_height(d->png, d->info);
  d->channels = png_get_channels(d->png, d->info);
  if (d->channels != (d->direct_gray ? 1 : 3)) png_error(d->png, "unexpected channel count");
  if (d->width <= 0 || d->height <= 0) png_error(d->png, "image has no pixels");
  if (d->width * d->height * d->channels > kMaxImageBytes) {
    d->too_large = true;
    png_error(d->png, "image too large");
  }
  return true;
}

// Decode the image data into `into` (height x width x channels bytes, rows filled in
// d->rows), then read the file's end; false after a libpng error (RunPngHeader's rules).
bool RunPngRows(PngDecode* d, uint8_t* into) {
  if (setjmp(d->error.jump)) {
    // libpng writes each row into `into` before finishing it; finishing the last one reads
    // the rest of the last IDAT chunk and its CRC. A file cut there (the data ran out, not
    // a checksum that failed: corrupt data) comes with every pixel written, as a file cut
    // in its IEND: PIL decodes it. After the last row libpng's row number is the height
    // (non-interlaced) or its pass 7 (interlaced, with its deinterlacing).
    const bool interlaced = png_get_interlace_type(d->png, d->info) != PNG_INTERLACE_NONE;
    if (d->source.ran_out &&
        (interlaced ? png_get_current_pass_number(d->png) >= 7
                    : png_get_current_row_number(d->png) >= static_cast<png_uint_32>(d->height))) {
      d->pixels_read = true;
    }
    return false;
  }
  for (int64_t y = 0; y < d->height; ++y) d->rows[y] = into + y * d->width * d->channels;
  png_read_image(d->png, d->rows.data());
  d->pixels_read = true;
  // An eXIf chunk may also follow the image data (PIL reads it there too).
  png_read_end(d->png, d->want_exif && d->exif.empty() ? d->info : nullptr);
  png_uint_32 exif_size = 0;
  png_bytep exif = nullptr;
  if (d->want_exif && d->exif.empty() && png_get_eXIf_1(d->png, d->info, &exif_size, &exif) != 0 &&
      exif != nullptr) {
    d->exif.assign(exif, exif + exif_size);
  }
  return true;
}

// Decode to 8-bit RGB (or gray) the way PIL's Image.convert("RGB"/"L") sees the file:
// palettes expanded, 16-bit samples reduced to their high byte, alpha dropped (not
// composited), no gamma correction.
// With `orientation`, also set it to the image's EXIF orientation (1 without one).
arrow::Result<SampleTensor> DecodePng(const uint8_t* data, int64_t size, ImageMode mode,
                                      int* orientation = nullptr) {
  PngDecode d;
  d.source = PngSource{data, size, 0};
  d.want_exif = orientation != nullptr;
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d.error, PngError, PngWarning);
  if (d.png == nullptr) return arrow::Status::OutOfMemory("cannot create a PNG decoder");
  d.info = png_create_info_struct(d.png);
  if (d.info == nullptr) return arrow::Status::OutOfMemory("cannot create a PNG decoder");
  // libpng refuses a side over 10^6 by default ("Invalid IHDR data": a 1 x 1000001 strip
  // PIL decodes); the bound here is the image's bytes (kMaxImageBytes, RunPngHeader), as
  // for JPEG. PNG's own limit is 2^31 - 1.
  png_set_user_limits(d.png, 0x7fffffff, 0x7fffffff);
  // A file that ends after its image data (no IEND, or a cut one: a download short by a
  // few bytes) fails in png_read_end with every pixel read; PIL decodes it, and so do we
  // (an eXIf chunk after the image data is then not seen, as PIL does not see it). libpng
  // checks the image data's own end while reading the last row.
  if (!RunPngHeader(&d, mode)) {
    if (d.too_large) {
      return arrow::Status::Invalid("PNG image of ", d.width, "x", d.height,
                                    " is too large (over ", kMaxImageBytes >> 30, " GiB of pixels)");
    }
    return arrow::Status::Invalid("corrupt PNG data: ", d.error.message);
  }
  const int64_t w = d.width, h = d.height;
  // The rows go straight into the sample (the image was held twice: a 2 GiB one took
  // 4 GiB), but for gray of a colour PNG, whose RGB is converted after.
  SampleTensor out;
  ARROW_ASSIGN_OR_RAISE(out, AllocateSample(DType::kUInt8, {h, w, mode == ImageMode::kGray ? 1 : 3}));
  uint8_t* const sample = out.data->mutable_data();
  uint8_t* into = sample;
  if (mode == ImageMode::kGray && !d.direct_gray) {
    d.pixels.resize(static_cast<size_t>(w * h * d.channels));
    into = d.pixels.data();
  }
  d.rows.resize(static_cast<size_t>(h));
  if (!RunPngRows(&d, into) && !d.pixels_read) {
    return arrow::Status::Invalid("corrupt PNG data: ", d.error.message);
  }
  if (orientation != nullptr) *orientation = PngExifOrientation(d.exif);
  if (mode == ImageMode::kGray && !d.direct_gray) RgbToGray(d.pixels.data(), w * h, sample);
  return out;
}

class DecodeImageOp : public Op {
 public:
  DecodeImageOp(ImageMode mode, int64_t min_short_side, bool keepdims, bool exif_transpose)
      : mode_(mode), min_short_side_(min_short_side), keepdims_(keepdims),
        exif_transpose_(exif_transpose) {}
  std::string ToString() const override {
    // min_short_side changes pixels, so it is part of the fingerprint.
    std::ostringstream out;
    out.imbue(std::locale::classic());
    // "gray=L": gray is PIL's L of the RGB (it was TurboJPEG's luma for colour JPEGs), so
    // a state saved before is refused rather than resumed into other pixels.
    out << "DecodeImage(mode=" << (mode_ == ImageMode::kGray ? "gray, gray=L" : "rgb");
    if (min_short_side_ > 0) out << ", min_short_side=" << min_short_side_;
    if (!keepdims_) out << ", keepdims=false";
    if (exif_transpose_) out << ", exif_transpose=true";
    out << ")";
    return out.str();
  }
  // v2: CMYK and YCCK JPEGs decoded (they were refused: skipped rows under "skip"), and
  // DCT scaling keeps a margin above the Resize target (kDctScaleMargin). v3: gray of a
  // colour JPEG converted from RGB (it was the stored luma), JPEGs whose header warns
  // decoded, progressive JPEGs of over 500 scans refused. v4: a JPEG that warns and then
  // fails is refused (it was taken, unwritten), no DCT scaling for a Resize under 128.
  // v5: every JPEG decoded by a fresh decompressor (one without DHT/DQT tables took the
  // previous image's), a PNG whose IEND is missing or cut decoded (it was refused).
  // v6: a JPEG cut short after a harmless warning refused (its missing rows were gray), a
  // JPEG's EXIF read past stray bytes, PNGs of a side over 10^6 and PNGs cut in their
  // last IDAT chunk's checksum decoded (they were refused).
  std::string Fingerprint() const override { return ToString() + "@v6"; }
  // (Of a number column every row failed: under on_decode_error="skip", all skipped.)
  arrow::Status CheckInput(const SampleSignature& in) const override {
    return CheckEncodedInput(in, "DecodeImage");
  }
  SampleSignature OutputSignature(const SampleSignature&) const override {
    SampleSignature out;
    out.dtype = DType::kUInt8;
    if (mode_ == ImageMode::kGray && !keepdims_) {
      out.shape = std::vector<int64_t>{-1, -1};
    } else {
      out.shape = std::vector<int64_t>{-1, -1, mode_ == ImageMode::kGray ? 1 : 3};
    }
    return out;
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    if (in.dtype != DType::kUInt8 || in.shape.size() != 1) {
      return arrow::Status::Invalid("DecodeImage needs encoded bytes (a binary column)");
    }
    const uint8_t* p = in.data->data();
    const int64_t n = in.shape[0];
    arrow::Result<SampleTensor> out;
    if (IsJpeg(p, n)) {
      const int orientation = exif_transpose_ ? JpegExifOrientation(p, n) : 1;
      out = DecodeJpeg(p, n, mode_, min_short_side_, /*exact_scale=*/orientation != 1);
      if (out.ok()) out = Orient(std::move(out).ValueUnsafe(), orientation);
    } else if (IsPng(p, n)) {
      int orientation = 1;
      out = DecodePng(p, n, mode_, exif_transpose_ ? &orientation : nullptr);
      if (out.ok()) out = Orient(std::move(out).ValueUnsafe(), orientation);
    } else {
      const std::string other = OtherImageFormat(p, n);
      return arrow::Status::Invalid("not a JPEG or PNG image (", n, " bytes", other,
                                    other.empty() ? ")"
                                                  : "): re-encode it as PNG or JPEG when "
                                                    "writing (PIL's convert('RGB') or 'L')");
    }
    // Gray without its channel axis: (H, W), as Petastorm's codec and PIL's "L" give.
    if (out.ok() && mode_ == ImageMode::kGray && !keepdims_) out->shape.resize(2);
    return out;
  }

  std::shared_ptr<const Op> WithMinShortSide(int64_t min_short_side) const {
    return std::make_shared<DecodeImageOp>(mode_, min_short_side, keepdims_, exif_transpose_);
  }

 private:
  ImageMode mode_;
  int64_t min_short_side_;
  bool keepdims_;
  bool exif_transpose_;
};

}  // namespace

std::shared_ptr<const Op> WithMinShortSide(const Op& op, int64_t min_short_side) {
  auto* decode = dynamic_cast<const DecodeImageOp*>(&op);
  if (decode == nullptr) return nullptr;
  return decode->WithMinShortSide(min_short_side);
}

arrow::Result<std::shared_ptr<const Op>> MakeDecodeImage(const OpParams& params) {
  const std::string mode = params.String("mode", "rgb");
  if (mode != "rgb" && mode != "gray") {
    return arrow::Status::Invalid("DecodeImage mode must be 'rgb' or 'gray', got '", mode, "'");
  }
  // (checked before the cast: NaN or 1e30 cast to int64 is undefined)
  const double min_short_side = params.Number("min_short_side", 0);
  if (!(min_short_side >= 0 && min_short_side < 2147483648.0) ||
      min_short_side != std::floor(min_short_side)) {
    return arrow::Status::Invalid("DecodeImage min_short_side must be a whole number in [0, 2^31), "
                                  "got ", ExactText(min_short_side));
  }
  return std::make_shared<DecodeImageOp>(mode == "gray" ? ImageMode::kGray : ImageMode::kRGB,
                                         static_cast<int64_t>(min_short_side),
                                         params.Number("keepdims", 1) != 0,
                                         params.Number("exif_transpose", 0) != 0);
}

}  // namespace pqloader
