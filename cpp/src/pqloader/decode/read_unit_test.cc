// Read-unit level checks: exact number text, nested extraction, validity, read-ahead
// priming, and a Loader reading partitions, fills, masks and filtered rows.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <parquet/arrow/writer.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pqloader/decode/nested.h"
#include "pqloader/decode/read_unit.h"
#include "pqloader/error.h"
#include "pqloader/exec/readahead.h"
#include "pqloader/loader.h"
#include "pqloader/test_util.h"
#include "pqloader/util/exact_text.h"

namespace pqloader {
namespace {

TEST(ExactText, TellsCloseDoublesApartAndReadsBackExactly) {
  EXPECT_EQ(ExactText(0.1), "0.1");
  EXPECT_EQ(ExactText(1e-7), "1e-07");
  EXPECT_EQ(ExactText(16777217.0), "16777217");  // not a float's 16777216
  EXPECT_EQ(ExactText(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(CompatibleText(0.5), "0.5");
  EXPECT_EQ(CompatibleText(-100), "-100");
  EXPECT_EQ(CompatibleText(1234567), "1234567");  // the stream's 1.23457e+06 is not exact
  EXPECT_NE(CompatibleText(1234567), CompatibleText(1234568));
  EXPECT_EQ(CompatibleText(10.00001), "10.00001");
  EXPECT_EQ(CompatibleText(100000), "100000");  // what fingerprints held (not 1e+05)
  EXPECT_EQ(CompatibleText(0.0001), "0.0001");
}

std::shared_ptr<arrow::Array> StructWithNullParent() {
  // struct<a: int32> rows {a:1}, null (child slot holds 2), {a:3}
  static const std::vector<int32_t> kValues{1, 2, 3};
  auto child = std::make_shared<arrow::Int32Array>(3, arrow::Buffer::Wrap(kValues));
  static const uint8_t kValid[] = {0b101};
  auto bitmap = std::make_shared<arrow::Buffer>(kValid, 1);
  return arrow::StructArray::Make({child}, {arrow::field("a", arrow::int32())}, bitmap, 1)
      .ValueOrDie();
}

TEST(ExtractPath, AStructFieldTakesItsParentsNulls) {
  auto got = ExtractPath(StructWithNullParent(), {"a"}, arrow::default_memory_pool());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto a = std::static_pointer_cast<arrow::Int32Array>(*got);
  ASSERT_EQ(a->length(), 3);
  EXPECT_TRUE(a->IsValid(0));
  EXPECT_TRUE(a->IsNull(1));
  EXPECT_EQ(a->Value(0), 1);
  EXPECT_EQ(a->Value(2), 3);
}

TEST(ExtractPath, AFieldBelowALargeListKeepsTheLargeList) {
  arrow::LargeListBuilder lists(arrow::default_memory_pool(),
                                std::make_shared<arrow::StructBuilder>(
                                    arrow::struct_({arrow::field("a", arrow::int64())}),
                                    arrow::default_memory_pool(),
                                    std::vector<std::shared_ptr<arrow::ArrayBuilder>>{
                                        std::make_shared<arrow::Int64Builder>()}));
  auto* st = static_cast<arrow::StructBuilder*>(lists.value_builder());
  auto* a = static_cast<arrow::Int64Builder*>(st->field_builder(0));
  ASSERT_TRUE(lists.Append().ok());
  for (int64_t v : {5, 6}) {
    ASSERT_TRUE(st->Append().ok());
    ASSERT_TRUE(a->Append(v).ok());
  }
  ASSERT_TRUE(lists.Append().ok());
  ASSERT_TRUE(st->Append().ok());
  ASSERT_TRUE(a->Append(7).ok());
  auto array = lists.Finish().ValueOrDie();
  auto got = ExtractPath(array, {"a"}, arrow::default_memory_pool());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE((*got)->type()->Equals(arrow::large_list(arrow::int64())))
      << (*got)->type()->ToString();
  ASSERT_TRUE((*got)->ValidateFull().ok());
  const auto& l = static_cast<const arrow::LargeListArray&>(**got);
  EXPECT_EQ(l.value_length(0), 2);
  EXPECT_EQ(l.value_length(1), 1);
  auto values = std::static_pointer_cast<arrow::Int64Array>(l.values());
  EXPECT_EQ(values->Value(2), 7);
}

TEST(ExtractPath, AFieldBelowAListOfNumbersIsAnError) {
  arrow::ListBuilder lists(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
  ASSERT_TRUE(lists.Append().ok());
  auto got = ExtractPath(lists.Finish().ValueOrDie(), {"a"}, arrow::default_memory_pool());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("no field 'a' below list"), std::string::npos)
      << got.status().message();
}

TEST(ValidityColumn, OneByteARowAcrossChunks) {
  arrow::Int32Builder b;
  ASSERT_TRUE(b.Append(1).ok());
  ASSERT_TRUE(b.AppendNull().ok());
  auto first = b.Finish().ValueOrDie();
  ASSERT_TRUE(b.AppendNull().ok());
  ASSERT_TRUE(b.Append(4).ok());
  ASSERT_TRUE(b.Append(5).ok());
  auto second = b.Finish().ValueOrDie();
  arrow::Int32Builder c;
  ASSERT_TRUE(c.Append(6).ok());
  auto third = c.Finish().ValueOrDie();
  arrow::ChunkedArray chunked({first, second, third});
  auto got = ValidityColumn(chunked, arrow::default_memory_pool());
  ASSERT_TRUE(got.ok());
  const uint8_t* p = got->data->data();
  EXPECT_EQ(std::vector<uint8_t>(p, p + 6), (std::vector<uint8_t>{1, 0, 0, 1, 1, 1}));
  auto none = ConstantValidity(4, false, arrow::default_memory_pool());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(std::vector<uint8_t>(none->data->data(), none->data->data() + 4),
            (std::vector<uint8_t>(4, 0)));
  auto all = ConstantValidity(3, true, arrow::default_memory_pool());
  EXPECT_EQ(std::vector<uint8_t>(all->data->data(), all->data->data() + 3),
            (std::vector<uint8_t>(3, 1)));
}

TEST(ReadAheadMore, PrimeStartsTheWindowAndOneItemOverTheCost) {
  std::vector<int64_t> started;
  ReadAhead<int64_t> ra(
      0, 10, [&](int64_t i) -> arrow::Result<int64_t> { started.push_back(i); return i; },
      [](int64_t) { return int64_t{1}; }, ReadAheadOptions{2, INT64_MAX});
  ra.Prime();
  EXPECT_EQ(started, (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(*ra.Take(0), 0);
  ASSERT_EQ(*ra.Take(1), 1);
  EXPECT_FALSE(ra.Take(1).ok());  // taken twice
  EXPECT_EQ(started, (std::vector<int64_t>{0, 1, 2, 3}));
  std::vector<int64_t> big;
  ReadAhead<int64_t> rb(
      0, 10, [&](int64_t i) -> arrow::Result<int64_t> { big.push_back(i); return i; },
      [](int64_t) { return int64_t{100}; }, ReadAheadOptions{4, 50});
  ASSERT_EQ(*rb.Take(0), 0);
  ASSERT_EQ(*rb.Take(1), 1);
  EXPECT_EQ(big, (std::vector<int64_t>{0, 1, 2}));
}

// "s<x>" (built so that GCC 12's -Wrestrict does not misfire on "s" + std::to_string).
std::string SText(int64_t x) {
  std::string out = std::to_string(x);
  out.insert(out.begin(), 's');
  return out;
}

// id 0..n-1; v = id / 4.0, null where id % 3 == 1; s = "s<id>", null where id % 4 == 2.
void WriteNullable(const std::string& path, int64_t start, int64_t n, int64_t rg_rows) {
  arrow::Int64Builder ids;
  arrow::DoubleBuilder vs;
  arrow::StringBuilder ss;
  for (int64_t id = start; id < start + n; ++id) {
    (void)ids.Append(id);
    if (id % 3 == 1) (void)vs.AppendNull(); else (void)vs.Append(id / 4.0);
    if (id % 4 == 2) (void)ss.AppendNull(); else (void)ss.Append(SText(id));
  }
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("id", arrow::int64(), false), arrow::field("v", arrow::float64()),
                     arrow::field("s", arrow::utf8())}),
      {ids.Finish().ValueOrDie(), vs.Finish().ValueOrDie(), ss.Finish().ValueOrDie()});
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  ASSERT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, rg_rows).ok());
  ASSERT_TRUE(out->Close().ok());
}

std::string PartitionedDataset() {
  const std::string dir = testing::MakeTempDir();
  const std::string a = dir + "/part=3/tag=abc", b = dir + "/part=__HIVE_DEFAULT_PARTITION__/tag=__HIVE_DEFAULT_PARTITION__";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  WriteNullable(a + "/a.parquet", 0, 20, 7);
  WriteNullable(b + "/b.parquet", 20, 13, 5);
  return dir;
}

int Index(const Loader& loader, const std::string& name, bool mask = false) {
  const auto& specs = loader.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name && !mask && specs[i].mask_of < 0) return static_cast<int>(i);
    if (mask && specs[i].mask_of >= 0 && specs[specs[i].mask_of].name == name) {
      return static_cast<int>(i);
    }
  }
  ADD_FAILURE() << "no column " << name;
  return 0;
}

