#include <cstdint>
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

}  // namespace
}  // namespace pqloader
