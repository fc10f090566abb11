// Numbers as text that tells every two values apart, for keys and fingerprints.
#pragma once

#include <charconv>
#include <string>

namespace pqloader {

/// The shortest text that reads back as exactly `v` (std::to_chars), e.g. "0.4", "1e-07",
/// "1234567": a cache key or state fingerprint must tell every two values apart, where
/// std::to_string keeps 6 decimals (0 and 1e-7 alike) and a stream 6 significant digits
/// (10 and 10.00001 alike); and it reads well in messages.
inline std::string ExactText(double v) {
  char text[64];
  const auto end = std::to_chars(text, text + sizeof(text), v).ptr;
  return std::string(text, end);
}

}  // namespace pqloader
