// Geometric and numeric image ops, with torchvision semantics.
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>
#include <utility>

#include <arrow/util/float16.h>

#include "pqloader/error.h"
#include "pqloader/tensor/group_rows.h"
#include "pqloader/transform/op.h"
#include "pqloader/util/exact_text.h"
#include "pqloader/util/target_clones.h"

namespace pqloader {

namespace {

constexpr int kMaxCropAttempts = 10;  // torchvision RandomResizedCrop

// Python's round(): half to even.
int64_t RoundHalfEven(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

struct ImageDims {
  int64_t h = 0, w = 0, c = 1;
};

arrow::Result<ImageDims> Dims(const SampleTensor& s, const char* op) {
  ImageDims d;
  if (s.shape.size() == 2) {
    d.h = s.shape[0];
    d.w = s.shape[1];
  } else if (s.shape.size() == 3) {
    if (s.channels_first) {
      d.c = s.shape[0]; d.h = s.shape[1]; d.w = s.shape[2];
    } else {
      d.h = s.shape[0]; d.w = s.shape[1]; d.c = s.shape[2];
    }
  } else {
    return arrow::Status::Invalid(op, " needs an image (HWC, CHW or HW), got shape ",
                                  ShapeToString(s.shape));
  }
  return d;
}

std::vector<int64_t> ImageShape(const SampleTensor& like, int64_t h, int64_t w, int64_t c) {
  if (like.shape.size() == 2) return {h, w};
  return like.channels_first ? std::vector<int64_t>{c, h, w} : std::vector<int64_t>{h, w, c};
}

// Where the height is in the shape of an image (HW, HWC or CHW) described by `s`, the
// width following it; -1 if `s` is not known to be an image.
int HeightAxis(const SampleSignature& s) {
  if (!s.shape.has_value() || (s.shape->size() != 2 && s.shape->size() != 3)) return -1;
  return s.shape->size() == 3 && s.channels_first ? 1 : 0;
}

// What Dims (and ResizeImage, when `resizes`) refuse for every sample `in` describes,
// found before any data (Op::CheckInput).
arrow::Status CheckImageInput(const SampleSignature& in, const char* op, bool resizes) {
  if (in.shape.has_value() && in.shape->size() != 2 && in.shape->size() != 3) {
    return arrow::Status::Invalid(op, " needs an image (HWC, CHW or HW), got rows of shape ",
                                  ShapeToString(*in.shape));
  }
  if (resizes && in.channels_first) {
    return arrow::Status::Invalid("resize an image before ToCHW (it expects HWC)");
  }
  if (resizes && in.dtype.has_value() && *in.dtype != DType::kUInt8 &&
      *in.dtype != DType::kFloat32) {
    return arrow::Status::Invalid(op, " supports uint8 and float32 images, got ",
                                  DTypeName(*in.dtype));
  }
  return arrow::Status::OK();
}

// The signature of an image op's output of `h` x `w` pixels (-1: depends on the data)
// for input `in`: its dtype, rank and channel axis; no shape unless `in` is an image.
SampleSignature ImageSignature(const SampleSignature& in, int64_t h, int64_t w) {
  SampleSignature out = in;
  const int at = HeightAxis(in);
  if (at < 0) {
    out.shape.reset();
    return out;
  }
  (*out.shape)[at] = h;
  (*out.shape)[at + 1] = w;
  return out;
}

// Filter weights of one output pixel along one axis (PIL's precompute_coeffs, bilinear).
struct AxisWeights {
  std::vector<int64_t> first;      // first input index per output index
  std::vector<int64_t> count;      // number of taps per output index
  std::vector<double> weights;     // count[i] taps per output index, `stride` apart
  int64_t stride = 0;
};

// `in_len` may be fractional: the exact extent of a DCT-scaled image, whose last pixel
// is only partly inside the picture.
AxisWeights ComputeWeights(double in_begin, double in_len, int64_t in_size, int64_t out_size) {
  AxisWeights a;
  const double scale = in_len / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // bilinear support is 1
  a.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  a.first.resize(out_size);
  a.count.resize(out_size);
  a.weights.assign(out_size * a.stride, 0.0);
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = in_begin + (i + 0.5) * scale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    const int64_t n = xmax - xmin;
    double total = 0;
    double* w = &a.weights[i * a.stride];
    for (int64_t x = 0; x < n; ++x) {
      const double t = (x + xmin - center + 0.5) / filter_scale;
      const double v = std::abs(t) < 1.0 ? 1.0 - std::abs(t) : 0.0;
      w[x] = v;
      total += v;
    }
    if (total != 0) {
      for (int64_t x = 0; x < n; ++x) w[x] /= total;
    }
    a.first[i] = xmin;
    a.count[i] = n;
  }
  return a;
}

// The rows [y0, y1) of the horizontal pass that the vertical pass reads for output
// rows [top, top + height).
std::pair<int64_t, int64_t> RowsNeeded(const AxisWeights& wy, int64_t top, int64_t height) {
  int64_t y0 = wy.first[top], y1 = y0;
  for (int64_t j = top; j < top + height; ++j) {
    y0 = std::min(y0, wy.first[j]);
    y1 = std::max(y1, wy.first[j] + wy.count[j]);
  }
  return {y0, y1};
}

// Resample the `box` of HWC `src` (row pitch src_w*c) to out_h × out_w, and write the
// window `win` of that output (all of it by default) to dst: width first, then height,
// as PIL does (torchvision's antialiased resize follows the same scheme). Filter taps
// are clamped to the box, so this equals cropping first, then resizing; each output
// pixel depends only on its own position, so a window equals resizing, then cropping.
// Float images accumulate in double.
void ResampleFloat(const float* src, int64_t src_w, int64_t c, const CropBox& box,
                   double extent_h, double extent_w, int64_t out_h, int64_t out_w,
                   const CropBox& win, float* dst) {
  const AxisWeights wx = ComputeWeights(0, extent_w, box.width, out_w);
  const AxisWeights wy = ComputeWeights(0, extent_h, box.height, out_h);
  const auto [y0, y1] = RowsNeeded(wy, win.top, win.height);
  const int64_t row_len = win.width * c;
  std::vector<float> tmp((y1 - y0) * row_len);
  for (int64_t y = y0; y < y1; ++y) {
    const float* row = src + ((box.top + y) * src_w + box.left) * c;
    for (int64_t i = win.left; i < win.left + win.width; ++i) {
      const double* w = &wx.weights[i * wx.stride];
      const float* px = row + wx.first[i] * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        double acc = 0;
        for (int64_t k = 0; k < wx.count[i]; ++k) acc += w[k] * px[k * c + ch];
        tmp[(y - y0) * row_len + (i - win.left) * c + ch] = static_cast<float>(acc);
      }
    }
  }
  std::vector<double> acc(row_len);
  for (int64_t j = win.top; j < win.top + win.height; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k < wy.count[j]; ++k) {
      const double w = wy.weights[j * wy.stride + k];
      const float* r = &tmp[(wy.first[j] + k - y0) * row_len];
      for (int64_t i = 0; i < row_len; ++i) acc[i] += w * r[i];
    }
    float* out = dst + (j - win.top) * row_len;
    for (int64_t i = 0; i < row_len; ++i) out[i] = static_cast<float>(acc[i]);
  }
}

