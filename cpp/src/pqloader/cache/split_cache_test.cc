#include "pqloader/cache/split_cache.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pqloader/test_util.h"
#include "pqloader/util/node_lock.h"

namespace pqloader {

namespace {

namespace fs = std::filesystem;

std::shared_ptr<DecodedUnit> UnitOfBytes(int64_t n, char fill = 'a') {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = 1;
  ColumnData c;
  c.row_shape = {n};
  c.row_bytes = n;
  c.data = arrow::Buffer::FromString(std::string(static_cast<size_t>(n), fill));
  u->columns = {c};
  return u;
}

SourceIdentity SourceOf(const std::string& path, int64_t version, int64_t row_group = 0) {
  return SourceIdentity{path, 1000 + version, version, "hash" + std::to_string(version),
                        row_group};
}

// A schedule for tests: owns the keys it is given; a file is at the version it is given.
class FakeSchedule : public CacheSchedule {
 public:
  std::set<std::string> owned;
  std::map<std::string, int64_t> versions;  // path -> current version
  double NextUse(const std::string&, double) const override { return kNeverUsed; }
  bool Owns(const std::string& key) const override { return owned.count(key) > 0; }
  bool IsStale(const SourceIdentity& source) const override {
    auto it = versions.find(source.path);
    return it != versions.end() && !source.SameFileVersion(SourceOf(source.path, it->second));
  }
};

// The path of the (last listed) entry file under `dir`.
std::string EntryFileIn(const std::string& dir) {
  std::string path;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".pqc") path = e.path().string();
  }
  return path;
}

// Options of a disk cache in a new directory, of one shard.
CacheOptions OneShardCache() {
  CacheOptions o;
  o.dir = testing::MakeTempDir() + "/cache";
  o.shards = 1;
  return o;
}

// A one-shard disk cache in a new directory holding `n` entries of one file's row
// groups 0..n-1 (keys "e0", "e1", ...); its directory.
std::string OneShardCacheOf(int n) {
  const CacheOptions o = OneShardCache();
  auto cache = SplitCache::Open(o);
  for (int rg = 0; rg < n; ++rg) {
    std::string name = "e";  // not "e" + ...: GCC 12's -Wrestrict misfires on it here
    name += std::to_string(rg);
    cache->Put(CacheKey(name), UnitOfBytes(100), SourceOf("/f", 1, rg));
  }
  return o.dir;
}

int64_t EntryFiles(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    n += e.path().extension() == ".pqc";
  }
  return n;
}

}  // namespace

TEST(SplitCache, DiskCachePublishesAndServesEntries) {
  CacheOptions o;
  o.dir = testing::MakeTempDir() + "/cache";
  o.shards = 2;
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("some split");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_EQ(cache->Get(key), nullptr);
  EXPECT_EQ(cache->Put(key, UnitOfBytes(5), SourceOf("/f", 1)), CacheRefusal::kNone);
  auto hit = cache->Get(key);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->columns[0].data->ToString(), "aaaaa");
  auto c = cache->counters();
  EXPECT_EQ(c.misses, 1);
  EXPECT_EQ(c.hits, 1);
  EXPECT_EQ(c.inserts, 1);
  auto stats = InspectCacheDir(o.dir).ValueOrDie();
  EXPECT_EQ(stats.entries, 1);
  ASSERT_TRUE(ClearCacheDir(o.dir).ok());
  EXPECT_EQ(cache->Get(key), nullptr);
}

// Clear sweeps a shard under its lock and keeps the lock file and the directories: it
// deleted a .lock a writer held (the next writer locked a new file beside it) and removed
// the shard directories it emptied (a cache object open meanwhile inserted nothing more).
TEST(SplitCache, ClearWaitsForAShardsLockAndKeepsItAndTheDirectories) {
  CacheOptions o;
  o.dir = testing::MakeTempDir() + "/cache";
  o.shards = 1;
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("split"), later = CacheKey("later");
  ASSERT_EQ(cache->Put(key, UnitOfBytes(5), SourceOf("/f", 1)), CacheRefusal::kNone);
  const std::string lock_path = o.dir + "/shard-00/.lock";
  struct stat before;
  ASSERT_EQ(::stat(lock_path.c_str(), &before), 0);
  auto held = NodeLock::AcquireExisting(lock_path, std::chrono::milliseconds(0));
  ASSERT_NE(held, nullptr);
  std::atomic<bool> done{false};
  arrow::Result<CacheClearReport> report;
  std::thread clearer([&] {
    report = ClearCacheDir(o.dir);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load());  // waits for the writer's lock
  EXPECT_EQ(EntryFiles(o.dir), 1);
  held.reset();
  clearer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->entries, 1);
  struct stat after;
  ASSERT_EQ(::stat(lock_path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(cache->Put(later, UnitOfBytes(5), SourceOf("/f", 2)), CacheRefusal::kNone);
  EXPECT_EQ(cache->counters().write_errors, 0);
  EXPECT_NE(cache->Get(later), nullptr);
  // A shard directory removed by hand is made again.
  fs::remove_all(o.dir + "/shard-00");
  EXPECT_EQ(cache->Put(key, UnitOfBytes(5), SourceOf("/f", 1)), CacheRefusal::kNone);
  EXPECT_EQ(cache->counters().write_errors, 0);
  EXPECT_NE(cache->TryClaim(CacheKey("third")), nullptr);
  EXPECT_EQ(EntryFiles(o.dir), 1);
  // The cache directory deleted whole is not (it would lack its marker): inserts fail.
  fs::remove_all(o.dir);
  EXPECT_EQ(cache->Put(later, UnitOfBytes(5), SourceOf("/f", 2)), CacheRefusal::kNone);
  EXPECT_EQ(cache->counters().write_errors, 1);
  EXPECT_FALSE(fs::exists(o.dir));
}

TEST(SplitCache, KeepRefusesInsertsBeyondTheLimitAndSaysSoOnce) {
  for (const std::string& dir : {std::string(":memory:"), testing::MakeTempDir() + "/c"}) {
    CacheOptions o;
    o.dir = dir;
    o.shards = 1;
    o.size_limit = dir == ":memory:" ? 150 : 1500;  // one entry fits
    const int64_t bytes = dir == ":memory:" ? 100 : 1000;
    auto cache = SplitCache::Open(o);
    EXPECT_EQ(cache->Put(CacheKey("a"), UnitOfBytes(bytes), SourceOf("/f", 1, 0)),
              CacheRefusal::kNone);
    EXPECT_EQ(cache->TakeWarning(), "");
    EXPECT_EQ(cache->Put(CacheKey("b"), UnitOfBytes(bytes), SourceOf("/f", 1, 1)),
              CacheRefusal::kFull);
    EXPECT_EQ(cache->Put(CacheKey("c"), UnitOfBytes(bytes), SourceOf("/f", 1, 2)),
              CacheRefusal::kFull);
    EXPECT_NE(cache->Get(CacheKey("a")), nullptr);
    EXPECT_EQ(cache->Get(CacheKey("b")), nullptr);
    EXPECT_EQ(cache->counters().refused_full, 2);
    const std::string warning = cache->TakeWarning();
    EXPECT_NE(warning.find("is full"), std::string::npos) << warning;
    EXPECT_NE(warning.find("cache_policy='plan'"), std::string::npos) << warning;
    EXPECT_EQ(cache->TakeWarning(), "");  // once per cache object
    // Another reason warns once more.
    EXPECT_EQ(cache->Put(CacheKey("d"), UnitOfBytes(bytes * 2), SourceOf("/f", 1, 3)),
              CacheRefusal::kTooLarge);
    EXPECT_EQ(cache->counters().refused_too_large, 1);
    EXPECT_NE(cache->TakeWarning().find("row group 3 of '/f'"), std::string::npos);
    cache->Refuse(CacheRefusal::kStale, SourceOf("/g", 2));
    EXPECT_EQ(cache->counters().refused_stale, 1);
    EXPECT_NE(cache->TakeWarning().find("'/g' changed while the loader read it"),
              std::string::npos);
  }
}

TEST(SplitCache, LruEvictsTheLeastRecentlyUsed) {
  CacheOptions o;
  o.dir = ":memory:";
  o.size_limit = 250;
  o.policy = CachePolicy::kLru;
  auto lru = SplitCache::Open(o);
  lru->Put("a", UnitOfBytes(100), SourceOf("/f", 1));
  lru->Put("b", UnitOfBytes(100), SourceOf("/f", 1));
  EXPECT_NE(lru->Get("a"), nullptr);  // b is now the least recently used
  lru->Put("c", UnitOfBytes(100), SourceOf("/f", 1));
  EXPECT_NE(lru->Get("a"), nullptr);
  EXPECT_EQ(lru->Get("b"), nullptr);
  EXPECT_NE(lru->Get("c"), nullptr);
  EXPECT_EQ(lru->counters().evictions, 1);
}

namespace {

int64_t EntryBytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".pqc") n += static_cast<int64_t>(e.file_size());
  }
  return n;
}

