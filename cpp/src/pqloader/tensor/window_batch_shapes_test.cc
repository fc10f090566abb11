// A batch cut across two shuffle windows whose rows have different shapes (a test
// written against a hand-made mutant of window_gather.cc that window_gather_test let pass).
#include "pqloader/tensor/window_gather.h"

#include <gtest/gtest.h>

#include <cstring>

namespace pqloader {
namespace {

// A window of one unit of `rows` rows of 4 bytes each, of row shape `shape`.
std::shared_ptr<WindowGather> Window(int64_t rows, const std::vector<int64_t>& shape) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = rows;
  ColumnData d;
  d.row_bytes = 4;
  d.row_shape = shape;
  std::string bytes(rows * 4, '\0');
  for (int64_t i = 0; i < rows * 4; ++i) bytes[i] = static_cast<char>(i);
  d.data = arrow::Buffer::FromString(bytes);
  u->columns.push_back(d);
  std::string index(rows * sizeof(int32_t), '\0');
  for (int32_t r = 0; r < rows; ++r) std::memcpy(&index[r * sizeof(int32_t)], &r, sizeof(r));
  ColumnSpec s;
  s.name = "v";
  s.dtype = DType::kUInt8;
  s.row_shape = shape;
  auto g = WindowGather::Make({s}, {u}, arrow::Buffer::FromString(index), arrow::default_memory_pool())
               .ValueOrDie();
  EXPECT_TRUE(g->Run().ok());
  return g;
}

TEST(WindowBatch, ABatchAcrossWindowsOfDifferentRowShapesIsRefused) {
  ColumnSpec s;
  s.name = "v";
  s.dtype = DType::kUInt8;
  s.row_shape = {4};
  auto a = Window(3, {4});
  auto b = Window(3, {2, 2});  // the same bytes per row, another shape
  auto same = WindowBatch({s}, {a, Window(3, {4})}, {0, 3}, 1, 5, arrow::default_memory_pool());
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ((*same)->columns[0].shape, (std::vector<int64_t>{4, 4}));
  auto r = WindowBatch({s}, {a, b}, {0, 3}, 1, 5, arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("different shapes"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace pqloader