// uint8 images use PIL's fixed-point arithmetic: weights scaled by 2^22, rounded sums,
// results clipped to [0, 255], an 8-bit image between the two passes.
constexpr int kPrecisionBits = 22;

std::vector<int32_t> FixedPoint(const AxisWeights& a) {
  std::vector<int32_t> out(a.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    const double v = a.weights[i] * (1 << kPrecisionBits);
    out[i] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
  }
  return out;
}

inline uint8_t Clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Vector kernels compiled for AVX2 too and picked at load time.
#define PQLOADER_VECTOR_CLONES PQLOADER_TARGET_CLONES("avx2", "default")

// out[j] = Clip8(2^21 + sum over k < taps of src[k * stride + j] * w[k]) for j < n: one
// output row (or column, on a transposed block) of a pass, its taps summed in registers.
void WeightedSumScalar(const uint8_t* src, int64_t stride, const int32_t* w, int64_t taps,
                       int64_t n, uint8_t* out) {
  for (int64_t j = 0; j < n; ++j) {
    int32_t acc = 1 << (kPrecisionBits - 1);
    for (int64_t k = 0; k < taps; ++k) acc += src[k * stride + j] * w[k];
    out[j] = Clip8(acc);
  }
}

// The same sums, 16 values at a time (the x86-64 baseline has no 32-bit vector
// multiply); saturating packs clip to [0, 255] as Clip8 does.
__attribute__((target("avx2"))) void WeightedSumAvx2(const uint8_t* src, int64_t stride,
                                                     const int32_t* w, int64_t taps, int64_t n,
                                                     uint8_t* out) {
  const __m256i round = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256i a0 = round, a1 = round;
    for (int64_t k = 0; k < taps; ++k) {
      const __m128i px = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k * stride + j));
      const __m256i wk = _mm256_set1_epi32(w[k]);
      a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), wk));
      a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(px, 8)), wk));
    }
    a0 = _mm256_srai_epi32(a0, kPrecisionBits);
    a1 = _mm256_srai_epi32(a1, kPrecisionBits);
    // int16 (values j..j+3, j+8..j+11, j+4..j+7, j+12..j+15), in order, then uint8.
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a0, a1), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     _mm_packus_epi16(_mm256_castsi256_si128(words),
                                      _mm256_extracti128_si256(words, 1)));
  }
  if (j < n) WeightedSumScalar(src + j, stride, w, taps, n - j, out + j);
}

void WeightedSum(const uint8_t* src, int64_t stride, const int32_t* w, int64_t taps, int64_t n,
                 uint8_t* out) {
  if (HasAvx2()) return WeightedSumAvx2(src, stride, w, taps, n, out);
  WeightedSumScalar(src, stride, w, taps, n, out);
}

// Copy a `rows` x `cols` block of pixels of `c` bytes, from row pitch src_pitch to a
// layout where pixel (r, k) goes to dst + k * dst_col_pitch + r * c (a transpose).
template <int C>
void TransposePixels(const uint8_t* src, int64_t src_pitch, int64_t rows, int64_t cols,
                     uint8_t* dst, int64_t dst_col_pitch) {
  constexpr int64_t kTile = 16;  // columns per pass: 16 output streams, one input stream
  for (int64_t k0 = 0; k0 < cols; k0 += kTile) {
    const int64_t k1 = std::min(cols, k0 + kTile);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* in = src + r * src_pitch + k0 * C;
      for (int64_t k = k0; k < k1; ++k, in += C) {
        std::memcpy(dst + k * dst_col_pitch + r * C, in, C);
      }
    }
  }
}

// 3-byte pixels moved as 4-byte words where the extra byte is rewritten afterwards: in
// dst, pixel (r, k)'s fourth byte is pixel (r + 1, k)'s first, written later (r grows
// in the outer loop); the last pixel of a row and of a column move 3 bytes.
void TransposePixels3(const uint8_t* src, int64_t src_pitch, int64_t rows, int64_t cols,
                      uint8_t* dst, int64_t dst_col_pitch) {
  constexpr int64_t kTile = 16;
  for (int64_t k0 = 0; k0 < cols; k0 += kTile) {
    const int64_t k1 = std::min(cols, k0 + kTile);
    const int64_t k_wide = std::min(k1, cols - 1);  // columns [k0, k_wide) may read 4 bytes
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* in = src + r * src_pitch;
      uint8_t* out = dst + r * 3;
      if (r + 1 < rows) {
        int64_t k = k0;
        for (; k < k_wide; ++k) std::memcpy(out + k * dst_col_pitch, in + k * 3, 4);
        for (; k < k1; ++k) std::memcpy(out + k * dst_col_pitch, in + k * 3, 3);
      } else {
        for (int64_t k = k0; k < k1; ++k) std::memcpy(out + k * dst_col_pitch, in + k * 3, 3);
      }
    }
  }
}

// Tiles of 8 x 8 pixels of 3 bytes: each row of a tile (24 bytes) spread into 8 dwords,
// the 8 x 8 dword transpose of tensor/group_rows.h, each column packed back into 24
// bytes. `rows` and `cols` are multiples of 8; reads and writes stay inside the block.
__attribute__((target("avx2"))) void TransposeTiles3Avx2(const uint8_t* src, int64_t src_pitch,
                                                         int64_t rows, int64_t cols, uint8_t* dst,
                                                         int64_t dst_col_pitch) {
  const __m256i spread = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
                                          0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
  for (int64_t k0 = 0; k0 < cols; k0 += 8) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
      __m256 v[8];
      for (int j = 0; j < 8; ++j) {
        const uint8_t* p = src + (r0 + j) * src_pitch + k0 * 3;
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));  // bytes 0-15
        const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 16));  // 16-23
        const __m128i mid = _mm_alignr_epi8(hi, lo, 12);  // bytes 12-23, then zeros
        const __m256i row = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), mid, 1);
        v[j] = _mm256_castsi256_ps(_mm256_shuffle_epi8(row, spread));
      }
      Transpose8x32(v);
      for (int j = 0; j < 8; ++j) {
        const __m256i col = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(_mm256_castps_si256(v[j]), pack), join);  // bytes 0-23
        uint8_t* q = dst + (k0 + j) * dst_col_pitch + r0 * 3;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm256_castsi256_si128(col));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + 16), _mm256_extracti128_si256(col, 1));
      }
    }
  }
}

}  // namespace