int64_t RecordedUsage(const std::string& dir) {
  std::ifstream in(dir + "/shard-00/.usage");
  int64_t v = -1;
  in >> v;
  return v;
}

}  // namespace

// The checksum is checked on a version's first read in the process; bytes changed in
// place afterwards make a new version (its ctime), checked again and dropped.
TEST(SplitCache, AnEntryDamagedAfterItsFirstReadIsCaughtOnTheNext) {
  CacheOptions o = OneShardCache();
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("damaged later");
  ASSERT_EQ(cache->Put(key, UnitOfBytes(4000, 'q'), SourceOf("/f", 1)), CacheRefusal::kNone);
  const std::string path = EntryFileIn(o.dir);
  ASSERT_FALSE(path.empty());
  for (int i = 0; i < 2; ++i) {  // verified, then served as verified
    auto hit = cache->Get(key);
    ASSERT_NE(hit, nullptr);
    EXPECT_EQ(hit->columns[0].data->ToString(), std::string(4000, 'q'));
  }
  {
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const size_t at = bytes.find(std::string(4000, 'q'));
    ASSERT_NE(at, std::string::npos);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at + 2000));
    f.put('r');  // a value among the column's values: only the checksum can tell
  }
  EXPECT_EQ(cache->Get(key), nullptr);
  EXPECT_EQ(cache->counters().corrupt, 1);
  EXPECT_FALSE(fs::exists(path));
}

// A unit of two fixed-width columns (int32 x1 and uint8 x3 per row), rows numbered.
std::shared_ptr<DecodedUnit> TwoColumnUnit(int64_t rows, int32_t first) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = rows;
  std::string a(static_cast<size_t>(rows * 4), '\0'), b;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t v = first + static_cast<int32_t>(r);
    std::memcpy(a.data() + r * 4, &v, 4);
    b += std::string(3, static_cast<char>('a' + r % 26));
  }
  ColumnData ca;
  ca.row_bytes = 4;
  ca.data = arrow::Buffer::FromString(a);
  ColumnData cb;
  cb.row_shape = {3};
  cb.row_bytes = 3;
  cb.data = arrow::Buffer::FromString(b);
  u->columns = {ca, cb};
  return u;
}

std::string ReadAll(const DeferredBytes& d) {
  std::string out(static_cast<size_t>(d.size()), '\0');
  EXPECT_TRUE(d.ReadInto(reinterpret_cast<uint8_t*>(out.data())).ok());
  return out;
}

TEST(SplitCache, AVerifiedEntryIsServedWithItsColumnsReadOnDemand) {
  CacheOptions o = OneShardCache();
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("deferred");
  const auto unit = TwoColumnUnit(1000, 7);
  ASSERT_EQ(cache->Put(key, unit, SourceOf("/f", 1)), CacheRefusal::kNone);
  // Not yet verified in this process: read whole (and verified).
  auto first = cache->GetDeferred(key);
  ASSERT_NE(first, nullptr);
  EXPECT_NE(first->columns[0].data, nullptr);
  EXPECT_EQ(first->columns[0].deferred, nullptr);
  // Verified: the columns stay in the file until read, and read as they were written.
  auto hit = cache->GetDeferred(key);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->num_rows, 1000);
  ASSERT_EQ(hit->columns.size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    const ColumnData& d = hit->columns[c];
    EXPECT_EQ(d.data, nullptr);
    ASSERT_NE(d.deferred, nullptr);
    EXPECT_EQ(d.row_bytes, unit->columns[c].row_bytes);
    EXPECT_EQ(d.row_shape, unit->columns[c].row_shape);
    EXPECT_EQ(ReadAll(*d.deferred), unit->columns[c].data->ToString());
    EXPECT_EQ(ReadAll(*d.deferred->Slice(30, 60)), unit->columns[c].data->ToString().substr(30, 60));
  }
  EXPECT_EQ(hit->ByteSize(), 0);  // it holds an open file, not the bytes
  std::vector<ColumnSpec> specs(2);
  specs[0].name = "a";
  specs[0].dtype = DType::kInt32;
  specs[1].name = "b";
  specs[1].dtype = DType::kUInt8;
  specs[1].row_shape = {3};
  EXPECT_TRUE(CheckUnitLayout(*hit, specs).ok());
  EXPECT_EQ(cache->counters().hits, 2);
  // Evicted (deleted) meanwhile: the open file still reads.
  for (const auto& e : fs::recursive_directory_iterator(o.dir)) {
    if (e.path().extension() == ".pqc") fs::remove(e.path());
  }
  EXPECT_EQ(cache->Get(key), nullptr);
  EXPECT_EQ(ReadAll(*hit->columns[1].deferred), unit->columns[1].data->ToString());
}

TEST(SplitCache, AnLruCacheKeepsItsEntriesVerifiedAcrossTheTouchesOfItsHits) {
  // A hit of an LRU cache marks its entry as recently used (mtime); the entry's version
  // as verified follows, so later hits neither hash it again nor miss the deferred read.
  CacheOptions o = OneShardCache();
  o.policy = CachePolicy::kLru;
  o.size_limit = 1 << 20;
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("lru touched");
  ASSERT_EQ(cache->Put(key, TwoColumnUnit(100, 0), SourceOf("/f", 1)), CacheRefusal::kNone);
  const std::string path = EntryFileIn(o.dir);
  const auto mtime = fs::last_write_time(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(cache->Get(key), nullptr);  // verified, and touched
  EXPECT_GT(fs::last_write_time(path), mtime);
  for (int i = 0; i < 3; ++i) {
    auto hit = cache->GetDeferred(key);
    ASSERT_NE(hit, nullptr);
    EXPECT_NE(hit->columns[0].deferred, nullptr) << i;
  }
  // Bytes written in place are still caught (a write is a new ctime).
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-40, std::ios::end);
    f.put('x');
  }
  EXPECT_EQ(cache->GetDeferred(key), nullptr);
  EXPECT_EQ(cache->counters().corrupt, 1);
}

