// Per-sample transform ops (image decoding and augmentation, ndarray codecs, padding).
//
// An Op maps one sample tensor to another. Deterministic ops are pure functions of the
// sample; random ops draw only from CounterRng::ForSample(seed, epoch, sample index, op
// position), so a sample gets the same augmentation whichever thread runs it and at
// whatever time. Ops know nothing of files, order or threads.
// Thread-safety: an Op is immutable after construction and may be applied concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/result.h>

#include "pqloader/random/philox.h"
#include "pqloader/tensor/batch.h"

namespace pqloader {

/// The most bytes an image may take, decoded (a corrupt or hostile header) or resized
/// (a 1xN PNG of 100 bytes resized to 256 x 256N).
constexpr int64_t kMaxImageBytes = int64_t{1} << 31;

/// Where a sample is in the epoch: the key of every random draw.
struct SampleContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t sample_index = 0;  ///< Global index of the row in the dataset.
};

class Op {
 public:
  virtual ~Op() = default;
  /// Name and parameters, e.g. "Resize(size=256)".
  virtual std::string ToString() const = 0;
  /// What identifies the op's output in cache keys: ToString(), and for an op whose
  /// output for the same input changed between releases, a version after it, so that
  /// entries written by an older pqloader are not served as this one's.
  virtual std::string Fingerprint() const { return ToString(); }
  /// Whether the op draws random numbers (it then runs after the cache point).
  virtual bool is_random() const { return false; }
  /// Transform `in`. `op_index` is the op's position in its column's pipeline.
  virtual arrow::Result<SampleTensor> Apply(const SampleTensor& in, const SampleContext& ctx,
                                            int op_index) const = 0;
  /// Return what Apply makes of samples described by `in`, as far as it is known before
  /// any data (the dtype and row shape of a batch without rows). Default: nothing.
  virtual SampleSignature OutputSignature(const SampleSignature& /*in*/) const { return {}; }
  /// Refuse samples described by `in` that Apply would refuse whatever their data (an
  /// image op on a 1-D column, Resize of uint16 pixels): found when the plan is made, not
  /// at the first row (where on_decode_error="skip" had skipped every row). Default: OK.
  virtual arrow::Status CheckInput(const SampleSignature& /*in*/) const {
    return arrow::Status::OK();
  }
};

/// Parameters of an op as given by the user (Python keyword arguments).
struct OpParams {
  std::map<std::string, double> numbers;
  std::map<std::string, std::vector<double>> lists;
  std::map<std::string, std::string> strings;

  double Number(const std::string& key, double fallback) const;
  std::vector<double> List(const std::string& key, std::vector<double> fallback) const;
  std::string String(const std::string& key, const std::string& fallback) const;
};

/// Make the op called `name` (DecodeImage, Resize, CenterCrop, RandomResizedCrop,
/// RandomHorizontalFlip, Normalize, ToCHW, Cast, DecodeNdarray,
/// DecodeCompressedNdarray, PadOrTruncate). Fails on an unknown name or bad parameters.
arrow::Result<std::shared_ptr<const Op>> MakeOp(const std::string& name, const OpParams& params);

/// For a decoding op's CheckInput: refuses rows `in` describes that are not encoded bytes
/// (a binary column's, or a 1-D list of uint8), which `op`'s Apply refuses at every row.
arrow::Status CheckEncodedInput(const SampleSignature& in, const std::string& op);

/// Allocate an uninitialised sample of `dtype` and `shape`: in the slot of this thread's
/// SampleSlotScope when one is open, unused, and exactly the sample's size.
arrow::Result<SampleTensor> AllocateSample(DType dtype, std::vector<int64_t> shape,
                                           bool channels_first = false);

/// While open, the first AllocateSample on this thread of exactly `bytes` bytes returns a
/// view of `block` at `offset` instead of new memory: a transformed sample is written
/// straight into its row of a batch column (TransformPlan::ApplySuffix). An op that
/// allocates a temporary of that size first takes the slot with it; its output then
/// comes from the pool as usual (the batch copies it: correct, only not faster).
class SampleSlotScope {
 public:
  SampleSlotScope(std::shared_ptr<arrow::Buffer> block, int64_t offset, int64_t bytes);
  ~SampleSlotScope();
  SampleSlotScope(const SampleSlotScope&) = delete;
  SampleSlotScope& operator=(const SampleSlotScope&) = delete;
};

// Image ops, exposed for tests and for the random-crop parameters.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};
/// torchvision's RandomResizedCrop.get_params, drawing from `rng`.
CropBox RandomResizedCropParams(int64_t height, int64_t width, double scale_lo, double scale_hi,
                                double ratio_lo, double ratio_hi, CounterRng* rng);
/// Resize an HWC uint8 or float32 image to (out_h, out_w), bilinear with antialias
/// (PIL / torchvision semantics), after cropping to `box`; return only the `window` of
/// the result (in its coordinates) when given: the same pixels, computed for the window.
arrow::Result<SampleTensor> ResizeImage(const SampleTensor& in, const CropBox& box,
                                        int64_t out_h, int64_t out_w,
                                        const CropBox* window = nullptr);
/// Copy a `rows` x `cols` block of 3-byte pixels (row pitch `src_pitch` bytes)
/// transposed: pixel (r, k) to dst + k * dst_col_pitch + r * 3, nothing else written.
/// `vector`: 8 x 8 tiles with AVX2 where the CPU has it; the same bytes either way.
/// (The resize's horizontal pass runs on transposed blocks.)
void TransposeRgbPixels(const uint8_t* src, int64_t src_pitch, int64_t rows, int64_t cols,
                        uint8_t* dst, int64_t dst_col_pitch, bool vector = true);

}  // namespace pqloader
