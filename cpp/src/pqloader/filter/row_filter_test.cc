#include "pqloader/filter/row_filter.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include <arrow/api.h>
#include <arrow/compute/api.h>
#include <arrow/compute/expression.h>
#include <arrow/io/file.h>
#include <arrow/json/from_string.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include "pqloader/error.h"
#include "pqloader/loader.h"
#include "pqloader/test_util.h"

namespace pqloader {
namespace {

namespace cp = arrow::compute;

std::string Serialized(const cp::Expression& e) {
  return cp::Serialize(e).ValueOrDie()->ToString();
}

// Two files of three 100-row row groups: ids 0..299 and 300..599 (statistics written).
std::string TwoFiles() {
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/a.parquet", {100, 100, 100}, 0);
  testing::WriteIdFile(dir + "/b.parquet", {100, 100, 100}, 300);
  return dir;
}

// The ids of `epoch`, every row's x checked against its id (the kept rows of both
// columns are the same rows).
std::vector<int64_t> Ids(Loader* loader, int64_t epoch) {
  EXPECT_TRUE(loader->StartEpoch(epoch).ok());
  return testing::DrainIds(loader, /*check_x=*/true);
}

TEST(RowFilter, StatisticsPruneRowGroupsAndMasksSelectRows) {
  const std::string dir = TwoFiles();
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression = Serialized(
      cp::and_(cp::greater_equal(cp::field_ref("id"), cp::literal(int64_t{150})),
               cp::less(cp::field_ref("id"), cp::literal(int64_t{420}))));
  auto sel = EvaluateFilter(*ds, options).ValueOrDie();
  using S = RowSelection::Stage;
  EXPECT_EQ(sel.stage, (std::vector<S>{S::kStatistics, S::kMasked, S::kAll, S::kAll, S::kMasked,
                                       S::kStatistics}));
  EXPECT_EQ(sel.rows[1]->size(), 50u);
  EXPECT_EQ(sel.rows[1]->front(), 50);
  EXPECT_EQ(sel.rows[4]->size(), 20u);
  EXPECT_EQ(sel.stats.row_groups_pruned_statistics, 2);
  // Row groups 2 and 3 lie wholly in the range: statistics only prune, so they are
  // masked too (and kept whole by the mask).
  EXPECT_EQ(sel.stats.row_groups_masked, 4);
  EXPECT_EQ(sel.stats.row_groups_all_rows, 0);
  EXPECT_EQ(sel.stats.rows, 600);
  EXPECT_EQ(sel.stats.rows_kept, 270);
  EXPECT_GT(sel.stats.bytes_pruned, 0);
  EXPECT_GT(sel.stats.mask_bytes_read, 0);
}

// One row group: ids [0, n) and the columns of `named`.
void WriteColumns(const std::string& path,
                  const std::vector<std::pair<std::string, std::shared_ptr<arrow::Array>>>& named) {
  arrow::Int64Builder ids;
  for (int64_t i = 0; i < named[0].second->length(); ++i) ASSERT_TRUE(ids.Append(i).ok());
  arrow::FieldVector fields = {arrow::field("id", arrow::int64())};
  arrow::ArrayVector arrays = {ids.Finish().ValueOrDie()};
  for (const auto& [name, values] : named) {
    fields.push_back(arrow::field(name, values->type()));
    arrays.push_back(values);
  }
  auto table = arrow::Table::Make(arrow::schema(fields), arrays);
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  ASSERT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, 100).ok());
  ASSERT_TRUE(out->Close().ok());
}

template <typename Builder, typename T>
std::shared_ptr<arrow::Array> ArrayOf(std::vector<T> values) {
  Builder b;
  EXPECT_TRUE(b.AppendValues(values).ok());
  return b.Finish().ValueOrDie();
}

// Each file's kept rows, with every row group masked.
void ExpectRowZeroKeptIn(const RowSelection& sel, size_t files) {
  ASSERT_EQ(sel.stage.size(), files);
  for (size_t s = 0; s < files; ++s) {
    ASSERT_EQ(sel.stage[s], RowSelection::Stage::kMasked) << s;
    EXPECT_EQ(*sel.rows[s], std::vector<int32_t>{0}) << s;
  }
}

