#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "pqloader/transform/op.h"

namespace pqloader {
namespace {

// The AVX2 tiles and the pixel-by-pixel copy write the same bytes, each pixel where the
// transpose puts it, nothing past a column's rows, and read nothing past the block
// (source rows with no padding after them end the buffer; ASan builds check it).
TEST(TransposeRgbPixels, TilesWriteEachPixelWhereThePixelCopyDoesAndNothingElse) {
  std::mt19937 rng(7);
  for (const int64_t rows : {1, 7, 8, 9, 16, 23, 64}) {
    for (const int64_t cols : {1, 5, 8, 13, 24, 31}) {
      for (const int64_t src_pad : {0, 5}) {
        const int64_t src_pitch = cols * 3 + src_pad;
        std::vector<uint8_t> src(static_cast<size_t>((rows - 1) * src_pitch + cols * 3));
        for (auto& b : src) b = static_cast<uint8_t>(rng());
        const int64_t pitch = rows * 3 + 7;
        std::vector<uint8_t> vec(static_cast<size_t>(cols * pitch), 0xAB);
        std::vector<uint8_t> one_by_one = vec;
        TransposeRgbPixels(src.data(), src_pitch, rows, cols, vec.data(), pitch, true);
        TransposeRgbPixels(src.data(), src_pitch, rows, cols, one_by_one.data(), pitch, false);
        ASSERT_EQ(vec, one_by_one) << rows << " x " << cols;
        for (int64_t k = 0; k < cols; ++k) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t b = 0; b < 3; ++b) {
              ASSERT_EQ(vec[k * pitch + r * 3 + b], src[r * src_pitch + k * 3 + b])
                  << "pixel (" << r << ", " << k << ") of " << rows << " x " << cols;
            }
          }
          for (int64_t at = rows * 3; at < pitch; ++at) {
            ASSERT_EQ(vec[k * pitch + at], 0xAB) << "byte " << at << " of column " << k;
          }
        }
      }
    }
  }
}

// --- Image and ndarray ops on small known inputs (each kills hand-made mutants) -------

