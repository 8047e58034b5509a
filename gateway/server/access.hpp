// Who may use which route, decided from a request's head alone (the HTTP server runs this as its
// head_check, so a refused request never has its body read). docs/operations.md "Security"
// states the rules and the threats they answer; this is their one implementation.
//
// Planes: the admin plane is every path under /admin (switch, stop, logs, status, preflight,
// models); /health is open to every local caller; everything else is the data plane (the
// OpenAI-compatible routes, /metrics).
//
// Checks, in this order, each answered with the OpenAI error envelope:
//   1. Host (every route): absent, an IP address, `localhost`, or a name in
//      server.allowed_hosts; otherwise 403 host_not_allowed. A page that reaches this port through
//      DNS rebinding sends its own DNS name here, never an address.
//   2. Origin (every route, when present): its host must be `localhost`, a loopback address, the
//      listen address, or a name in server.allowed_hosts (`null` never is); otherwise 403
//      origin_not_allowed. `Sec-Fetch-Site: cross-site` (a browser saying a foreign page sent
//      the request) is refused the same way.
//   3. Admin plane: the peer must be on loopback (unless the server listens on loopback anyway:
//      403 admin_loopback_only) and send `Authorization: Bearer <admin token>`: 401
//      admin_credential_required without it, not_an_admin_credential for a client API key,
//      invalid_admin_token for anything else; 403 admin_disabled when no token was configured.
//   4. Data plane: with server.api_keys set, `Authorization: Bearer <key>`, or `x-api-key: <key>`
//      as Anthropic clients send it (401 invalid_api_key; Anthropic's envelope on /v1/messages).
//   5. POST on any route: Content-Type application/json (parameters allowed); otherwise 415
//      unsupported_media_type. A browser page cannot send that type cross-origin without a CORS
//      preflight, which this server never grants.
//
// Thread-safety: check_access is a pure function of its arguments.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/server.hpp"

namespace servedeck::gateway {

struct AccessRules {
  std::vector<std::string> api_keys;       // data-plane bearer keys; empty = none needed
  std::string admin_token;                 // admin-plane bearer token; empty = admin plane closed
  std::string admin_token_path;            // where the CLI reads it, for the 401 message
  std::string listen_host;                 // as bound: "127.0.0.1", "0.0.0.0", "::", "192.168.1.5"
  std::vector<std::string> allowed_hosts;  // server.allowed_hosts, lower-cased
};

enum class Plane { admin, health, data };

/// The plane of a request path: "/admin" and "/admin/..." → admin, "/health" → health, else data.
Plane plane_of(std::string_view path);

/// The refusal for a request head, or nullopt when it may proceed. See the rules above.
std::optional<http::HeadRejection> check_access(const AccessRules& rules, const http::Request& head);

/// The host part of a Host header value or URL authority, lower-cased, without port, brackets
/// or a trailing dot: "LocalHost.:8090" → "localhost", "[::1]:8090" → "::1". "" when malformed:
/// any character not valid in host[:port] — userinfo ("localhost:80@evil.example"), '%',
/// '/', spaces, sub-delimiters — a port that is not up to five digits, or an empty host.
std::string host_of_authority(std::string_view authority);

/// True for an IPv4 or IPv6 address literal (no brackets, no port).
bool is_ip_literal(std::string_view host);

/// True for a loopback address literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z) or "localhost".
bool is_loopback_host(std::string_view host);

}  // namespace servedeck::gateway
