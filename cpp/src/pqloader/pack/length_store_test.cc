#include "pqloader/pack/length_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <arrow/api.h>

#include "pqloader/pack/document_lengths.h"
#include "pqloader/test_util.h"

namespace pqloader {

namespace {

std::shared_ptr<Dataset> OpenTokens(const std::string& dir) {
  DatasetOptions options;
  options.columns.columns = {"tokens"};
  auto dataset = Dataset::Open({dir}, options);
  EXPECT_TRUE(dataset.ok()) << dataset.status().ToString();
  return *dataset;
}

arrow::Result<std::shared_ptr<const DocumentLengths>> ReadLengths(
    const Dataset& dataset, const std::string& store, bool null_is_empty = false,
    const std::string& remedy = "") {
  return DocumentLengths::Read(dataset, 0, null_is_empty, remedy, 2,
                               arrow::default_memory_pool(), nullptr, store);
}

// Overwrite the column chunks of the Parquet file at `path` (the bytes between its magic
// and its footer) and put its modification time back: its size, time and footer are
// those of the file it was, but no page of it reads.
void DamagePages(const std::string& path) {
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint32_t footer = 0;
  f.seekg(st.st_size - 8);
  f.read(reinterpret_cast<char*>(&footer), 4);
  const int64_t pages = st.st_size - 8 - footer - 4;
  ASSERT_GT(pages, 0);
  f.seekp(4);
  const std::string junk(static_cast<size_t>(pages), '\xa5');
  f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  f.close();
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

std::string LengthsFile(const std::string& store, const DataFile& file) {
  return store + "/lengths/" + LengthsKey(file, file.columns[0]) + ".len";
}

TEST(LengthStore, ReadOnceThenTakenFromTheStoreWithoutReadingTheSource) {
  const std::string dir = testing::MakeTempDir();
  const std::string store = testing::MakeTempDir();
  const std::vector<int32_t> a = {3, 0, 5, 1, 1, 8, 2};  // row groups {3 0 5} {1 1 8} {2}
  const std::vector<int32_t> b = {4, 6};
  testing::WriteTokensFile(dir + "/a.parquet", a, 3);
  testing::WriteTokensFile(dir + "/b.parquet", b, 3);
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  auto first = ReadLengths(*OpenTokens(dir), store);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->lengths(), all);
  EXPECT_EQ((*first)->files_stored(), 2);
  EXPECT_EQ((*first)->files_from_store(), 0);
  EXPECT_EQ((*first)->store_error(), "");
  // The same files, no page of them readable (size, time and footer unchanged).
  DamagePages(dir + "/a.parquet");
  DamagePages(dir + "/b.parquet");
  auto dataset = OpenTokens(dir);
  EXPECT_FALSE(ReadLengths(*dataset, "").ok());  // from the source: refused
  auto again = ReadLengths(*dataset, store);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->lengths(), all);
  EXPECT_EQ((*again)->files_from_store(), 2);
  EXPECT_EQ((*again)->files_stored(), 0);
  EXPECT_EQ((*again)->Sum(1, 0, 3), 10);
}

// The store keeps every row of a row group, nulls as nulls: a filter's rows and the
// null rules are applied when the lengths are used, as they are to a read from the source.
TEST(LengthStore, StoredRowsServeAFilterAndTheNullRulesAsTheSourceDoes) {
  const std::string dir = testing::MakeNullDocumentsDir();
  const std::string store = testing::MakeTempDir();
  auto dataset = OpenTokens(dir);
  auto all = ReadLengths(*dataset, store, true);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)->lengths(), (std::vector<int32_t>{2, 0, 3, 0, 0, 0, 0}));
  EXPECT_EQ((*all)->null_rows(), 5);
  EXPECT_EQ((*all)->files_stored(), 1);  // b lacks the column: nothing to keep
  const auto source_error = ReadLengths(*dataset, "", false, "use fill_null").status();
  const auto stored_error = ReadLengths(*dataset, store, false, "use fill_null").status();
  ASSERT_FALSE(stored_error.ok());
  EXPECT_EQ(stored_error.ToString(), source_error.ToString());
  EXPECT_NE(stored_error.message().find("row 1 is a null list; use fill_null"), std::string::npos);
  EXPECT_NE(stored_error.message().find("a.parquet', row group 0"), std::string::npos)
      << stored_error.ToString();
  // A filter kept a's rows 0 and 2 (no null among them) and b's row 1 (a null one).
  const std::vector<Split> splits = testing::KeepRows(dataset.get(), {{0, 2}, {1}});
  auto kept = ReadLengths(*dataset, store, true);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ((*kept)->lengths(), (std::vector<int32_t>{2, 3, 0}));
  EXPECT_EQ((*kept)->null_rows(), 1);
  EXPECT_EQ((*kept)->files_from_store(), 1);
  dataset->RestrictSplits({splits[0]});  // without a fill, the dropped nulls are not refused
  auto a_only = ReadLengths(*dataset, store, false);
  ASSERT_TRUE(a_only.ok()) << a_only.status().ToString();
  EXPECT_EQ((*a_only)->lengths(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ((*a_only)->files_from_store(), 1);
}

TEST(LengthStore, DamagedOrAnotherFilesLengthsAreReadFromTheSourceAgain) {
  const std::string dir = testing::MakeTempDir();
  const std::string store = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {3, 0, 5, 1}, 2);
  testing::WriteTokensFile(dir + "/b.parquet", {4, 6, 9, 9}, 2);
  auto dataset = OpenTokens(dir);
  ASSERT_TRUE(ReadLengths(*dataset, store).ok());
  const std::string a_file = LengthsFile(store, dataset->files()[0]);
  const std::string b_file = LengthsFile(store, dataset->files()[1]);
  ASSERT_TRUE(std::filesystem::exists(a_file));
  // A length flipped (its checksum fails): read again, and stored again.
  {
    std::fstream f(a_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(a_file) - 8 - 4));
    const int32_t wrong = 77;
    f.write(reinterpret_cast<const char*>(&wrong), 4);
  }
  auto damaged = ReadLengths(*dataset, store);
  ASSERT_TRUE(damaged.ok()) << damaged.status().ToString();
  EXPECT_EQ((*damaged)->lengths(), (std::vector<int32_t>{3, 0, 5, 1, 4, 6, 9, 9}));
  EXPECT_EQ((*damaged)->files_from_store(), 1);
  EXPECT_EQ((*damaged)->files_stored(), 1);
  // b's lengths copied over a's (valid, but another key's): not a's.
  std::filesystem::copy_file(b_file, a_file, std::filesystem::copy_options::overwrite_existing);
  auto foreign = ReadLengths(*dataset, store);
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  EXPECT_EQ((*foreign)->lengths(), (std::vector<int32_t>{3, 0, 5, 1, 4, 6, 9, 9}));
  EXPECT_EQ((*foreign)->files_from_store(), 1);
  EXPECT_EQ((*foreign)->files_stored(), 1);
  auto fine = ReadLengths(*dataset, store);
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ((*fine)->files_from_store(), 2);
}