void TransposeRgbPixels(const uint8_t* src, int64_t src_pitch, int64_t rows, int64_t cols,
                        uint8_t* dst, int64_t dst_col_pitch, bool vector) {
  // 8 x 8 tiles with AVX2 (a resize's two transposes took 12 % of the image pipeline's
  // CPU one pixel at a time), the rest of the rows and columns as before.
  const int64_t rows8 = vector && HasAvx2() ? rows / 8 * 8 : 0;
  const int64_t cols8 = rows8 > 0 ? cols / 8 * 8 : 0;
  if (rows8 > 0 && cols8 > 0) {
    TransposeTiles3Avx2(src, src_pitch, rows8, cols8, dst, dst_col_pitch);
    TransposePixels3(src + rows8 * src_pitch, src_pitch, rows - rows8, cols8, dst + rows8 * 3,
                     dst_col_pitch);
    TransposePixels3(src + cols8 * 3, src_pitch, rows, cols - cols8, dst + cols8 * dst_col_pitch,
                     dst_col_pitch);
    return;
  }
  TransposePixels3(src, src_pitch, rows, cols, dst, dst_col_pitch);
}

namespace {

void TransposePixels(const uint8_t* src, int64_t src_pitch, int64_t rows, int64_t cols,
                     int64_t c, uint8_t* dst, int64_t dst_col_pitch) {
  switch (c) {
    case 1: return TransposePixels<1>(src, src_pitch, rows, cols, dst, dst_col_pitch);
    case 3: return TransposeRgbPixels(src, src_pitch, rows, cols, dst, dst_col_pitch, true);
    case 4: return TransposePixels<4>(src, src_pitch, rows, cols, dst, dst_col_pitch);
    default:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < cols; ++k) {
          std::memcpy(dst + k * dst_col_pitch + r * c, src + r * src_pitch + k * c,
                      static_cast<size_t>(c));
        }
      }
  }
}

// The horizontal pass of rows [y0, y1) of the box for output columns [x0, x1), into tmp
// (row pitch (x1 - x0) * c): PIL's integer sums for each output pixel, computed on the
// transposed block so that each output column is a vector sum of whole input columns
// (vectorised like the vertical pass) instead of a gather per pixel.
void HorizontalPassTransposed(const uint8_t* src, int64_t src_w, int64_t c, const CropBox& box,
                              const AxisWeights& wx, const std::vector<int32_t>& coef,
                              int64_t x0, int64_t x1, int64_t y0, int64_t y1, uint8_t* tmp) {
  int64_t c0 = wx.first[x0], c1 = c0;
  for (int64_t i = x0; i < x1; ++i) {
    c0 = std::min(c0, wx.first[i]);
    c1 = std::max(c1, wx.first[i] + wx.count[i]);
  }
  const int64_t rows = y1 - y0, col_len = rows * c;
  thread_local std::vector<uint8_t> in_t, out_t;
  in_t.resize(static_cast<size_t>((c1 - c0) * col_len));
  out_t.resize(static_cast<size_t>((x1 - x0) * col_len));
  TransposePixels(src + ((box.top + y0) * src_w + box.left + c0) * c, src_w * c, rows, c1 - c0, c,
                  in_t.data(), col_len);
  for (int64_t i = x0; i < x1; ++i) {
    WeightedSum(in_t.data() + (wx.first[i] - c0) * col_len, col_len, &coef[i * wx.stride],
                wx.count[i], col_len, out_t.data() + (i - x0) * col_len);
  }
  // Back to rows: output column i of row y is at out_t + (i - x0) * col_len + (y - y0) * c.
  TransposePixels(out_t.data(), col_len, x1 - x0, rows, c, tmp, (x1 - x0) * c);
}

void ResampleU8(const uint8_t* src, int64_t src_w, int64_t c, const CropBox& box,
                double extent_h, double extent_w, int64_t out_h, int64_t out_w,
                const CropBox& win, uint8_t* dst) {
  const AxisWeights wx = ComputeWeights(0, extent_w, box.width, out_w);
  const AxisWeights wy = ComputeWeights(0, extent_h, box.height, out_h);
  const std::vector<int32_t> cx = FixedPoint(wx), cy = FixedPoint(wy);
  const auto [y0, y1] = RowsNeeded(wy, win.top, win.height);
  const int64_t x0 = win.left, x1 = win.left + win.width;
  const int64_t row_len = win.width * c;
  std::vector<uint8_t> tmp((y1 - y0) * row_len);
  HorizontalPassTransposed(src, src_w, c, box, wx, cx, x0, x1, y0, y1, tmp.data());
  for (int64_t j = win.top; j < win.top + win.height; ++j) {
    WeightedSum(tmp.data() + (wy.first[j] - y0) * row_len, row_len, &cy[j * wy.stride], wy.count[j],
                row_len, dst + (j - win.top) * row_len);
  }
}

// Copy the `box` of an image into a new image of the box's size; pixels outside the
// source are zero (torchvision pads a center crop larger than the image with zeros).
arrow::Result<SampleTensor> Crop(const SampleTensor& in, const ImageDims& d, const CropBox& box) {
  const int64_t elem = DTypeSize(in.dtype);
  ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(in.dtype, ImageShape(in, box.height, box.width, d.c),
                                                 in.channels_first));
  uint8_t* dst = out.data->mutable_data();
  std::memset(dst, 0, out.data->size());
  const uint8_t* src = in.data->data();
  const int64_t planes = in.channels_first ? d.c : 1;
  const int64_t px = in.channels_first ? elem : elem * d.c;  // bytes per pixel in a plane
  for (int64_t p = 0; p < planes; ++p) {
    const uint8_t* sp = src + p * d.h * d.w * px;
    uint8_t* dp = dst + p * box.height * box.width * px;
    for (int64_t y = 0; y < box.height; ++y) {
      const int64_t sy = box.top + y;
      if (sy < 0 || sy >= d.h) continue;
      const int64_t x0 = std::max<int64_t>(0, -box.left);
      const int64_t x1 = std::min<int64_t>(box.width, d.w - box.left);
      if (x1 <= x0) continue;
      std::memcpy(dp + (y * box.width + x0) * px, sp + (sy * d.w + box.left + x0) * px,
                  (x1 - x0) * px);
    }
  }
  return out;
}

// `exact`: each value as ExactText (for cache keys: every two values apart); else as a
// stream writes it, 6 significant digits (ToString: messages and the state fingerprint,
// whose text states saved by earlier versions hold).
std::string Join(const std::vector<double>& v, bool exact = false) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    out << (i ? ", " : "");
    if (exact) out << ExactText(v[i]);
    else out << v[i];
  }
  out << "]";
  return out.str();
}

