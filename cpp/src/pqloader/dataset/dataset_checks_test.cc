// Column resolution, row-group selection and the early refusals from footers, through
// Dataset::Open on small files (tests written against hand-made mutants of columns.cc,
// dataset.cc and footer_checks.cc that the rest of the C++ suite let pass).
#include <filesystem>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/json/from_string.h>
#include <arrow/util/key_value_metadata.h>
#include <gtest/gtest.h>
#include <arrow/filesystem/localfs.h>
#include <parquet/arrow/writer.h>
#include <parquet/file_reader.h>
#include <parquet/file_writer.h>
#include <parquet/metadata.h>

#include "pqloader/dataset/columns.h"
#include "pqloader/dataset/dataset.h"
#include "pqloader/dataset/footer_checks.h"
#include "pqloader/dataset/summary.h"
#include "pqloader/test_util.h"

namespace pqloader {
namespace {

std::shared_ptr<arrow::Array> Json(const std::shared_ptr<arrow::DataType>& type, const std::string& json) {
  return arrow::json::ArrayFromJSONString(type, json).ValueOrDie();
}

// Write `columns` (name, array) to `path` in row groups of `row_group_rows` rows.
void Write(const std::string& path,
           const std::vector<std::pair<std::string, std::shared_ptr<arrow::Array>>>& columns,
           int64_t row_group_rows = 1 << 20,
           std::shared_ptr<const arrow::KeyValueMetadata> metadata = nullptr) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  arrow::FieldVector fields;
  arrow::ArrayVector arrays;
  for (const auto& [name, array] : columns) {
    fields.push_back(arrow::field(name, array->type()));
    arrays.push_back(array);
  }
  auto table = arrow::Table::Make(arrow::schema(fields, metadata), arrays);
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  auto props = parquet::ArrowWriterProperties::Builder().store_schema()->build();
  ASSERT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, row_group_rows,
                                         parquet::default_writer_properties(), props)
                  .ok());
  ASSERT_TRUE(out->Close().ok());
}

std::string Text(const arrow::Status& s) { return s.ToString(); }

std::vector<std::string> Names(const Dataset& ds) {
  std::vector<std::string> out;
  for (const auto& s : ds.specs()) out.push_back(s.name);
  return out;
}

arrow::Status FooterCheck(const Dataset& ds, bool null_ok = false, bool ragged_ok = false) {
  return CheckColumnsFromFooters(ds, std::vector<bool>(ds.specs().size(), null_ok),
                                 std::vector<bool>(ds.specs().size(), ragged_ok));
}

TEST(DatasetRowGroups, SelectionIsSortedUniqueInRangeAndNamesFilesOfTheDataset) {
  const std::string dir = testing::MakeTempDir();
  const std::string file = dir + "/a.parquet";
  testing::WriteIdFile(file, {2, 3, 4}, 0);
  DatasetOptions o;
  o.row_groups[file] = {2, 1, 2};
  auto ds = Dataset::Open({file}, o).ValueOrDie();
  ASSERT_EQ(ds->splits().size(), 2u);  // each once, in file order
  EXPECT_EQ(ds->splits()[0].row_group, 1);
  EXPECT_EQ(ds->splits()[1].row_group, 2);
  EXPECT_EQ(ds->num_rows(), 7);
  o.row_groups[file] = {3};
  auto past = Dataset::Open({file}, o);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(Text(past.status()).find("row_groups selects row group 3"), std::string::npos)
      << Text(past.status());
  DatasetOptions unknown;
  unknown.row_groups[dir + "/nope.parquet"] = {0};
  auto missing = Dataset::Open({file}, unknown);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(Text(missing.status()).find("nope.parquet"), std::string::npos);
}

