#include "pqloader/test_util.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include "pqloader/loader.h"

namespace pqloader::testing {

namespace {

struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    for (const auto& d : dirs) std::filesystem::remove_all(d);
  }
};

}  // namespace

std::string MakeTempDir() {
  static TempDirs all;
  char tmpl[] = "/tmp/pqloader_test_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  all.dirs.emplace_back(tmpl);
  return tmpl;
}

void WriteIdFile(const std::string& path, const std::vector<int64_t>& row_groups,
                 int64_t start_id) {
  auto schema = arrow::schema({arrow::field("id", arrow::int64(), false),
                               arrow::field("x", arrow::float32(), false)});
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  auto writer = parquet::arrow::FileWriter::Open(*schema, arrow::default_memory_pool(), out)
                    .ValueOrDie();
  int64_t id = start_id;
  for (int64_t rows : row_groups) {
    arrow::Int64Builder ids;
    arrow::FloatBuilder xs;
    for (int64_t i = 0; i < rows; ++i, ++id) {
      (void)ids.Append(id);
      (void)xs.Append(static_cast<float>(id) / 2);
    }
    auto batch = arrow::RecordBatch::Make(schema, rows,
                                          {ids.Finish().ValueOrDie(), xs.Finish().ValueOrDie()});
    if (!writer->NewBufferedRowGroup().ok() || !writer->WriteRecordBatch(*batch).ok()) {
      throw std::runtime_error("cannot write " + path);
    }
  }
  if (!writer->Close().ok() || !out->Close().ok()) throw std::runtime_error("close " + path);
}

void WriteTokensFile(const std::string& path, const std::vector<int32_t>& lengths,
                     int64_t row_group_rows) {
  arrow::Int64Builder ids;
  arrow::ListBuilder tokens(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
  auto* values = static_cast<arrow::Int32Builder*>(tokens.value_builder());
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (!ids.Append(static_cast<int64_t>(i)).ok() || !tokens.Append().ok()) {
      throw std::runtime_error("cannot build " + path);
    }
    for (int32_t t = 0; t < lengths[i]; ++t) (void)values->Append(t);
  }
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("id", arrow::int64()),
                     arrow::field("tokens", arrow::list(arrow::int32()))}),
      {ids.Finish().ValueOrDie(), tokens.Finish().ValueOrDie()});
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  if (!parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, row_group_rows).ok() ||
      !out->Close().ok()) {
    throw std::runtime_error("cannot write " + path);
  }
}

std::string MakeNullDocumentsDir() {
  const std::string dir = MakeTempDir();
  arrow::ListBuilder tokens(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
  auto* values = static_cast<arrow::Int32Builder*>(tokens.value_builder());
  arrow::Int64Builder ids, b_ids;
  if (!tokens.Append().ok() || !values->AppendValues({0, 1}).ok() || !tokens.AppendNull().ok() ||
      !tokens.Append().ok() || !values->AppendValues({0, 1, 2}).ok() || !tokens.AppendNull().ok() ||
      !ids.AppendValues({0, 1, 2, 3}).ok() || !b_ids.AppendValues({0, 1, 2}).ok()) {
    throw std::runtime_error("cannot build the null documents");
  }
  auto a = arrow::Table::Make(arrow::schema({arrow::field("id", arrow::int64()),
                                             arrow::field("tokens", arrow::list(arrow::int32()))}),
                              {ids.Finish().ValueOrDie(), tokens.Finish().ValueOrDie()});
  auto b = arrow::Table::Make(arrow::schema({arrow::field("id", arrow::int64())}),
                              {b_ids.Finish().ValueOrDie()});
  for (const auto& [name, table] : {std::pair{"a", a}, std::pair{"b", b}}) {
    auto out = arrow::io::FileOutputStream::Open(dir + "/" + name + ".parquet").ValueOrDie();
    if (!parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, 100).ok() ||
        !out->Close().ok()) {
      throw std::runtime_error("cannot write " + dir + "/" + name + ".parquet");
    }
  }
  return dir;
}

std::vector<Split> KeepRows(Dataset* dataset, const std::vector<std::vector<int32_t>>& rows) {
  std::vector<Split> splits = dataset->splits();
  for (size_t s = 0; s < rows.size() && s < splits.size(); ++s) {
    splits[s].rows = std::make_shared<const std::vector<int32_t>>(rows[s]);
    splits[s].num_rows = static_cast<int64_t>(rows[s].size());
  }
  dataset->RestrictSplits(splits);
  return splits;
}

std::vector<int64_t> DrainIds(Loader* loader, bool check_x, std::vector<int64_t>* sizes) {
  std::vector<int64_t> ids;
  while (true) {
    auto r = loader->Next();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || *r == nullptr) break;
    const Batch& b = **r;
    const auto* p = reinterpret_cast<const int64_t*>(b.columns[0].data->data());
    ids.insert(ids.end(), p, p + b.num_rows);
    if (check_x) {
      const auto* x = reinterpret_cast<const float*>(b.columns[1].data->data());
      for (int64_t i = 0; i < b.num_rows; ++i) EXPECT_EQ(x[i], static_cast<float>(p[i]) / 2);
    }
    if (sizes != nullptr) sizes->push_back(b.num_rows);
  }
  return ids;
}

}  // namespace pqloader::testing