TEST(SplitCache, ADeferredColumnOfAFileCutShortSaysSoByName) {
  CacheOptions o = OneShardCache();
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("cut short");
  ASSERT_EQ(cache->Put(key, TwoColumnUnit(5000, 0), SourceOf("/f", 1)), CacheRefusal::kNone);
  ASSERT_NE(cache->Get(key), nullptr);  // verified
  auto hit = cache->GetDeferred(key);
  ASSERT_NE(hit, nullptr);
  ASSERT_NE(hit->columns[1].deferred, nullptr);
  const std::string path = EntryFileIn(o.dir);
  ASSERT_EQ(::truncate(path.c_str(), 32 * 1024), 0);  // inside the second column's bytes
  std::string out(static_cast<size_t>(hit->columns[1].deferred->size()), '\0');
  const arrow::Status st = hit->columns[1].deferred->ReadInto(reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("changed while in use"), std::string::npos) << st.ToString();
  // A read error (its reader takes the rows from the source), counted once per hit however
  // many of its reads fail; not a drop: the file is kept.
  EXPECT_FALSE(hit->columns[1].deferred->ReadInto(reinterpret_cast<uint8_t*>(out.data())).ok());
  EXPECT_EQ(cache->counters().read_errors, 1);
  EXPECT_EQ(cache->counters().corrupt, 0);
  EXPECT_TRUE(fs::exists(path));
  // The next lookup sees a changed file: read whole, found corrupt, dropped.
  EXPECT_EQ(cache->GetDeferred(key), nullptr);
  EXPECT_EQ(cache->counters().corrupt, 1);
  EXPECT_EQ(cache->counters().read_errors, 1);
  EXPECT_FALSE(fs::exists(path));
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(SplitCache, ADeferredColumnOfAFileWrittenInPlaceSinceItsLookupIsNotServed) {
  // A window gather reads a deferred hit's columns after its lookup (a paused consumer:
  // as long as it likes). Another key's entry of the same size copied over the file
  // meanwhile (`cp` writes in place) was served as this entry's rows, unchecked.
  CacheOptions o = OneShardCache();
  auto cache = SplitCache::Open(o);
  const std::string key = CacheKey("in place"), other = CacheKey("copied over it");
  const auto unit = TwoColumnUnit(1000, 0);
  ASSERT_EQ(cache->Put(key, unit, SourceOf("/f", 1)), CacheRefusal::kNone);
  ASSERT_EQ(cache->Put(other, TwoColumnUnit(1000, 5000), SourceOf("/f", 1, 1)),
            CacheRefusal::kNone);
  const std::string path = o.dir + "/shard-00/" + key + ".pqc";
  const std::string copied = FileBytes(o.dir + "/shard-00/" + other + ".pqc");
  ASSERT_EQ(copied.size(), FileBytes(path).size());
  ASSERT_NE(cache->Get(key), nullptr);  // verified
  auto hit = cache->GetDeferred(key);
  ASSERT_NE(hit, nullptr);
  ASSERT_NE(hit->columns[0].deferred, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (coarse file times)
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.write(copied.data(), static_cast<std::streamsize>(copied.size()));
  }
  const DeferredBytes& column = *hit->columns[0].deferred;
  std::string out(static_cast<size_t>(column.size()), '\0');
  const arrow::Status st = column.ReadInto(reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_TRUE(st.IsIOError()) << st.ToString();  // its reader takes the rows from the source
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  EXPECT_EQ(cache->counters().read_errors, 1);
  // The next lookup reads the changed file whole: another key's, dropped.
  EXPECT_EQ(cache->GetDeferred(key), nullptr);
  EXPECT_EQ(cache->counters().corrupt, 1);
}

TEST(SplitCache, ADeferredColumnOfAnEntryOnlyTouchedOrDeletedSinceItsLookupIsServed) {
  // Another process's LRU hit (a new mtime) or eviction (a new link count) changes the
  // ctime as a write does: the file is then checked again, not given up.
  CacheOptions o = OneShardCache();
  o.policy = CachePolicy::kLru;
  o.size_limit = 1 << 20;
  auto cache = SplitCache::Open(o);
  CacheOptions other_process = o;
  other_process.share_claims_in_process = false;
  auto other = SplitCache::Open(other_process);
  const std::string key = CacheKey("touched");
  const auto unit = TwoColumnUnit(1000, 0);
  ASSERT_EQ(cache->Put(key, unit, SourceOf("/f", 1)), CacheRefusal::kNone);
  ASSERT_NE(cache->Get(key), nullptr);  // verified
  auto hit = cache->GetDeferred(key);
  ASSERT_NE(hit, nullptr);
  ASSERT_NE(hit->columns[0].deferred, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (coarse file times)
  ASSERT_NE(other->Get(key), nullptr);  // touched
  EXPECT_EQ(ReadAll(*hit->columns[0].deferred), unit->columns[0].data->ToString());
  fs::remove(o.dir + "/shard-00/" + key + ".pqc");  // evicted
  EXPECT_EQ(ReadAll(*hit->columns[1].deferred), unit->columns[1].data->ToString());
  EXPECT_EQ(cache->counters().read_errors, 0);
  EXPECT_EQ(cache->counters().corrupt, 0);
}

TEST(SplitCache, EntriesNotPlainOrPastTheOpenFileBoundAreReadWhole) {
  CacheOptions o = OneShardCache();
  auto cache = SplitCache::Open(o);
  // A row mask (rows a transform skipped): not plain.
  auto masked = TwoColumnUnit(10, 0);
  masked->row_ok.assign(10, 1);
  masked->row_ok[3] = 0;
  masked->skipped_rows = 1;
  const std::string masked_key = CacheKey("masked");
  ASSERT_EQ(cache->Put(masked_key, masked, SourceOf("/m", 1)), CacheRefusal::kNone);
  ASSERT_NE(cache->Get(masked_key), nullptr);
  auto whole = cache->GetDeferred(masked_key);
  ASSERT_NE(whole, nullptr);
  EXPECT_NE(whole->columns[0].data, nullptr);
  EXPECT_EQ(whole->row_ok, masked->row_ok);
  // At most 64 entry files open for deferred columns; past them, entries are read whole.
  std::vector<std::shared_ptr<const DecodedUnit>> held;
  for (int i = 0; i < 70; ++i) {
    const std::string key = CacheKey("many " + std::to_string(i));
    ASSERT_EQ(cache->Put(key, TwoColumnUnit(10, i), SourceOf("/f" + std::to_string(i), 1)),
              CacheRefusal::kNone);
    ASSERT_NE(cache->Get(key), nullptr);
    held.push_back(cache->GetDeferred(key));
    ASSERT_NE(held.back(), nullptr);
    EXPECT_EQ(held.back()->columns[0].deferred != nullptr, i < 64) << i;
  }
  held.clear();  // the files close
  auto again = cache->GetDeferred(CacheKey("many 69"));
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->columns[0].deferred, nullptr);
}

TEST(SplitCache, AShardsRecordedUsageIsTheSizeOfItsEntries) {
  // .usage decides when a writer must make room: it must follow every publish, eviction
  // and drop of a corrupt entry (too low, the cache outgrows its limit; too high, it
  // lists the shard on every write).
  const std::string probe = testing::MakeTempDir() + "/probe";
  {
    CacheOptions o;
    o.dir = probe;
    SplitCache::Open(o)->Put(CacheKey("probe"), UnitOfBytes(1000), SourceOf("/f", 1));
  }
  const int64_t entry = EntryBytes(probe);
  ASSERT_GT(entry, 1000);
  CacheOptions o = OneShardCache();
  o.policy = CachePolicy::kLru;
  o.size_limit = 2 * entry + entry / 2;  // two entries fit
  auto cache = SplitCache::Open(o);
  for (const char* name : {"a", "b", "c", "d"}) {
    EXPECT_EQ(cache->Put(CacheKey(name), UnitOfBytes(1000), SourceOf("/f", 1)), CacheRefusal::kNone);
    EXPECT_EQ(RecordedUsage(o.dir), EntryBytes(o.dir)) << "after putting " << name;
  }
  EXPECT_EQ(cache->counters().evictions, 2);
  EXPECT_EQ(EntryBytes(o.dir), 2 * entry);
  // Damage d's data (same size): the read drops it.
  std::string d_path;
  for (const auto& e : fs::recursive_directory_iterator(o.dir)) {
    if (e.path().filename() == CacheKey("d") + ".pqc") d_path = e.path().string();
  }
  ASSERT_FALSE(d_path.empty());
  {
    std::fstream f(d_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(entry - 100);
    f.put('!');
  }
  EXPECT_EQ(cache->Get(CacheKey("d")), nullptr);
  EXPECT_EQ(cache->counters().corrupt, 1);
  EXPECT_EQ(EntryBytes(o.dir), entry);
  EXPECT_EQ(RecordedUsage(o.dir), entry);
}

TEST(CacheAdmission, StaleEntriesGoFirstUnderEveryPolicy) {
  // Held: 3 entries of 10 bytes, the middle one stale; budget 30, insert 10.
  const std::vector<HeldEntry> held = {{10, 1, false}, {10, 2, true}, {10, 3, false}};
  for (CachePolicy p : {CachePolicy::kKeep, CachePolicy::kLru}) {
    const Admission a = Admit(p, held, 30, 30, 10);
    EXPECT_EQ(a.refusal, CacheRefusal::kNone);
    EXPECT_EQ(a.evict, std::vector<size_t>{1});
  }
  // Not enough room even without the stale entry: keep refuses (still dropping the
  // stale one), lru evicts the oldest live entry too.
  const Admission keep = Admit(CachePolicy::kKeep, held, 30, 30, 20);
  EXPECT_EQ(keep.refusal, CacheRefusal::kFull);
  EXPECT_EQ(keep.evict, std::vector<size_t>{1});
  const Admission lru = Admit(CachePolicy::kLru, held, 30, 30, 20);
  EXPECT_EQ(lru.refusal, CacheRefusal::kNone);
  EXPECT_EQ(lru.evict, (std::vector<size_t>{1, 0}));
  // Room to spare, no limit, or larger than the budget.
  EXPECT_TRUE(Admit(CachePolicy::kKeep, held, 30, 100, 10).evict.empty());
  EXPECT_EQ(Admit(CachePolicy::kKeep, held, 30, 0, 10).refusal, CacheRefusal::kNone);
  EXPECT_EQ(Admit(CachePolicy::kLru, held, 30, 30, 31).refusal, CacheRefusal::kTooLarge);
}

TEST(SplitCache, AFullDiskCacheDeletesStaleEntriesOfItsOwnersFilesFirst) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions o;
  o.dir = dir;
  o.shards = 1;
  o.size_limit = 4500;  // three entries of ~1.4 KB
  // A first owner fills the cache from version 1 of /f (and one entry of /other).
  {
    auto cache = SplitCache::Open(o);
    cache->Put(CacheKey("f1-0"), UnitOfBytes(1000), SourceOf("/f", 1, 0));
    cache->Put(CacheKey("f1-1"), UnitOfBytes(1000), SourceOf("/f", 1, 1));
    cache->Put(CacheKey("o-0"), UnitOfBytes(1000), SourceOf("/other", 1, 0));
    EXPECT_EQ(cache->counters().inserts, 3);
  }
  // /f is now at version 2: its old entries are stale for a loader that reads /f.
  auto schedule = std::make_shared<FakeSchedule>();
  schedule->owned = {CacheKey("f2-0"), CacheKey("f2-1")};
  schedule->versions = {{"/f", 2}};
  auto cache = SplitCache::Open(o);
  cache->set_schedule(schedule);
  EXPECT_EQ(cache->Put(CacheKey("f2-0"), UnitOfBytes(1000), SourceOf("/f", 2, 0)),
            CacheRefusal::kNone);
  const CacheCounters c = cache->counters();
  EXPECT_EQ(c.inserts, 1);
  EXPECT_EQ(c.evictions, 2);  // both stale entries, not the entry of /other
  EXPECT_EQ(c.evicted_stale, 2);
  EXPECT_NE(cache->Get(CacheKey("o-0")), nullptr);
  EXPECT_EQ(cache->Get(CacheKey("f1-0")), nullptr);
  EXPECT_EQ(EntryFiles(dir), 2);
  // Full again, nothing stale: keep refuses.
  EXPECT_EQ(cache->Put(CacheKey("f2-1"), UnitOfBytes(1000), SourceOf("/f", 2, 1)),
            CacheRefusal::kNone);
  EXPECT_EQ(cache->Put(CacheKey("x"), UnitOfBytes(1000), SourceOf("/f", 2, 2)),
            CacheRefusal::kFull);
}

TEST(SplitCache, AFullDiskCacheDeletesEntriesOfOlderFormatsFirst) {
  // An entry of format 2 (no source identity) is never read by this version: stale.
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions o;
  o.dir = dir;
  o.shards = 1;
  o.size_limit = 3000;  // two entries of ~1.4 KB
  {
    auto cache = SplitCache::Open(o);
    cache->Put(CacheKey("old"), UnitOfBytes(1000), SourceOf("/other", 1, 0));
    cache->Put(CacheKey("kept"), UnitOfBytes(1000), SourceOf("/other", 1, 1));
  }
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename() != CacheKey("old") + ".pqc") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t version = 2;
    f.seekp(8);  // after the magic
    f.write(reinterpret_cast<const char*>(&version), sizeof(version));
  }
  auto schedule = std::make_shared<FakeSchedule>();
  schedule->owned = {CacheKey("new")};
  auto cache = SplitCache::Open(o);
  cache->set_schedule(schedule);
  EXPECT_EQ(cache->Put(CacheKey("new"), UnitOfBytes(1000), SourceOf("/f", 1)), CacheRefusal::kNone);
  EXPECT_EQ(cache->counters().evicted_stale, 1);
  EXPECT_TRUE(cache->Contains(CacheKey("kept")));
  EXPECT_FALSE(cache->Contains(CacheKey("old")));
}