TEST(DatasetFiles, ADirectorysFilesAreInPathOrder) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/b.parquet", {1}, 10);
  testing::WriteIdFile(dir + "/a.parquet", {1}, 0);
  testing::WriteIdFile(dir + "/c.parquet", {1}, 20);
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  ASSERT_EQ(ds->files().size(), 3u);
  EXPECT_EQ(std::filesystem::path(ds->files()[0].path).filename().string(), "a.parquet");
  EXPECT_EQ(std::filesystem::path(ds->files()[1].path).filename().string(), "b.parquet");
  EXPECT_EQ(std::filesystem::path(ds->files()[2].path).filename().string(), "c.parquet");
}

TEST(DatasetColumns, TypesUnifyAcrossFilesAndDecimalScalesMustAgreeForInt64) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/a.parquet", {{"x", Json(arrow::int32(), "[1, 2]")}});
  Write(dir + "/b.parquet", {{"x", Json(arrow::int64(), "[3000000000]")}});
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  EXPECT_TRUE(ds->column_types()[0]->Equals(*arrow::int64())) << ds->column_types()[0]->ToString();
  EXPECT_EQ(ds->specs()[0].dtype, DType::kInt64);

  const std::string dec = testing::MakeTempDir();
  Write(dec + "/a.parquet", {{"d", Json(arrow::decimal128(10, 2), R"(["1.25"])")}});
  Write(dec + "/b.parquet", {{"d", Json(arrow::decimal128(10, 3), R"(["1.250"])")}});
  DatasetOptions as_int;
  as_int.columns.spec.decimals_as_int64 = true;
  auto refused = Dataset::Open({dec}, as_int);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(Text(refused.status()).find("needs one scale"), std::string::npos) << Text(refused.status());
  // The other way round: a later file of a smaller scale than the first's.
  const std::string dec2 = testing::MakeTempDir();
  Write(dec2 + "/a.parquet", {{"d", Json(arrow::decimal128(10, 3), R"(["1.250"])")}});
  Write(dec2 + "/b.parquet", {{"d", Json(arrow::decimal128(10, 2), R"(["1.25"])")}});
  refused = Dataset::Open({dec2}, as_int);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(Text(refused.status()).find("needs one scale"), std::string::npos) << Text(refused.status());
}

TEST(DatasetColumns, StructsExpandToTheirFieldsOnceWhateverFilesHoldThem) {
  const std::string dir = testing::MakeTempDir();
  auto st = arrow::struct_({arrow::field("a", arrow::int32()), arrow::field("b", arrow::int32())});
  Write(dir + "/a.parquet", {{"s", Json(st, R"([{"a": 1, "b": 2}])")}});
  Write(dir + "/b.parquet", {{"s", Json(st, R"([{"a": 3, "b": 4}])")}});
  // A file where the struct is all null (type null): absent there, not another type.
  Write(dir + "/c.parquet", {{"s", Json(arrow::null(), "[null]")}});
  auto ds = Dataset::Open({dir}, DatasetOptions{});
  ASSERT_TRUE(ds.ok()) << Text(ds.status());
  EXPECT_EQ(Names(**ds), (std::vector<std::string>{"s.a", "s.b"}));
}

TEST(DatasetColumns, AColumnSelectedTwiceIsRefused) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/a.parquet", {2}, 0);
  DatasetOptions o;
  o.columns.columns = {"x", "id", "x"};
  auto ds = Dataset::Open({dir}, o);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(Text(ds.status()).find("selected twice"), std::string::npos) << Text(ds.status());
}

TEST(DatasetColumns, PandasIndexColumnsAreLeftOutOfTheDefaults) {
  const std::string dir = testing::MakeTempDir();
  auto md = arrow::key_value_metadata(
      {"pandas"}, {R"({"index_columns": ["__index_level_0__"], "columns": []})"});
  Write(dir + "/a.parquet",
        {{"x", Json(arrow::int32(), "[1]")}, {"__index_level_0__", Json(arrow::int64(), "[7]")}},
        1 << 20, md);
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  EXPECT_EQ(Names(*ds), (std::vector<std::string>{"x"}));
}