// Every row of an epoch, checked against what was written; returns the ids.
std::vector<int64_t> CheckRows(Loader* loader, bool masks) {
  std::vector<int64_t> seen;
  EXPECT_TRUE(loader->StartEpoch(0).ok());
  const int id = Index(*loader, "id"), v = Index(*loader, "v"), part = Index(*loader, "part");
  const int s = masks ? -1 : Index(*loader, "s");
  const int tag = masks ? -1 : Index(*loader, "tag");
  const int vm = masks ? Index(*loader, "v", true) : -1;
  const int pm = masks ? Index(*loader, "part", true) : -1;
  while (true) {
    auto r = loader->Next();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || *r == nullptr) break;
    const Batch& b = **r;
    const auto* ids = reinterpret_cast<const int64_t*>(b.columns[id].data->data());
    const auto* vs = reinterpret_cast<const double*>(b.columns[v].data->data());
    const auto* ps = reinterpret_cast<const int64_t*>(b.columns[part].data->data());
    for (int64_t i = 0; i < b.num_rows; ++i) {
      const int64_t x = ids[i];
      seen.push_back(x);
      const bool v_null = x % 3 == 1;
      if (masks) {
        EXPECT_EQ(b.columns[vm].data->data()[i], v_null ? 0 : 1) << x;
        EXPECT_EQ(b.columns[pm].data->data()[i], x < 20 ? 1 : 0) << x;
        if (!v_null) {
          EXPECT_EQ(vs[i], x / 4.0) << x;
        }
        if (x < 20) {
          EXPECT_EQ(ps[i], 3) << x;
        }
      } else {
        EXPECT_EQ(vs[i], v_null ? -1.5 : x / 4.0) << x;
        EXPECT_EQ(ps[i], x < 20 ? 3 : 9) << x;
        const auto* o = reinterpret_cast<const int64_t*>(b.columns[s].offsets->data());
        const std::string text(reinterpret_cast<const char*>(b.columns[s].data->data()) + o[i],
                               o[i + 1] - o[i]);
        std::string expect_s = "zz";
        if (x % 4 != 2) expect_s = SText(x);
        EXPECT_EQ(text, expect_s) << x;
        const auto* to = reinterpret_cast<const int64_t*>(b.columns[tag].offsets->data());
        const std::string t(reinterpret_cast<const char*>(b.columns[tag].data->data()) + to[i],
                            to[i + 1] - to[i]);
        EXPECT_EQ(t, x < 20 ? "abc" : "none") << x;
      }
    }
  }
  return seen;
}

