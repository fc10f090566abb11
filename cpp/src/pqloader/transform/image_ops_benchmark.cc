// The image ops of an eval pipeline on a 375 x 500 RGB image (ImageNet's most common
// size): Resize(256) + CenterCrop(224) (fused), and Normalize + ToCHW.
//
//   build/py/cpp/src/pqloader/image_ops_benchmark
#include <benchmark/benchmark.h>

#include <cmath>

#include "pqloader/transform/op.h"
#include "pqloader/transform/pipeline.h"

namespace pqloader {
namespace {

SampleTensor Photo() {
  SampleTensor s = AllocateSample(DType::kUInt8, {375, 500, 3}).ValueOrDie();
  uint8_t* p = s.data->mutable_data();
  for (int64_t y = 0; y < 375; ++y) {
    for (int64_t x = 0; x < 500; ++x) {
      for (int c = 0; c < 3; ++c) {
        p[(y * 500 + x) * 3 + c] = static_cast<uint8_t>(128 + 100 * std::sin(0.05 * x + 0.07 * y + c));
      }
    }
  }
  return s;
}

void BM_ResizeCenterCrop(benchmark::State& state) {
  const SampleTensor in = Photo();
  // Resize(256) of 375 x 500 is 256 x 341; the centre 224 x 224 window of it.
  const CropBox win{16, 58, 224, 224};
  for (auto _ : state) {
    auto out = ResizeImage(in, CropBox{0, 0, 375, 500}, 256, 341, &win);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Resize(benchmark::State& state) {
  const SampleTensor in = Photo();
  for (auto _ : state) {
    auto out = ResizeImage(in, CropBox{0, 0, 375, 500}, 256, 341);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_NormalizeToCHW(benchmark::State& state) {
  OpParams p;
  p.lists["mean"] = {0.485, 0.456, 0.406};
  p.lists["std"] = {0.229, 0.224, 0.225};
  ColumnSpec spec;
  spec.name = "img";
  spec.dtype = DType::kUInt8;
  spec.row_shape = {224, 224, 3};
  // Through a plan, which fuses the two ops into one pass.
  auto plan = TransformPlan::Make({spec}, {{"img", {MakeOp("Normalize", p).ValueOrDie(),
                                                    MakeOp("ToCHW", {}).ValueOrDie()}}},
                                  DecodeErrorPolicy::kRaise, /*cache_point=*/false)
                  .ValueOrDie();
  DecodedUnit unit;
  unit.num_rows = 1;
  ColumnData c;
  c.row_shape = spec.row_shape;
  c.row_bytes = 224 * 224 * 3;
  c.data = AllocateSample(DType::kUInt8, {c.row_bytes}).ValueOrDie().data;
  for (int64_t i = 0; i < c.row_bytes; ++i) c.data->mutable_data()[i] = static_cast<uint8_t>(i);
  unit.columns.push_back(c);
  for (auto _ : state) {
    auto out = plan.ApplySuffix(0, spec, unit, 0, SampleContext{});
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_ResizeCenterCrop)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Resize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NormalizeToCHW)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pqloader

BENCHMARK_MAIN();
