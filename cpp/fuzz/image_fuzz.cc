// Fuzz JPEG / PNG decoding (DecodeImage): the first byte picks the mode (rgb or gray),
// the DCT-scaling target and whether EXIF orientation is applied (bit 2), the rest is
// the encoded image. Each input is decoded
// twice on the same thread, so state left behind by a failure is exercised too.
#include <cstdint>
#include <string>

#include "pqloader/transform/op.h"

static volatile uint8_t g_sink;  // keeps the reads of the output

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
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
