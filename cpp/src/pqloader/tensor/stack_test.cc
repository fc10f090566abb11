#include "pqloader/tensor/stack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace pqloader {
namespace {

ColumnSpec Tensor(const std::string& name, DType dtype, std::vector<int64_t> row_shape = {}) {
  ColumnSpec s;
  s.name = name;
  s.dtype = dtype;
  s.row_shape = std::move(row_shape);
  return s;
}

std::vector<std::optional<FixedRows>> FixedOf(const std::vector<ColumnSpec>& specs) {
  std::vector<std::optional<FixedRows>> out;
  for (const ColumnSpec& s : specs) {
    bool fixed = s.kind == ColumnKind::kTensor;
    for (int64_t d : s.row_shape) fixed = fixed && d >= 0;
    if (fixed) {
      out.push_back(FixedRows{s.dtype, s.row_shape});
    } else {
      out.push_back(std::nullopt);
    }
  }
  return out;
}

arrow::Result<StackPlan> Plan(const std::vector<ColumnSpec>& specs, std::vector<StackSpec> stacks) {
  return StackPlan::Make(specs, FixedOf(specs), stacks);
}

// Every width the kernel has a path for (and one it has not), column counts around the
// vector groups (8 of 4 bytes, 4 of 8), row counts around the 8- and 4-row blocks.
TEST(StackRows, EqualsOneValueAtATime) {
  std::mt19937 rng(7);
  for (int64_t width : {1, 2, 4, 8, 12}) {
    for (int64_t k : {1, 3, 4, 5, 8, 9, 16, 17}) {
      for (int64_t n : {0, 1, 3, 7, 8, 9, 100}) {
        std::vector<std::vector<uint8_t>> cols(k, std::vector<uint8_t>(n * width));
        for (auto& c : cols) for (auto& b : c) b = static_cast<uint8_t>(rng());
        std::vector<const uint8_t*> ptrs;
        for (auto& c : cols) ptrs.push_back(c.data());
        std::vector<uint8_t> got(n * k * width + 1, 0xAB), want(n * k * width + 1, 0xAB);
        StackRows(ptrs.data(), k, n, width, got.data());
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = 0; c < k; ++c) {
            std::memcpy(want.data() + (r * k + c) * width, cols[c].data() + r * width, width);
          }
        }
        ASSERT_EQ(got, want) << "width " << width << " k " << k << " n " << n;  // incl. the byte after
      }
    }
  }
}

