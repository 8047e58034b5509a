// Pieces of the HTTP/1.1 wire format the server writes by hand (internal to common/http).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/http/server.hpp"

namespace servedeck::http::detail {

/// "HTTP/1.1 <status> <reason>\r\n"; an unknown status gets the reason "Status".
std::string status_line(int status);

/// Whether `h` holds a header named `name` (ASCII case-insensitive).
bool has_header(const Headers& h, std::string_view name);

/// `n` in lower-case hex without leading zeros (a chunk-size line of chunked encoding).
std::string to_hex(std::size_t n);

/// The origin form (path and query) of a request target: an absolute-form target
/// ("http://host:8080/v1/models?x=1", which RFC 9112 section 3.2.2 says a server must accept) loses
/// its scheme and authority ("/v1/models?x=1"; "/" when it has no path); any other target is
/// returned as sent. The scheme is matched ASCII case-insensitively ("HTTP://", "https://").
std::string origin_form(std::string_view target);

}  // namespace servedeck::http::detail