LoaderOptions FilledOptions() {
  LoaderOptions o;
  o.plan.batch_size = 4;
  o.num_workers = 2;
  o.dataset.columns.columns = {"id", "v", "s", "part", "tag"};
  NullFill v;
  v.enabled = true;
  v.is_float = true;
  v.float_value = -1.5;
  NullFill s;
  s.enabled = true;
  s.is_bytes = true;
  s.bytes_value = "zz";
  NullFill part;
  part.enabled = true;
  part.is_float = true;  // a float fill of an int key: 9
  part.float_value = 9.0;
  NullFill tag;
  tag.enabled = true;
  tag.is_bytes = true;
  tag.bytes_value = "none";
  o.fills = {{"v", v}, {"s", s}, {"part", part}, {"tag", tag}};
  return o;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

TEST(ReadUnit, FillsPartitionsAndStringsAreReadRowByRow) {
  const auto dir = PartitionedDataset();
  auto loader = Loader::Make({dir}, FilledOptions());
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  auto seen = CheckRows(loader->get(), false);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, Range(33));
}

TEST(ReadUnit, MasksFlagNullRowsAndNullPartitions) {
  const auto dir = PartitionedDataset();
  LoaderOptions o;
  o.plan.batch_size = 4;
  o.num_workers = 2;
  o.dataset.columns.columns = {"id", "v", "part"};
  o.dataset.columns.null_mask_columns = {"v", "part"};
  auto loader = Loader::Make({dir}, o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  auto seen = CheckRows(loader->get(), true);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, Range(33));
}