TEST(StackPlan, ReplacesTheMembersByOneColumnInTheFirstMembersPlace) {
  std::vector<ColumnSpec> specs = {Tensor("id", DType::kInt64), Tensor("b", DType::kFloat32),
                                   Tensor("a", DType::kFloat32), Tensor("label", DType::kInt64),
                                   Tensor("c", DType::kFloat32)};
  auto plan = Plan(specs, {{"x", {"a", "b", "c"}}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> names;
  for (const ColumnSpec& s : plan->specs()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"id", "x", "label"}));
  EXPECT_EQ(plan->specs()[1].dtype, DType::kFloat32);
  EXPECT_EQ(plan->specs()[1].row_shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(plan->sources(), (std::vector<int>{0, -1, 3}));

  // A member's name may be the stack's; rows of a shape stack to [n, k, shape...].
  std::vector<ColumnSpec> pairs = {Tensor("p", DType::kInt16, {2}), Tensor("q", DType::kInt16, {2})};
  auto same_name = Plan(pairs, {{"q", {"p", "q"}}});
  ASSERT_TRUE(same_name.ok()) << same_name.status().ToString();
  ASSERT_EQ(same_name->specs().size(), 1u);
  EXPECT_EQ(same_name->specs()[0].name, "q");
  EXPECT_EQ(same_name->specs()[0].row_shape, (std::vector<int64_t>{2, 2}));
}

TEST(StackPlan, AMembersMaskMarksTheStack) {
  std::vector<ColumnSpec> specs = {Tensor("a", DType::kFloat32), Tensor("b", DType::kFloat32),
                                   Tensor("b_valid", DType::kBool), Tensor("d", DType::kInt8),
                                   Tensor("d_valid", DType::kBool)};
  specs[2].mask_of = 1;
  specs[4].mask_of = 3;
  auto plan = Plan(specs, {{"x", {"a", "b"}}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->specs().size(), 4u);  // x, b_valid, d, d_valid
  EXPECT_EQ(plan->specs()[1].mask_of, 0);
  EXPECT_EQ(plan->specs()[3].mask_of, 2);
}

TEST(StackPlan, RefusesWhatCannotBeStacked) {
  std::vector<ColumnSpec> specs = {Tensor("a", DType::kFloat32), Tensor("b", DType::kFloat32),
                                   Tensor("i", DType::kInt32), Tensor("m", DType::kFloat32, {2}),
                                   Tensor("list", DType::kFloat32, {-1}), Tensor("s", DType::kUInt8)};
  specs[5].kind = ColumnKind::kString;
  auto refused = [&](std::vector<StackSpec> stacks, const std::string& says) {
    auto plan = Plan(specs, std::move(stacks));
    ASSERT_FALSE(plan.ok()) << says;
    EXPECT_TRUE(plan.status().IsInvalid());
    EXPECT_NE(plan.status().message().find(says), std::string::npos) << plan.status().message();
  };
  {
    auto plan = Plan(specs, {{"x", {"a", "nope"}}});  // a name the selection lacks
    ASSERT_FALSE(plan.ok());
    EXPECT_TRUE(plan.status().IsKeyError());  // ColumnNotFoundError in Python
    EXPECT_NE(plan.status().message().find("names column 'nope', which is not among the selected"),
              std::string::npos)
        << plan.status().message();
  }
  refused({{"x", {"a", "i"}}}, "column 'i' is int32 with rows of shape ()");
  refused({{"x", {"a", "m"}}}, "column 'm' is float32 with rows of shape (2,)");
  refused({{"x", {"a", "list"}}}, "column 'list' has rows whose shape or dtype depends on the data");
  refused({{"x", {"a", "s"}}}, "column 's' holds strings or bytes");
  refused({{"x", {"a", "a"}}}, "column 'a' is already in this stack");
  refused({{"x", {"a"}}, {"y", {"b", "a"}}}, "column 'a' is already in stack 'x'");
  refused({{"x", {"a"}}, {"x", {"b"}}}, "two stacks have this name");
  refused({{"x", {}}}, "no columns to stack");
  refused({{"", {"a"}}}, "needs a name");
  refused({{"i", {"a", "b"}}}, "the name of an output column that is not one of its members");
  refused({{"a", {"b"}}, {"y", {"a"}}}, "the name of a member of stack 'y'");
}

BatchColumn Column(DType dtype, std::vector<int64_t> shape, std::shared_ptr<arrow::Buffer> data) {
  BatchColumn c;
  c.dtype = dtype;
  c.shape = std::move(shape);
  c.data = std::move(data);
  return c;
}

std::shared_ptr<arrow::Buffer> Floats(const std::vector<float>& v) {
  auto b = arrow::AllocateBuffer(static_cast<int64_t>(v.size() * sizeof(float))).ValueOrDie();
  std::memcpy(b->mutable_data(), v.data(), v.size() * sizeof(float));
  return std::shared_ptr<arrow::Buffer>(std::move(b));
}

TEST(StackPlan, ApplyStacksTheBatchAndChecksItsColumns) {
  std::vector<ColumnSpec> specs = {Tensor("a", DType::kFloat32), Tensor("label", DType::kInt64),
                                   Tensor("b", DType::kFloat32)};
  auto plan = Plan(specs, {{"x", {"b", "a"}}});
  ASSERT_TRUE(plan.ok());
  auto batch = std::make_shared<Batch>();
  batch->num_rows = 3;
  BatchColumn a = Column(DType::kFloat32, {3}, Floats({1, 2, 3}));
  BatchColumn b = Column(DType::kFloat32, {3}, Floats({10, 20, 30}));
  BatchColumn label = Column(DType::kInt64, {3}, Floats({0, 0, 0, 0, 0, 0}));
  batch->columns = {a, label, b};
  auto out = plan->Apply(batch, arrow::default_memory_pool());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ((*out)->columns.size(), 2u);
  const BatchColumn& x = (*out)->columns[0];
  EXPECT_EQ(x.shape, (std::vector<int64_t>{3, 2}));
  std::vector<float> got(6);
  std::memcpy(got.data(), x.data->data(), 24);
  EXPECT_EQ(got, (std::vector<float>{10, 1, 20, 2, 30, 3}));
  EXPECT_EQ((*out)->columns[1].dtype, DType::kInt64);
  EXPECT_EQ((*out)->owned_bytes, 24);

  auto wrong = std::make_shared<Batch>();
  wrong->num_rows = 3;
  BatchColumn a2 = Column(DType::kFloat32, {3, 1}, Floats({1, 2, 3}));
  wrong->columns = {a2, label, b};
  auto refused = plan->Apply(wrong, arrow::default_memory_pool());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("is not float32 of shape (3,)"), std::string::npos)
      << refused.status().message();
}

// The stack takes the place of its earliest member in the selection, whatever the order
// its columns are listed in.
TEST(StackPlan, TheStackIsInItsEarliestMembersPlaceWhateverTheListsOrder) {
  std::vector<ColumnSpec> specs = {Tensor("id", DType::kInt64), Tensor("b", DType::kFloat32),
                                   Tensor("label", DType::kInt64), Tensor("a", DType::kFloat32)};
  auto plan = Plan(specs, {{"x", {"a", "b"}}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> names;
  for (const ColumnSpec& s : plan->specs()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"id", "x", "label"}));
  EXPECT_EQ(plan->sources(), (std::vector<int>{0, -1, 2}));
}

// A member whose buffer holds fewer rows than the batch is refused (not read past), and
// the stacked block is added to the bytes the batch already owns.
TEST(StackPlan, ApplyRefusesAShortMemberAndCountsTheBlock) {
  std::vector<ColumnSpec> specs = {Tensor("a", DType::kFloat32), Tensor("b", DType::kFloat32)};
  auto plan = Plan(specs, {{"x", {"a", "b"}}});
  ASSERT_TRUE(plan.ok());
  auto batch = std::make_shared<Batch>();
  batch->num_rows = 3;
  batch->owned_bytes = 100;
  batch->columns = {Column(DType::kFloat32, {3}, Floats({1, 2, 3})),
                    Column(DType::kFloat32, {3}, Floats({4, 5, 6}))};
  auto out = plan->Apply(batch, arrow::default_memory_pool());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)->owned_bytes, 100 + 24);

  auto shortb = std::make_shared<Batch>();
  shortb->num_rows = 3;
  shortb->columns = {Column(DType::kFloat32, {3}, Floats({1, 2, 3})),
                     Column(DType::kFloat32, {3}, Floats({4, 5}))};
  auto refused = plan->Apply(shortb, arrow::default_memory_pool());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("stack 'x': column 1 of the batch"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace pqloader
