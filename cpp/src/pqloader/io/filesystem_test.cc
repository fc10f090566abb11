#include "pqloader/io/filesystem.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <arrow/buffer.h>
#include <arrow/filesystem/mockfs.h>
#include <arrow/io/interfaces.h>

#include "pqloader/tensor/buffer_pool.h"

namespace pqloader {

namespace {

StorageOptions Opts(std::map<std::string, std::string> v) { return StorageOptions{std::move(v)}; }

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() { if (had_) setenv(name_, old_.c_str(), 1); else unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST(MakeS3Options, MapsTheKeysOfPyarrowS3FileSystem) {
  ScopedEnv e1("AWS_ENDPOINT_URL", nullptr), e2("AWS_ENDPOINT_URL_S3", nullptr);
  auto o = MakeS3Options(Opts({{"endpoint_override", "127.0.0.1:9000"}, {"scheme", "http"},
                               {"region", "eu-west-3"}, {"access_key", "AK"},
                               {"secret_key", "SK"}, {"connect_timeout", "1.5"},
                               {"request_timeout", "4"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint_override, "127.0.0.1:9000");
  EXPECT_EQ(o->scheme, "http");
  EXPECT_EQ(o->region, "eu-west-3");
  EXPECT_EQ(o->GetAccessKey(), "AK");
  EXPECT_EQ(o->GetSecretKey(), "SK");
  EXPECT_EQ(o->connect_timeout, 1.5);
  EXPECT_EQ(o->request_timeout, 4.0);
  EXPECT_NE(o->retry_strategy, nullptr);
}

TEST(MakeS3Options, EndpointComesFromTheEnvironmentUnlessGiven) {
  ScopedEnv e1("AWS_ENDPOINT_URL", "http://127.0.0.1:1234/"), e2("AWS_ENDPOINT_URL_S3", nullptr);
  auto o = MakeS3Options(Opts({}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint_override, "127.0.0.1:1234");
  EXPECT_EQ(o->scheme, "http");
  ScopedEnv e3("AWS_ENDPOINT_URL_S3", "https://127.0.0.1:99");
  EXPECT_EQ(MakeS3Options(Opts({}))->endpoint_override, "127.0.0.1:99");
  EXPECT_EQ(MakeS3Options(Opts({}))->scheme, "https");
  EXPECT_EQ(MakeS3Options(Opts({{"endpoint_override", "h:1"}}))->endpoint_override, "h:1");
}

// A scheme that came with the endpoint is refused naming where it came from, not as
// storage_options['scheme'] (an option never given).
TEST(MakeS3Options, ASchemeFromTheEndpointIsRefusedNamingWhereItCameFrom) {
  ScopedEnv e1("AWS_ENDPOINT_URL", "ftp://127.0.0.1:1"), e2("AWS_ENDPOINT_URL_S3", nullptr);
  auto o = MakeS3Options(Opts({}));
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("environment variable AWS_ENDPOINT_URL"), std::string::npos)
      << o.status();
  EXPECT_EQ(o.status().message().find("storage_options['scheme']"), std::string::npos);
  auto p = MakeS3Options(Opts({{"endpoint_override", "ftp://h:1"}}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("storage_options['endpoint_override']"), std::string::npos)
      << p.status();
  auto q = MakeS3Options(Opts({{"scheme", "ftp"}}));
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("storage_options['scheme'] = 'ftp'"), std::string::npos)
      << q.status();
}

TEST(MakeS3Options, RefusesUnknownKeysAndBadValuesNamingThem) {
  auto unknown = MakeS3Options(Opts({{"endpoint", "x"}}));
  ASSERT_TRUE(unknown.status().IsInvalid());
  EXPECT_NE(unknown.status().message().find("'endpoint'"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("endpoint_override"), std::string::npos);
  for (const auto& [k, v] : std::map<std::string, std::string>{
           {"anonymous", "maybe"}, {"connect_timeout", "-1"}, {"retry_max_attempts", "0"},
           {"scheme", "ftp"}, {"request_timeout", "soon"}, {"retry_max_delay", "1e300"},
           {"retry_budget", "604801"}}) {
    auto bad = MakeS3Options(Opts({{k, v}}));
    ASSERT_TRUE(bad.status().IsInvalid()) << k;
    EXPECT_NE(bad.status().message().find(k), std::string::npos) << bad.status();
  }
  EXPECT_FALSE(MakeS3Options(Opts({{"access_key", "AK"}})).ok());  // no secret key
  EXPECT_FALSE(
      MakeS3Options(Opts({{"anonymous", "true"}, {"access_key", "A"}, {"secret_key", "S"}}))
          .ok());
}

TEST(MakeS3Options, RetriesRetryableErrorsWithExponentialBackoff) {
  auto o = MakeS3Options(Opts({{"retry_max_attempts", "4"}, {"retry_base_delay", "0.1"},
                               {"retry_max_delay", "0.3"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  auto& r = *o->retry_strategy;
  arrow::fs::S3RetryStrategy::AWSErrorDetail transient{0, "connection refused", "", true};
  arrow::fs::S3RetryStrategy::AWSErrorDetail permanent{0, "access denied", "", false};
  EXPECT_FALSE(r.ShouldRetry(permanent, 0));
  // The delay of retry n: min(max, base * 2^n), jittered into [d/2, d], whichever way
  // round the client asks (aws-sdk-cpp asks for the delay first, then ShouldRetry: the
  // delay drawn by ShouldRetry was the retry before's, and the first retry went at once).
  const int64_t full_ms[] = {100, 200, 300};  // capped at 0.3 s
  for (bool delay_first : {true, false}) {
    for (int64_t n = 0; n < 3; ++n) {
      int64_t ms = -1;
      if (delay_first) ms = r.CalculateDelayBeforeNextRetry(transient, n);
      EXPECT_TRUE(r.ShouldRetry(transient, n));
      if (!delay_first) ms = r.CalculateDelayBeforeNextRetry(transient, n);
      EXPECT_GE(ms, full_ms[n] / 2 - 1) << n << delay_first;
      EXPECT_LE(ms, full_ms[n]) << n << delay_first;
    }
    EXPECT_GE(r.CalculateDelayBeforeNextRetry(transient, 3), 0);
    EXPECT_FALSE(r.ShouldRetry(transient, 3));  // 4 attempts in all
  }
}

TEST(FileSystemResolver, LocalPathsAndFileUrisKeepTheirPathAsName) {
  auto r = FileSystemResolver::Make(StorageOptions{});
  ASSERT_TRUE(r.ok());
  auto local = (*r)->Resolve("/tmp");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->path, "/tmp");
  EXPECT_EQ(local->prefix, "");
  auto uri = (*r)->Resolve("file:///tmp");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->prefix, "");
}

TEST(OpenListedFile, ReadsALocalFileIntoTheRecyclingPoolAndRefusesAFifo) {
  char dir_template[] = "/tmp/pqloader_listed_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template, path = dir + "/f", fifo = dir + "/p";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string bytes(1 << 20, 'x');
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = FileSystemResolver::Make(StorageOptions{});
  ASSERT_TRUE(r.ok());
  auto local = (*r)->Resolve(dir);
  ASSERT_TRUE(local.ok()) << local.status();
  // Local reads go into the recycling pool Resolve gives local file systems (opened by
  // descriptor, they went into Arrow's default pool).
  auto file = OpenListedFile(local->fs, path, 1 << 20, path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int64_t before = RecyclingPool::Global()->total_bytes_allocated();
  auto read = (*file)->ReadAt(0, 1 << 20);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)->size(), 1 << 20);
  EXPECT_GE(RecyclingPool::Global()->total_bytes_allocated() - before, 1 << 20);
  // A FIFO in a listed file's place is refused at once (a blocking open waited forever).
  auto pipe = OpenListedFile(local->fs, fifo, 10, fifo);
  ASSERT_FALSE(pipe.ok());
  EXPECT_NE(pipe.status().message().find("not a regular file"), std::string::npos) << pipe.status();
  std::remove(fifo.c_str());
  std::remove(path.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace pqloader

namespace {

// S3 initialised by a test must be finalised before the process exits.
class FinalizeS3AtExit : public ::testing::Environment {
 public:
  void TearDown() override { ASSERT_TRUE(pqloader::FinalizeS3().ok()); }
};

const auto* const kFinalize = ::testing::AddGlobalTestEnvironment(new FinalizeS3AtExit);

}  // namespace

namespace pqloader {

TEST(RetryPolicy, DefaultsRideOutTensOfSecondsThenStop) {
  const RetryPolicy p;  // the defaults every s3:// loader gets
  // Sleep as the AWS client would, with the worst and the best jitter draws.
  for (double u : {0.0, 0.999}) {
    double elapsed = 0;
    int64_t retries = 0;
    while (true) {
      const double delay = RetryDelaySeconds(p, retries, u);
      if (!MayRetry(p, retries, elapsed, delay)) break;
      elapsed += delay;
      ++retries;
      ASSERT_LT(retries, 1000);
    }
    EXPECT_GE(elapsed, 55.0) << "u=" << u;  // retries keep coming for most of a minute
    EXPECT_LE(elapsed, 60.0) << "u=" << u;  // and never start after the budget
    EXPECT_GE(retries, 12) << "u=" << u;
  }
}

TEST(RetryPolicy, DelaysGrowExponentiallyWithEqualJitterUpToTheCap) {
  const RetryPolicy p;
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 0, 0.0), 0.1);
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 0, 1.0), 0.2);
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 3, 1.0), 1.6);
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 3, 0.5), 1.2);
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 10, 1.0), 5.0);
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 10, 0.0), 2.5);
  EXPECT_DOUBLE_EQ(RetryDelaySeconds(p, 1000, 1.0), 5.0);  // no overflow
}