// A dataset that reads row groups the stored lengths lack (a filter pruned them before)
// reads those and stores the file's lengths with all of them.
TEST(LengthStore, RowGroupsItLacksAreReadAndAdded) {
  const std::string dir = testing::MakeTempDir();
  const std::string store = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {3, 0, 5, 1, 1, 8, 2}, 3);
  auto dataset = OpenTokens(dir);
  const std::vector<Split> splits = dataset->splits();
  ASSERT_EQ(splits.size(), 3u);
  dataset->RestrictSplits({splits[0], splits[2]});
  auto some = ReadLengths(*dataset, store);
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ((*some)->lengths(), (std::vector<int32_t>{3, 0, 5, 2}));
  const DataFile& file = dataset->files()[0];
  const std::string key = LengthsKey(file, file.columns[0]);
  auto held = LoadLengths(store, key, 3, 7);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->row_groups, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(held->Find(1, 3), -1);
  EXPECT_EQ(held->Find(2, 1), 3);
  EXPECT_EQ(held->Find(2, 2), -1);  // another count of rows: not held
  dataset->RestrictSplits(splits);
  auto whole = ReadLengths(*dataset, store);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ((*whole)->lengths(), (std::vector<int32_t>{3, 0, 5, 1, 1, 8, 2}));
  EXPECT_EQ((*whole)->files_from_store(), 0);
  EXPECT_EQ((*whole)->files_stored(), 1);
  held = LoadLengths(store, key, 3, 7);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->row_groups, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(held->rows, (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(held->lengths, (std::vector<int32_t>{3, 0, 5, 1, 1, 8, 2}));
  EXPECT_FALSE(LoadLengths(store, key, 2, 7).has_value());  // more row groups than the file's
  EXPECT_FALSE(LoadLengths(store, key, 3, 6).has_value());  // more rows
  auto again = ReadLengths(*dataset, store);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->files_from_store(), 1);
}

TEST(LengthStore, AStoreThatCannotBeWrittenIsReportedAndTheLengthsStillRead) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteTokensFile(dir + "/a.parquet", {3, 0, 5}, 2);
  const std::string not_a_dir = testing::MakeTempDir() + "/file";
  std::ofstream(not_a_dir) << "x";
  auto lengths = ReadLengths(*OpenTokens(dir), not_a_dir + "/cache");
  ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
  EXPECT_EQ((*lengths)->lengths(), (std::vector<int32_t>{3, 0, 5}));
  EXPECT_EQ((*lengths)->files_stored(), 0);
  EXPECT_NE((*lengths)->store_error().find("cannot save row lengths"), std::string::npos)
      << (*lengths)->store_error();
}

}  // namespace

}  // namespace pqloader