TEST(RowFilter, NumbersAreComparedInTheTypeTheLoaderLoads) {
  // x is int64 [3, 4] in one file and double [3, 4] in the other, declared double: "x / 2
  // == 1.5" holds for both 3s (bound to the int64 file's own type, x / 2 divided as
  // integers and kept only the double file's row).
  const std::string dir = testing::MakeTempDir();
  WriteColumns(dir + "/a.parquet", {{"x", ArrayOf<arrow::Int64Builder>(std::vector<int64_t>{3, 4})}});
  WriteColumns(dir + "/b.parquet", {{"x", ArrayOf<arrow::DoubleBuilder>(std::vector<double>{3, 4})}});
  FilterOptions options;
  options.serialized_expression = Serialized(cp::equal(
      cp::call("divide", {cp::field_ref("x"), cp::literal(int64_t{2})}), cp::literal(1.5)));
  DatasetOptions declared;
  declared.columns.schema = arrow::schema({arrow::field("id", arrow::int64()),
                                           arrow::field("x", arrow::float64())});
  auto ds = Dataset::Open({dir}, declared).ValueOrDie();
  ExpectRowZeroKeptIn(EvaluateFilter(*ds, options).ValueOrDie(), 2);
  // Columns the filter reads alone, uint32 in one file and int64 in the other: compared
  // as int64, the type common to the files ("a - b < 0" overflowed the uint32 file's).
  const std::string dir2 = testing::MakeTempDir();
  WriteColumns(dir2 + "/a.parquet", {{"a", ArrayOf<arrow::UInt32Builder>(std::vector<uint32_t>{1, 5})},
                                     {"b", ArrayOf<arrow::UInt32Builder>(std::vector<uint32_t>{2, 3})}});
  WriteColumns(dir2 + "/b.parquet", {{"a", ArrayOf<arrow::Int64Builder>(std::vector<int64_t>{1, 5})},
                                     {"b", ArrayOf<arrow::Int64Builder>(std::vector<int64_t>{2, 3})}});
  options.serialized_expression = Serialized(cp::less(
      cp::call("subtract_checked", {cp::field_ref("a"), cp::field_ref("b")}), cp::literal(int64_t{0})));
  DatasetOptions ids_only;
  ids_only.columns.columns = {"id"};
  auto ds2 = Dataset::Open({dir2}, ids_only).ValueOrDie();
  ExpectRowZeroKeptIn(EvaluateFilter(*ds2, options).ValueOrDie(), 2);
}

