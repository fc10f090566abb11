// Filesystem resolution: from a source (a local path or a URI) and storage options to
// an Arrow filesystem and a path within it.
//
// `s3://bucket/key` sources get one arrow::fs::S3FileSystem per resolver, configured by
// StorageOptions (whose keys are the argument names of pyarrow.fs.S3FileSystem) and the
// standard AWS sources (environment, profile) for whatever the options leave unset;
// `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` set the endpoint when the options do not.
// Every other source goes to arrow::fs::FileSystemFromUriOrPath (local paths, file://,
// and gs:// or hdfs:// where the Arrow build supports them, configured by their URI).
// Thread-safety: a resolver is used by one thread; the filesystems it returns are
// thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include <arrow/filesystem/filesystem.h>
#include <arrow/filesystem/localfs.h>
#include <arrow/filesystem/s3fs.h>
#include <arrow/result.h>
#include <arrow/util/thread_pool.h>

#include "pqloader/util/cancel.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

/// Storage options of s3:// sources: key → value as text ("true"/"false" for flags,
/// decimal numbers for numbers). Keys:
///   endpoint_override, scheme, region, access_key, secret_key, session_token,
///   anonymous, connect_timeout (seconds to connect; default the AWS SDK's 1 s),
///   request_timeout (seconds an attempt may go without receiving a byte before it
///   fails; default the AWS SDK's 3 s), tls_ca_file_path, force_virtual_addressing, and
///   the retry policy (see RetryPolicy): retry_budget (seconds; default 60),
///   retry_max_attempts (attempts in all, >= 1; default: no limit but the budget),
///   retry_base_delay and retry_max_delay (seconds; defaults 0.2 and 5).
/// Unknown keys are an error, whatever the sources.
struct StorageOptions {
  std::map<std::string, std::string> values;
};

/// How a failed object-store request is retried. Only what the AWS SDK marks retryable
/// is (network errors, timeouts, 5xx, throttling); errors such as a missing key or a
/// denied access fail at once. Retry n (0-based) waits a jittered delay in
/// [d/2, d] with d = min(max_delay, base_delay * 2^n) ("equal jitter", so clients
/// that failed together do not retry together). No retry starts more than budget
/// seconds after the request's first failure: a request fails for good within about
/// budget + one attempt (at most request_timeout of silence) after it first failed.
struct RetryPolicy {
  /// Attempts in all, the first included; 0 means no limit but the budget. Default: 0.
  int64_t max_attempts = 0;
  /// Seconds. Default: 0.2.
  double base_delay_s = 0.2;
  /// Seconds. Default: 5.
  double max_delay_s = 5;
  /// Seconds after a request's first failure within which retries may start. Rides out
  /// tens of seconds of throttling or a server restart. Default: 60.
  double budget_s = 60;
};

/// Return the delay before retry `retry` (0-based) under `policy`, with the jitter draw
/// `u` in [0, 1): min(max, base * 2^retry) * (1 + u) / 2.
double RetryDelaySeconds(const RetryPolicy& policy, int64_t retry, double u);

/// Return whether retry `retry` (0-based) may be made `elapsed_s` seconds after the
/// request's first failure, after waiting `delay_s`.
bool MayRetry(const RetryPolicy& policy, int64_t retry, double elapsed_s, double delay_s);

/// Build the options of an S3FileSystem from `storage` and the environment, initialising
/// S3 (see FinalizeS3). Fails (Invalid) on an unknown key or a value that does not
/// parse, naming it.
arrow::Result<arrow::fs::S3Options> MakeS3Options(const StorageOptions& storage);

/// A source resolved to a filesystem.
struct ResolvedSource {
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::string path;    ///< Path within `fs` ("bucket/key" for S3).
  std::string prefix;  ///< Prepended to a path to name it to the user ("s3://"), or "".
};

/// A relative local path (no scheme, not starting with '/') made absolute from the working
/// directory, as the Python Loader takes it (Arrow takes only absolute ones); anything
/// else as it is.
std::string AbsoluteLocalSource(const std::string& source);

class FileSystemResolver {
 public:
  /// Check `storage` (initialising S3 if it is not empty) and make a resolver. No
  /// connection is made.
  static arrow::Result<std::unique_ptr<FileSystemResolver>> Make(const StorageOptions& storage);