TEST(RetryPolicy, AttemptsAndBudgetBothBound) {
  RetryPolicy p;
  p.max_attempts = 3;  // the first attempt and two retries
  EXPECT_TRUE(MayRetry(p, 0, 0, 0.1));
  EXPECT_TRUE(MayRetry(p, 1, 0, 0.1));
  EXPECT_FALSE(MayRetry(p, 2, 0, 0.1));
  p.max_attempts = 0;
  p.budget_s = 0;  // no retries at all
  EXPECT_FALSE(MayRetry(p, 0, 0, 0.1));
  p.budget_s = 10;
  EXPECT_TRUE(MayRetry(p, 50, 9.0, 1.0));
  EXPECT_FALSE(MayRetry(p, 50, 9.5, 1.0));
}

TEST(MakeS3Options, RetryBudgetIsCheckedAndAccepted) {
  EXPECT_TRUE(MakeS3Options(Opts({{"retry_budget", "0"}})).ok());
  EXPECT_TRUE(MakeS3Options(Opts({{"retry_budget", "120.5"}})).ok());
  auto bad = MakeS3Options(Opts({{"retry_budget", "-1"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("retry_budget"), std::string::npos);
}

}  // namespace pqloader

namespace pqloader {

// An object store's file opened with its listed size reads its bytes, also where a read's
// last byte equals the marker OpenListedFile puts there (one-byte reads of every value:
// ~1 in 256 asks the store for the size, which agrees); a file listed longer than it is
// now (replaced by a shorter one after the listing) is an error naming it, not a short
// or stale buffer. (A mock filesystem stands for the store: it is not "local".)
TEST(OpenListedFile, ReadsTheBytesAndRefusesAFileShorterThanListed) {
  auto fs = std::make_shared<arrow::fs::internal::MockFileSystem>(arrow::fs::TimePoint{});
  std::string bytes(4096, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 % 256);
  ASSERT_TRUE(fs->CreateDir("b").ok());
  {
    auto out = fs->OpenOutputStream("b/f").ValueOrDie();
    ASSERT_TRUE(out->Write(bytes).ok());
    ASSERT_TRUE(out->Close().ok());
  }
  const auto size = static_cast<int64_t>(bytes.size());
  auto file = OpenListedFile(fs, "b/f", size, "mock://b/f").ValueOrDie();
  for (int64_t pos = 0; pos < size; ++pos) {
    uint8_t b = 0;
    auto got = file->ReadAt(pos, 1, &b);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, 1);
    ASSERT_EQ(b, static_cast<uint8_t>(bytes[pos])) << pos;
  }
  auto buffer = file->ReadAt(100, 1000).ValueOrDie();
  EXPECT_EQ(buffer->ToString(), bytes.substr(100, 1000));
  EXPECT_EQ(file->GetSize().ValueOrDie(), size);

  auto listed_longer = OpenListedFile(fs, "b/f", size + 100, "mock://b/f").ValueOrDie();
  auto read = listed_longer->ReadAt(4000, 196);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find(
                "'mock://b/f' changed since the loader listed it (4196 bytes, now 4096)"),
            std::string::npos)
      << read.status().ToString();
}

}  // namespace pqloader