TEST(RowFilter, LoaderDeliversExactlyTheKeptRowsInEveryOrder) {
  const std::string dir = TwoFiles();
  LoaderOptions o;
  o.plan.batch_size = 32;
  o.num_workers = 3;
  // Rows 150..419 that are not multiples of 7: every split kind (pruned, masked
  // scattered, whole).
  o.filter.serialized_expression = Serialized(cp::and_(
      {cp::greater_equal(cp::field_ref("id"), cp::literal(int64_t{150})),
       cp::less(cp::field_ref("id"), cp::literal(int64_t{420})),
       cp::equal(cp::call("divide", {cp::field_ref("id"), cp::literal(int64_t{7})}),
                     cp::call("divide", {cp::call("add", {cp::field_ref("id"),
                                                          cp::literal(int64_t{1})}),
                                         cp::literal(int64_t{7})}))}));
  std::vector<int64_t> expected;
  for (int64_t id = 150; id < 420; ++id) {
    if ((id + 1) % 7 != 0) expected.push_back(id);
  }
  auto loader = Loader::Make({dir}, o).ValueOrDie();
  EXPECT_EQ(loader->num_rows(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(Ids(loader.get(), 0), expected);
  // Shuffled: the same multiset, the same order for any worker count.
  o.plan.shuffle = true;
  o.plan.seed = 9;
  auto shuffled = Loader::Make({dir}, o).ValueOrDie();
  auto ids = Ids(shuffled.get(), 1);
  o.num_workers = 1;
  auto one = Loader::Make({dir}, o).ValueOrDie();
  EXPECT_EQ(Ids(one.get(), 1), ids);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, expected);
}

TEST(RowFilter, PartitionKeysPruneFiles) {
  const std::string dir = testing::MakeTempDir();
  std::filesystem::create_directories(dir + "/part=1");
  std::filesystem::create_directories(dir + "/part=2");
  testing::WriteIdFile(dir + "/part=1/a.parquet", {10, 10}, 0);
  testing::WriteIdFile(dir + "/part=2/b.parquet", {10}, 20);
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression =
      Serialized(cp::equal(cp::field_ref("part"), cp::literal(int64_t{2})));
  auto sel = EvaluateFilter(*ds, options).ValueOrDie();
  EXPECT_EQ(sel.stats.files_pruned, 1);
  EXPECT_EQ(sel.stats.row_groups_pruned_partition, 2);
  EXPECT_EQ(sel.stats.rows_kept, 10);
  EXPECT_EQ(sel.stats.mask_bytes_read, 0);  // decided from the path alone
}

TEST(RowFilter, SelectionIsStoredAndReusedButNotAfterTheFilesChange) {
  const std::string dir = TwoFiles();
  const std::string store = testing::MakeTempDir();
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression =
      Serialized(cp::equal(cp::call("bit_wise_and", {cp::field_ref("id"),
                                                     cp::literal(int64_t{1})}),
                           cp::literal(int64_t{0})));
  options.store_dir = store;
  auto first = EvaluateFilter(*ds, options).ValueOrDie();
  EXPECT_FALSE(first.stats.from_store);
  auto second = EvaluateFilter(*ds, options).ValueOrDie();
  EXPECT_TRUE(second.stats.from_store);
  EXPECT_GT(first.stats.mask_bytes_read, 0);
  EXPECT_EQ(second.stats.mask_bytes_read, 0);  // loaded: nothing read now
  EXPECT_EQ(second.stage, first.stage);
  for (size_t s = 0; s < first.rows.size(); ++s) {
    ASSERT_EQ(first.rows[s] == nullptr, second.rows[s] == nullptr);
    if (first.rows[s]) {
      EXPECT_EQ(*first.rows[s], *second.rows[s]);
    }
  }
  EXPECT_EQ(second.stats.rows_kept, 300);
  // A damaged stored selection is not used.
  int damaged = 0;
  for (const auto& e : std::filesystem::directory_iterator(store + "/filters")) {
    if (e.path().extension() != ".sel") continue;  // not the lock
    std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) - 1);
    ++damaged;
  }
  EXPECT_EQ(damaged, 1);
  EXPECT_FALSE(EvaluateFilter(*ds, options).ValueOrDie().stats.from_store);
  // Another file content: another key.
  testing::WriteIdFile(dir + "/b.parquet", {100, 100, 100}, 301);
  auto changed = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  auto third = EvaluateFilter(*changed, options).ValueOrDie();
  EXPECT_FALSE(third.stats.from_store);
}

TEST(RowFilter, RanksSharingAStoreComputeTheSelectionOnce) {
  const std::string dir = TwoFiles();
  const std::string store = testing::MakeTempDir();
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression =
      Serialized(cp::less(cp::field_ref("x"), cp::literal(100.0f)));
  options.store_dir = store;
  std::vector<std::thread> ranks;
  std::vector<int> computed(4, -1);
  std::vector<int64_t> kept(4, -1);
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      auto sel = EvaluateFilter(*ds, options).ValueOrDie();
      computed[r] = sel.stats.from_store ? 0 : 1;
      kept[r] = sel.stats.rows_kept;
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(computed[0] + computed[1] + computed[2] + computed[3], 1);
  EXPECT_EQ(kept, std::vector<int64_t>(4, 200));
}

TEST(RowFilter, ACancelledEvaluationStopsWithCancelled) {
  const std::string dir = TwoFiles();
  DatasetOptions dataset_options;
  auto cancel = std::make_shared<std::atomic<bool>>(true);
  dataset_options.cancel = cancel;
  EXPECT_TRUE(Dataset::Open({dir}, dataset_options).status().IsCancelled());
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression = Serialized(cp::less(cp::field_ref("x"), cp::literal(100.0f)));
  options.cancel = cancel;
  EXPECT_TRUE(EvaluateFilter(*ds, options).status().IsCancelled());
  // Set while a predicate runs: the row groups after it are not read.
  cancel->store(false);
  std::atomic<int> calls{0};
  options.serialized_expression.clear();
  options.predicate_columns = {"id"};
  options.threads = 1;
  options.predicate = [&](const std::shared_ptr<arrow::RecordBatch>& batch)
      -> arrow::Result<std::shared_ptr<arrow::Array>> {
    ++calls;
    cancel->store(true);
    arrow::BooleanBuilder b;
    ARROW_RETURN_NOT_OK(b.AppendValues(std::vector<bool>(batch->num_rows(), true)));
    return b.Finish();
  };
  EXPECT_TRUE(EvaluateFilter(*ds, options).status().IsCancelled());
  EXPECT_EQ(calls.load(), 1);
}

