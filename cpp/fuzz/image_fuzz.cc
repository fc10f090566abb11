// Fuzz JPEG / PNG decoding (DecodeImage): the first byte picks the mode (rgb or gray),
// the DCT-scaling target and whether EXIF orientation is applied (bit 2), the rest is
// the encoded image. Each input is decoded
// twice on the same thread, so state left behind by a failure is exercised too.
#include <turbojpeg.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "pqloader/transform/op.h"

static volatile uint8_t g_sink;  // keeps the reads of the output

// Whether the image declares more than 4 M pixels. Such inputs are skipped, as
// libjpeg-turbo's own fuzzers skip them: a few hundred bytes can declare a 134 M-pixel
// CMYK JPEG whose entropy data ends at once, which decodes (gray-filled, with a warning,
// as PIL decodes it) in 50 s under ASan: a timeout, not a finding. The product's own
// bound (kMaxImageBytes) is tested by transform/image_decode_test.cc.
static bool TooLarge(const uint8_t* p, size_t n) {
  constexpr uint64_t kMaxPixels = uint64_t{1} << 22;
  if (n >= 24 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) {
    auto be32 = [](const uint8_t* q) {
      return (uint64_t{q[0]} << 24) | (uint64_t{q[1]} << 16) | (uint64_t{q[2]} << 8) | q[3];
    };
    return be32(p + 16) * be32(p + 20) > kMaxPixels;
  }
  tjhandle h = tjInitDecompress();
  if (h == nullptr) return false;
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  (void)tjDecompressHeader3(h, p, static_cast<unsigned long>(n), &width, &height, &subsamp,
                            &colorspace);  // dimensions set also where it warns
  tjDestroy(h);
  return width > 0 && height > 0 && uint64_t(width) * uint64_t(height) > kMaxPixels;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || TooLarge(data + 1, size - 1)) return 0;
  static const std::shared_ptr<const pqloader::Op> ops[8] = {
      pqloader::MakeOp("DecodeImage", {}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{}, {}, {{"mode", "gray"}}}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{{"min_short_side", 8}}, {}, {}}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{{"min_short_side", 3}}, {}, {{"mode", "gray"}}}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{{"exif_transpose", 1}}, {}, {}}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{{"exif_transpose", 1}}, {}, {{"mode", "gray"}}}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{{"min_short_side", 8}, {"exif_transpose", 1}}, {}, {}}).ValueOrDie(),
      pqloader::MakeOp("DecodeImage", {{{"min_short_side", 3}, {"exif_transpose", 1}}, {}, {{"mode", "gray"}}})
          .ValueOrDie()};
  pqloader::SampleTensor in;
  in.dtype = pqloader::DType::kUInt8;
  in.shape = {static_cast<int64_t>(size - 1)};
  in.data = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  for (int pass = 0; pass < 2; ++pass) {
    auto out = ops[data[0] & 7]->Apply(in, pqloader::SampleContext{}, 0);
    if (out.ok()) {
      uint8_t acc = 0;
      for (int64_t i = 0; i < out->data->size(); i += 64) acc ^= out->data->data()[i];
      g_sink = acc;
    }
  }
  return 0;
}