TEST(SplitCache, StatsAndPruneTellStaleEntriesByTheirHeaders) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions o;
  o.dir = dir;
  o.shards = 4;
  {
    auto cache = SplitCache::Open(o);
    for (int rg = 0; rg < 3; ++rg) {
      cache->Put(CacheKey("old" + std::to_string(rg)), UnitOfBytes(100), SourceOf("/f", 1, rg));
      cache->Put(CacheKey("new" + std::to_string(rg)), UnitOfBytes(100), SourceOf("/f", 2, rg));
    }
    cache->Put(CacheKey("gone"), UnitOfBytes(100), SourceOf("/gone", 1));
    cache->Put(CacheKey("remote"), UnitOfBytes(100), SourceOf("s3://b/k", 1));
  }
  std::ofstream(dir + "/shard-00/notes.txt") << "not an entry";
  // A file named like an entry without an entry's header is never deleted.
  const std::string fake = dir + "/shard-01/" + CacheKey("fake") + ".pqc";
  std::ofstream(fake) << std::string(200, 'x');
  const SourceChecker checker = [](const SourceIdentity& s) {
    if (s.path == "/gone") return SourceState::kStale;
    if (s.path != "/f") return SourceState::kUnknown;
    return s.SameFileVersion(SourceOf("/f", 2)) ? SourceState::kCurrent : SourceState::kStale;
  };
  auto stats = InspectCacheDir(dir, checker).ValueOrDie();
  EXPECT_EQ(stats.entries, 9);  // by name, the fake included
  EXPECT_EQ(stats.stale_entries, 4);
  EXPECT_EQ(stats.unverified_entries, 1);
  EXPECT_GT(stats.stale_bytes, 400);
  auto report = PruneCacheDir(dir, checker).ValueOrDie();
  EXPECT_EQ(report.entries, 4);
  EXPECT_EQ(report.bytes, stats.stale_bytes);
  EXPECT_EQ(report.kept, 4);
  EXPECT_EQ(report.unverified_entries, 1);
  EXPECT_TRUE(fs::exists(fake));
  EXPECT_TRUE(fs::exists(dir + "/shard-00/notes.txt"));
  EXPECT_EQ(EntryFiles(dir), 5);
  auto cache = SplitCache::Open(o);
  EXPECT_NE(cache->Get(CacheKey("new1")), nullptr);
  EXPECT_EQ(cache->Get(CacheKey("old1")), nullptr);
  // The shards' usage files follow the deletions: 4 live entries of one shard budget.
  int64_t usage = 0;
  for (int s = 0; s < 4; ++s) {
    std::ifstream in(dir + "/shard-0" + std::to_string(s) + "/.usage");
    int64_t v = 0;
    if (in >> v) usage += v;
  }
  EXPECT_EQ(usage, InspectCacheDir(dir).ValueOrDie().bytes - 200);  // the fake is not counted
}