TEST(RowFilter, PredicateRunsOnWholeBatchesAndAndsWithTheExpression) {
  const std::string dir = TwoFiles();
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression =
      Serialized(cp::less(cp::field_ref("id"), cp::literal(int64_t{100})));
  std::atomic<int> calls{0};
  options.predicate_columns = {"x"};
  options.predicate = [&](const std::shared_ptr<arrow::RecordBatch>& batch)
      -> arrow::Result<std::shared_ptr<arrow::Array>> {
    ++calls;
    EXPECT_EQ(batch->num_columns(), 1);
    EXPECT_EQ(batch->schema()->field(0)->name(), "x");
    return cp::CallFunction("less", {batch->column(0), arrow::MakeScalar(10.0f)})
        .ValueOrDie()
        .make_array();
  };
  auto sel = EvaluateFilter(*ds, options).ValueOrDie();
  EXPECT_EQ(sel.stats.rows_kept, 20);  // x = id / 2 < 10
  EXPECT_EQ(calls.load(), 1);          // one row group left by statistics
}

TEST(RowFilter, ErrorsNameTheColumnOrTheProblem) {
  const std::string dir = TwoFiles();
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.serialized_expression =
      Serialized(cp::equal(cp::field_ref("lang"), cp::literal("en")));
  auto st = EvaluateFilter(*ds, options).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'lang'"), std::string::npos) << st.message();
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kColumnNotFound);
  options.serialized_expression = Serialized(cp::field_ref("id"));
  st = EvaluateFilter(*ds, options).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a condition"), std::string::npos) << st.message();
  options.serialized_expression = "garbage";
  EXPECT_FALSE(EvaluateFilter(*ds, options).ok());
}

TEST(RowFilter, NothingKeptGivesAnEmptyEpoch) {
  const std::string dir = TwoFiles();
  LoaderOptions o;
  o.filter.serialized_expression =
      Serialized(cp::greater(cp::field_ref("id"), cp::literal(int64_t{10000})));
  auto loader = Loader::Make({dir}, o).ValueOrDie();
  EXPECT_EQ(loader->num_rows(), 0);
  EXPECT_TRUE(Ids(loader.get(), 0).empty());
  EXPECT_EQ(loader->filter_stats().row_groups_pruned_statistics, 6);
  EXPECT_EQ(loader->filter_stats().mask_bytes_read, 0);
}

// The rows `sel` keeps of its one row group (empty when it keeps none), all of them as
// [0, n) when it keeps it whole.
std::vector<int32_t> KeptRows(const RowSelection& sel, int32_t n) {
  EXPECT_EQ(sel.stage.size(), 1u);
  switch (sel.stage[0]) {
    case RowSelection::Stage::kMasked: return *sel.rows[0];
    case RowSelection::Stage::kAll: {
      std::vector<int32_t> all(n);
      for (int32_t i = 0; i < n; ++i) all[i] = i;
      return all;
    }
    default: return {};
  }
}

TEST(RowFilter, NullsNaNsAndAPredicateAloneAreDecidedRowByRow) {
  // x: null 2 0 (statistics [0, 2], one null); f: 1 NaN 2 (statistics [1, 2], NaN left out).
  const std::string dir = testing::MakeTempDir();
  arrow::Int64Builder x;
  ASSERT_TRUE(x.AppendNull().ok() && x.Append(2).ok() && x.Append(0).ok());
  arrow::DoubleBuilder f;
  ASSERT_TRUE(f.AppendValues({1.0, std::nan(""), 2.0}).ok());
  WriteColumns(dir + "/a.parquet", {{"x", x.Finish().ValueOrDie()}, {"f", f.Finish().ValueOrDie()}});
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  auto kept = [&](const FilterOptions& options) {
    auto sel = EvaluateFilter(*ds, options);
    EXPECT_TRUE(sel.ok()) << sel.status().ToString();
    return sel.ok() ? KeptRows(*sel, 3) : std::vector<int32_t>{-1};
  };
  FilterOptions options;
  // A null comparison drops its row.
  options.serialized_expression = Serialized(cp::greater(cp::field_ref("x"), cp::literal(int64_t{1})));
  EXPECT_EQ(kept(options), std::vector<int32_t>{1});
  // The statistics' range holds the non-null values only: is_null keeps the null row.
  options.serialized_expression = Serialized(cp::is_null(cp::field_ref("x")));
  EXPECT_EQ(kept(options), std::vector<int32_t>{0});
  // Floating-point statistics leave NaN out: "not (f > 0)" holds for the NaN row.
  options.serialized_expression =
      Serialized(cp::not_(cp::greater(cp::field_ref("f"), cp::literal(0.0))));
  EXPECT_EQ(kept(options), std::vector<int32_t>{1});
  // A predicate without an expression still runs on every row group.
  options.serialized_expression.clear();
  options.predicate_columns = {"x"};
  options.predicate = [](const std::shared_ptr<arrow::RecordBatch>& batch)
      -> arrow::Result<std::shared_ptr<arrow::Array>> {
    return cp::CallFunction("is_valid", {batch->column(0)}).ValueOrDie().make_array();
  };
  EXPECT_EQ(kept(options), (std::vector<int32_t>{1, 2}));
}