class ResizeOp : public Op {
 public:
  arrow::Status CheckInput(const SampleSignature& in) const override {
    return CheckImageInput(in, "Resize", true);
  }
  explicit ResizeOp(int64_t size) : size_(size) {}
  std::string ToString() const override { return "Resize(size=" + std::to_string(size_) + ")"; }
  int64_t size() const { return size_; }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "Resize"));
    ARROW_ASSIGN_OR_RAISE(auto out, OutputSize(in));
    return ResizeImage(in, CropBox{0, 0, d.h, d.w}, out.first, out.second);
  }

  SampleSignature OutputSignature(const SampleSignature& in) const override {
    const int at = HeightAxis(in);
    int64_t oh = -1, ow = -1;
    if (at >= 0 && (*in.shape)[at] > 0 && (*in.shape)[at + 1] > 0) {
      std::tie(oh, ow) = Target((*in.shape)[at], (*in.shape)[at + 1]);  // as Apply does
    }
    return ImageSignature(in, oh, ow);
  }

  /// The output size of Apply for `in`: (height, width).
  /// torchvision's: the shorter side becomes `size`, the longer keeps the aspect
  /// (truncated), of the full-size image when the decoder scaled it down.
  arrow::Result<std::pair<int64_t, int64_t>> OutputSize(const SampleTensor& in) const {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "Resize"));
    const int64_t h = in.full_height > 0 ? in.full_height : d.h;
    const int64_t w = in.full_width > 0 ? in.full_width : d.w;
    if (h <= 0 || w <= 0) {  // (size * h / 0 is infinite: its cast to an integer undefined)
      return arrow::Status::Invalid("cannot resize an empty image (", h, "x", w, ")");
    }
    return Target(h, w);
  }

 private:
  // The output (height, width) of an h x w image, both > 0.
  std::pair<int64_t, int64_t> Target(int64_t h, int64_t w) const {
    if (w <= h) return {static_cast<int64_t>(static_cast<double>(size_) * h / w), size_};
    return {size_, static_cast<int64_t>(static_cast<double>(size_) * w / h)};
  }

  int64_t size_;
};

// The box CenterCrop takes of an h x w image (beyond the image where it is larger).
CropBox CenterBox(int64_t crop_h, int64_t crop_w, int64_t h, int64_t w) {
  CropBox box;
  box.height = crop_h;
  box.width = crop_w;
  box.top = crop_h > h ? -((crop_h - h) / 2) : RoundHalfEven((h - crop_h) / 2.0);
  box.left = crop_w > w ? -((crop_w - w) / 2) : RoundHalfEven((w - crop_w) / 2.0);
  return box;
}

// Refuses an output of `h` x `w` (a crop, padded where larger than the image) whose pixels
// exceed kMaxImageBytes, as ResizeImage refuses its output: a typo'd size allocated up to
// kMaxSampleBytes (16 GiB) a sample. `c`, `item`: the channels and bytes per value.
arrow::Status CheckCropBytes(const char* op, int64_t h, int64_t w, int64_t c, int64_t item) {
  if (static_cast<double>(h) * static_cast<double>(w) * static_cast<double>(c) *
          static_cast<double>(item) > static_cast<double>(kMaxImageBytes)) {
    return arrow::Status::Invalid(op, " to ", h, "x", w, " (", c, " channel", c == 1 ? "" : "s",
                                  ") would exceed the 2 GiB limit of an image");
  }
  return arrow::Status::OK();
}

// CheckCropBytes for an op whose output is `h` x `w` of input `in`, when the loader is
// made: where the channels and the dtype are known before any data (a decoded image's).
// (Else every row failed, and under on_decode_error="skip" every row was skipped.)
arrow::Status CheckCropBytes(const char* op, const SampleSignature& in, int64_t h, int64_t w) {
  if (HeightAxis(in) < 0 || !in.dtype.has_value()) return arrow::Status::OK();
  const auto& shape = *in.shape;
  const int64_t c = shape.size() == 2 ? 1 : shape[in.channels_first ? 0 : 2];
  if (c < 0) return arrow::Status::OK();
  return CheckCropBytes(op, h, w, c, DTypeSize(*in.dtype));
}

class CenterCropOp : public Op {
 public:
  arrow::Status CheckInput(const SampleSignature& in) const override {
    ARROW_RETURN_NOT_OK(CheckImageInput(in, "CenterCrop", false));
    return CheckCropBytes("CenterCrop", in, h_, w_);
  }
  CenterCropOp(int64_t h, int64_t w) : h_(h), w_(w) {}
  std::string ToString() const override {
    return "CenterCrop(size=[" + std::to_string(h_) + ", " + std::to_string(w_) + "])";
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "CenterCrop"));
    ARROW_RETURN_NOT_OK(CheckCropBytes("CenterCrop", h_, w_, d.c, DTypeSize(in.dtype)));
    return Crop(in, d, CenterBox(h_, w_, d.h, d.w));
  }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    return ImageSignature(in, h_, w_);
  }
  int64_t height() const { return h_; }
  int64_t width() const { return w_; }

 private:
  int64_t h_, w_;
};

// Resize directly followed by CenterCrop: only the pixels of the crop are computed
// (the same values; each output pixel of a resize depends only on its position).
class ResizeCenterCropOp : public Op {
 public:
  // The crop's own check too (a size past the image limit): with the Resize's alone, such
  // a crop after a Resize failed every row (all skipped under on_decode_error="skip"),
  // and the batch's rows of the crop's size were allocated first.
  arrow::Status CheckInput(const SampleSignature& in) const override {
    ARROW_RETURN_NOT_OK(resize_->CheckInput(in));
    return crop_->CheckInput(resize_->OutputSignature(in));
  }
  ResizeCenterCropOp(std::shared_ptr<const ResizeOp> resize, std::shared_ptr<const CenterCropOp> crop)
      : resize_(std::move(resize)), crop_(std::move(crop)) {}
  // The two ops' texts, so fingerprints (states, cache keys) equal the unfused ones'.
  std::string ToString() const override { return resize_->ToString() + ";" + crop_->ToString(); }
  int64_t size() const { return resize_->size(); }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext& ctx,
                                    int op_index) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "Resize"));
    ARROW_ASSIGN_OR_RAISE(auto size, resize_->OutputSize(in));
    const CropBox win = CenterBox(crop_->height(), crop_->width(), size.first, size.second);
    // The crop pads (also by one row or column, where CenterBox's top or left is 0):
    // resize, then crop.
    if (crop_->height() > size.first || crop_->width() > size.second) {
      ARROW_ASSIGN_OR_RAISE(auto resized, resize_->Apply(in, ctx, op_index));
      return crop_->Apply(resized, ctx, op_index);
    }
    return ResizeImage(in, CropBox{0, 0, d.h, d.w}, size.first, size.second, &win);
  }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    return crop_->OutputSignature(resize_->OutputSignature(in));
  }

 private:
  std::shared_ptr<const ResizeOp> resize_;
  std::shared_ptr<const CenterCropOp> crop_;
};