// Ctrl-C in `pqloader cache stats|prune|clear` (the binding sets the flag): each stops
// at its next entry with Cancelled; what was deleted by then stays deleted, nothing more.
TEST(SplitCache, StatsPruneAndClearStopAtTheNextEntryOnceCancelled) {
  const std::string dir = OneShardCacheOf(6);
  auto flag = std::make_shared<std::atomic<bool>>(false);
  const CancelFlag cancel = flag;
  int checked = 0;
  const SourceChecker stale_then_cancel = [&](const SourceIdentity&) {
    if (++checked == 2) flag->store(true);  // Ctrl-C while the second entry is checked
    return SourceState::kStale;
  };
  auto stats = InspectCacheDir(dir, stale_then_cancel, cancel);
  EXPECT_TRUE(stats.status().IsCancelled()) << stats.status().ToString();
  EXPECT_EQ(checked, 2);
  flag->store(false);
  checked = 0;
  auto pruned = PruneCacheDir(dir, stale_then_cancel, cancel);
  EXPECT_TRUE(pruned.status().IsCancelled()) << pruned.status().ToString();
  EXPECT_EQ(EntryFiles(dir), 4);  // the two checked before the flag was seen
  auto cleared = ClearCacheDir(dir, cancel);  // the flag still set: nothing deleted
  EXPECT_TRUE(cleared.status().IsCancelled()) << cleared.status().ToString();
  EXPECT_EQ(EntryFiles(dir), 4);
  flag->store(false);
  EXPECT_EQ(ClearCacheDir(dir, cancel).ValueOrDie().entries, 4);
}

// A prune that cannot have a shard's lock in time (another process holds it) fails
// naming the shard and what it deleted before, instead of leaving stale entries silently.
TEST(SplitCache, PruneFailsNamingAShardWhoseLockIsHeldTooLong) {
  const std::string dir = OneShardCacheOf(3);
  const SourceChecker all_stale = [](const SourceIdentity&) { return SourceState::kStale; };
  auto held = NodeLock::AcquireExisting(dir + "/shard-00/.lock", std::chrono::milliseconds(0));
  ASSERT_NE(held, nullptr);
  auto pruned = PruneCacheDir(dir, all_stale, nullptr, std::chrono::milliseconds(50));
  ASSERT_FALSE(pruned.ok());
  EXPECT_TRUE(pruned.status().IsIOError());
  const std::string message = pruned.status().message();
  EXPECT_NE(message.find("shard-00"), std::string::npos) << message;
  EXPECT_NE(message.find("held its lock for more than 50 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("0 stale entries were deleted"), std::string::npos) << message;
  EXPECT_EQ(EntryFiles(dir), 3);
  held.reset();
  auto again = PruneCacheDir(dir, all_stale, nullptr, std::chrono::milliseconds(50));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->entries, 3);
  EXPECT_EQ(EntryFiles(dir), 0);
}

TEST(SplitCache, PruneRefusesADirectoryThatIsNotACache) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/mine.txt") << "user data";
  const SourceChecker all_stale = [](const SourceIdentity&) { return SourceState::kStale; };
  EXPECT_FALSE(PruneCacheDir(dir, all_stale).ok());
  EXPECT_TRUE(fs::exists(dir + "/mine.txt"));
}

namespace {

// The path of the in-progress marker of `key` in a one-shard cache at `dir`.
std::string MarkerOf(const std::string& dir, const std::string& key) {
  return dir + "/shard-00/" + key + ".fetch";
}

// Each object made with these options stands for a process of its own (its claims are
// not shared with this process's other objects on the directory).
CacheOptions OneShard(const std::string& dir, int64_t wait_timeout_ms = 30000) {
  CacheOptions o;
  o.dir = dir;
  o.shards = 1;
  o.wait_timeout_ms = wait_timeout_ms;
  o.share_claims_in_process = false;
  return o;
}

std::string ThisHost() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

TEST(FetchClaims, OneProcessAtATimeClaimsASplit) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  // Two cache objects on one directory stand for two processes.
  auto a = SplitCache::Open(OneShard(dir));
  auto b = SplitCache::Open(OneShard(dir));
  const std::string key = CacheKey("split 1");
  auto claim = a->TryClaim(key);
  ASSERT_NE(claim, nullptr);
  EXPECT_TRUE(fs::exists(MarkerOf(dir, key)));
  EXPECT_EQ(b->TryClaim(key), nullptr);
  auto same = a->TryClaim(key);
  EXPECT_EQ(same, claim);  // shared within one cache object
  EXPECT_EQ(InspectCacheDir(dir).ValueOrDie().fetch_markers, 1);
  claim.reset();
  EXPECT_TRUE(fs::exists(MarkerOf(dir, key)));  // the second reference holds it
  same.reset();
  EXPECT_FALSE(fs::exists(MarkerOf(dir, key)));
  EXPECT_NE(b->TryClaim(key), nullptr);
}