TEST(RowFilter, TheLowestFailingRowGroupIsNamedWhateverTheThreadsTiming) {
  // A predicate failing on every row group: the error names row group 0 of the first
  // file, on any number of threads, every time (the first to fail was named before).
  const std::string dir = testing::MakeTempDir();
  for (int f = 0; f < 4; ++f) {
    testing::WriteIdFile(dir + "/f" + std::to_string(f) + ".parquet", {10, 10, 10, 10}, f * 40);
  }
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  FilterOptions options;
  options.threads = 8;
  options.predicate_columns = {"id"};
  options.predicate = [](const std::shared_ptr<arrow::RecordBatch>& batch)
      -> arrow::Result<std::shared_ptr<arrow::Array>> {
    // Later row groups fail later: the last to fail is not the lowest.
    std::this_thread::sleep_for(std::chrono::microseconds(
        200 * (1 + std::static_pointer_cast<arrow::Int64Array>(batch->column(0))->Value(0) / 10)));
    return arrow::Status::Invalid("no");
  };
  for (int i = 0; i < 10; ++i) {
    auto st = EvaluateFilter(*ds, options).status();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("f0.parquet', row group 0"), std::string::npos) << st.message();
  }
}

// A row group's string, binary or list column is one array for the filter: past its
// 32-bit offsets (2^31 - 1 bytes or values; a smaller limit stands in for it here) the
// error names the column, the row group and the limit (Arrow's concatenation said
// "offset overflow" and named neither); below it, the values are the chunks' own.
TEST(RowFilter, AColumnPastItsOffsetsIsNamedWithTheLimit) {
  const std::string where = "'a.parquet', row group 3";
  auto strings = [](const std::vector<std::string>& values) {
    arrow::StringBuilder b;
    EXPECT_TRUE(b.AppendValues(values).ok());
    return b.Finish().ValueOrDie();
  };
  // 6 + 6 bytes, the second chunk a slice (its offsets do not start at 0).
  auto sliced = strings({"xxxx", "ghi", "jkl"})->Slice(1);
  arrow::ChunkedArray text(arrow::ArrayVector{strings({"abc", "def"}), sliced});
  auto st = ConcatenateFilterColumn(text, "name", where, /*max_offset=*/11).status();
  ASSERT_FALSE(st.ok());
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kInvalidData);
  for (const char* part : {"column 'name'", "'a.parquet', row group 3", "12 bytes", "(11)",
                           "large_string"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << ": " << st.message();
  }
  auto joined = ConcatenateFilterColumn(text, "name", where, /*max_offset=*/12);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_TRUE((*joined)->Equals(*strings({"abc", "def", "ghi", "jkl"})));

  // A list counts its values (2 + 3), not its rows or bytes.
  auto lists = arrow::json::ArrayFromJSONString(arrow::list(arrow::int8()), "[[1, 2], [3, 4, 5]]")
                   .ValueOrDie();
  arrow::ChunkedArray tokens(arrow::ArrayVector{lists->Slice(0, 1), lists->Slice(1, 1)});
  st = ConcatenateFilterColumn(tokens, "tokens", where, /*max_offset=*/4).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("column 'tokens' holds 5 values"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("large_list"), std::string::npos) << st.message();
  ASSERT_TRUE(ConcatenateFilterColumn(tokens, "tokens", where, /*max_offset=*/5).ok());

  // No chunks (a row group of no rows): an empty array of the column's type.
  arrow::ChunkedArray none(arrow::ArrayVector{}, arrow::utf8());
  auto empty = ConcatenateFilterColumn(none, "name", where);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ((*empty)->length(), 0);
  EXPECT_TRUE((*empty)->type()->Equals(*arrow::utf8()));
}

}  // namespace
}  // namespace pqloader