class RandomResizedCropOp : public Op {
 public:
  arrow::Status CheckInput(const SampleSignature& in) const override {
    ARROW_RETURN_NOT_OK(CheckImageInput(in, "RandomResizedCrop", true));
    return CheckCropBytes("RandomResizedCrop", in, h_, w_);
  }
  RandomResizedCropOp(int64_t h, int64_t w, std::vector<double> scale, std::vector<double> ratio)
      : h_(h), w_(w), scale_(std::move(scale)), ratio_(std::move(ratio)) {}
  std::string ToString() const override {
    return "RandomResizedCrop(size=[" + std::to_string(h_) + ", " + std::to_string(w_) +
           "], scale=" + Join(scale_) + ", ratio=" + Join(ratio_) + ")";
  }
  bool is_random() const override { return true; }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext& ctx,
                                    int op_index) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "RandomResizedCrop"));
    auto rng = CounterRng::ForSample(ctx.seed, ctx.epoch, ctx.sample_index, op_index);
    const CropBox box =
        RandomResizedCropParams(d.h, d.w, scale_[0], scale_[1], ratio_[0], ratio_[1], &rng);
    return ResizeImage(in, box, h_, w_);
  }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    return ImageSignature(in, h_, w_);
  }

 private:
  int64_t h_, w_;
  std::vector<double> scale_, ratio_;
};

class RandomHorizontalFlipOp : public Op {
 public:
  arrow::Status CheckInput(const SampleSignature& in) const override {
    return CheckImageInput(in, "RandomHorizontalFlip", false);
  }
  explicit RandomHorizontalFlipOp(double p) : p_(p) {}
  std::string ToString() const override {
    std::ostringstream out;
    out.imbue(std::locale::classic());
    out << "RandomHorizontalFlip(p=" << p_ << ")";
    return out.str();
  }
  bool is_random() const override { return true; }
  SampleSignature OutputSignature(const SampleSignature& in) const override { return in; }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext& ctx,
                                    int op_index) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "RandomHorizontalFlip"));
    auto rng = CounterRng::ForSample(ctx.seed, ctx.epoch, ctx.sample_index, op_index);
    if (!(rng.UniformDouble() < p_)) return in;
    ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(in.dtype, in.shape, in.channels_first));
    const int64_t elem = DTypeSize(in.dtype);
    const int64_t px = in.channels_first ? elem : elem * d.c;
    const int64_t rows = in.channels_first ? d.c * d.h : d.h;
    const uint8_t* src = in.data->data();
    uint8_t* dst = out.data->mutable_data();
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* s = src + r * d.w * px;
      uint8_t* o = dst + r * d.w * px;
      for (int64_t x = 0; x < d.w; ++x) std::memcpy(o + x * px, s + (d.w - 1 - x) * px, px);
    }
    return out;
  }

 private:
  double p_;
};

// uint8 HWC with 3 channels to float planes: dst[c * plane + p] = src[3p + c] * mul[c] +
// add[c] (the same float operations as the general loop).
PQLOADER_VECTOR_CLONES void NormalizeHwc3ToChw(const uint8_t* src, int64_t plane,
                                               const float* mul, const float* add, float* dst) {
  const float m0 = mul[0], m1 = mul[1], m2 = mul[2], a0 = add[0], a1 = add[1], a2 = add[2];
  float* d0 = dst;
  float* d1 = dst + plane;
  float* d2 = dst + 2 * plane;
  for (int64_t p = 0; p < plane; ++p) {
    d0[p] = static_cast<float>(src[3 * p]) * m0 + a0;
    d1[p] = static_cast<float>(src[3 * p + 1]) * m1 + a1;
    d2[p] = static_cast<float>(src[3 * p + 2]) * m2 + a2;
  }
}

// What ToCHW makes of rows of signature `in`: HWC -> CHW, HW -> 1HW.
SampleSignature ChannelsFirst(const SampleSignature& in) {
  if (in.channels_first) return in;
  SampleSignature out = in;
  out.channels_first = true;
  const int at = HeightAxis(in);
  if (at < 0) {
    out.shape.reset();
  } else {
    const auto& s = *in.shape;
    out.shape = std::vector<int64_t>{s.size() == 3 ? s[2] : 1, s[0], s[1]};
  }
  return out;
}

class NormalizeOp : public Op {
 public:
  arrow::Status CheckInput(const SampleSignature& in) const override {
    ARROW_RETURN_NOT_OK(CheckImageInput(in, "Normalize", false));
    if (!in.shape.has_value() || mean_.size() == 1) return arrow::Status::OK();
    const auto& shape = *in.shape;
    const int64_t c = shape.size() == 2 ? 1 : in.channels_first ? shape[0] : shape[2];
    if (c >= 0 && static_cast<int64_t>(mean_.size()) != c) {
      return arrow::Status::Invalid("Normalize has ", mean_.size(), " means for an image with ",
                                    c, " channels");
    }
    return arrow::Status::OK();
  }
  NormalizeOp(std::vector<double> mean, std::vector<double> std, bool to_chw)
      : mean_(std::move(mean)), std_(std::move(std)), to_chw_(to_chw) {}
  std::string ToString() const override {
    return "Normalize(mean=" + Join(mean_) + ", std=" + Join(std_) + ")" +
           (to_chw_ ? "; ToCHW()" : "");
  }
  // Exact: Normalize(mean=10) and 10.00001 shared cache entries. v2: a 2-D image fused
  // with ToCHW is 1HW (it was HW).
  std::string Fingerprint() const override {
    return "Normalize(mean=" + Join(mean_, true) + ", std=" + Join(std_, true) + ")" +
           (to_chw_ ? "; ToCHW()" : "") + "@v2";
  }
  std::shared_ptr<const Op> WithChannelsFirstOutput() const {
    return std::make_shared<NormalizeOp>(mean_, std_, true);
  }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    SampleSignature out = in;
    out.dtype = DType::kFloat32;
    return to_chw_ ? ChannelsFirst(out) : out;  // as Normalize, then ToCHW
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "Normalize"));
    if (static_cast<int64_t>(mean_.size()) != d.c && mean_.size() != 1) {
      return arrow::Status::Invalid("Normalize has ", mean_.size(), " means for an image with ",
                                    d.c, " channels");
    }
    // uint8 pixels are scaled to [0, 1] first, as torchvision's ToTensor does.
    const double scale = in.dtype == DType::kUInt8 ? 1.0 / 255.0 : 1.0;
    // Fused with a following ToCHW: write channels-first directly (one pass, one buffer;
    // a 2-D image becomes 1HW, as ToCHW makes it).
    const bool chw_out = in.channels_first || to_chw_;
    ARROW_ASSIGN_OR_RAISE(
        auto out, AllocateSample(DType::kFloat32,
                                 chw_out && !in.channels_first ? std::vector<int64_t>{d.c, d.h, d.w}
                                                               : in.shape,
                                 chw_out));
    const int64_t elem = DTypeSize(in.dtype);
    const uint8_t* src = in.data->data();
    auto* dst = reinterpret_cast<float*>(out.data->mutable_data());
    const int64_t plane = d.h * d.w;
    // out = v * mul[c] + add[c], with mul = scale / std and add = -mean / std.
    std::vector<float> mul(d.c), add(d.c);
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
      mul[c] = static_cast<float>(scale / std_[k]);
      add[c] = static_cast<float>(-mean_[k] / std_[k]);
    }
    if (in.dtype == DType::kUInt8 && !in.channels_first && chw_out && d.c == 3) {
      NormalizeHwc3ToChw(src, plane, mul.data(), add.data(), dst);
      return out;
    }
    for (int64_t p = 0; p < plane; ++p) {
      for (int64_t c = 0; c < d.c; ++c) {
        const int64_t i = in.channels_first ? c * plane + p : p * d.c + c;
        const int64_t o = chw_out ? c * plane + p : i;
        const float v = in.dtype == DType::kUInt8 ? static_cast<float>(src[i])
                                                  : static_cast<float>(LoadScalar(in.dtype, src + i * elem));
        dst[o] = v * mul[c] + add[c];
      }
    }
    return out;
  }

 private:
  std::vector<double> mean_, std_;
  bool to_chw_;
};

