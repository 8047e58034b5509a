// The access rules of gateway/server/access.hpp.
#include "gateway/server/access.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/json_limits.hpp"
#include "common/openai_error.hpp"

namespace servedeck::gateway {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return std::string(s.substr(b, e - b));
}

/// Compares without an early exit on the first differing byte (a token is not guessed byte by
/// byte from response times).
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

/// The bearer credential of an Authorization header ("" when none or another scheme).
std::string bearer_of(const std::string& authorization) {
  if (authorization.size() < 7 || lower(authorization.substr(0, 7)) != "bearer ") return "";
  return trim(authorization.substr(7));
}

bool is_wildcard(std::string_view host) { return host == "0.0.0.0" || host == "::" || host.empty(); }

http::HeadRejection refuse(int status, const std::string& message, const char* type, const char* code,
                           http::Headers extra = {}) {
  return {status, dump_safe(make_error(message, type, code)), std::move(extra)};
}

/// The address of a peer "ADDR:PORT" (the server writes IPv6 peers without brackets).
std::string peer_address(std::string_view remote) {
  auto colon = remote.rfind(':');
  std::string addr(colon == std::string_view::npos ? remote : remote.substr(0, colon));
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') addr = addr.substr(1, addr.size() - 2);
  return addr;
}

bool in_list(const std::vector<std::string>& list, const std::string& host) {
  return std::find(list.begin(), list.end(), host) != list.end();
}

/// A host an Origin may name: loopback, the listen address, or server.allowed_hosts.
bool origin_host_allowed(const AccessRules& rules, const std::string& host) {
  if (is_loopback_host(host) || in_list(rules.allowed_hosts, host)) return true;
  return !is_wildcard(rules.listen_host) && host == host_of_authority(rules.listen_host);
}

std::optional<http::HeadRejection> check_browser_headers(const AccessRules& rules, const http::Request& head) {
  const std::string host_header = head.header("host");
  if (!host_header.empty()) {
    const std::string host = host_of_authority(host_header);
    if (host.empty() || !(is_ip_literal(host) || host == "localhost" || in_list(rules.allowed_hosts, host)))
      return refuse(403,
                    "Host '" + host_header.substr(0, 200) +
                        "' is not a name of this server; expected an IP address, localhost, or a name listed in "
                        "server.allowed_hosts (a web page that reached this port through DNS rebinding sends its own "
                        "name)",
                    "permission_error", "host_not_allowed");
  }
  const std::string origin = head.header("origin");
  if (!origin.empty()) {
    const std::string o = lower(trim(origin));
    std::string host;
    bool web = false;
    for (const char* scheme : {"http://", "https://"}) {
      if (o.rfind(scheme, 0) == 0) {
        web = true;
        std::string authority = o.substr(std::strlen(scheme));
        host = host_of_authority(authority.substr(0, authority.find('/')));
      }
    }
    // note: a web page always has an http(s) origin, or "null" (sandboxed frames, file: pages).
    // Other schemes (vscode-webview://, app://) belong to software installed on this machine.
    if (o == "null" || (web && (host.empty() || !origin_host_allowed(rules, host))))
      return refuse(403,
                    "Origin '" + origin.substr(0, 200) +
                        "' is not allowed: a page served from another site may not use this server; allowed origins "
                        "are localhost, loopback addresses, the listen address and server.allowed_hosts",
                    "permission_error", "origin_not_allowed");
  } else if (lower(trim(head.header("sec-fetch-site"))) == "cross-site") {
    return refuse(403, "a page served from another site sent this request (Sec-Fetch-Site: cross-site)",
                  "permission_error", "origin_not_allowed");
  }
  return std::nullopt;
}

std::optional<http::HeadRejection> check_admin(const AccessRules& rules, const http::Request& head) {
  if (!is_loopback_host(rules.listen_host) && !is_loopback_host(peer_address(head.remote_address)))
    return refuse(403, "the admin API answers only loopback clients", "permission_error", "admin_loopback_only");
  if (rules.admin_token.empty())
    return refuse(403, "the admin API is disabled: this server has no admin token", "permission_error",
                  "admin_disabled");
  const std::string where = rules.admin_token_path.empty() ? std::string("the daemon's admin token file")
                                                           : rules.admin_token_path;
  const std::string presented = bearer_of(head.header("authorization"));
  if (presented.empty())
    return refuse(401,
                  "the admin API needs the daemon's admin token: Authorization: Bearer <contents of " + where +
                      "> (the servedeck CLI sends it)",
                  "authentication_error", "admin_credential_required", {{"WWW-Authenticate", "Bearer"}});
  if (same_secret(presented, rules.admin_token)) return std::nullopt;
  bool client_key = false;
  for (const auto& k : rules.api_keys) client_key = same_secret(presented, k) || client_key;
  if (client_key)
    return refuse(401,
                  "client API keys (server.api_keys) do not open the admin API; send the admin token from " + where,
                  "authentication_error", "not_an_admin_credential", {{"WWW-Authenticate", "Bearer"}});
  return refuse(401, "invalid admin token (the daemon writes a new one to " + where + " each time it starts)",
                "authentication_error", "invalid_admin_token", {{"WWW-Authenticate", "Bearer"}});
}