// A claim held in a read-ahead longer than the wait timeout (a slow or paused consumer)
// is dated again when its worker starts on it (Touch): the other processes then wait for
// its entry rather than take it over and fetch the split a second time. A claim found
// already too old by a worker that needs it now is taken over, counted as a wait that
// timed out (before, in neither counter); by the read-ahead, in neither.
TEST(FetchClaims, ATouchedClaimIsNotTakenOverAndATakeOverCounts) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  auto a = SplitCache::Open(OneShard(dir, /*wait_timeout_ms=*/1000));
  auto b = SplitCache::Open(OneShard(dir, /*wait_timeout_ms=*/1000));
  const std::string key = CacheKey("split 1");
  auto age = [&](const std::string& k) {  // as if claimed 5 s ago
    struct timespec times[2];
    ::clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec -= 5;
    times[1] = times[0];
    ASSERT_EQ(::utimensat(AT_FDCWD, MarkerOf(dir, k).c_str(), times, 0), 0);
  };
  auto claim = a->TryClaim(key);
  ASSERT_NE(claim, nullptr);
  age(key);
  claim->Touch();  // its worker starts on it
  EXPECT_EQ(b->TryClaim(key, nullptr, /*needed_now=*/true), nullptr);  // fresh: waited on
  EXPECT_EQ(b->counters().waits, 0);
  // Not touched: taken over. By a worker: a wait that timed out.
  age(key);
  auto taken = b->TryClaim(key, nullptr, /*needed_now=*/true);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(b->counters().waits, 1);
  EXPECT_EQ(b->counters().wait_timeouts, 1);
  // The old claim's touch and release leave the new one alone.
  claim->Touch();
  age(key);
  claim.reset();
  EXPECT_TRUE(fs::exists(MarkerOf(dir, key)));
  // By the read-ahead: counted in neither.
  auto c = SplitCache::Open(OneShard(dir, /*wait_timeout_ms=*/1000));
  EXPECT_NE(c->TryClaim(key), nullptr);
  EXPECT_EQ(c->counters().waits, 0);
  EXPECT_EQ(c->counters().wait_timeouts, 0);
}

// A shard's lock held by a process that stopped (suspended, or paused in a debugger)
// costs a writer lock_timeout_ms, not its run: the insert fails and says why, a claim's
// marker is left (to age out), and once the lock is free the cache works again.
// Two loaders of one process on one directory (a paused iterator holding a claimed split
// in its read-ahead, and a new one) share claims: the second never waits for the first
// (a wait it would have sat out whole, the first not draining its read-ahead), while
// another process still sees the claim. An object opened with another shard count uses
// the directory's (recorded in its marker), so its markers lie where the others look: it
// shares them too.
TEST(FetchClaims, ObjectsOfOneProcessOnOneDirectoryShareTheirClaims) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions shared = OneShard(dir);
  shared.share_claims_in_process = true;
  auto a = SplitCache::Open(shared);
  shared.dir = dir + "/./";  // the same directory, named otherwise
  auto b = SplitCache::Open(shared);
  shared.shards = 4;
  auto c = SplitCache::Open(shared);
  auto other_process = SplitCache::Open(OneShard(dir));
  const std::string key = CacheKey("split 1");
  auto claim = a->TryClaim(key);
  ASSERT_NE(claim, nullptr);
  auto from_b = b->TryClaim(key);
  EXPECT_EQ(from_b, claim);
  EXPECT_EQ(c->TryClaim(key), claim);  // the directory's count (1), not 4: the same marker
  EXPECT_EQ(other_process->TryClaim(key), nullptr);
  // Released by the last holder, whichever object it came from, which may outlive them.
  claim.reset();
  a.reset(), b.reset(), c.reset();
  EXPECT_TRUE(fs::exists(MarkerOf(dir, key)));
  from_b.reset();
  EXPECT_FALSE(fs::exists(MarkerOf(dir, key)));
  EXPECT_NE(other_process->TryClaim(key), nullptr);
}

TEST(FetchClaims, AShardLockHeldTooLongFailsTheInsertAndKeepsTheClaimsMarker) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions o = OneShard(dir);
  o.lock_timeout_ms = 50;
  auto cache = SplitCache::Open(o);
  const std::string first = CacheKey("split 1"), second = CacheKey("split 2");
  ASSERT_EQ(cache->Put(first, UnitOfBytes(5), SourceOf("/f", 1)), CacheRefusal::kNone);
  ASSERT_EQ(cache->counters().inserts, 1);
  auto claim = cache->TryClaim(second);
  ASSERT_NE(claim, nullptr);
  auto held = NodeLock::AcquireExisting(dir + "/shard-00/.lock", std::chrono::milliseconds(0));
  ASSERT_NE(held, nullptr);  // "another process": its own open file description
  EXPECT_EQ(cache->Put(second, UnitOfBytes(7), SourceOf("/f", 1, 1)), CacheRefusal::kNone);
  EXPECT_EQ(cache->counters().inserts, 1);
  EXPECT_EQ(cache->counters().write_errors, 1);
  const std::string warning = cache->TakeWarning();
  EXPECT_NE(warning.find("held its lock for more than 50 ms"), std::string::npos) << warning;
  EXPECT_EQ(cache->Get(second), nullptr);
  EXPECT_EQ(EntryFiles(dir), 1);  // no entry, no temp file left
  claim.reset();
  EXPECT_TRUE(fs::exists(MarkerOf(dir, second)));  // not deleted without the lock
  held.reset();
  EXPECT_EQ(cache->Put(second, UnitOfBytes(7), SourceOf("/f", 1, 1)), CacheRefusal::kNone);
  EXPECT_EQ(cache->counters().inserts, 2);
  ASSERT_NE(cache->Get(second), nullptr);
  int temp_files = 0;
  for (const auto& e : fs::directory_iterator(dir + "/shard-00")) {
    temp_files += e.path().filename().string().rfind(".tmp-", 0) == 0;
  }
  EXPECT_EQ(temp_files, 0);
}

// A loader that stops while one of its workers waits for a shard's lock (held by a
// stalled process) does not wait out the lock timeout: the insert gives up at once
// (not counted as a failure, nothing left behind), and so does a claim that would
// break an abandoned marker.
// One shard whose lock a stalled process holds: `owner`'s claim of `claimed` is too old
// for `other` (a 50 ms wait timeout: abandoned), whose waits for the lock last ten
// minutes unless cancelled.
struct StalledShard {
  StalledShard() {
    owner = SplitCache::Open(OneShard(dir));
    CacheOptions o = OneShard(dir, 50);
    o.lock_timeout_ms = 600000;  // ten minutes: only a cancel can end these waits
    other = SplitCache::Open(o);
    claim = owner->TryClaim(claimed);
    std::this_thread::sleep_for(std::chrono::milliseconds(80));  // too old for `other`
    held = NodeLock::AcquireExisting(dir + "/shard-00/.lock", std::chrono::milliseconds(0));
  }
  const std::string dir = testing::MakeTempDir() + "/cache";
  const std::string claimed = CacheKey("split 1"), fresh = CacheKey("split 2");
  std::shared_ptr<SplitCache> owner, other;
  std::shared_ptr<FetchClaim> claim;
  std::unique_ptr<NodeLock> held;
};

TEST(FetchClaims, AWaitForAShardLockEndsWhenTheCallerStops) {
  StalledShard shard;
  auto& [dir, claimed, fresh, owner, other, claim, held] = shard;
  ASSERT_NE(claim, nullptr);
  ASSERT_NE(held, nullptr);
  std::atomic<bool> cancel{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = true;
  });
  EXPECT_EQ(other->TryClaim(claimed, BorrowedCancelFlag(&cancel)), nullptr);
  stopper.join();
  EXPECT_TRUE(fs::exists(MarkerOf(dir, claimed)));  // not broken without the lock
  EXPECT_EQ(other->Put(fresh, UnitOfBytes(7), SourceOf("/f", 1, 1), 0, &cancel), CacheRefusal::kNone);
  EXPECT_EQ(other->counters().inserts, 0);
  EXPECT_EQ(other->counters().write_errors, 0);
  EXPECT_EQ(other->TakeWarning(), "");
  held.reset();
  EXPECT_EQ(other->Get(fresh), nullptr);
  EXPECT_EQ(EntryFiles(dir), 0);
  for (const auto& e : fs::directory_iterator(dir + "/shard-00")) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
  }
}