TEST(ReadUnit, FilteredRowsAreTheOnesKept) {
  const auto dir = PartitionedDataset();
  // mode 0: every other id (a take); mode 1: ids 9..30 (slices not starting at 0);
  // mode 2: ids not divisible by 3 (a take of a unit starting inside its row group).
  const auto kept = [](int mode, int64_t x) {
    if (mode == 0) return x % 2 == 0;
    if (mode == 1) return x >= 9 && x <= 30;
    return x % 3 != 0;
  };
  for (int mode = 0; mode < 3; ++mode) {
    LoaderOptions o = FilledOptions();
    o.filter.predicate_columns = {"id"};
    o.filter.predicate = [mode, kept](const std::shared_ptr<arrow::RecordBatch>& batch)
        -> arrow::Result<std::shared_ptr<arrow::Array>> {
      auto ids = std::static_pointer_cast<arrow::Int64Array>(batch->GetColumnByName("id"));
      arrow::BooleanBuilder keep;
      for (int64_t i = 0; i < ids->length(); ++i) {
        const int64_t x = ids->Value(i);
        ARROW_RETURN_NOT_OK(keep.Append(kept(mode, x)));
      }
      return keep.Finish();
    };
    auto loader = Loader::Make({dir}, o);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    auto seen = CheckRows(loader->get(), false);
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> expect;
    for (int64_t x = 0; x < 33; ++x) {
      if (kept(mode, x)) expect.push_back(x);
    }
    EXPECT_EQ(seen, expect) << mode;
    // Two ranks: units start inside row groups; together they hold kept rows once each.
    for (int64_t world = 2; world <= 3; ++world) {
    std::vector<int64_t> both;
    for (int64_t rank = 0; rank < world; ++rank) {
      o.plan.world_size = world;
      o.plan.rank = rank;
      auto ranked = Loader::Make({dir}, o);
      ASSERT_TRUE(ranked.ok()) << ranked.status().ToString();
      auto part = CheckRows(ranked->get(), false);
      both.insert(both.end(), part.begin(), part.end());
    }
    std::sort(both.begin(), both.end());
    EXPECT_TRUE(std::adjacent_find(both.begin(), both.end()) == both.end()) << mode;
    EXPECT_GE(both.size() + static_cast<size_t>(world), expect.size()) << mode;
    EXPECT_TRUE(std::includes(expect.begin(), expect.end(), both.begin(), both.end())) << mode;
    }
  }
}