template <typename T>
SampleTensor Tensor(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values,
                    bool channels_first = false) {
  auto t = AllocateSample(dtype, std::move(shape), channels_first).ValueOrDie();
  std::memcpy(t.data->mutable_data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> Values(const SampleTensor& t) {
  std::vector<T> out(static_cast<size_t>(t.data->size()) / sizeof(T));
  std::memcpy(out.data(), t.data->data(), out.size() * sizeof(T));
  return out;
}

std::shared_ptr<const Op> MakeImageOp(const std::string& name, OpParams p = {}) {
  auto op = MakeOp(name, p);
  EXPECT_TRUE(op.ok()) << op.status().ToString();
  return op.ValueOrDie();
}

SampleTensor ApplyOp(const Op& op, const SampleTensor& in, int64_t sample = 0) {
  SampleContext ctx;
  ctx.seed = 11;
  ctx.sample_index = sample;
  auto out = op.Apply(in, ctx, 0);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ValueOrDie();
}

// A 5 x 7 RGB image and what PIL's Image.resize(BILINEAR) makes of it (numpy seed 3).
const std::vector<uint8_t> kPilImage = {
    248, 194, 190, 207, 147, 26,  237, 21,  245, 211, 239, 45,  5,   157, 159, 60,  54,  236,
    109, 46,  199, 82,  32,  205, 36,  7,   134, 222, 57,  146, 8,   149, 14,  15,  22,  10,
    144, 208, 24,  24,  7,   41,  11,  85,  59,  104, 225, 110, 226, 201, 8,   159, 26,  27,
    163, 122, 33,  41,  201, 67,  70,  166, 228, 40,  50,  179, 0,   177, 137, 63,  13,  188,
    255, 64,  94,  8,   8,   156, 25,  29,  157, 146, 190, 115, 219, 135, 39,  100, 237, 127,
    72,  227, 168, 21,  73,  132, 16,  153, 140, 107, 80,  163, 61,  110, 47};

TEST(ImageOps, ResizeOfUint8PixelsEqualsPil) {
  const auto in = Tensor<uint8_t>(DType::kUInt8, {5, 7, 3}, kPilImage);
  auto small = ResizeImage(in, CropBox{0, 0, 5, 7}, 3, 4);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->shape, (std::vector<int64_t>{3, 4, 3}));
  EXPECT_EQ(Values<uint8_t>(*small),
            (std::vector<uint8_t>{161, 104, 143, 182, 92,  129, 59,  132, 87,  80,  72,  135,
                                  55,  112, 117, 153, 117, 76,  103, 89,  55,  71,  145, 120,
                                  102, 149, 116, 81,  132, 150, 55,  78,  141, 83,  105, 116}));
  auto large = ResizeImage(in, CropBox{0, 0, 5, 7}, 8, 9);
  ASSERT_TRUE(large.ok());
  const auto big = Values<uint8_t>(*large);
  ASSERT_EQ(big.size(), 8u * 9 * 3);
  // First row and last pixel of PIL's 8 x 9.
  EXPECT_EQ(std::vector<uint8_t>(big.begin(), big.begin() + 12),
            (std::vector<uint8_t>{248, 194, 190, 221, 163, 81, 220, 91, 123, 231, 69, 201}));
  EXPECT_EQ(std::vector<uint8_t>(big.end() - 6, big.end()),
            (std::vector<uint8_t>{92, 90, 124, 61, 110, 47}));
  // Float pixels resample alike (in double; uint8 rounds to 8 bits after each pass).
  std::vector<float> f(kPilImage.begin(), kPilImage.end());
  auto fl = ResizeImage(Tensor<float>(DType::kFloat32, {5, 7, 3}, f), CropBox{0, 0, 5, 7}, 3, 4);
  ASSERT_TRUE(fl.ok());
  const auto fv = Values<float>(*fl);
  const auto uv = Values<uint8_t>(*small);
  for (size_t i = 0; i < fv.size(); ++i) EXPECT_NEAR(fv[i], uv[i], 1.0) << i;  // uint8 rounds between the passes
}

TEST(ImageOps, ResizeMakesTheShorterSideSizeAndTruncatesTheOther) {
  OpParams p;
  p.numbers["size"] = 4;
  auto resize = MakeImageOp("Resize", p);
  std::vector<uint8_t> px(5 * 7 * 3, 100);
  EXPECT_EQ(ApplyOp(*resize, Tensor<uint8_t>(DType::kUInt8, {5, 7, 3}, px)).shape,
            (std::vector<int64_t>{4, 5, 3}));  // 4 * 7 / 5 = 5.6
  EXPECT_EQ(ApplyOp(*resize, Tensor<uint8_t>(DType::kUInt8, {7, 5, 3}, px)).shape,
            (std::vector<int64_t>{5, 4, 3}));
  const auto flat = Values<uint8_t>(ApplyOp(*resize, Tensor<uint8_t>(DType::kUInt8, {7, 5, 3}, px)));
  for (uint8_t v : flat) ASSERT_EQ(v, 100);  // a flat image stays flat
}

TEST(ImageOps, CenterCropTakesTheMiddleAndPadsWithZeros) {
  std::vector<uint8_t> px(6 * 7);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i + 1);
  const auto in = Tensor<uint8_t>(DType::kUInt8, {6, 7}, px);
  OpParams p;
  p.lists["size"] = {3, 4};
  auto crop = Values<uint8_t>(ApplyOp(*MakeImageOp("CenterCrop", p), in));
  // top = round(1.5) = 2, left = round(1.5) = 2 (half to even).
  EXPECT_EQ(crop, (std::vector<uint8_t>{17, 18, 19, 20, 24, 25, 26, 27, 31, 32, 33, 34}));
  p.lists["size"] = {3, 5};  // left = round(1.0) = 1, top = round(1.5) = 2
  crop = Values<uint8_t>(ApplyOp(*MakeImageOp("CenterCrop", p), in));
  EXPECT_EQ(crop, (std::vector<uint8_t>{16, 17, 18, 19, 20, 23, 24, 25, 26, 27, 30, 31, 32, 33, 34}));
  p.lists["size"] = {5, 5};  // top = round(0.5) = 0
  crop = Values<uint8_t>(ApplyOp(*MakeImageOp("CenterCrop", p), in));
  EXPECT_EQ(crop[0], 2);
  // Larger than the image: the image sits at (1, 1) of a 9 x 10 crop, zeros around it.
  p.lists["size"] = {9, 10};
  auto padded = ApplyOp(*MakeImageOp("CenterCrop", p), in);
  ASSERT_EQ(padded.shape, (std::vector<int64_t>{9, 10}));
  const auto v = Values<uint8_t>(padded);
  for (int64_t y = 0; y < 9; ++y) {
    for (int64_t x = 0; x < 10; ++x) {
      const bool inside = y >= 1 && y < 7 && x >= 1 && x < 8;
      ASSERT_EQ(v[y * 10 + x], inside ? px[(y - 1) * 7 + (x - 1)] : 0) << y << ", " << x;
    }
  }
  // Channels-first: every plane is cropped alike.
  std::vector<uint8_t> chw(2 * 6 * 7);
  for (size_t i = 0; i < chw.size(); ++i) chw[i] = static_cast<uint8_t>(i);
  p.lists["size"] = {2, 2};
  const auto c2 = Values<uint8_t>(
      ApplyOp(*MakeImageOp("CenterCrop", p), Tensor<uint8_t>(DType::kUInt8, {2, 6, 7}, chw, true)));
  EXPECT_EQ(c2, (std::vector<uint8_t>{16, 17, 23, 24, 58, 59, 65, 66}));
}

