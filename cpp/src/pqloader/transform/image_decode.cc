// DecodeImage: JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng) to uint8 HWC.
#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstring>
#include <sstream>

#include "pqloader/error.h"
#include "pqloader/transform/op.h"

namespace pqloader {

namespace {

enum class ImageMode { kRGB, kGray };

// Refuse images whose decoded size would exceed this (a corrupt or hostile header).
constexpr int64_t kMaxImageBytes = int64_t{1} << 31;

bool IsJpeg(const uint8_t* p, int64_t n) { return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF; }
bool IsPng(const uint8_t* p, int64_t n) {
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return n >= 8 && std::memcmp(p, kSig, 8) == 0;
}

// PIL's RGB → L conversion (ITU-R 601-2 luma, 16-bit fixed point, rounded).
void RgbToGray(const uint8_t* rgb, int64_t pixels, uint8_t* gray) {
  for (int64_t i = 0; i < pixels; ++i) {
    const uint32_t r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
    gray[i] = static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
  }
}

// One TurboJPEG decompressor per thread, created on first use.
class TjHandle {
 public:
  TjHandle() : h_(tjInitDecompress()) {}
  ~TjHandle() {
    if (h_) tjDestroy(h_);
  }
  tjhandle get() const { return h_; }

 private:
  tjhandle h_;
};

arrow::Result<SampleTensor> DecodeJpeg(const uint8_t* data, int64_t size, ImageMode mode,
                                       int64_t min_short_side) {
  thread_local TjHandle handle;
  tjhandle h = handle.get();
  if (h == nullptr) return arrow::Status::OutOfMemory("cannot create a JPEG decoder");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    return arrow::Status::Invalid("corrupt JPEG header: ", tjGetErrorStr2(h));
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return arrow::Status::Invalid("CMYK JPEG images are not supported");
  }
  // DCT scaling: the smallest scale whose shorter side still reaches min_short_side,
  // among 1/2, 1/4 and 1/8: libjpeg-turbo has SIMD code for those only (a 6/8 decode
  // of a 500x375 photograph takes 1.5x as long as a full one).
  tjscalingfactor chosen = {1, 1};
  if (min_short_side > 0) {
    int n = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&n);
    for (int i = 0; i < n; ++i) {
      const tjscalingfactor f = factors[i];
      if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8)) continue;
      const int64_t sw = TJSCALED(width, f), sh = TJSCALED(height, f);
      const bool better = static_cast<int64_t>(f.num) * chosen.denom <
                          static_cast<int64_t>(chosen.num) * f.denom;
      if (std::min(sw, sh) >= min_short_side && better) chosen = f;
    }
  }
  const int64_t w = TJSCALED(width, chosen), hgt = TJSCALED(height, chosen);
  const int64_t channels = mode == ImageMode::kGray ? 1 : 3;
  if (w * hgt * channels > kMaxImageBytes) {
    return arrow::Status::Invalid("JPEG image of ", width, "x", height, " is too large");
  }
  ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(DType::kUInt8, {hgt, w, channels}));
  if (chosen.num != chosen.denom) {
    out.full_height = height;
    out.full_width = width;
    out.decode_scale = static_cast<double>(chosen.num) / chosen.denom;
  }
  if (tjDecompress2(h, data, static_cast<unsigned long>(size), out.data->mutable_data(),
                    static_cast<int>(w), 0, static_cast<int>(hgt),
                    mode == ImageMode::kGray ? TJPF_GRAY : TJPF_RGB, 0) != 0) {
    const bool warning = tjGetErrorCode(h) == TJERR_WARNING;
    const std::string msg = tjGetErrorStr2(h);
    // Warnings about extraneous bytes are harmless (PIL accepts them); a premature end
    // means the data is truncated.
    if (!warning || msg.find("Premature end") != std::string::npos) {
      return arrow::Status::Invalid("corrupt JPEG data: ", msg);
    }
  }
  return out;
}

struct PngErrorState {
  std::jmp_buf jump;
  char message[256] = {0};
};

void PngError(png_structp png, png_const_charp msg) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", msg);
  std::longjmp(state->jump, 1);
}
void PngWarning(png_structp, png_const_charp) {}

