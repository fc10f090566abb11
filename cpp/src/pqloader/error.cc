#include "pqloader/error.h"

#include <arrow/util/io_util.h>
#include <arrow/util/utf8.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace pqloader {

std::string ErrorDetail::ToString() const {
  switch (kind_) {
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kInvalidData: return "invalid data";
    case ErrorKind::kSchemaMismatch: return "schema mismatch";
    case ErrorKind::kUnsupportedType: return "unsupported type";
    case ErrorKind::kColumnNotFound: return "column not found";
    case ErrorKind::kIO: return "storage error";
  }
  return "error";
}

const ErrorDetail* GetErrorDetail(const arrow::Status& status) {
  const auto& detail = status.detail();
  if (detail == nullptr || std::string(detail->type_id()) != "pqloader::ErrorDetail") {
    return nullptr;
  }
  return static_cast<const ErrorDetail*>(detail.get());
}

int OsErrorOf(const arrow::Status& status) {
  if (const ErrorDetail* d = GetErrorDetail(status)) return d->os_error();
  return std::max(0, arrow::internal::ErrnoFromStatus(status));
}

std::string Reason(const arrow::Status& status) {
  const int e = OsErrorOf(status);
  if (e <= 0 || GetErrorDetail(status) != nullptr) return status.message();
  return status.message() + " (" + std::strerror(e) + ")";
}

std::string OneLine(std::string_view message) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) {
      out += c;  // printable ASCII, or a byte of a UTF-8 sequence
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  return out;
}

arrow::Status WithContext(const arrow::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return arrow::Status(status.code(), context + ": " + status.message(), status.detail());
}

std::string Printable(std::string_view bytes, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(bytes.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  if (bytes.size() > n) out += "...";
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  static const bool initialized = [] {
    arrow::util::InitializeUTF8();
    return true;
  }();
  (void)initialized;
  return arrow::util::ValidateUTF8(reinterpret_cast<const uint8_t*>(bytes.data()),
                                   static_cast<int64_t>(bytes.size()));
}

}  // namespace pqloader
