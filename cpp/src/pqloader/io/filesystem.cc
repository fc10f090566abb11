#include "pqloader/io/filesystem.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <locale>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/io/file.h>
#include <arrow/io/interfaces.h>

#include "pqloader/error.h"
#include "pqloader/tensor/buffer_pool.h"
#include "pqloader/util/cancel.h"
#include "pqloader/util/fork_gate.h"
#include "pqloader/util/start_threads.h"

namespace pqloader {

namespace {

constexpr char kS3Prefix[] = "s3://";

const std::set<std::string>& KnownKeys() {
  static const std::set<std::string> keys = {
      "endpoint_override", "scheme",           "region",
      "access_key",        "secret_key",       "session_token",
      "anonymous",         "connect_timeout",  "request_timeout",
      "tls_ca_file_path",  "force_virtual_addressing",
      "retry_max_attempts", "retry_base_delay", "retry_max_delay", "retry_budget"};
  return keys;
}

// Set when S3 is shut down at exit: requests still running (one a Ctrl-C'd constructor
// left on Arrow's I/O threads) are not retried, as the shutdown waits for them.
std::atomic<bool> s3_finalizing{false};

// S3 (the AWS SDK) was initialised in this process, or in a process it was forked from.
std::atomic<bool> s3_initialized{false};
std::atomic<bool> s3_inherited{false};

// The exit of a child forked after S3 was initialised: the exit handlers registered
// before the fork (Arrow's AwsInstance, the SDK's and OpenSSL's static destructors, and
// FinalizeS3 through Python's atexit) would join the parent's SDK threads, which the
// child lacks, and free what they held: a normal exit died of SIGSEGV
// (aws/aws-sdk-cpp#1779). Registered in the child, this handler runs before those and
// ends the process with its status, C's buffered output flushed.
void ExitWithoutInheritedTeardown(int status, void*) {
  std::fflush(nullptr);
  _exit(status);
}

void S3AfterForkInChild() {
  if (!s3_initialized.load()) return;
  s3_inherited = true;  // FinalizeS3 leaves the SDK alone here
#ifdef __GLIBC__
  on_exit(&ExitWithoutInheritedTeardown, nullptr);
#endif
}

arrow::Status InitializeS3() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &S3AfterForkInChild); });
  ARROW_RETURN_NOT_OK(arrow::fs::EnsureS3Initialized());
  s3_initialized = true;
  return arrow::Status::OK();
}

// RetryPolicy in the AWS client. The SDK retries a request synchronously on the thread
// that made it (ShouldRetry, then CalculateDelayBeforeNextRetry, then sleep), so the
// time of the request's first failure and the drawn delay are kept per thread.
class BackoffRetryStrategy : public arrow::fs::S3RetryStrategy {
 public:
  explicit BackoffRetryStrategy(const RetryPolicy& policy) : policy_(policy) {}

  bool ShouldRetry(const AWSErrorDetail& error, int64_t attempted_retries) override {
    if (!error.should_retry || RetryStopScope::Stopped() || s3_finalizing.load()) {
      state().pending = false;
      return false;
    }
    const double delay_s = Delay(attempted_retries);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - state().first_failure)
            .count();
    return MayRetry(policy_, attempted_retries, elapsed, delay_s);
  }

  int64_t CalculateDelayBeforeNextRetry(const AWSErrorDetail& error,
                                        int64_t attempted_retries) override {
    return static_cast<int64_t>(Delay(attempted_retries) * 1e3);
  }

 private:
  struct State {
    std::chrono::steady_clock::time_point first_failure;
    double delay_s = 0;
    int64_t retry = -1;
    bool pending = false;  // drawn by the first of the two calls for `retry`
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  // The delay before retry `n`, drawn once per failed attempt by whichever of the SDK's
  // two calls comes first (aws-sdk-cpp asks for the delay, then whether to retry: the
  // delay drawn in ShouldRetry was the one of the retry before, the first retry none).
  double Delay(int64_t n) {
    State& s = state();
    // Each call of a request's first failure restarts the budget's clock: a draw left
    // pending by a request whose ShouldRetry never came (the SDK skips it for a region
    // redirect) must not carry that request's first failure over.
    if (n == 0) s.first_failure = std::chrono::steady_clock::now();
    if (s.pending && s.retry == n) {
      s.pending = false;
      return s.delay_s;
    }
    thread_local std::mt19937_64 rng(std::random_device{}());
    s.delay_s = RetryDelaySeconds(policy_, n, std::uniform_real_distribution<double>(0, 1)(rng));
    s.retry = n;
    s.pending = true;
    return s.delay_s;
  }

  RetryPolicy policy_;
};