struct PngSource {
  const uint8_t* data;
  int64_t size;
  int64_t pos;
};

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->pos + static_cast<int64_t>(n) > src->size) png_error(png, "unexpected end of PNG data");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += static_cast<int64_t>(n);
}

// Decode to 8-bit RGB (or gray) the way PIL's Image.convert("RGB"/"L") sees the file:
// palettes expanded, 16-bit samples reduced to their high byte, alpha dropped (not
// composited), no gamma correction.
arrow::Result<SampleTensor> DecodePng(const uint8_t* data, int64_t size, ImageMode mode) {
  PngErrorState state;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, PngError, PngWarning);
  if (png == nullptr) return arrow::Status::OutOfMemory("cannot create a PNG decoder");
  png_infop info = png_create_info_struct(png);
  PngSource src{data, size, 0};
  SampleTensor out;
  std::vector<uint8_t> rgb;
  std::vector<png_bytep> rows;
  if (setjmp(state.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return arrow::Status::Invalid("corrupt PNG data: ", state.message);
  }
  png_set_read_fn(png, &src, PngRead);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info);
  const bool gray_source = (color & PNG_COLOR_MASK_COLOR) == 0;
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  const bool direct_gray = gray_source && mode == ImageMode::kGray;
  if (!direct_gray) png_set_gray_to_rgb(png);
  png_read_update_info(png, info);
  const int64_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  const int64_t channels = png_get_channels(png, info);
  if (channels != (direct_gray ? 1 : 3)) png_error(png, "unexpected channel count");
  if (w * h * channels > kMaxImageBytes) png_error(png, "image too large");
  rgb.resize(static_cast<size_t>(w * h * channels));
  rows.resize(static_cast<size_t>(h));
  for (int64_t y = 0; y < h; ++y) rows[y] = rgb.data() + y * w * channels;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);

  if (mode == ImageMode::kGray) {
    ARROW_ASSIGN_OR_RAISE(out, AllocateSample(DType::kUInt8, {h, w, 1}));
    if (direct_gray) {
      std::memcpy(out.data->mutable_data(), rgb.data(), rgb.size());
    } else {
      RgbToGray(rgb.data(), w * h, out.data->mutable_data());
    }
  } else {
    ARROW_ASSIGN_OR_RAISE(out, AllocateSample(DType::kUInt8, {h, w, 3}));
    std::memcpy(out.data->mutable_data(), rgb.data(), rgb.size());
  }
  return out;
}

class DecodeImageOp : public Op {
 public:
  DecodeImageOp(ImageMode mode, int64_t min_short_side, bool keepdims = true)
      : mode_(mode), min_short_side_(min_short_side), keepdims_(keepdims) {}
  std::string ToString() const override {
    // min_short_side changes pixels, so it is part of the fingerprint.
    std::ostringstream out;
    out << "DecodeImage(mode=" << (mode_ == ImageMode::kGray ? "gray" : "rgb");
    if (min_short_side_ > 0) out << ", min_short_side=" << min_short_side_;
    if (!keepdims_) out << ", keepdims=false";
    out << ")";
    return out.str();
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
      out = DecodeJpeg(p, n, mode_, min_short_side_);
    } else if (IsPng(p, n)) {
      out = DecodePng(p, n, mode_);
    } else {
      return arrow::Status::Invalid("not a JPEG or PNG image (", n, " bytes)");
    }
    // Gray without its channel axis: (H, W), as Petastorm's codec and PIL's "L" give.
    if (out.ok() && mode_ == ImageMode::kGray && !keepdims_) out->shape.resize(2);
    return out;
  }

  std::shared_ptr<const Op> WithMinShortSide(int64_t min_short_side) const {
    return std::make_shared<DecodeImageOp>(mode_, min_short_side, keepdims_);
  }

 private:
  ImageMode mode_;
  int64_t min_short_side_;
  bool keepdims_;
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
  return std::make_shared<DecodeImageOp>(mode == "gray" ? ImageMode::kGray : ImageMode::kRGB,
                                         static_cast<int64_t>(params.Number("min_short_side", 0)),
                                         params.Number("keepdims", 1) != 0);
}

}  // namespace pqloader