// HWC → CHW for elements of type T.
template <typename T>
void Transpose(const uint8_t* src_bytes, int64_t plane, int64_t channels, uint8_t* dst_bytes) {
  const T* src = reinterpret_cast<const T*>(src_bytes);
  T* dst = reinterpret_cast<T*>(dst_bytes);
  for (int64_t c = 0; c < channels; ++c) {
    T* out = dst + c * plane;
    for (int64_t p = 0; p < plane; ++p) out[p] = src[p * channels + c];
  }
}

class ToCHWOp : public Op {
 public:
  arrow::Status CheckInput(const SampleSignature& in) const override {
    return CheckImageInput(in, "ToCHW", false);
  }
  std::string ToString() const override { return "ToCHW()"; }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    return ChannelsFirst(in);
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "ToCHW"));
    if (in.channels_first) return in;
    const int64_t elem = DTypeSize(in.dtype);
    ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(in.dtype, {d.c, d.h, d.w}, true));
    const int64_t plane = d.h * d.w;
    switch (elem) {
      case 1: Transpose<uint8_t>(in.data->data(), plane, d.c, out.data->mutable_data()); break;
      case 2: Transpose<uint16_t>(in.data->data(), plane, d.c, out.data->mutable_data()); break;
      case 4: Transpose<uint32_t>(in.data->data(), plane, d.c, out.data->mutable_data()); break;
      default: Transpose<uint64_t>(in.data->data(), plane, d.c, out.data->mutable_data()); break;
    }
    return out;
  }
};

bool IsIntegerDType(DType t) {
  return t != DType::kBool && t != DType::kFloat16 && t != DType::kFloat32 &&
         t != DType::kFloat64;
}
bool IsUnsignedDType(DType t) {
  return t == DType::kUInt8 || t == DType::kUInt16 || t == DType::kUInt32 || t == DType::kUInt64;
}

// The integer at `p` as its two's-complement 64 bits (sign-extended for signed types).
uint64_t LoadIntegerBits(DType t, const uint8_t* p) {
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case DType::kInt8: return static_cast<uint64_t>(int64_t{get(int8_t{})});
    case DType::kInt16: return static_cast<uint64_t>(int64_t{get(int16_t{})});
    case DType::kInt32: return static_cast<uint64_t>(int64_t{get(int32_t{})});
    case DType::kInt64: return static_cast<uint64_t>(get(int64_t{}));
    case DType::kUInt8: return get(uint8_t{});
    case DType::kUInt16: return get(uint16_t{});
    case DType::kUInt32: return get(uint32_t{});
    default: return get(uint64_t{});
  }
}

// numpy's astype from an integer: to an integer, its low bits (wrapped); to a float,
// rounded once. (Through a double, int64 lost every bit past 2^53, an out-of-range
// narrowing was undefined behaviour — 2^32 + 5 to int32 gave INT_MIN, numpy 5 — and
// int64 to float32 rounded twice.)
void StoreFromInteger(DType to, uint64_t bits, bool is_unsigned, uint8_t* p) {
  auto put = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  const auto as_signed = static_cast<int64_t>(bits);
  switch (to) {
    case DType::kInt8:
    case DType::kUInt8: put(static_cast<uint8_t>(bits)); break;
    case DType::kInt16:
    case DType::kUInt16: put(static_cast<uint16_t>(bits)); break;
    case DType::kInt32:
    case DType::kUInt32: put(static_cast<uint32_t>(bits)); break;
    case DType::kInt64:
    case DType::kUInt64: put(bits); break;
    case DType::kFloat32:
      put(is_unsigned ? static_cast<float>(bits) : static_cast<float>(as_signed));
      break;
    default:  // bool, float64; float16 through a double (exact below 2^53, inf beyond 65504)
      StoreScalar(to, is_unsigned ? static_cast<double>(bits) : static_cast<double>(as_signed), p);
  }
}

class CastOp : public Op {
 public:
  explicit CastOp(DType to) : to_(to) {}
  std::string ToString() const override { return std::string("Cast(") + DTypeName(to_) + ")"; }
  // v2: integers cast as integers (cached prefixes of v1 hold values through a double).
  std::string Fingerprint() const override { return ToString() + "@v2"; }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    SampleSignature out = in;
    out.dtype = to_;
    return out;
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    if (in.dtype == to_) return in;
    ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(to_, in.shape, in.channels_first));
    const int64_t n = in.num_elements();
    const int64_t ei = DTypeSize(in.dtype), eo = DTypeSize(to_);
    if (IsIntegerDType(in.dtype)) {
      const bool is_unsigned = IsUnsignedDType(in.dtype);
      for (int64_t i = 0; i < n; ++i) {
        StoreFromInteger(to_, LoadIntegerBits(in.dtype, in.data->data() + i * ei), is_unsigned,
                         out.data->mutable_data() + i * eo);
      }
      return out;
    }
    for (int64_t i = 0; i < n; ++i) {
      StoreScalar(to_, LoadScalar(in.dtype, in.data->data() + i * ei), out.data->mutable_data() + i * eo);
    }
    return out;
  }

 private:
  DType to_;
};

class PadOrTruncateOp : public Op {
 public:
  PadOrTruncateOp(int64_t length, double pad, bool pad_left, bool truncate_left)
      : length_(length), pad_(pad), pad_left_(pad_left), truncate_left_(truncate_left) {}
  int64_t length() const { return length_; }
  double pad() const { return pad_; }
  bool pad_left() const { return pad_left_; }
  bool truncate_left() const { return truncate_left_; }
  std::string ToString() const override {
    std::ostringstream out;
    out.imbue(std::locale::classic());
    // (The pad's text reads back exactly: with 6 digits, pads 1000000 and 1000001 were one
    // state fingerprint, and a state resumed padding with the other.)
    out << "PadOrTruncate(length=" << length_ << ", pad=" << CompatibleText(pad_);
    if (pad_left_) out << ", side=left";
    if (truncate_left_) out << ", truncation=left";
    out << ")";
    return out.str();
  }
  std::string Fingerprint() const override {  // exact: see Normalize's
    return ToString() + "@pad=" + ExactText(pad_);
  }
  SampleSignature OutputSignature(const SampleSignature& in) const override {
    SampleSignature out = in;
    if (out.shape.has_value() && !out.shape->empty()) (*out.shape)[0] = length_;
    return out;
  }
  arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext&,
                                    int) const override {
    if (in.shape.empty()) {
      return arrow::Status::Invalid("PadOrTruncate needs a list (1-D or more), got a scalar");
    }
    std::vector<int64_t> shape = in.shape;
    shape[0] = length_;
    ARROW_ASSIGN_OR_RAISE(auto out, AllocateSample(in.dtype, shape));
    const int64_t elem = DTypeSize(in.dtype);
    int64_t inner = 1;
    for (size_t i = 1; i < shape.size(); ++i) inner *= shape[i];
    const int64_t keep = std::min(in.shape[0], length_);
    const int64_t skip = truncate_left_ ? in.shape[0] - keep : 0;  // rows dropped in front
    const int64_t at = pad_left_ ? length_ - keep : 0;             // where the rows go
    uint8_t* dst = out.data->mutable_data();
    for (int64_t i = 0; i < length_ * inner; ++i) StoreScalar(in.dtype, pad_, dst + i * elem);
    if (keep > 0) {
      std::memcpy(dst + at * inner * elem, in.data->data() + skip * inner * elem, keep * inner * elem);
    }
    return out;
  }

 private:
  int64_t length_;
  double pad_;
  bool pad_left_, truncate_left_;
};

