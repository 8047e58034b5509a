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

std::string origin_form(std::string_view target) {
  auto starts_ci = [&](std::string_view prefix) {
    if (target.size() < prefix.size()) return false;
    for (std::size_t i = 0; i < prefix.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(target[i])) != prefix[i]) return false;
    return true;
  };
  std::size_t skip = 0;
  if (starts_ci("http://")) skip = 7;
  else if (starts_ci("https://")) skip = 8;
  else return std::string(target);
  const std::size_t end = target.find_first_of("/?", skip);  // the authority ends at the path or the query
  if (end == std::string_view::npos) return "/";
  if (target[end] == '?') return "/" + std::string(target.substr(end));
  return std::string(target.substr(end));
}

}  // namespace servedeck::http::detail
