// Error kinds carried on arrow::Status, so bindings can raise precise exceptions.
//
// Engine functions return arrow::Status; when the kind of failure matters to the
// user (a missing path, a schema mismatch ...) the status carries an ErrorDetail.
// Thread-safety: immutable values.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <arrow/status.h>

namespace pqloader {

enum class ErrorKind {
  kNotFound,         ///< A path, file, glob or directory has no Parquet data.
  kInvalidData,      ///< Not Parquet, truncated, corrupt, or values the loader refuses.
  kSchemaMismatch,   ///< Files disagree on a selected column.
  kUnsupportedType,  ///< A selected column's type cannot become a tensor.
  kColumnNotFound,   ///< A selected column does not exist.
  kIO,               ///< Storage failed: network, timeout, permission, credentials.
};

class ErrorDetail : public arrow::StatusDetail {
 public:
  explicit ErrorDetail(ErrorKind kind, int os_error = 0) : kind_(kind), os_error_(os_error) {}
  const char* type_id() const override { return "pqloader::ErrorDetail"; }
  std::string ToString() const override;
  ErrorKind kind() const { return kind_; }
  /// The OS error number (errno) behind a storage error, or 0.
  int os_error() const { return os_error_; }

 private:
  ErrorKind kind_;
  int os_error_;
};

/// Return the kind carried by `status`, or nullptr if it carries none.
const ErrorDetail* GetErrorDetail(const arrow::Status& status);

/// Build an error status of `kind` whose message is the concatenation of `args`.
template <typename... Args>
arrow::Status MakeError(ErrorKind kind, Args&&... args) {
  const arrow::StatusCode code =
      kind == ErrorKind::kUnsupportedType  ? arrow::StatusCode::TypeError
      : kind == ErrorKind::kColumnNotFound ? arrow::StatusCode::KeyError
      : kind == ErrorKind::kNotFound || kind == ErrorKind::kIO ? arrow::StatusCode::IOError
                                           : arrow::StatusCode::Invalid;
  return arrow::Status::FromDetailAndArgs(code, std::make_shared<ErrorDetail>(kind),
                                          std::forward<Args>(args)...);
}

/// The OS error number `status` carries (Arrow's errno detail, or ours), or 0.
int OsErrorOf(const arrow::Status& status);

/// The message of `status` and the OS error it carries, if any (Arrow keeps a local
/// file's errno in the status's detail, not in its message): "Failed to open local file
/// 'x' (Permission denied)".
std::string Reason(const arrow::Status& status);

/// A storage error (kIO) whose message is the concatenation of `args`, ": " and
/// Reason(cause), carrying `cause`'s OS error number (the Python exception's errno).
template <typename... Args>
arrow::Status MakeIOError(const arrow::Status& cause, Args&&... args) {
  return arrow::Status::FromDetailAndArgs(
      arrow::StatusCode::IOError, std::make_shared<ErrorDetail>(ErrorKind::kIO, OsErrorOf(cause)),
      std::forward<Args>(args)..., ": ", Reason(cause));
}

/// `message` on one line, its control characters escaped as Python's str.isprintable()
/// and the CLI's error line show them (\n, \r, \t, \x1b; other bytes as they are). Arrow's
/// and Thrift's messages may break lines ("don't know what type: \nDeserializing page header
/// failed."), and so may a path the message quotes: a line break made a space named another
/// file ('a\nb.parquet' as 'a b.parquet').
std::string OneLine(std::string_view message);

/// A storage error (kIO) whose message is the concatenation of `args`, ": " and the OS's
/// description of `errnum`, carrying `errnum` (e.g. a std::error_code's value).
template <typename... Args>
arrow::Status MakeOsError(int errnum, Args&&... args) {
  return arrow::Status::FromDetailAndArgs(
      arrow::StatusCode::IOError, std::make_shared<ErrorDetail>(ErrorKind::kIO, errnum),
      std::forward<Args>(args)..., ": ", std::strerror(errnum));
}

/// Prefix the message of a failed status with `context`, keeping its code and detail.
arrow::Status WithContext(const arrow::Status& status, const std::string& context);

/// Return `bytes` as printable ASCII for an error message: printable ASCII as is, a
/// backslash doubled, every other byte as \xNN; cut after `max_bytes` bytes ("...").
/// Use it to quote data (headers, values, names) that may not be valid UTF-8.
std::string Printable(std::string_view bytes, size_t max_bytes = 80);

/// Return whether `bytes` is valid UTF-8.
bool IsValidUtf8(std::string_view bytes);

}  // namespace pqloader