TEST(ImageOps, FlipMirrorsEveryRowOfEveryChannelAsOftenAsAsked) {
  const std::vector<uint8_t> hwc = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 2 x 3 x 2
  OpParams p;
  p.numbers["p"] = 1;
  auto always = MakeImageOp("RandomHorizontalFlip", p);
  EXPECT_EQ(Values<uint8_t>(ApplyOp(*always, Tensor<uint8_t>(DType::kUInt8, {2, 3, 2}, hwc))),
            (std::vector<uint8_t>{5, 6, 3, 4, 1, 2, 11, 12, 9, 10, 7, 8}));
  // The same bytes as 2 planes of 2 x 3 (channels first): each plane's rows mirrored.
  auto chw = ApplyOp(*always, Tensor<uint8_t>(DType::kUInt8, {2, 2, 3}, hwc, true));
  EXPECT_EQ(Values<uint8_t>(chw), (std::vector<uint8_t>{3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10}));
  p.numbers["p"] = 0;
  auto never = MakeImageOp("RandomHorizontalFlip", p);
  for (int64_t s = 0; s < 20; ++s) {
    EXPECT_EQ(Values<uint8_t>(ApplyOp(*never, Tensor<uint8_t>(DType::kUInt8, {2, 3, 2}, hwc), s)), hwc);
  }
  p.numbers["p"] = 0.25;
  auto quarter = MakeImageOp("RandomHorizontalFlip", p);
  int flipped = 0;
  for (int64_t s = 0; s < 400; ++s) {
    flipped += Values<uint8_t>(ApplyOp(*quarter, Tensor<uint8_t>(DType::kUInt8, {2, 3, 2}, hwc), s)) != hwc;
  }
  EXPECT_GT(flipped, 60);
  EXPECT_LT(flipped, 140);
}

TEST(ImageOps, NormalizeScalesUint8ThenSubtractsTheMeanOfEachChannel) {
  const std::vector<double> mean = {0.1, 0.2, 0.3}, sd = {0.5, 0.25, 0.125};
  std::vector<uint8_t> px(2 * 3 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 13 + 7);
  for (const bool to_chw : {false, true}) {
    OpParams p;
    p.lists["mean"] = mean;
    p.lists["std"] = sd;
    p.numbers["to_chw"] = to_chw;
    const auto out = ApplyOp(*MakeImageOp("Normalize", p), Tensor<uint8_t>(DType::kUInt8, {2, 3, 3}, px));
    EXPECT_EQ(out.dtype, DType::kFloat32);
    EXPECT_EQ(out.shape, to_chw ? (std::vector<int64_t>{3, 2, 3}) : (std::vector<int64_t>{2, 3, 3}));
    const auto v = Values<float>(out);
    for (int64_t q = 0; q < 6; ++q) {
      for (int64_t c = 0; c < 3; ++c) {
        const double want = (px[q * 3 + c] / 255.0 - mean[c]) / sd[c];
        EXPECT_NEAR(v[to_chw ? c * 6 + q : q * 3 + c], want, 1e-5) << q << ", " << c;
      }
    }
  }
  // Two channels fused with ToCHW (the general loop), float pixels (no scaling).
  OpParams p;
  p.lists["mean"] = {1, 2};
  p.lists["std"] = {2, 4};
  p.numbers["to_chw"] = 1;
  const auto two = Values<float>(ApplyOp(*MakeImageOp("Normalize", p),
                                     Tensor<float>(DType::kFloat32, {1, 2, 2}, {3, 6, 5, 10})));
  EXPECT_EQ(two, (std::vector<float>{1, 2, 1, 2}));
  // A mean per channel or one for all; any other count is refused.
  p.lists["mean"] = {1, 2, 3, 4};
  p.lists["std"] = {1, 1, 1, 1};
  EXPECT_FALSE(MakeImageOp("Normalize", p)->Apply(Tensor<uint8_t>(DType::kUInt8, {2, 3, 3}, px), {}, 0).ok());
  p.lists["mean"] = {1, 2};
  p.lists["std"] = {1, 1};
  EXPECT_FALSE(MakeImageOp("Normalize", p)->Apply(Tensor<uint8_t>(DType::kUInt8, {2, 3, 3}, px), {}, 0).ok());
}