std::optional<http::HeadRejection> check_api_key(const AccessRules& rules, const http::Request& head) {
  if (rules.api_keys.empty()) return std::nullopt;
  const std::string auth = head.header("authorization");
  // Anthropic clients send the key as x-api-key (ANTHROPIC_API_KEY) or as a bearer token
  // (ANTHROPIC_AUTH_TOKEN).
  const std::string presented = auth.empty() ? trim(head.header("x-api-key")) : bearer_of(auth);
  bool ok = false;
  for (const auto& k : rules.api_keys) ok = (!presented.empty() && same_secret(presented, k)) || ok;
  if (ok) return std::nullopt;
  return refuse(401,
                presented.empty() && auth.empty() ? "missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)"
                                                  : "invalid API key",
                "authentication_error", "invalid_api_key", {{"WWW-Authenticate", "Bearer"}});
}

std::optional<http::HeadRejection> check_content_type(const http::Request& head) {
  if (head.method != "POST") return std::nullopt;
  const std::string type = head.header("content-type");
  const std::string media = lower(trim(std::string_view(type).substr(0, type.find(';'))));
  if (media == "application/json") return std::nullopt;
  return refuse(415,
                "POST bodies must be sent as Content-Type: application/json; got " +
                    (type.empty() ? std::string("no Content-Type") : "'" + type.substr(0, 200) + "'"),
                "invalid_request_error", "unsupported_media_type");
}

}  // namespace

Plane plane_of(std::string_view path) {
  if (path == "/admin" || path.rfind("/admin/", 0) == 0) return Plane::admin;
  if (path == "/health") return Plane::health;
  return Plane::data;
}

std::string host_of_authority(std::string_view authority) {
  std::string a = lower(trim(authority));
  if (a.empty()) return "";
  std::string host, port;
  if (a.front() == '[') {
    auto close = a.find(']');
    if (close == std::string::npos) return "";
    std::string rest = a.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return "";
    host = a.substr(1, close - 1);
    if (!rest.empty()) port = rest.substr(1);
    // An IPv6 literal: hex digits, ':' and '.' (an embedded IPv4 address), nothing else.
    if (host.empty() || host.find_first_not_of("0123456789abcdef:.") != std::string::npos) return "";
  } else if (std::count(a.begin(), a.end(), ':') > 1) {
    host = a;  // a bare IPv6 address (no port can be told apart)
    if (host.find_first_not_of("0123456789abcdef:.") != std::string::npos) return "";
  } else {
    const auto colon = a.find(':');
    host = a.substr(0, colon);
    if (colon != std::string::npos) port = a.substr(colon + 1);
    // A registered name or an IPv4 address: letters, digits, '-', '.' and '_' only. Userinfo
    // ("localhost:80@evil.example" names evil.example), percent-escapes, paths and the
    // sub-delimiters a browser would never put in a Host are all refused.
    if (host.empty() || host.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-._") != std::string::npos)
      return "";
  }
  // The port: empty (RFC 3986 allows "host:") or up to five digits.
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return "";
  if (!host.empty() && host.back() == '.') host.pop_back();
  return host;
}

bool is_ip_literal(std::string_view host) {
  std::string h(host);
  unsigned char buf[16];
  return inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

bool is_loopback_host(std::string_view host) {
  std::string h = lower(host);
  if (h == "localhost") return true;
  unsigned char b[16];
  if (inet_pton(AF_INET, h.c_str(), b) == 1) return b[0] == 127;
  if (inet_pton(AF_INET6, h.c_str(), b) != 1) return false;
  static const unsigned char loop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (std::memcmp(b, loop6, 16) == 0) return true;
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(b, mapped, 12) == 0 && b[12] == 127;  // ::ffff:127.x.y.z
}

std::optional<http::HeadRejection> check_access(const AccessRules& rules, const http::Request& head) {
  if (auto r = check_browser_headers(rules, head)) return r;
  switch (plane_of(head.path)) {
    case Plane::admin:
      if (auto r = check_admin(rules, head)) return r;
      break;
    case Plane::data:
      if (auto r = check_api_key(rules, head)) return r;
      break;
    case Plane::health:
      break;
  }
  return check_content_type(head);
}

}  // namespace servedeck::gateway
