// DecodeImage on hostile bytes: a failed decode must leave the thread able to decode
// the next image exactly (issue 12, item 1: a JPEG whose header fails, then a valid
// JPEG on the same thread, corrupted the heap).
#include <png.h>
#include <turbojpeg.h>

#include <gtest/gtest.h>

#include <csetjmp>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pqloader/transform/op.h"

namespace pqloader {

namespace {

using Bytes = std::vector<uint8_t>;

// A deterministic test pattern of w x h pixels with `channels` channels.
Bytes Pattern(int w, int h, int channels) {
  Bytes out(static_cast<size_t>(w) * h * channels);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>((i * 37) ^ (i >> 3));
  return out;
}

Bytes EncodeJpeg(int w, int h, bool gray) {
  tjhandle h_enc = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  Bytes pixels = Pattern(w, h, gray ? 1 : 3);
  const int rc = tjCompress2(h_enc, pixels.data(), w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &buf,
                             &size, gray ? TJSAMP_GRAY : TJSAMP_420, 90, 0);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(h_enc);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(h_enc);
  return out;
}

struct PngSink {
  Bytes bytes;
  std::jmp_buf jump;
};

Bytes EncodePng(int w, int h, bool gray) {
  PngSink sink;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  Bytes pixels = Pattern(w, h, gray ? 1 : 3);
  std::vector<png_bytep> rows(h);
  for (int y = 0; y < h; ++y) rows[y] = pixels.data() + static_cast<size_t>(y) * w * (gray ? 1 : 3);
  png_set_write_fn(
      png, &sink,
      [](png_structp p, png_bytep data, png_size_t n) {
        auto* s = static_cast<PngSink*>(png_get_io_ptr(p));
        s->bytes.insert(s->bytes.end(), data, data + n);
      },
      nullptr);
  png_set_IHDR(png, info, w, h, 8, gray ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return sink.bytes;
}

SampleTensor AsSample(const Bytes& b) {
  SampleTensor s;
  s.dtype = DType::kUInt8;
  s.shape = {static_cast<int64_t>(b.size())};
  s.data = arrow::Buffer::FromString(std::string(b.begin(), b.end()));
  return s;
}

arrow::Result<SampleTensor> Decode(const Bytes& b, const std::string& mode = "rgb") {
  OpParams p;
  p.strings["mode"] = mode;
  auto op = MakeOp("DecodeImage", p).ValueOrDie();
  return op->Apply(AsSample(b), SampleContext{}, 0);
}

// The decoded pixels and shape, for comparison.
std::pair<std::vector<int64_t>, std::string> Pixels(const SampleTensor& s) {
  return {s.shape, std::string(reinterpret_cast<const char*>(s.data->data()), s.data->size())};
}

// The result of decoding `b` on a thread that has decoded nothing else.
std::pair<std::vector<int64_t>, std::string> FreshDecode(const Bytes& b,
                                                         const std::string& mode = "rgb") {
  std::pair<std::vector<int64_t>, std::string> out;
  std::thread t([&] {
    auto r = Decode(b, mode);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    out = Pixels(*r);
  });
  t.join();
  return out;
}

size_t FindMarker(const Bytes& b, uint8_t marker) {
  for (size_t i = 2; i + 1 < b.size(); ++i) {
    if (b[i] == 0xFF && b[i + 1] == marker) return i;
  }
  return b.size();
}

// JPEGs whose header fails after part of it was read: the failed image's frame (SOF,
// one component) stays in a reused decompressor.
std::vector<Bytes> CorruptGrayJpegs() {
  const Bytes gray = EncodeJpeg(16, 12, /*gray=*/true);
  const size_t sos = FindMarker(gray, 0xDA);
  const size_t sof = FindMarker(gray, 0xC0);
  EXPECT_LT(sos, gray.size());
  EXPECT_LT(sof, gray.size());
  std::vector<Bytes> out;
  out.emplace_back(gray.begin(), gray.begin() + sos);  // ends before SOS: no image
  Bytes no_sos = gray;
  no_sos[sos + 1] = 0xD9;  // SOS replaced by EOI
  out.push_back(no_sos);
  out.emplace_back(gray.begin(), gray.begin() + sof + 6);  // ends inside SOF
  Bytes bad_sof = gray;
  bad_sof[sof + 9] = 0;  // component count 0
  out.push_back(bad_sof);
  return out;
}

}  // namespace

TEST(DecodeImage, FailedJpegHeaderDoesNotPoisonTheNextJpegOnTheThread) {
  const Bytes rgb = EncodeJpeg(24, 20, /*gray=*/false);
  const auto expected = FreshDecode(rgb);
  ASSERT_EQ(expected.first, (std::vector<int64_t>{20, 24, 3}));
  for (const Bytes& bad : CorruptGrayJpegs()) {
    std::thread t([&] {
      auto failed = Decode(bad);
      ASSERT_FALSE(failed.ok());
      EXPECT_NE(failed.status().message().find("JPEG"), std::string::npos)
          << failed.status().ToString();
      auto next = Decode(rgb);  // the same thread, so the same decompressor
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      EXPECT_EQ(Pixels(*next), expected);
      auto gray = Decode(rgb, "gray");
      ASSERT_TRUE(gray.ok()) << gray.status().ToString();
      EXPECT_EQ(gray->shape, (std::vector<int64_t>{20, 24, 1}));
    });
    t.join();
  }
}

// Flat-coloured CMYK images, written by TurboJPEG (it compresses CMYK as YCCK) in
// Adobe's inverted convention (stored = 255 - ink), decode to the RGB and gray that PIL
// gives: R = (255 - C)(255 - K) / 255 (and G from M, B from Y), then PIL's luma.
TEST(DecodeImage, CmykJpegsDecodeToTheRgbPilGives) {
  struct Ink {
    int c, m, y, k;
  };
  for (const Ink ink : {Ink{0, 0, 0, 0}, Ink{0, 255, 255, 0}, Ink{255, 0, 255, 0}, Ink{0, 0, 0, 255},
                        Ink{0, 0, 0, 128}, Ink{64, 128, 192, 32}}) {
    const int w = 24, h = 16;
    Bytes stored(static_cast<size_t>(w) * h * 4);
    for (size_t i = 0; i < stored.size(); i += 4) {
      stored[i] = static_cast<uint8_t>(255 - ink.c);
      stored[i + 1] = static_cast<uint8_t>(255 - ink.m);
      stored[i + 2] = static_cast<uint8_t>(255 - ink.y);
      stored[i + 3] = static_cast<uint8_t>(255 - ink.k);
    }
    tjhandle enc = tjInitCompress();
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    ASSERT_EQ(tjCompress2(enc, stored.data(), w, 0, h, TJPF_CMYK, &buf, &size, TJSAMP_444, 95, 0), 0)
        << tjGetErrorStr2(enc);
    const Bytes jpeg(buf, buf + size);
    tjFree(buf);
    tjDestroy(enc);
    const double rgb[3] = {(255.0 - ink.c) * (255 - ink.k) / 255, (255.0 - ink.m) * (255 - ink.k) / 255,
                           (255.0 - ink.y) * (255 - ink.k) / 255};
    const auto color = FreshDecode(jpeg);
    ASSERT_EQ(color.first, (std::vector<int64_t>{h, w, 3}));
    const auto gray = FreshDecode(jpeg, "gray");
    ASSERT_EQ(gray.first, (std::vector<int64_t>{h, w, 1}));
    const double luma = (rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471) / 65536;
    for (int p = 0; p < w * h; ++p) {
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(static_cast<uint8_t>(color.second[3 * p + c]), rgb[c], 2.5)
            << "ink " << ink.c << "," << ink.m << "," << ink.y << "," << ink.k << " channel " << c;
      }
      EXPECT_NEAR(static_cast<uint8_t>(gray.second[p]), luma, 2.5);
    }
  }
}

TEST(DecodeImage, AHugeProgressiveJpegIsRefusedWhateverTheScaling) {
  // A progressive JPEG whose header claims 65444x64223: DCT scaling to 1/8 would give an
  // output under the 2 GiB cap, but the decoder would first hold the full-size image's
  // coefficients (12+ GB; make fuzz). Refused from the header, before any allocation.
  tjhandle enc = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  Bytes pixels = Pattern(16, 16, 3);
  ASSERT_EQ(tjCompress2(enc, pixels.data(), 16, 0, 16, TJPF_RGB, &buf, &size, TJSAMP_444, 90,
                        TJFLAG_PROGRESSIVE),
            0);
  Bytes jpeg(buf, buf + size);
  tjFree(buf);
  tjDestroy(enc);
  bool patched = false;
  for (size_t i = 0; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC2) {  // SOF2: length(2) precision(1) h(2) w(2)
      jpeg[i + 5] = 0xFA, jpeg[i + 6] = 0xDF, jpeg[i + 7] = 0xFF, jpeg[i + 8] = 0xA4;
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  OpParams p;
  p.numbers["min_short_side"] = 8;
  auto op = MakeOp("DecodeImage", p).ValueOrDie();
  auto out = op->Apply(AsSample(jpeg), SampleContext{}, 0);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("too large"), std::string::npos) << out.status().ToString();
}

TEST(DecodeImage, FailedPngDoesNotPoisonTheNextPng) {
  const Bytes png = EncodePng(9, 7, /*gray=*/false);
  const auto expected = FreshDecode(png);
  std::vector<Bytes> bad;
  bad.emplace_back(png.begin(), png.begin() + png.size() / 2);  // truncated
  Bytes bad_crc = png;
  bad_crc[20] ^= 0x55;  // inside IHDR: its CRC fails
  bad.push_back(bad_crc);
  Bytes huge = png;
  huge[16] = 0x7F;  // width 2^30 and more: refused before any allocation
  bad.push_back(huge);
  std::thread t([&] {
    for (const Bytes& b : bad) {
      auto failed = Decode(b);
      ASSERT_FALSE(failed.ok());
      EXPECT_NE(failed.status().message().find("PNG"), std::string::npos);
      auto next = Decode(png);
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      EXPECT_EQ(Pixels(*next), expected);
    }
  });
  t.join();
}

// `jpeg` without its header segments of `marker` (0xC4 DHT, 0xDB DQT).
Bytes WithoutSegments(const Bytes& jpeg, uint8_t marker) {
  Bytes out(jpeg.begin(), jpeg.begin() + 2);
  size_t i = 2;
  while (jpeg[i + 1] != 0xDA) {
    const size_t n = (static_cast<size_t>(jpeg[i + 2]) << 8) | jpeg[i + 3];
    if (jpeg[i + 1] != marker) out.insert(out.end(), jpeg.begin() + i, jpeg.begin() + i + 2 + n);
    i += 2 + n;
  }
  out.insert(out.end(), jpeg.begin() + i, jpeg.end());
  return out;
}

TEST(DecodeImage, AJpegWithoutTablesDoesNotTakeThoseOfTheJpegDecodedBefore) {
  // libjpeg keeps DHT/DQT tables across images. A frame without DHT (Motion-JPEG: the
  // standard Huffman tables implied; TurboJPEG's encoder writes exactly those) decodes
  // as the full file; after a progressive JPEG (optimized tables) on the same thread it
  // must still. A file without DQT is refused, also after a valid JPEG.
  const Bytes full = EncodeJpeg(24, 20, /*gray=*/false);
  const Bytes no_dht = WithoutSegments(full, 0xC4);
  ASSERT_LT(no_dht.size(), full.size());
  const auto expected = FreshDecode(full);
  tjhandle enc = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  Bytes pixels = Pattern(40, 30, 3);
  for (uint8_t& v : pixels) v = static_cast<uint8_t>(255 - v / 3);
  ASSERT_EQ(tjCompress2(enc, pixels.data(), 40, 0, 30, TJPF_RGB, &buf, &size, TJSAMP_444, 95,
                        TJFLAG_PROGRESSIVE),
            0);
  const Bytes progressive(buf, buf + size);
  tjFree(buf);
  tjDestroy(enc);
  const Bytes no_dqt = WithoutSegments(full, 0xDB);
  std::thread t([&] {
    for (int i = 0; i < 2; ++i) {
      auto frame = Decode(no_dht);
      ASSERT_TRUE(frame.ok()) << frame.status().ToString();
      EXPECT_EQ(Pixels(*frame), expected) << "after " << i << " progressive decodes";
      ASSERT_TRUE(Decode(progressive).ok());
    }
    ASSERT_TRUE(Decode(full).ok());
    auto tableless = Decode(no_dqt);
    EXPECT_FALSE(tableless.ok()) << "a JPEG without quantization tables was decoded";
  });
  t.join();
}

TEST(DecodeImage, APngWhoseEndChunkIsMissingOrCutDecodesAsTheWholeFile) {
  // PIL decodes a PNG that ends after its image data (a download cut by a few bytes);
  // a cut inside the image data stays an error.
  const Bytes png = EncodePng(9, 7, /*gray=*/false);
  const auto expected = FreshDecode(png);
  for (size_t cut : {size_t{12}, size_t{2}}) {  // IEND is 12 bytes
    auto r = Decode(Bytes(png.begin(), png.end() - cut));
    ASSERT_TRUE(r.ok()) << "cut " << cut << ": " << r.status().ToString();
    EXPECT_EQ(Pixels(*r), expected);
  }
  const std::string bytes(png.begin(), png.end());
  const size_t idat = bytes.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  const size_t length = (size_t{png[idat - 4]} << 24) | (size_t{png[idat - 3]} << 16) |
                        (size_t{png[idat - 2]} << 8) | png[idat - 1];
  auto r = Decode(Bytes(png.begin(), png.begin() + idat + 4 + length / 2));  // rows missing
  EXPECT_FALSE(r.ok());
}

// Random damage (truncation, flipped bytes) to JPEG and PNG images of several layouts,
// interleaved with valid images on one thread: every valid image decodes exactly as on
// a fresh thread, and no damaged one crashes the process.
TEST(DecodeImage, CorruptAndValidImagesInterleavedOnOneThread) {
  const std::vector<Bytes> valid = {EncodeJpeg(24, 20, false), EncodeJpeg(16, 12, true),
                                    EncodeJpeg(33, 7, false), EncodePng(9, 7, false),
                                    EncodePng(5, 11, true)};
  std::vector<std::pair<std::vector<int64_t>, std::string>> expected;
  for (const Bytes& b : valid) expected.push_back(FreshDecode(b));
  std::thread t([&] {
    std::mt19937_64 rng(12);
    int failures = 0;
    for (int i = 0; i < 600; ++i) {
      const size_t k = rng() % valid.size();
      Bytes b = valid[k];
      switch (rng() % 3) {
        case 0:
          b.resize(rng() % b.size());
          break;
        case 1:
          for (int j = 0; j < 4; ++j) b[rng() % b.size()] = static_cast<uint8_t>(rng());
          break;
        default: {
          auto r = Decode(b);
          ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
          ASSERT_EQ(Pixels(*r), expected[k]) << "image " << k << " at step " << i;
          continue;
        }
      }
      auto r = Decode(b);  // may fail or succeed; it must not crash
      if (!r.ok()) ++failures;
    }
    EXPECT_GT(failures, 50);
  });
  t.join();
}

}  // namespace pqloader
