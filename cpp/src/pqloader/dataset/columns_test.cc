#include "pqloader/dataset/columns.h"

#include <gtest/gtest.h>

#include <arrow/util/key_value_metadata.h>

namespace pqloader {
namespace {

std::vector<std::string> IndexOf(const std::string& pandas_json) {
  const auto metadata = arrow::key_value_metadata({"pandas"}, {pandas_json});
  return PandasIndexColumns(metadata.get());
}

TEST(PandasIndexColumns, NamesTheStoredIndexColumnsAndSkipsRangeIndexes) {
  EXPECT_EQ(IndexOf(R"({"index_columns": ["__index_level_0__", "a\"b"], "columns": []})"),
            (std::vector<std::string>{"__index_level_0__", "a\"b"}));
  EXPECT_TRUE(IndexOf(R"({"index_columns": [{"kind": "range", "name": null, "start": 0,
                         "stop": 1, "step": 1}], "columns": []})")
                  .empty());
  EXPECT_TRUE(PandasIndexColumns(nullptr).empty());
}

TEST(PandasIndexColumns, MalformedJsonEndsTheListInsteadOfLooping) {
  // Regression (fuzz_parquet): the list's closing ']' mutated to '=' left the scan at the
  // object's closing '}', where no value starts, and it looped there forever.
  // What a broken list yields does not matter (the names are only left out of the
  // default columns); that the scan returns does.
  for (const char* json : {R"({"index_columns": [{"kind": "range"}=, "columns : [{"x": 1}]})",
                           R"({"index_columns": [)", R"({"index_columns": ["a)",
                           R"({"index_columns": [}}}})", R"({"index_columns": [,,,)"}) {
    IndexOf(json);
  }
}

}  // namespace
}  // namespace pqloader