TEST(DatasetColumns, LeafPathsRoundTrip) {
  const std::string encoded = EncodeLeafPath("a.b", {"c:d", "", "e"});
  auto md = arrow::key_value_metadata({kLeafPathKey}, {encoded});
  std::string top;
  std::vector<std::string> path;
  ASSERT_TRUE(DecodeLeafPath(md, &top, &path));
  EXPECT_EQ(top, "a.b");
  EXPECT_EQ(path, (std::vector<std::string>{"c:d", "", "e"}));
}

TEST(DatasetColumns, NullMasksFollowNamesAndNullMaskAll) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/a.parquet", {{"x", Json(arrow::int32(), "[1, null]")},
                             {"y", Json(arrow::int32(), "[1, 2]")}});
  DatasetOptions named;
  named.columns.null_mask_columns = {"x"};
  auto ds = Dataset::Open({dir}, named);
  ASSERT_TRUE(ds.ok()) << Text(ds.status());
  EXPECT_EQ(Names(**ds), (std::vector<std::string>{"x", "x_valid", "y"}));
  DatasetOptions all;
  all.columns.null_mask_all = true;
  all.columns.columns = {"x"};
  auto ds2 = Dataset::Open({dir}, all).ValueOrDie();
  EXPECT_EQ(Names(*ds2), (std::vector<std::string>{"x", "x_valid"}));
}

TEST(DatasetPartitions, ANullKeyLoadsAsANullableInt64AndIsRefusedWithoutFill) {
  const std::string dir = testing::MakeTempDir();
  std::filesystem::create_directories(dir + "/k=1");
  std::filesystem::create_directories(dir + "/k=__HIVE_DEFAULT_PARTITION__");
  testing::WriteIdFile(dir + "/k=1/a.parquet", {2}, 0);
  testing::WriteIdFile(dir + "/k=__HIVE_DEFAULT_PARTITION__/b.parquet", {3}, 2);
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  const int k = ds->schema()->GetFieldIndex("k");
  ASSERT_GE(k, 0);
  EXPECT_EQ(ds->specs()[k].arrow_type, "int64");
  EXPECT_TRUE(ds->schema()->field(k)->nullable());
  const auto nulls = NullsFromFooters(ds->files(), ds->splits(), k, ds->partition_index()[k]);
  EXPECT_EQ(nulls, (std::vector<int64_t>{0, 3}));
  const auto st = FooterCheck(*ds);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("column 'k'"), std::string::npos) << Text(st);
}

TEST(DatasetPartitions, AKeyStoredInSomeFilesOnlyIsRefused) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/k=1/a.parquet", {{"x", Json(arrow::int32(), "[1]")}});
  Write(dir + "/k=2/b.parquet", {{"x", Json(arrow::int32(), "[1]")}, {"k", Json(arrow::int64(), "[2]")}});
  auto ds = Dataset::Open({dir}, DatasetOptions{});
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(Text(ds.status()).find("is stored as a column"), std::string::npos) << Text(ds.status());
}

TEST(DatasetPartitions, AStoredKeyMustAgreeWithThePathAtBothEnds) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/k=1/a.parquet", {{"k", Json(arrow::int64(), "[1, 2]")}});
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  const auto st = CheckStoredKeys(*ds);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("from 1 to 2"), std::string::npos) << Text(st);
}

TEST(FooterChecks, NullsAndAbsentColumnsAreRefusedWithoutAPolicy) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/a.parquet", {{"x", Json(arrow::int32(), "[1, null, 3]")}, {"y", Json(arrow::int32(), "[1, 2, 3]")}});
  Write(dir + "/b.parquet", {{"x", Json(arrow::int32(), "[4]")}});
  DatasetOptions only_x;
  only_x.columns.columns = {"x"};
  auto ds = Dataset::Open({dir}, only_x).ValueOrDie();
  EXPECT_EQ(NullsFromFooters(ds->files(), ds->splits(), 0, -1), (std::vector<int64_t>{1, 0}));
  auto st = FooterCheck(*ds);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("1 null value(s)"), std::string::npos) << Text(st);
  EXPECT_TRUE(FooterCheck(*ds, /*null_ok=*/true).ok());
  DatasetOptions only_y;
  only_y.columns.columns = {"y"};
  auto ds2 = Dataset::Open({dir}, only_y).ValueOrDie();
  st = FooterCheck(*ds2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("which lacks the column"), std::string::npos) << Text(st);
}

