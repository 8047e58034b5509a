#include "common/http/wire_format.hpp"

#include <algorithm>
#include <cctype>

#include <boost/beast/http.hpp>

namespace servedeck::http::detail {

namespace bhttp = boost::beast::http;

std::string status_line(int status) {
  std::string reason(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
  if (reason.empty() || reason == "<unknown-status>") reason = "Status";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
}

bool has_header(const Headers& h, std::string_view name) {
  for (const auto& [k, v] : h) {
    if (k.size() == name.size() &&
        std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        }))
      return true;
  }
  return false;
}

std::string to_hex(std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), digits[n & 0xf]);
    n >>= 4;
  } while (n);
  return out;
}

}  // namespace servedeck::http::detail
