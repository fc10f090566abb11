// Fuzz .npy / .npz decoding (DecodeNdarray, DecodeCompressedNdarray): the first byte
// picks the op, the rest is the encoded sample.
#include <cstdint>
#include <string>

#include "pqloader/transform/op.h"

static volatile uint8_t g_sink;  // keeps the reads of the output

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto npy = pqloader::MakeOp("DecodeNdarray", {}).ValueOrDie();
  static const auto npz = pqloader::MakeOp("DecodeCompressedNdarray", {}).ValueOrDie();
  if (size < 1) return 0;
  pqloader::SampleTensor in;
  in.dtype = pqloader::DType::kUInt8;
  in.shape = {static_cast<int64_t>(size - 1)};
  in.data = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  auto out = ((data[0] & 1) ? npz : npy)->Apply(in, pqloader::SampleContext{}, 0);
  if (out.ok() && out->data != nullptr) {
    uint8_t acc = 0;
    for (int64_t i = 0; i < out->data->size(); i += 4096) acc ^= out->data->data()[i];
    g_sink = acc;
  }
  return 0;
}