TEST(DatasetColumns, AColumnAbsentFromAFileIsNullable) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/a.parquet", {2}, 0);  // id and x, not nullable
  Write(dir + "/b.parquet", {{"id", Json(arrow::int64(), "[5]")}});
  DatasetOptions o;
  o.columns.null_mask_all = true;
  auto ds = Dataset::Open({dir}, o).ValueOrDie();
  EXPECT_TRUE(ds->schema()->GetFieldByName("x")->nullable());
  EXPECT_EQ(Names(*ds), (std::vector<std::string>{"id", "id_valid", "x", "x_valid"}));
}

TEST(FooterChecks, RaggedListsAreRefusedAndEmptyListsAreNotNulls) {
  const std::string dir = testing::MakeTempDir();
  // Rows of 3 values in the first row group, of 2 in the second.
  testing::WriteTokensFile(dir + "/a.parquet", {3, 3, 2, 2}, 2);
  DatasetOptions tokens;
  tokens.columns.columns = {"tokens"};
  auto ds = Dataset::Open({dir}, tokens).ValueOrDie();
  auto st = FooterCheck(*ds, /*null_ok=*/false, /*ragged_ok=*/false);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("differ in length"), std::string::npos) << Text(st);

  const std::string dir2 = testing::MakeTempDir();
  // An empty list beside a list of 2 in one row group: ragged, and no null.
  testing::WriteTokensFile(dir2 + "/a.parquet", {0, 2}, 2);
  auto ds2 = Dataset::Open({dir2}, tokens).ValueOrDie();
  const auto nulls = NullsFromFooters(ds2->files(), ds2->splits(), 0, -1);
  ASSERT_EQ(nulls.size(), 1u);
  EXPECT_LE(nulls[0], 0);  // none, or unknown
  EXPECT_TRUE(FooterCheck(*ds2, /*null_ok=*/false, /*ragged_ok=*/true).ok());
  const ListLayout layout = ListLayoutFromFooters(ds2->files(), ds2->splits(), 0);
  EXPECT_NE(layout.lengths, ListLayout::Lengths::kUniform) << layout.values_per_row;
}

TEST(FooterChecks, NullRowsOfFixedSizeListsAreRefused) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/a.parquet",
        {{"v", Json(arrow::fixed_size_list(arrow::int32(), 2), "[[1, 2], null, [5, 6]]")}});
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  const auto st = FooterCheck(*ds, /*null_ok=*/true, /*ragged_ok=*/true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("has null rows"), std::string::npos) << Text(st);
}

