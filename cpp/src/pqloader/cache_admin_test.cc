#include "pqloader/cache_admin.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "pqloader/dataset/dataset.h"
#include "pqloader/test_util.h"

namespace pqloader {

namespace {

namespace fs = std::filesystem;

// The source identity a loader stores for row group `rg` of `path` as it is now.
SourceIdentity IdentityNow(const std::string& path, int64_t rg = 0) {
  auto found = DiscoverFiles({path}).ValueOrDie();
  EXPECT_EQ(found.size(), 1u);
  const std::string hash = ReadFooterHash(found[0]).ValueOrDie();
  return SourceIdentity{found[0].display, found[0].size, found[0].mtime_ns, hash, rg};
}

}  // namespace

// The cancel flag of a listing (a listing on S3, cancelled between its pages, is
// test_signals.py's).
TEST(DiscoverFiles, ListsEveryFileWithACancelFlagAndStopsOnceItIsSet) {
  const std::string dir = testing::MakeTempDir();
  const std::vector<std::string> names = {"a.parquet", "b.parquet", "sub/c.parquet",
                                          "sub/deeper/d.parquet"};
  for (const std::string& name : names) {
    fs::create_directories(fs::path(dir + "/" + name).parent_path());
    testing::WriteIdFile(dir + "/" + name, {3}, 0);
  }
  auto flag = std::make_shared<std::atomic<bool>>(false);
  const auto found = DiscoverFiles({dir}, {}, nullptr, false, flag).ValueOrDie();
  ASSERT_EQ(found.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(found[i].path, dir + "/" + names[i]);
  flag->store(true);
  EXPECT_TRUE(DiscoverFiles({dir}, {}, nullptr, false, flag).status().IsCancelled());
  EXPECT_TRUE(DiscoverFiles({dir + "/*.parquet"}, {}, nullptr, false, flag).status().IsCancelled());
}

TEST(SourceChecker, TellsChangedAndDeletedLocalFiles) {
  const std::string dir = testing::MakeTempDir();
  const std::string a = dir + "/a.parquet", b = dir + "/b.parquet";
  testing::WriteIdFile(a, {10, 10}, 0);
  testing::WriteIdFile(b, {10}, 100);
  const SourceIdentity a0 = IdentityNow(a), b0 = IdentityNow(b);
  auto check = MakeSourceChecker(dir + "/cache", {}).ValueOrDie();
  EXPECT_EQ(check(a0), SourceState::kCurrent);
  EXPECT_EQ(check(b0), SourceState::kCurrent);
  SourceIdentity older = a0;
  older.mtime_ns -= 1;
  EXPECT_EQ(check(older), SourceState::kStale);
  SourceIdentity other_footer = a0;
  other_footer.footer_hash = std::string(32, '0');
  EXPECT_EQ(check(other_footer), SourceState::kStale);
  fs::remove(b);
  auto fresh = MakeSourceChecker(dir + "/cache", {}).ValueOrDie();  // checks each file once
  EXPECT_EQ(fresh(b0), SourceState::kStale);
  EXPECT_EQ(fresh(a0), SourceState::kCurrent);
}

TEST(SourceChecker, ADatasetScopesTheCheck) {
  const std::string dir = testing::MakeTempDir();
  fs::create_directories(dir + "/ds");
  fs::create_directories(dir + "/elsewhere");
  const std::string a = dir + "/ds/a.parquet", gone = dir + "/ds/gone.parquet";
  const std::string other = dir + "/elsewhere/o.parquet";
  testing::WriteIdFile(a, {5}, 0);
  testing::WriteIdFile(gone, {5}, 0);
  testing::WriteIdFile(other, {5}, 0);
  const SourceIdentity a0 = IdentityNow(a), gone0 = IdentityNow(gone), other0 = IdentityNow(other);
  fs::remove(gone);
  CacheAdminOptions options;
  options.dataset = {dir + "/ds"};
  auto check = MakeSourceChecker(dir + "/cache", options).ValueOrDie();
  EXPECT_EQ(check(a0), SourceState::kCurrent);
  EXPECT_EQ(check(gone0), SourceState::kStale);   // was below the dataset's directory
  EXPECT_EQ(check(other0), SourceState::kUnknown);  // not the dataset's
  options.dataset = {dir + "/missing"};
  EXPECT_FALSE(MakeSourceChecker(dir + "/cache", options).ok());
}

}  // namespace pqloader