  /// Resolve `source`. S3 is initialised on first use (and finalised by FinalizeS3).
  /// With `cancel`, making the S3 filesystem is waited for while `cancel` is polled:
  /// Arrow makes a new S3 client only once no request of this process's other S3
  /// clients is in flight, and a request abandoned on Ctrl-C (Arrow finishes it in the
  /// background) may retry a refusing endpoint for a minute.
  arrow::Result<ResolvedSource> Resolve(const std::string& source,
                                        const CancelFlag& cancel = nullptr);

 private:
  FileSystemResolver() = default;

  StorageOptions storage_;
  std::shared_ptr<arrow::fs::FileSystem> s3_;  // made on first s3:// source
};

/// The executor of one loader's storage reads: a thread pool whose tasks stop retrying
/// failed object-store requests once Abandon() was called. A loader that goes away with
/// requests in flight (a prefetch of the next epoch, say, against an endpoint that went
/// down) would otherwise wait, when its pool joins, for each to use up its retry budget
/// (60 s by default); abandoned, each ends after its current attempt (at most the
/// request timeout, after the retry delay it may be sleeping). Thread-safety: all
/// methods may be called concurrently.
class StorageExecutor : public arrow::internal::Executor {
 public:
  static arrow::Result<std::shared_ptr<StorageExecutor>> Make(int threads);

  /// Requests of this executor's tasks, running or to come, are not retried any more
  /// (each task runs in a RetryStopScope of this flag).
  void Abandon() {
    MutexLock lock(flag_mu_);
    abandoned_->store(true);
  }

  /// Requests of the tasks spawned so far are not retried any more; later tasks' are
  /// (a closed loader: close() returns with nothing more read, and the loader stays
  /// usable).
  void AbandonSpawned() {
    MutexLock lock(flag_mu_);
    abandoned_->store(true);
    abandoned_ = std::make_shared<std::atomic<bool>>(false);
  }

  /// Let the idle threads go, all but one (a closed loader: Loader::Close); new ones
  /// start on demand once Resume() raised the capacity again.
  void Park() { SetCapacity(1); }
  void Resume(int threads) { SetCapacity(threads); }

  int GetCapacity() override { return pool_->GetCapacity(); }
  bool OwnsThisThread() override { return pool_->OwnsThisThread(); }

 protected:
  arrow::Status SpawnReal(arrow::internal::TaskHints hints, arrow::internal::FnOnce<void()> task,
                          arrow::StopToken stop_token, StopCallback&& stop_callback) override;

 private:
  explicit StorageExecutor(std::shared_ptr<arrow::internal::ThreadPool> pool)
      : pool_(std::move(pool)) {}

  void SetCapacity(int threads);
  // The OS refused a thread (std::system_error from Arrow's pool): the pool is kept
  // for the process's life (Arrow left a worker that never started in its list, which
  // its Shutdown would wait for, for ever) and every later task is refused.
  void Broke();

  std::shared_ptr<arrow::internal::ThreadPool> pool_;
  Mutex flag_mu_;
  std::shared_ptr<std::atomic<bool>> abandoned_ PQ_GUARDED_BY(flag_mu_) =
      std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> broken_{false};
};

/// Open `path` of `fs` as the file of `size` bytes it was listed with (no request for its
/// size). On an object store the file is wrapped so that a read the object's body does
/// not fill is an error naming `display` ("changed since the loader listed it"), not a
/// buffer whose tail is what the memory was before: Arrow's S3 reader reports the length
/// it asked for when the body is shorter (an object replaced by a shorter one after the
/// listing). Each read's last byte is set to a varying marker first; one whose marker is
/// still there (a short body, or data that holds that byte: 1 read in 256) asks the
/// store for the object's size once (a HEAD). An object replaced by one at least as
/// long is not detected. Buffers come from `pool`. Local files are read as they are,
/// into their file system's pool, opened without blocking: one that is no longer a
/// regular file (a FIFO put in its place) is an IOError, not a wait for a writer.
arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> OpenListedFile(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& path, int64_t size,
    const std::string& display, arrow::MemoryPool* pool = arrow::default_memory_pool());

/// Shut S3 down if it was initialised, so that the process exits cleanly. Call once,
/// at exit, after which s3:// sources fail. Idempotent.
arrow::Status FinalizeS3();

}  // namespace pqloader