TEST(FooterChecks, IntegersADeclaredFloatDoesNotHoldAreRefused) {
  const std::string dir = testing::MakeTempDir();
  Write(dir + "/a.parquet", {{"x", Json(arrow::int64(), "[0, 16777217]")}});
  DatasetOptions f32;
  f32.columns.schema = arrow::schema({arrow::field("x", arrow::float32())});
  auto ds = Dataset::Open({dir}, f32).ValueOrDie();
  const auto st = FooterCheck(*ds, true, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(Text(st).find("16777217"), std::string::npos) << Text(st);
  DatasetOptions f64;
  f64.columns.schema = arrow::schema({arrow::field("x", arrow::float64())});
  auto ds2 = Dataset::Open({dir}, f64).ValueOrDie();
  EXPECT_TRUE(FooterCheck(*ds2, true, true).ok());
}

TEST(DatasetSummary, AFileRewrittenSinceItWasIndexedIsReadFromItsOwnFooter) {
  const std::string dir = testing::MakeTempDir();
  const std::string file = dir + "/a.parquet";
  testing::WriteIdFile(file, {3}, 0);
  const auto time = std::filesystem::last_write_time(file);
  ASSERT_TRUE(WriteDatasetIndex(dir, StorageOptions{}).ok());
  // Rewritten with more rows (another size), its modification time set back.
  testing::WriteIdFile(file, {3, 4}, 0);
  std::filesystem::last_write_time(file, time);
  auto ds = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  EXPECT_EQ(ds->footers_from_summary(), 0);
  EXPECT_EQ(ds->num_rows(), 7);
  EXPECT_EQ(ds->splits().size(), 2u);
}

TEST(DatasetSummary, ASummaryListingARowGroupTwiceIsRefused) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteIdFile(dir + "/a.parquet", {3, 2}, 0);
  auto reader = parquet::ParquetFileReader::OpenFile(dir + "/a.parquet");
  auto md = reader->metadata();
  md->set_file_path("a.parquet");
  auto twice = md->Subset({0, 1});
  twice->AppendRowGroups(*md->Subset({1}));
  {
    auto out = arrow::io::FileOutputStream::Open(dir + "/_metadata").ValueOrDie();
    parquet::WriteMetaDataFile(*twice, out.get());
    ASSERT_TRUE(out->Close().ok());
  }
  auto ds = Dataset::Open({dir}, DatasetOptions{});
  ASSERT_FALSE(ds.ok()) << "rows: " << (*ds)->num_rows();
  EXPECT_NE(Text(ds.status()).find("twice"), std::string::npos) << Text(ds.status());
  // The summary as written (each row group once) is taken.
  {
    auto out = arrow::io::FileOutputStream::Open(dir + "/_metadata").ValueOrDie();
    parquet::WriteMetaDataFile(*md, out.get());
    ASSERT_TRUE(out->Close().ok());
  }
  auto ok = Dataset::Open({dir}, DatasetOptions{}).ValueOrDie();
  EXPECT_EQ(ok->footers_from_summary(), 1);
  EXPECT_EQ(ok->num_rows(), 5);
}

TEST(DatasetSummary, IndexLinesMustBeRelativeSortedAndUnique) {
  const std::string dir = testing::MakeTempDir();
  auto fs = std::make_shared<arrow::fs::LocalFileSystem>();
  auto parse = [&](const std::string& lines) {
    auto out = arrow::io::FileOutputStream::Open(dir + "/_pqloader_index").ValueOrDie();
    const std::string text = "pqloader-index 1\n" + lines;
    EXPECT_TRUE(out->Write(text.data(), static_cast<int64_t>(text.size())).ok());
    EXPECT_TRUE(out->Close().ok());
    return ReadIndexFile(fs, dir, -1, dir + "/_pqloader_index");
  };
  auto good = parse("10\t5\th\ta.parquet\n11\t6\th\tb/c.parquet\n");
  ASSERT_TRUE(good.ok()) << Text(good.status());
  ASSERT_EQ(good->files.size(), 2u);
  EXPECT_EQ(good->files[1].path, "b/c.parquet");
  EXPECT_EQ(good->files[1].size, 11);
  EXPECT_EQ(good->files[1].mtime_ns, 6);
  for (const char* bad : {"10\t5\th\ta.parquet\n10\t5\th\ta.parquet\n",  // twice
                          "10\t5\th\tb.parquet\n10\t5\th\ta.parquet\n",  // out of order
                          "10\t5\th\t../a.parquet\n", "10\t5\th\ta/./b.parquet\n",
                          "10\t5\th\t/a.parquet\n", "-1\t5\th\ta.parquet\n"}) {
    auto r = parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

}  // namespace
}  // namespace pqloader