// While one thread waits for a shard's lock (to break an abandoned claim), the cache's
// other claims go on: the wait does not hold the claims' mutex. And a claim's release,
// which deletes its marker under the shard's lock, gives up that wait once its claimer
// stops, leaving the marker to age out (a loader closed while a stalled process holds
// the lock returns at once, not after the lock timeout).
TEST(FetchClaims, AWaitForAShardLockHoldsUpNoOtherClaimAndAStoppedReleaseEndsIt) {
  StalledShard shard;
  auto& [dir, claimed, fresh, owner, other, abandoned, held] = shard;
  ASSERT_NE(abandoned, nullptr);
  ASSERT_NE(held, nullptr);
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> waiting_returned{false};
  std::thread waiter([&] {
    EXPECT_EQ(other->TryClaim(claimed, cancel), nullptr);  // waits for the lock
    waiting_returned = true;
  });
  // Bounds the test if the claim below did wait for the waiter (it then returns after
  // the waiter, which the expectation tells).
  std::thread stopper([&] {
    for (int i = 0; i < 5000 && !cancel->load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    *cancel = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the waiter is waiting
  auto claim = other->TryClaim(fresh, cancel);
  EXPECT_NE(claim, nullptr);
  EXPECT_FALSE(waiting_returned.load());  // the other claim did not wait for the waiter
  EXPECT_TRUE(fs::exists(MarkerOf(dir, fresh)));
  *cancel = true;
  stopper.join();
  waiter.join();
  std::atomic<bool> released{false};
  std::thread watchdog([&] {  // fails the test (rather than hang for the lock timeout)
    for (int i = 0; i < 60000 && !released; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!released) {
      std::fprintf(stderr, "a stopped claim's release still waited after 60 s\n");
      std::_Exit(1);
    }
  });
  claim.reset();  // its release gives up the lock's wait (after 250 ms): the marker stays
  released = true;
  watchdog.join();
  EXPECT_TRUE(fs::exists(MarkerOf(dir, fresh)));
  EXPECT_TRUE(fs::exists(MarkerOf(dir, claimed)));  // not broken without the lock
  held.reset();
  abandoned.reset();  // with the lock free, a release deletes its marker
  EXPECT_FALSE(fs::exists(MarkerOf(dir, claimed)));
}

// Past the lock timeout, nothing that needs the shard's lock is done without it: an
// abandoned claim marker is not broken (the claimer fetches without coordinating, a
// waiter stops waiting: one lock timeout each, not one per retry), and a corrupt
// entry is deleted without rewriting the usage (it then overstates the shard until a
// writer finds it full and recounts; a rewrite beside a writer could lose its addition).
TEST(FetchClaims, AShardLockHeldTooLongBreaksNoMarkerAndRewritesNoUsage) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions o = OneShard(dir, 50);
  o.lock_timeout_ms = 50;
  auto owner = SplitCache::Open(OneShard(dir));
  auto other = SplitCache::Open(o);
  const std::string claimed = CacheKey("split 1"), damaged = CacheKey("split 2");
  auto claim = owner->TryClaim(claimed);
  ASSERT_NE(claim, nullptr);
  ASSERT_EQ(owner->Put(damaged, UnitOfBytes(4000, 'q'), SourceOf("/f", 1)), CacheRefusal::kNone);
  const int64_t usage = RecordedUsage(dir);
  ASSERT_EQ(usage, EntryBytes(dir));
  std::string path;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename() == damaged + ".pqc") path = e.path().string();
  }
  ASSERT_FALSE(path.empty());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('!');
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(80));  // the marker is now too old for `other`
  auto held = NodeLock::AcquireExisting(dir + "/shard-00/.lock", std::chrono::milliseconds(0));
  ASSERT_NE(held, nullptr);
  auto read_marker = [&] {
    std::ifstream in(MarkerOf(dir, claimed));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string owners = read_marker();
  ASSERT_FALSE(owners.empty());
  // Not taken over (the owner's marker stays), and not waited on again: fetch uncoordinated.
  EXPECT_NE(other->TryClaim(claimed), nullptr);
  EXPECT_EQ(read_marker(), owners);
  EXPECT_EQ(other->WaitForFetch(claimed, nullptr), FetchWait::kTimedOut);
  EXPECT_EQ(read_marker(), owners);
  EXPECT_EQ(other->Get(damaged), nullptr);
  EXPECT_EQ(other->counters().corrupt, 1);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(RecordedUsage(dir), usage);  // not rewritten without the lock
  // With the lock free again, the too-old marker is broken and the key claimed.
  held.reset();
  auto taken = other->TryClaim(claimed);
  ASSERT_NE(taken, nullptr);
  EXPECT_TRUE(fs::exists(MarkerOf(dir, claimed)));
  EXPECT_NE(read_marker(), owners);  // the marker is `other`'s now
}

// A claim makes the other processes wait for its entry. A cache that refuses the entry
// (larger than a shard's budget; its shard full under kKeep) claimed it all the same,
// and the others waited for nothing until its consumer reached the split (or the wait
// timeout). It claims no such split now; one that goes in again is claimed again.
TEST(FetchClaims, AnEntryTheCacheRefusesIsNotClaimed) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  CacheOptions small = OneShard(dir);
  small.size_limit = 1500;  // one entry of 1000 bytes fits
  auto a = SplitCache::Open(small);
  auto other_process = SplitCache::Open(OneShard(dir));
  const std::string big = CacheKey("big"), first = CacheKey("first"), second = CacheKey("second");
  // Too large: never claimed again, whatever the shard holds.
  auto held = a->TryClaim(big);  // not known yet
  ASSERT_NE(held, nullptr);
  EXPECT_TRUE(fs::exists(MarkerOf(dir, big)));
  EXPECT_EQ(a->Put(big, UnitOfBytes(2000), SourceOf("/f", 1, 0)), CacheRefusal::kTooLarge);
  EXPECT_NE(a->TakeWarning().find("never cached"), std::string::npos);
  held.reset();  // dropped unwritten: its marker goes
  EXPECT_FALSE(fs::exists(MarkerOf(dir, big)));
  auto none = a->TryClaim(big);
  ASSERT_NE(none, nullptr);  // fetched ...
  EXPECT_FALSE(fs::exists(MarkerOf(dir, big)));  // ... without a claim
  // Full under kKeep: the shard's next splits are not claimed until an insert goes in.
  EXPECT_EQ(a->Put(first, UnitOfBytes(1000), SourceOf("/f", 1, 1)), CacheRefusal::kNone);
  EXPECT_EQ(a->Put(second, UnitOfBytes(1000), SourceOf("/f", 1, 2)), CacheRefusal::kFull);
  auto unclaimed = a->TryClaim(second);
  ASSERT_NE(unclaimed, nullptr);
  EXPECT_FALSE(fs::exists(MarkerOf(dir, second)));
  EXPECT_NE(other_process->TryClaim(second), nullptr);  // free for a process that may insert it
  fs::remove(dir + "/shard-00/" + first + ".pqc");
  fs::remove(dir + "/shard-00/.usage");
  EXPECT_EQ(a->Put(second, UnitOfBytes(1000), SourceOf("/f", 1, 2)), CacheRefusal::kNone);
  const std::string third = CacheKey("third");
  auto claim = a->TryClaim(third);
  ASSERT_NE(claim, nullptr);
  EXPECT_TRUE(fs::exists(MarkerOf(dir, third)));  // claimed again
  EXPECT_FALSE(fs::exists(MarkerOf(dir, big)));  // (too large whatever the shard holds)
  EXPECT_NE(a->TryClaim(big), nullptr);
  EXPECT_FALSE(fs::exists(MarkerOf(dir, big)));
}