arrow::Result<DType> ParseDType(const std::string& name) {
  static const std::pair<const char*, DType> kNames[] = {
      {"bool", DType::kBool}, {"int8", DType::kInt8}, {"int16", DType::kInt16},
      {"int32", DType::kInt32}, {"int64", DType::kInt64}, {"uint8", DType::kUInt8},
      {"uint16", DType::kUInt16}, {"uint32", DType::kUInt32}, {"uint64", DType::kUInt64},
      {"float16", DType::kFloat16}, {"float32", DType::kFloat32}, {"float64", DType::kFloat64}};
  for (const auto& [n, t] : kNames) {
    if (name == n) return t;
  }
  return arrow::Status::Invalid("unknown dtype '", name, "'");
}

// Decoders live in their own files.
}  // namespace

arrow::Result<std::shared_ptr<const Op>> MakeDecodeImage(const OpParams& params);
arrow::Result<std::shared_ptr<const Op>> MakeDecodeNdarray(const OpParams& params, bool compressed);

CropBox RandomResizedCropParams(int64_t height, int64_t width, double scale_lo, double scale_hi,
                                double ratio_lo, double ratio_hi, CounterRng* rng) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
  for (int attempt = 0; attempt < kMaxCropAttempts; ++attempt) {
    const double target = area * (scale_lo + (scale_hi - scale_lo) * rng->UniformDouble());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * rng->UniformDouble());
    // Compared as doubles, then cast: extreme scales or ratios make them inf, NaN or
    // beyond int64 (whose cast is undefined).
    const double wf = std::nearbyint(std::sqrt(target * aspect));
    const double hf = std::nearbyint(std::sqrt(target / aspect));
    if (0 < wf && wf <= static_cast<double>(width) && 0 < hf && hf <= static_cast<double>(height)) {
      const auto w = static_cast<int64_t>(wf), h = static_cast<int64_t>(hf);
      const auto top = static_cast<int64_t>(rng->Uniform(static_cast<uint64_t>(height - h + 1)));
      const auto left = static_cast<int64_t>(rng->Uniform(static_cast<uint64_t>(width - w + 1)));
      return CropBox{top, left, h, w};
    }
  }
  // Fallback: a central crop with the ratio clamped into range.
  const double in_ratio = static_cast<double>(width) / height;
  int64_t w = width, h = height;
  if (in_ratio < ratio_lo) {
    h = RoundHalfEven(w / ratio_lo);
  } else if (in_ratio > ratio_hi) {
    w = RoundHalfEven(h * ratio_hi);
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

arrow::Result<SampleTensor> ResizeImage(const SampleTensor& in, const CropBox& box, int64_t out_h,
                                        int64_t out_w, const CropBox* window) {
  ARROW_ASSIGN_OR_RAISE(auto d, Dims(in, "Resize"));
  if (out_h <= 0 || out_w <= 0) return arrow::Status::Invalid("cannot resize to an empty image");
  if (box.height <= 0 || box.width <= 0) {  // RandomResizedCrop's fallback, ratio far off
    return arrow::Status::Invalid("cannot resize an empty crop (", box.height, "x", box.width,
                                  ") of the ", d.h, "x", d.w, " image");
  }
  // Its pixels (and the weight tables of the whole extent), in double: no overflow.
  if (static_cast<double>(out_h) * static_cast<double>(out_w) * static_cast<double>(d.c) *
          static_cast<double>(DTypeSize(in.dtype)) > static_cast<double>(kMaxImageBytes)) {
    return arrow::Status::Invalid("resizing the ", d.h, "x", d.w, " image to ", out_h, "x",
                                  out_w, " would exceed the 2 GiB limit of an image");
  }
  if (in.channels_first) {
    return arrow::Status::Invalid("resize an image before ToCHW (it expects HWC)");
  }
  if (in.dtype != DType::kUInt8 && in.dtype != DType::kFloat32) {
    return arrow::Status::Invalid("Resize supports uint8 and float32 images, got ",
                                  DTypeName(in.dtype));
  }
  const CropBox win = window != nullptr ? *window : CropBox{0, 0, out_h, out_w};
  if (win.top < 0 || win.left < 0 || win.height <= 0 || win.width <= 0 ||
      win.top + win.height > out_h || win.left + win.width > out_w) {
    return arrow::Status::Invalid("resize window outside the resized image");
  }
  ARROW_ASSIGN_OR_RAISE(auto out,
                        AllocateSample(in.dtype, ImageShape(in, win.height, win.width, d.c)));
  // A whole DCT-scaled image spans full size x scale pixels, a little less than its
  // rounded-up pixel count.
  const bool whole = box.top == 0 && box.left == 0 && box.height == d.h && box.width == d.w;
  double extent_h = static_cast<double>(box.height), extent_w = static_cast<double>(box.width);
  if (whole && in.decode_scale > 0) {
    extent_h = std::min(extent_h, static_cast<double>(in.full_height) * in.decode_scale);
    extent_w = std::min(extent_w, static_cast<double>(in.full_width) * in.decode_scale);
  }
  if (in.dtype == DType::kUInt8) {
    ResampleU8(in.data->data(), d.w, d.c, box, extent_h, extent_w, out_h, out_w, win,
               out.data->mutable_data());
  } else {
    ResampleFloat(reinterpret_cast<const float*>(in.data->data()), d.w, d.c, box, extent_h,
                  extent_w, out_h, out_w, win, reinterpret_cast<float*>(out.data->mutable_data()));
  }
  return out;
}

// Parameter checks true of a finite value only: a NaN fails every comparison, and
// `x < 0 || x > 1` let it through (a flip that never flipped, a NaN std).
bool Positive(double v) { return std::isfinite(v) && v > 0; }

// The largest image side an op may ask for (a size is a double until it is checked).
constexpr int64_t kMaxImageSide = 2147483647;

arrow::Result<std::shared_ptr<const Op>> MakeOp(const std::string& name, const OpParams& p) {
  auto size2 = [&](const char* what) -> arrow::Result<std::pair<int64_t, int64_t>> {
    auto v = p.List("size", {});
    if (v.size() == 1) v.push_back(v[0]);
    if (v.size() != 2 || !Positive(v[0]) || !Positive(v[1])) {
      return arrow::Status::Invalid(what, " needs size=N or size=(height, width) > 0");
    }
    // Before the cast: 1e20 was undefined behaviour.
    const double most = static_cast<double>(kMaxImageSide);
    if (v[0] > most || v[1] > most) {
      return arrow::Status::Invalid(what, " size must be at most ", kMaxImageSide);
    }
    return std::make_pair(static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]));
  };
  if (name == "DecodeImage") return MakeDecodeImage(p);
  if (name == "DecodeNdarray") return MakeDecodeNdarray(p, false);
  if (name == "DecodeCompressedNdarray") return MakeDecodeNdarray(p, true);
  if (name == "Resize") {
    const double size = p.Number("size", 0);
    if (!Positive(size)) return arrow::Status::Invalid("Resize needs size > 0 (the shorter side)");
    if (size > static_cast<double>(kMaxImageSide)) {
      return arrow::Status::Invalid("Resize size must be at most ", kMaxImageSide);
    }
    return std::make_shared<ResizeOp>(static_cast<int64_t>(size));
  }
  if (name == "CenterCrop") {
    ARROW_ASSIGN_OR_RAISE(auto s, size2("CenterCrop"));
    return std::make_shared<CenterCropOp>(s.first, s.second);
  }
  if (name == "RandomResizedCrop") {
    ARROW_ASSIGN_OR_RAISE(auto s, size2("RandomResizedCrop"));
    auto scale = p.List("scale", {0.08, 1.0});
    auto ratio = p.List("ratio", {3.0 / 4.0, 4.0 / 3.0});
    if (scale.size() != 2 || ratio.size() != 2 || !Positive(scale[0]) || !Positive(ratio[0]) ||
        !std::isfinite(scale[1]) || !std::isfinite(ratio[1]) || scale[0] > scale[1] ||
        ratio[0] > ratio[1]) {
      return arrow::Status::Invalid("RandomResizedCrop needs scale=(lo, hi) and ratio=(lo, hi), "
                                    "0 < lo <= hi");
    }
    return std::make_shared<RandomResizedCropOp>(s.first, s.second, scale, ratio);
  }
  if (name == "RandomHorizontalFlip") {
    const double prob = p.Number("p", 0.5);
    if (!(prob >= 0 && prob <= 1)) {
      return arrow::Status::Invalid("RandomHorizontalFlip needs 0 <= p <= 1");
    }
    return std::make_shared<RandomHorizontalFlipOp>(prob);
  }
  if (name == "Normalize") {
    auto mean = p.List("mean", {});
    auto std = p.List("std", {});
    if (mean.empty() || mean.size() != std.size()) {
      return arrow::Status::Invalid("Normalize needs mean and std of one length");
    }
    for (double s : std) {
      if (s == 0 || !std::isfinite(s)) {
        return arrow::Status::Invalid("Normalize std must be finite and not 0");
      }
    }
    for (double m : mean) {
      if (!std::isfinite(m)) return arrow::Status::Invalid("Normalize mean must be finite");
    }
    // The op multiplies by 1/std and adds -mean/std in float32 (as torchvision computes
    // in the image's float32): factors that do not fit made every pixel inf or NaN.
    for (size_t k = 0; k < std.size(); ++k) {
      const double mul = 1.0 / std[k], add = -mean[k] / std[k];
      if (!std::isfinite(static_cast<float>(mul)) || !std::isfinite(static_cast<float>(add))) {
        return arrow::Status::Invalid("Normalize mean ", mean[k], " and std ", std[k],
                                      " do not fit float32 (1/std and mean/std must)");
      }
    }
    return std::make_shared<NormalizeOp>(mean, std, p.Number("to_chw", 0) != 0);
  }
  if (name == "ToCHW") return std::make_shared<ToCHWOp>();
  if (name == "Cast") {
    ARROW_ASSIGN_OR_RAISE(auto t, ParseDType(p.String("dtype", "")));
    return std::make_shared<CastOp>(t);
  }
  if (name == "PadOrTruncate") {
    const double length = p.Number("length", 0);
    if (!Positive(length) || length != std::floor(length) || length > kMaxListLength) {
      return arrow::Status::Invalid("PadOrTruncate needs a whole length in [1, 2^40], got ",
                                    ExactText(length));
    }
    const std::string side = p.String("side", "right"), truncation = p.String("truncation", "right");
    for (const auto& [what, v] : {std::make_pair("side", side), std::make_pair("truncation", truncation)}) {
      if (v != "left" && v != "right") {
        return arrow::Status::Invalid("PadOrTruncate ", what, " must be 'left' or 'right', got '", v, "'");
      }
    }
    return std::make_shared<PadOrTruncateOp>(static_cast<int64_t>(length), p.Number("pad", 0),
                                             side == "left", truncation == "left");
  }
  return arrow::Status::Invalid("unknown transform '", name, "'");
}