TEST(ReadUnit, FillsThatDoNotSuitTheirColumnsAreRefusedWhenMade) {
  const auto dir = PartitionedDataset();
  LoaderOptions o = FilledOptions();
  NullFill unknown;
  unknown.enabled = true;
  o.fills["nope"] = unknown;
  auto st = Loader::Make({dir}, o).status();
  EXPECT_NE(st.message().find("fill_null names column 'nope', which is not among"),
            std::string::npos) << st.ToString();
  o = FilledOptions();
  o.fills["s"].is_bytes = false;  // a number for a string column
  st = Loader::Make({dir}, o).status();
  EXPECT_NE(st.message().find("fill_null['s']=0 is a number, but column 's'"), std::string::npos)
      << st.ToString();
  {  // a negative fill for a uint64 column
    const std::string udir = testing::MakeTempDir();
    arrow::UInt64Builder us;
    ASSERT_TRUE(us.Append(1).ok());
    ASSERT_TRUE(us.AppendNull().ok());
    auto table = arrow::Table::Make(arrow::schema({arrow::field("u", arrow::uint64())}),
                                    {us.Finish().ValueOrDie()});
    auto out = arrow::io::FileOutputStream::Open(udir + "/u.parquet").ValueOrDie();
    ASSERT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, 10).ok());
    ASSERT_TRUE(out->Close().ok());
    LoaderOptions u;
    NullFill minus;
    minus.enabled = true;
    minus.int_value = -1;
    u.fills["u"] = minus;
    st = Loader::Make({udir}, u).status();
    EXPECT_NE(st.message().find("fill_null['u']=-1 does not fit column 'u' (uint64)"),
              std::string::npos) << st.ToString();
    minus.int_value = 7;
    u.fills["u"] = minus;
    EXPECT_TRUE(Loader::Make({udir}, u).ok());
  }
  o = FilledOptions();
  o.fills["v"].is_float = false;  // an int fill for a float64 column is fine
  EXPECT_TRUE(Loader::Make({dir}, o).ok());
}

// Sets `path`'s modification time to `sec` (as a write in place moves it).
void Touch(const std::string& path, int64_t sec) {
  const struct timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(sec), 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST(WaitForBytes, ALocalFileWrittenInPlaceWhileItsRowGroupIsReadIsRefused) {
  // Its rows would mix two versions (one column of each): refused, naming it.
  const std::string dir = testing::MakeTempDir();
  const std::string file = dir + "/a.parquet";
  testing::WriteIdFile(file, {50, 50}, 0);
  auto ds = Dataset::Open({file}, DatasetOptions{}).ValueOrDie();
  const Unit unit{1, 0, 50};
  const ReadOptions ro;
  auto io = arrow::io::default_io_context();
  auto untouched = FetchUnit(*ds, unit, ro, arrow::default_memory_pool(), io).ValueOrDie();
  EXPECT_TRUE(WaitForBytes(*ds, unit, untouched.get()).ok());
  auto fetched = FetchUnit(*ds, unit, ro, arrow::default_memory_pool(), io).ValueOrDie();
  Touch(file, 1234567);  // written between the open and the end of the reads
  const arrow::Status st = WaitForBytes(*ds, unit, fetched.get());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'" + file + "', row group 1: it was modified while the row group "
                              "was read"), std::string::npos) << st.message();
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kInvalidData);
  // Changed before it was opened, and left alone while read: read as it now is.
  auto later = FetchUnit(*ds, unit, ro, arrow::default_memory_pool(), io).ValueOrDie();
  EXPECT_TRUE(WaitForBytes(*ds, unit, later.get()).ok());
}

TEST(FetchUnit, AFilteredLocalFileChangedSinceItWasListedIsRefused) {
  // A filter's selection of rows was made from the listed version: with another version
  // the rows handed out were not the ones it kept.
  const std::string dir = testing::MakeTempDir();
  const std::string file = dir + "/a.parquet";
  testing::WriteIdFile(file, {50}, 0);
  auto ds = Dataset::Open({file}, DatasetOptions{}).ValueOrDie();
  const Unit unit{0, 0, 50};
  ReadOptions ro;
  ro.filtered = true;
  auto io = arrow::io::default_io_context();
  EXPECT_TRUE(FetchUnit(*ds, unit, ro, arrow::default_memory_pool(), io).ok());
  Touch(file, 1234567);
  auto refused = FetchUnit(*ds, unit, ro, arrow::default_memory_pool(), io);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the filter selected its rows from the version the "
                                            "loader listed"), std::string::npos);
  ro.filtered = false;  // without a filter: read as it now is
  EXPECT_TRUE(FetchUnit(*ds, unit, ro, arrow::default_memory_pool(), io).ok());
}

}  // namespace
}  // namespace pqloader
