#include "pqloader/dataset/hive.h"

#include <charconv>

#include <cctype>

namespace pqloader {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool EndsWithNoCase(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t i = 0; i < suffix.size(); ++i) {
    const char a = static_cast<char>(std::tolower(static_cast<unsigned char>(s[s.size() - suffix.size() + i])));
    if (a != suffix[i]) return false;
  }
  return true;
}

}  // namespace

std::string UriUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::optional<HiveSegment> ParseHiveSegment(std::string_view component) {
  const size_t eq = component.find('=');
  if (eq == std::string_view::npos || eq == 0) return std::nullopt;
  HiveSegment out;
  out.key = UriUnescape(component.substr(0, eq));
  const std::string_view raw = component.substr(eq + 1);
  if (raw == kHiveNullValue) {
    out.is_null = true;
    return out;
  }
  out.value = UriUnescape(raw);
  return out;
}

bool HasParquetExtension(std::string_view path) {
  return EndsWithNoCase(path, ".parquet") || EndsWithNoCase(path, ".parq") ||
         EndsWithNoCase(path, ".pq");
}

bool HasParquetMagic(std::string_view head) { return head == "PAR1" || head == "PARE"; }

bool ParsesAsInt64(std::string_view v) {
  int64_t parsed = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
  return !v.empty() && ec == std::errc() && ptr == v.data() + v.size();
}

}  // namespace pqloader
