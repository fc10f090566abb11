#include "pqloader/error.h"

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

arrow::Status WithContext(const arrow::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return arrow::Status(status.code(), context + ": " + status.message(), status.detail());
}

}  // namespace pqloader