TEST(ImageOps, ToCHWMovesEachChannelToItsPlane) {
  const std::vector<uint16_t> hwc = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 2 x 2 x 3
  const auto out = ApplyOp(*MakeImageOp("ToCHW"), Tensor<uint16_t>(DType::kUInt16, {2, 2, 3}, hwc));
  EXPECT_TRUE(out.channels_first);
  EXPECT_EQ(out.shape, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(Values<uint16_t>(out), (std::vector<uint16_t>{1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 12}));
}

TEST(ImageOps, CastConvertsIntegersAsNumpyDoes) {
  OpParams p;
  p.strings["dtype"] = "int32";
  EXPECT_EQ(Values<int32_t>(ApplyOp(*MakeImageOp("Cast", p),
                                Tensor<int8_t>(DType::kInt8, {3}, {-1, -128, 127}))),
            (std::vector<int32_t>{-1, -128, 127}));
  p.strings["dtype"] = "float64";
  EXPECT_EQ(Values<double>(ApplyOp(*MakeImageOp("Cast", p),
                               Tensor<uint32_t>(DType::kUInt32, {1}, {4000000000u}))),
            (std::vector<double>{4000000000.0}));
  p.strings["dtype"] = "float32";
  EXPECT_EQ(Values<float>(ApplyOp(*MakeImageOp("Cast", p),
                              Tensor<uint64_t>(DType::kUInt64, {1}, {uint64_t{1} << 63}))),
            (std::vector<float>{9223372036854775808.0f}));
  p.strings["dtype"] = "int64";
  EXPECT_EQ(Values<int64_t>(ApplyOp(*MakeImageOp("Cast", p),
                                Tensor<int64_t>(DType::kInt64, {1}, {(int64_t{1} << 53) + 1}))),
            (std::vector<int64_t>{(int64_t{1} << 53) + 1}));
  EXPECT_EQ(Values<int64_t>(ApplyOp(*MakeImageOp("Cast", p),
                                    Tensor<uint64_t>(DType::kUInt64, {1}, {(uint64_t{1} << 53) + 1}))),
            (std::vector<int64_t>{(int64_t{1} << 53) + 1}));  // not through a double
  p.strings["dtype"] = "int16";  // 2^32 + 5 wraps to 5
  EXPECT_EQ(Values<int16_t>(ApplyOp(*MakeImageOp("Cast", p),
                                Tensor<int64_t>(DType::kInt64, {1}, {(int64_t{1} << 32) + 5}))),
            (std::vector<int16_t>{5}));
}

TEST(ImageOps, PadOrTruncateKeepsTheSideAsked) {
  const auto five = Tensor<int32_t>(DType::kInt32, {5}, {1, 2, 3, 4, 5});
  const auto two = Tensor<int32_t>(DType::kInt32, {2}, {1, 2});
  auto op = [](const char* side, const char* truncation) {
    OpParams p;
    p.numbers["length"] = 3;
    p.numbers["pad"] = 9;
    p.strings["side"] = side;
    p.strings["truncation"] = truncation;
    return MakeImageOp("PadOrTruncate", p);
  };
  EXPECT_EQ(Values<int32_t>(ApplyOp(*op("right", "right"), five)), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Values<int32_t>(ApplyOp(*op("right", "left"), five)), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(Values<int32_t>(ApplyOp(*op("right", "right"), two)), (std::vector<int32_t>{1, 2, 9}));
  EXPECT_EQ(Values<int32_t>(ApplyOp(*op("left", "right"), two)), (std::vector<int32_t>{9, 1, 2}));
}

TEST(ImageOps, RandomResizedCropReachesEveryPlaceAndFallsBackToTheCentre) {
  int64_t max_top = 0, max_left = 0;
  for (int64_t s = 0; s < 3000; ++s) {
    auto rng = CounterRng::ForSample(5, 0, s, 0);
    const CropBox b = RandomResizedCropParams(10, 12, 0.5, 0.6, 1.0, 1.0, &rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 10);
    ASSERT_LE(b.left + b.width, 12);
    if (b.top == 10 - b.height) max_top = 1;
    if (b.left == 12 - b.width) max_left = 1;
  }
  EXPECT_EQ(max_top, 1);   // the last row a box may start at is drawn too
  EXPECT_EQ(max_left, 1);
  // No attempt fits a ratio of 10 to 20 in a square: the centre, ratio clamped.
  auto rng = CounterRng::ForSample(5, 0, 0, 0);
  CropBox b = RandomResizedCropParams(10, 10, 1.0, 1.0, 10.0, 20.0, &rng);
  EXPECT_EQ(b.top, 4);
  EXPECT_EQ(b.left, 0);
  EXPECT_EQ(b.height, 1);
  EXPECT_EQ(b.width, 10);
  b = RandomResizedCropParams(10, 10, 1.0, 1.0, 0.05, 0.1, &rng);
  EXPECT_EQ(b.top, 0);
  EXPECT_EQ(b.left, 4);
  EXPECT_EQ(b.height, 10);
  EXPECT_EQ(b.width, 1);
}

TEST(ImageOps, ParametersOutsideTheirRangeAreRefused) {
  OpParams p;
  p.numbers["p"] = std::nan("");
  EXPECT_FALSE(MakeOp("RandomHorizontalFlip", p).ok());
  p.numbers["p"] = 1.5;
  EXPECT_FALSE(MakeOp("RandomHorizontalFlip", p).ok());
  OpParams r;
  r.lists["size"] = {8, 8};
  r.lists["scale"] = {0.9, 0.1};
  EXPECT_FALSE(MakeOp("RandomResizedCrop", r).ok());
  r.lists["scale"] = {0.1, 0.9};
  r.lists["ratio"] = {2.0, 1.0};
  EXPECT_FALSE(MakeOp("RandomResizedCrop", r).ok());
  OpParams c;
  c.lists["size"] = {1, 1e10};
  EXPECT_FALSE(MakeOp("CenterCrop", c).ok());
  c.lists["size"] = {1e10, 1};
  EXPECT_FALSE(MakeOp("CenterCrop", c).ok());
}

// A .npy: magic, version, little-endian header length, the header padded with spaces
// to `header_bytes` (numpy aligns to 64), then the data.
std::vector<uint8_t> Npy(const std::string& descr, bool fortran, const std::string& shape,
                         const std::vector<uint8_t>& data, size_t header_bytes = 118) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " +
                       (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
  if (header.size() + 1 < header_bytes) header.append(header_bytes - 1 - header.size(), ' ');
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                              static_cast<uint8_t>(header.size()),
                              static_cast<uint8_t>(header.size() >> 8)};
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

arrow::Result<SampleTensor> DecodeBytes(const std::string& op, const std::vector<uint8_t>& bytes) {
  auto in = Tensor<uint8_t>(DType::kUInt8, {static_cast<int64_t>(bytes.size())}, bytes);
  return MakeImageOp(op)->Apply(in, {}, 0);
}

TEST(Ndarray, DecodesOrderAndByteOrderAsNumpyWroteThem) {
  // int16 2 x 3, C order, little-endian.
  auto c = DecodeBytes("DecodeNdarray", Npy("<i2", false, "(2, 3)", {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 0xFF, 0xFF}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->dtype, DType::kInt16);
  EXPECT_EQ(c->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values<int16_t>(*c), (std::vector<int16_t>{1, 2, 3, 4, 5, -1}));
  // Big-endian int32.
  auto be = DecodeBytes("DecodeNdarray", Npy(">i4", false, "(2,)", {0, 0, 1, 2, 0xFF, 0xFF, 0xFF, 0xFE}));
  ASSERT_TRUE(be.ok());
  EXPECT_EQ(Values<int32_t>(*be), (std::vector<int32_t>{258, -2}));
  auto be2 = DecodeBytes("DecodeNdarray", Npy(">u2", false, "(2,)", {1, 2, 0, 7}));
  ASSERT_TRUE(be2.ok());
  EXPECT_EQ(Values<uint16_t>(*be2), (std::vector<uint16_t>{258, 7}));
  // Fortran order 2 x 3: stored column by column.
  auto f = DecodeBytes("DecodeNdarray", Npy("|u1", true, "(2, 3)", {1, 4, 2, 5, 3, 6}));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(Values<uint8_t>(*f), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  // Fortran order 2 x 3 x 2.
  std::vector<uint8_t> fdata(12);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) fdata[i + 2 * j + 6 * k] = static_cast<uint8_t>(i * 6 + j * 2 + k);
  auto f3 = DecodeBytes("DecodeNdarray", Npy("|u1", true, "(2, 3, 2)", fdata));
  ASSERT_TRUE(f3.ok());
  EXPECT_EQ(Values<uint8_t>(*f3), (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  // A header longer than 255 bytes (its length's high byte counts).
  auto longh = DecodeBytes("DecodeNdarray", Npy("<u2", false, "(1,)", {7, 1}, 374));
  ASSERT_TRUE(longh.ok()) << longh.status().ToString();
  EXPECT_EQ(Values<uint16_t>(*longh), (std::vector<uint16_t>{263}));
}

TEST(Ndarray, TruncatedDataAndBadHeadersAreRefused) {
  // 3 int32 need 12 bytes: 11 (and 3) are refused, not read past.
  EXPECT_FALSE(DecodeBytes("DecodeNdarray", Npy("<i4", false, "(3,)", std::vector<uint8_t>(11))).ok());
  EXPECT_FALSE(DecodeBytes("DecodeNdarray", Npy("<i4", false, "(3,)", std::vector<uint8_t>(3))).ok());
  EXPECT_TRUE(DecodeBytes("DecodeNdarray", Npy("<i4", false, "(3,)", std::vector<uint8_t>(12))).ok());
  EXPECT_FALSE(DecodeBytes("DecodeNdarray", Npy("<i4", false, "(-3,)", std::vector<uint8_t>(12))).ok());
  EXPECT_FALSE(DecodeBytes("DecodeNdarray", Npy("<c8", false, "(1,)", std::vector<uint8_t>(8))).ok());
  EXPECT_FALSE(DecodeBytes("DecodeNdarray", Npy("<i3", false, "(1,)", std::vector<uint8_t>(8))).ok());
}

// The CRC-32 of `data` (zip's, bit by bit).
uint32_t ZipCrc32(const std::vector<uint8_t>& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t b : data) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A zip of `members` stored .npy members (method 0), with its end record.
std::vector<uint8_t> StoredNpz(const std::vector<uint8_t>& npy, uint16_t entries) {
  std::vector<uint8_t> z;
  auto le = [&z](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) z.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  le(0x04034b50, 4);
  le(20, 2);
  le(0, 2);
  le(0, 2);  // stored
  le(0, 4);
  le(ZipCrc32(npy), 4);  // checked since the member's CRC-32 is
  le(npy.size(), 4);
  le(npy.size(), 4);
  le(5, 2);
  le(0, 2);
  for (char ch : std::string("a.npy")) z.push_back(static_cast<uint8_t>(ch));
  z.insert(z.end(), npy.begin(), npy.end());
  le(0x06054b50, 4);
  le(0, 2);
  le(0, 2);
  le(entries, 2);
  le(entries, 2);
  le(0, 4);
  le(0, 4);
  le(0, 2);
  return z;
}

TEST(Ndarray, AnNpzOfOneArrayDecodesAndOfSeveralIsRefused) {
  const auto npy = Npy("<u2", false, "(2,)", {1, 0, 2, 1});
  auto one = DecodeBytes("DecodeCompressedNdarray", StoredNpz(npy, 1));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(Values<uint16_t>(*one), (std::vector<uint16_t>{1, 258}));
  auto two = DecodeBytes("DecodeCompressedNdarray", StoredNpz(npy, 2));
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("holds 2 arrays"), std::string::npos) << two.status().ToString();
  // A flipped bit in the array fails its CRC-32 (it was decoded, altered).
  auto flipped = StoredNpz(npy, 1);
  flipped[30 + 5 + npy.size() - 1] ^= 1;
  auto bad = DecodeBytes("DecodeCompressedNdarray", flipped);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("CRC-32"), std::string::npos) << bad.status().ToString();
  // Without its end record the archive is cut short: refused (the first of two was taken).
  auto cut = StoredNpz(npy, 1);
  cut.resize(cut.size() - 22);
  EXPECT_FALSE(DecodeBytes("DecodeCompressedNdarray", cut).ok());
}

}  // namespace
}  // namespace pqloader