TEST(FetchClaims, AWaiterSeesTheEntryPublishedTheClaimDroppedATimeoutOrACancel) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  auto a = SplitCache::Open(OneShard(dir));
  auto b = SplitCache::Open(OneShard(dir, 300));
  const std::string key = CacheKey("split 2");
  // Published: the holder inserts, then releases.
  auto claim = a->TryClaim(key);
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    a->Put(key, UnitOfBytes(10), SourceOf("/f", 1));
    claim.reset();
  });
  EXPECT_EQ(b->WaitForFetch(key, nullptr), FetchWait::kCached);
  holder.join();
  EXPECT_NE(b->Get(key), nullptr);
  // Dropped without an entry (e.g. refused by the budget): the waiter may claim it.
  const std::string other = CacheKey("split 3");
  claim = a->TryClaim(other);
  std::thread dropper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    claim.reset();
  });
  EXPECT_EQ(b->WaitForFetch(other, nullptr), FetchWait::kFree);
  dropper.join();
  // Held past the waiter's timeout (300 ms): the claim is deemed abandoned and broken.
  // Its age comes from the marker's mtime, which the kernel stamps from a coarse clock
  // (a tick behind): the wait may end a few ms short of 300 ms after the claim.
  const auto t0 = std::chrono::steady_clock::now();
  claim = a->TryClaim(other);
  ASSERT_TRUE(fs::exists(MarkerOf(dir, other)));
  EXPECT_EQ(b->WaitForFetch(other, nullptr), FetchWait::kFree);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  EXPECT_FALSE(fs::exists(MarkerOf(dir, other)));
  auto taken_over = b->TryClaim(other);
  ASSERT_NE(taken_over, nullptr);
  claim.reset();  // the slow holder lets go: the new holder's marker stays
  EXPECT_TRUE(fs::exists(MarkerOf(dir, other)));
  // Cancelled from another thread, long before the timeout.
  auto patient = SplitCache::Open(OneShard(dir, 60000));
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel = true;
  });
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(patient->WaitForFetch(other, &cancel), FetchWait::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5));
  canceller.join();
  const CacheCounters c = b->counters();
  EXPECT_EQ(c.waits, 3);
  EXPECT_EQ(c.wait_timeouts, 1);
  EXPECT_GT(c.wait_ns, 250'000'000);
}

TEST(FetchClaims, MarkersOfDeadProcessesOrOlderThanTheTimeoutAreBroken) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  auto cache = SplitCache::Open(OneShard(dir, 2000));
  // A process that has exited: its pid is free (reaped).
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const std::string dead = CacheKey("dead");
  std::ofstream(MarkerOf(dir, dead)) << "pqloader fetch\npid " << child << "\nhost " << ThisHost()
                                     << "\ntoken x\n";
  EXPECT_NE(cache->TryClaim(dead), nullptr);
  // A live process (this one) whose marker is older than the timeout.
  const std::string old = CacheKey("old");
  std::ofstream(MarkerOf(dir, old)) << "pqloader fetch\npid " << ::getpid() << "\nhost "
                                    << ThisHost() << "\ntoken y\n";
  EXPECT_EQ(cache->TryClaim(old), nullptr);  // fresh: held
  struct timespec times[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, MarkerOf(dir, old).c_str(), times, 0), 0);
  EXPECT_EQ(cache->WaitForFetch(old, nullptr), FetchWait::kFree);  // broken by the waiter
  EXPECT_FALSE(fs::exists(MarkerOf(dir, old)));
  // A dead pid on another host may be alive there: only its age breaks it.
  const std::string remote = CacheKey("remote");
  std::ofstream(MarkerOf(dir, remote)) << "pqloader fetch\npid " << child
                                       << "\nhost another-host\ntoken z\n";
  EXPECT_EQ(cache->TryClaim(remote), nullptr);
}

TEST(FetchClaims, AMarkerAppearsWholeAndItsTempFileIsTheCachesToSweep) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  auto cache = SplitCache::Open(OneShard(dir));
  const std::string key = CacheKey("whole");
  auto claim = cache->TryClaim(key);
  ASSERT_NE(claim, nullptr);
  // Linked into place from a complete temp file, which is gone.
  std::ifstream in(MarkerOf(dir, key));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\npid " + std::to_string(::getpid()) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ntoken "), std::string::npos) << text;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir + "/shard-00")) names.push_back(e.path().filename());
  for (const auto& n : names) EXPECT_EQ(n.find(".tmp-"), std::string::npos) << n;
  // A process killed before linking leaves its marker's temp file: a temp file of the
  // cache (counted, cleared), not a foreign one, and not a claim.
  const std::string left = MarkerOf(dir, CacheKey("killed")) + ".tmp-123-7";
  std::ofstream(left) << "pqloader fetch\npid 123\n";
  EXPECT_EQ(InspectCacheDir(dir).ValueOrDie().temp_files, 1);
  EXPECT_NE(cache->TryClaim(CacheKey("killed")), nullptr);
  claim.reset();
  auto report = ClearCacheDir(dir).ValueOrDie();
  EXPECT_EQ(report.foreign_count, 0);
  EXPECT_FALSE(fs::exists(left));
}

TEST(FetchClaims, AClaimOutlivesItsCacheAndClearRemovesLeftMarkers) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  const std::string key = CacheKey("k");
  std::shared_ptr<FetchClaim> claim;
  {
    auto cache = SplitCache::Open(OneShard(dir));
    claim = cache->TryClaim(key);
  }
  EXPECT_TRUE(fs::exists(MarkerOf(dir, key)));
  claim.reset();
  EXPECT_FALSE(fs::exists(MarkerOf(dir, key)));
  // A marker left by a crash is the cache's: clear deletes it, and the directory may be
  // marked as a cache with it in place.
  auto cache = SplitCache::Open(OneShard(dir));
  claim = cache->TryClaim(key);
  std::ofstream(MarkerOf(dir, CacheKey("crashed"))) << "pqloader fetch\npid 1\n";
  fs::remove(dir + "/PQLOADER_CACHE");
  EXPECT_TRUE(MarkCacheDir(dir));
  auto report = ClearCacheDir(dir).ValueOrDie();
  EXPECT_EQ(report.foreign_count, 0);
  EXPECT_FALSE(fs::exists(MarkerOf(dir, CacheKey("crashed"))));
  claim.reset();  // its marker is gone already: nothing to delete, no error
}

TEST(FetchClaims, NoClaimsWithoutCoordination) {
  const std::string dir = testing::MakeTempDir() + "/cache";
  auto a = SplitCache::Open(OneShard(dir, 0));
  auto b = SplitCache::Open(OneShard(dir, 0));
  const std::string key = CacheKey("k");
  auto claim = a->TryClaim(key);
  EXPECT_NE(claim, nullptr);
  EXPECT_NE(b->TryClaim(key), nullptr);
  EXPECT_FALSE(fs::exists(MarkerOf(dir, key)));
  CacheOptions memory;
  memory.dir = ":memory:";
  EXPECT_NE(SplitCache::Open(memory)->TryClaim(key), nullptr);
  EXPECT_EQ(b->WaitForFetch(key, nullptr), FetchWait::kFree);
}

}  // namespace pqloader
