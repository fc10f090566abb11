// Numbers as text that tells every two values apart, for keys and fingerprints.
#pragma once

#include <charconv>
#include <sstream>
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

/// A stream's 6-significant-digit text of `v` (what state fingerprints have always held)
/// when it reads back as exactly `v` (-100, 0.5, 1024), else ExactText(v): fingerprints
/// written before still match for such values, and values that differ past the 6th digit
/// (a pad of 1234567 and 1234568) are told apart.
inline std::string CompatibleText(double v) {
  std::ostringstream out;
  out.imbue(std::locale::classic());  // not a host's global locale ("0,5", "1.024")
  out << v;
  const std::string six = out.str();
  double parsed = 0;  // from_chars: not LC_NUMERIC's decimal comma, as strtod would
  const auto read = std::from_chars(six.data(), six.data() + six.size(), parsed);
  return read.ec == std::errc() && read.ptr == six.data() + six.size() && parsed == v ? six
                                                                                      : ExactText(v);
}

}  // namespace pqloader