arrow::Status BadValue(const std::string& key, const std::string& value, const char* want) {
  return arrow::Status::Invalid("storage_options['", key, "'] = '", value, "' is not ", want);
}

arrow::Result<bool> ParseBool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return BadValue(key, v, "a boolean");
}

arrow::Result<double> ParseSeconds(const std::string& key, const std::string& v) {
  // from_chars: '.' whatever LC_NUMERIC says (strtod refused "0.5" under de_DE, and
  // took "0,5").
  double d = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  // At most a week (as cache_wait_timeout): the AWS SDK and the retry strategy take
  // milliseconds as integers, which a larger double (1e300) would overflow.
  constexpr double kMaxSeconds = 7 * 24 * 3600.0;
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || !std::isfinite(d) || d < 0 ||
      d > kMaxSeconds) {
    return BadValue(key, v, "a number of seconds from 0 to 604800 (a week)");
  }
  return d;
}

arrow::Result<int64_t> ParsePositiveInt(const std::string& key, const std::string& v) {
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size() || out < 1) {
    return BadValue(key, v, "an integer >= 1");
  }
  return out;
}

std::string Get(const StorageOptions& s, const std::string& key) {
  auto it = s.values.find(key);
  return it == s.values.end() ? std::string() : it->second;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

arrow::Result<std::shared_ptr<StorageExecutor>> StorageExecutor::Make(int threads) {
  ARROW_ASSIGN_OR_RAISE(auto pool, arrow::internal::ThreadPool::Make(threads));
  return std::shared_ptr<StorageExecutor>(new StorageExecutor(std::move(pool)));
}

void StorageExecutor::Broke() {
  if (broken_.exchange(true)) return;
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<arrow::internal::ThreadPool>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(pool_);
}

void StorageExecutor::SetCapacity(int threads) {
  if (broken_.load()) return;
  try {
    ARROW_UNUSED(pool_->SetCapacity(threads));  // (may start workers for queued tasks)
  } catch (const std::system_error&) {
    Broke();
  }
}

arrow::Status StorageExecutor::SpawnReal(arrow::internal::TaskHints hints,
                                         arrow::internal::FnOnce<void()> task,
                                         arrow::StopToken stop_token,
                                         StopCallback&& stop_callback) {
  if (broken_.load()) {
    return arrow::Status::IOError("cannot start a storage thread", kThreadLimitHint);
  }
  std::shared_ptr<std::atomic<bool>> abandoned;
  {
    MutexLock lock(flag_mu_);
    abandoned = abandoned_;
  }
  try {
    return pool_->Spawn(
        hints,
        [flag = std::move(abandoned), task = std::move(task)]() mutable {
          // A fork waits for this task's requests (see fork_gate.h).
          const fork_gate::Inside inside;
          const RetryStopScope abandoned(flag.get());
          std::move(task)();
        },
        std::move(stop_token), std::move(stop_callback));
  } catch (const std::system_error& e) {
    Broke();
    return MakeOsError(e.code().value(), "cannot start a storage thread", kThreadLimitHint);
  }
}

double RetryDelaySeconds(const RetryPolicy& policy, int64_t retry, double u) {
  const double cap = policy.base_delay_s * std::ldexp(1.0, static_cast<int>(std::clamp<int64_t>(
                                                               retry, 0, 60)));
  return std::min(cap, policy.max_delay_s) * (1 + std::clamp(u, 0.0, 1.0)) / 2;
}

bool MayRetry(const RetryPolicy& policy, int64_t retry, double elapsed_s, double delay_s) {
  if (policy.max_attempts > 0 && retry + 1 >= policy.max_attempts) return false;
  return elapsed_s + delay_s <= policy.budget_s;
}

namespace {

arrow::Status CheckKnownKeys(const StorageOptions& storage) {
  for (const auto& [key, value] : storage.values) {
    if (KnownKeys().count(key) == 0) {
      std::string known;
      for (const auto& k : KnownKeys()) known += (known.empty() ? "" : ", ") + k;
      return arrow::Status::Invalid("unknown storage option '", key, "'; known: ", known);
    }
  }
  return arrow::Status::OK();
}

// *out = parse(key, value) when `key` is given; left as it is otherwise.
template <typename T, typename Parse>
arrow::Status ParseIfSet(const StorageOptions& storage, const char* key, Parse parse, T* out) {
  if (storage.values.count(key) == 0) return arrow::Status::OK();
  ARROW_ASSIGN_OR_RAISE(*out, parse(key, Get(storage, key)));
  return arrow::Status::OK();
}

// Endpoint and scheme: the options, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL
// ("http://host:port").
arrow::Status SetEndpoint(const StorageOptions& storage, arrow::fs::S3Options* o) {
  std::string endpoint = Get(storage, "endpoint_override");
  std::string scheme;
  // Where the endpoint came from, for messages (a scheme of the environment's endpoint
  // was refused as storage_options['scheme'], an option never given).
  std::string from = "storage_options['endpoint_override']";
  if (endpoint.empty()) {
    endpoint = Env("AWS_ENDPOINT_URL_S3");
    from = "environment variable AWS_ENDPOINT_URL_S3";
    if (endpoint.empty()) {
      endpoint = Env("AWS_ENDPOINT_URL");
      from = "environment variable AWS_ENDPOINT_URL";
    }
  }
  if (const size_t sep = endpoint.find("://"); sep != std::string::npos) {
    scheme = endpoint.substr(0, sep);
    endpoint = endpoint.substr(sep + 3);
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  o->endpoint_override = endpoint;
  const bool given = storage.values.count("scheme") > 0;
  if (given) scheme = Get(storage, "scheme");
  if (!scheme.empty()) {
    if (scheme != "http" && scheme != "https") {
      if (given) return BadValue("scheme", scheme, "'http' or 'https'");
      return arrow::Status::Invalid(from, " gives the scheme '", scheme,
                                    "', which is not 'http' or 'https' (an S3 endpoint is "
                                    "http://host:port or https://host:port)");
    }
    o->scheme = scheme;
  }
  return arrow::Status::OK();
}

arrow::Result<RetryPolicy> ParseRetryPolicy(const StorageOptions& storage) {
  RetryPolicy retry;
  ARROW_RETURN_NOT_OK(
      ParseIfSet(storage, "retry_max_attempts", ParsePositiveInt, &retry.max_attempts));
  ARROW_RETURN_NOT_OK(ParseIfSet(storage, "retry_base_delay", ParseSeconds, &retry.base_delay_s));
  ARROW_RETURN_NOT_OK(ParseIfSet(storage, "retry_max_delay", ParseSeconds, &retry.max_delay_s));
  ARROW_RETURN_NOT_OK(ParseIfSet(storage, "retry_budget", ParseSeconds, &retry.budget_s));
  return retry;
}

}  // namespace

arrow::Result<arrow::fs::S3Options> MakeS3Options(const StorageOptions& storage) {
  ARROW_RETURN_NOT_OK(CheckKnownKeys(storage));
  const std::string access_key = Get(storage, "access_key");
  const std::string secret_key = Get(storage, "secret_key");
  if (access_key.empty() != secret_key.empty()) {
    return arrow::Status::Invalid(
        "storage_options: give both access_key and secret_key, or neither");
  }
  bool anonymous = false;
  ARROW_RETURN_NOT_OK(ParseIfSet(storage, "anonymous", ParseBool, &anonymous));
  if (anonymous && !access_key.empty()) {
    return arrow::Status::Invalid(
        "storage_options: anonymous=True cannot be combined with access_key/secret_key");
  }
  if (!Get(storage, "session_token").empty() && access_key.empty()) {
    return arrow::Status::Invalid("storage_options: session_token needs access_key/secret_key");
  }
  arrow::fs::S3Options o;  // credentials are configured last, once all else parsed
  o.region = Get(storage, "region");
  ARROW_RETURN_NOT_OK(SetEndpoint(storage, &o));
  ARROW_RETURN_NOT_OK(ParseIfSet(storage, "connect_timeout", ParseSeconds, &o.connect_timeout));
  ARROW_RETURN_NOT_OK(ParseIfSet(storage, "request_timeout", ParseSeconds, &o.request_timeout));
  o.tls_ca_file_path = Get(storage, "tls_ca_file_path");
  ARROW_RETURN_NOT_OK(
      ParseIfSet(storage, "force_virtual_addressing", ParseBool, &o.force_virtual_addressing));
  ARROW_ASSIGN_OR_RAISE(auto retry, ParseRetryPolicy(storage));
  o.retry_strategy = std::make_shared<BackoffRetryStrategy>(retry);

  // The credential providers are AWS SDK objects: the SDK must be initialised first.
  ARROW_RETURN_NOT_OK(InitializeS3());
  if (anonymous) {
    o.ConfigureAnonymousCredentials();
  } else if (!access_key.empty()) {
    o.ConfigureAccessKey(access_key, secret_key, Get(storage, "session_token"));
  } else {
    o.ConfigureDefaultCredentials();  // environment, profile, ... (the AWS chain)
  }
  return o;
}

namespace {

// Reads land in recycled blocks: column chunks are read again every epoch, and fresh
// pages cost page faults and zeroing (see tensor/buffer_pool.h).
arrow::io::IOContext IoContext() { return arrow::io::IOContext(RecyclingPool::Global()); }

}  // namespace

arrow::Result<std::unique_ptr<FileSystemResolver>> FileSystemResolver::Make(
    const StorageOptions& storage) {
  std::unique_ptr<FileSystemResolver> r(new FileSystemResolver());
  r->storage_ = storage;
  // Check the options now, whatever the sources; without options, S3 is left alone
  // until an s3:// source needs it.
  if (!storage.values.empty()) ARROW_RETURN_NOT_OK(MakeS3Options(storage).status());
  return r;
}

std::string AbsoluteLocalSource(const std::string& source) {
  if (source.empty() || source[0] == '/' || source.find("://") != std::string::npos) return source;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(source, error);
  return error ? source : absolute.lexically_normal().string();
}

arrow::Result<ResolvedSource> FileSystemResolver::Resolve(const std::string& source,
                                                          const CancelFlag& cancel) {
  if (source.compare(0, sizeof(kS3Prefix) - 1, kS3Prefix) == 0) {
    if (s3_ == nullptr) {
      ARROW_ASSIGN_OR_RAISE(auto options, MakeS3Options(storage_));
      auto make = [options] {
        const fork_gate::Inside inside;  // it takes Arrow's S3 client lock: no fork meanwhile
        return arrow::fs::S3FileSystem::Make(options, IoContext());
      };
      arrow::Result<std::shared_ptr<arrow::fs::S3FileSystem>> made;
      if (cancel == nullptr) {
        made = make();
      } else {
        // On Arrow's I/O pool, so that Ctrl-C need not wait for another client's
        // abandoned request (a Make left running finishes there and is dropped).
        ARROW_ASSIGN_OR_RAISE(auto future, arrow::io::default_io_context().executor()->Submit(make));
        if (!WaitUnlessCancelled(future, cancel)) return CancelledStatus();
        made = future.result();
      }
      if (made.ok()) s3_ = *made;
      const auto& st = made.status();
      if (!st.ok()) {
        return MakeIOError(st, "cannot use '", source, "'");
      }
    }
    std::string path = source.substr(sizeof(kS3Prefix) - 1);
    while (!path.empty() && path.back() == '/') path.pop_back();
    if (path.empty() || path[0] == '/') {
      return MakeError(ErrorKind::kNotFound, "'", source, "' names no bucket");
    }
    return ResolvedSource{s3_, path, kS3Prefix};
  }
  ResolvedSource out;
  std::string uri = AbsoluteLocalSource(source);
  if (uri.rfind("gs://", 0) == 0 && uri.find("retry_limit_seconds=") == std::string::npos) {
    // google-cloud-cpp retries for 15 minutes by default (no credentials, an unreachable
    // endpoint): a gs:// source hung that long. Bounded by the storage options' retry
    // budget, as S3 requests are.
    ARROW_ASSIGN_OR_RAISE(const RetryPolicy retry, ParseRetryPolicy(storage_));
    std::ostringstream limit;
    limit.imbue(std::locale::classic());
    limit << std::max(retry.budget_s, 0.001);
    uri += (uri.find('?') == std::string::npos ? "?" : "&");
    uri += "retry_limit_seconds=" + limit.str();
  }
  auto fs = arrow::fs::FileSystemFromUriOrPath(uri, IoContext(), &out.path);
  if (!fs.ok()) {
    return MakeError(ErrorKind::kNotFound, "cannot resolve '", source,
                     "': ", fs.status().message());
  }
  out.fs = *fs;
  if (out.fs->type_name() == "local") {
    // Arrow makes local filesystems for plain paths with the default IOContext.
    out.fs = std::make_shared<arrow::fs::LocalFileSystem>(
        arrow::fs::LocalFileSystemOptions::Defaults(), IoContext());
  }
  const size_t sep = source.find("://");
  if (sep != std::string::npos && source.compare(0, sep, "file") != 0) {
    out.prefix = source.substr(0, sep + 3);
  }
  return out;
}

namespace {

// See OpenListedFile.
class ListedObject final : public arrow::io::RandomAccessFile {
 public:
  ListedObject(std::shared_ptr<arrow::io::RandomAccessFile> inner,
               std::shared_ptr<arrow::fs::FileSystem> fs, std::string path, std::string display,
               int64_t size, arrow::MemoryPool* pool)
      : inner_(std::move(inner)), fs_(std::move(fs)), path_(std::move(path)),
        display_(std::move(display)), size_(size), pool_(pool) {}

  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Status Seek(int64_t position) override { return inner_->Seek(position); }
  arrow::Result<int64_t> GetSize() override { return size_; }

  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    ARROW_ASSIGN_OR_RAISE(const int64_t position, inner_->Tell());
    ARROW_ASSIGN_OR_RAISE(const int64_t got, ReadAt(position, nbytes, out));
    ARROW_RETURN_NOT_OK(inner_->Seek(position + got));
    return got;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    ARROW_ASSIGN_OR_RAISE(const int64_t position, inner_->Tell());
    ARROW_ASSIGN_OR_RAISE(auto buffer, ReadAt(position, nbytes));
    ARROW_RETURN_NOT_OK(inner_->Seek(position + buffer->size()));
    return buffer;
  }

  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, void* out) override {
    // Its answer (an error, or nothing) to a read of nothing, or of bytes past the end.
    if (position < 0 || nbytes <= 0 || position >= size_) {
      return inner_->ReadAt(position, nbytes, out);
    }
    nbytes = std::min(nbytes, size_ - position);
    // The marker varies per read (a generator per thread: no lock), so that no constant
    // byte of the data matches it every time.
    thread_local uint64_t state = 0x9E3779B97F4A7C15ull;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto marker = static_cast<uint8_t>(state >> 56);
    auto* last = static_cast<uint8_t*>(out) + nbytes - 1;
    *last = marker;
    auto got = inner_->ReadAt(position, nbytes, out);
    if (!got.ok()) {
      // A 404 (Arrow's message names AWS's error): deleted since it was listed, which
      // CheckSize says as a local read would (not found); a failing store stays an IOError.
      // A read of fewer bytes than the 404's XML body (a small column chunk, the 4 magic
      // bytes) fails in the SDK first, writing that body into the read's buffer:
      // "INTERNAL_FAILURE ... Failed to flush response stream" (CheckSize then finds the
      // object as listed, or not, and says which). A range that starts at or past the end
      // of an object replaced by a shorter one is refused by the store (416 InvalidRange:
      // it read as a failing store).
      const std::string& message = got.status().message();
      if (message.find("NO_SUCH_KEY") != std::string::npos ||
          message.find("RESOURCE_NOT_FOUND") != std::string::npos ||
          message.find("InvalidRange") != std::string::npos ||
          message.find("HTTP status 416") != std::string::npos ||
          message.find("Failed to flush response stream") != std::string::npos) {
        ARROW_RETURN_NOT_OK(CheckSize());
      }
      return got.status();
    }
    if (*got < nbytes || *last == marker) ARROW_RETURN_NOT_OK(CheckSize());
    return *got;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes) override {
    if (position < 0 || nbytes <= 0 || position >= size_) return inner_->ReadAt(position, nbytes);
    nbytes = std::min(nbytes, size_ - position);
    ARROW_ASSIGN_OR_RAISE(auto buffer, arrow::AllocateResizableBuffer(nbytes, pool_));
    ARROW_ASSIGN_OR_RAISE(const int64_t got, ReadAt(position, nbytes, buffer->mutable_data()));
    ARROW_RETURN_NOT_OK(buffer->Resize(got, /*shrink_to_fit=*/false));
    return std::shared_ptr<arrow::Buffer>(std::move(buffer));
  }

 private:
  // A read's last byte kept its marker: the body ended before it (the object is shorter
  // than listed now), or the data holds that byte there. The object's size tells them
  // apart (a read never ends past the listed size).
  arrow::Status CheckSize() const {
    ARROW_ASSIGN_OR_RAISE(const auto info, fs_->GetFileInfo(path_));
    if (info.type() == arrow::fs::FileType::Directory) {
      // Arrow's S3 listing names a folder marker that holds bytes (key 'p/', not empty)
      // as a file 'p', which no read finds.
      return MakeError(ErrorKind::kNotFound, "'", display_,
                       "' is listed as an object but none has that key: it is gone since the "
                       "loader listed it, or it is a folder marker '", display_, "/' holding ",
                       size_, " bytes (delete or empty that key)");
    }
    if (info.type() != arrow::fs::FileType::File) {
      return MakeError(ErrorKind::kNotFound, "'", display_,
                       "' is gone since the loader listed it");
    }
    if (info.size() != size_) {
      return MakeError(ErrorKind::kIO, "'", display_, "' changed since the loader listed it (",
                       size_, " bytes, now ", info.size(),
                       "): make a new Loader to read it as it is now");
    }
    return arrow::Status::OK();
  }

  std::shared_ptr<arrow::io::RandomAccessFile> inner_;
  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::string path_, display_;
  int64_t size_;
  arrow::MemoryPool* pool_;
};

}  // namespace

arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> OpenListedFile(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& path, int64_t size,
    const std::string& display, arrow::MemoryPool* pool) {
  arrow::fs::FileInfo info(path, arrow::fs::FileType::File);
  info.set_size(size);  // known from the listing: no request for it
  if (fs->type_name() == "local") {
    // Opened without blocking, and its kind checked on the descriptor: a FIFO put in the
    // listed file's place blocked the open forever, waiting for a writer (close() and
    // Ctrl-C could not end it: the worker was inside the call).
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st;
      const bool stated = ::fstat(fd, &st) == 0;
      if (stated && S_ISREG(st.st_mode)) {
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        // Into the file system's pool, as LocalFileSystem opens it (no mmap): the recycling
        // pool Resolve gives local file systems (it read into Arrow's default pool).
        auto file = arrow::io::ReadableFile::Open(fd, fs->io_context().pool());
        if (!file.ok()) ::close(fd);  // owned by the file only once it is made
        return file;
      }
      ::close(fd);
      if (stated && !S_ISDIR(st.st_mode)) {
        return MakeError(ErrorKind::kIO, "not a regular file (a FIFO, socket or device)");
      }
    }
    return fs->OpenInputFile(info);  // Arrow's error as before (not found, a directory, ...)
  }
  ARROW_ASSIGN_OR_RAISE(auto input, fs->OpenInputFile(info));
  return std::make_shared<ListedObject>(std::move(input), fs, path, display, size, pool);
}

arrow::Status FinalizeS3() {
  s3_finalizing = true;
  // A forked child: the SDK's threads are the parent's (see S3AfterForkInChild).
  if (s3_inherited.load()) return arrow::Status::OK();
  return arrow::fs::EnsureS3Finalized();
}

}  // namespace pqloader