// Used by the pipeline to let DecodeImage scale large JPEGs down when a Resize follows.
int64_t ResizeTarget(const Op& op) {
  if (auto* r = dynamic_cast<const ResizeOp*>(&op)) return r->size();
  if (auto* r = dynamic_cast<const ResizeCenterCropOp*>(&op)) return r->size();
  return 0;
}

std::shared_ptr<const Op> FuseResizeCenterCrop(const std::shared_ptr<const Op>& resize,
                                               const std::shared_ptr<const Op>& next) {
  auto r = std::dynamic_pointer_cast<const ResizeOp>(resize);
  auto c = std::dynamic_pointer_cast<const CenterCropOp>(next);
  if (r == nullptr || c == nullptr) return nullptr;
  return std::make_shared<ResizeCenterCropOp>(std::move(r), std::move(c));
}

bool PadOrTruncateParams(const Op& op, ColumnCollate* collate) {
  const auto* pad = dynamic_cast<const PadOrTruncateOp*>(&op);
  if (pad == nullptr) return false;
  collate->mode = ColumnCollate::Mode::kPad;
  collate->length = pad->length();
  collate->pad_value = pad->pad();
  collate->pad_left = pad->pad_left();
  collate->truncate_left = pad->truncate_left();
  return true;
}

// Used by the pipeline to fuse Normalize + ToCHW into one pass.
std::shared_ptr<const Op> FuseNormalizeToCHW(const Op& normalize, const Op& next) {
  auto* n = dynamic_cast<const NormalizeOp*>(&normalize);
  if (n == nullptr || dynamic_cast<const ToCHWOp*>(&next) == nullptr) return nullptr;
  return n->WithChannelsFirstOutput();
}

}  // namespace pqloader
