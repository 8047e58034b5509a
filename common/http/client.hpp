// A blocking HTTP/1.1 client on Boost.Beast for short calls: the CLI → admin API, the
// supervisor's health and warm-up probes, the gateway's /tokenize lookups, and tests.
// (The gateway's streaming proxy uses its own asynchronous client.)
//
// Thread-safety: free functions, no shared state; each call opens its own connection.
#pragma once

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/http/server.hpp"

namespace servedeck::http {

/// Connection refused, timeout, malformed response. what() names host:port, target and cause.
struct ClientError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

struct ClientRequest {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string method = "GET";
  std::string target = "/";
  std::string body;
  std::string content_type = "application/json";
  Headers headers;
  int timeout_ms = 10000;                      // whole exchange
};

/// Performs the request and reads the whole response. Throws ClientError.
ClientResponse fetch(const ClientRequest& req);

/// Performs the request and hands the body to `on_chunk` as it arrives (after `on_head`).
/// `on_chunk` returns false to stop early (the connection is closed). `timeout_ms` bounds the
/// gap between reads, not the whole exchange. Throws ClientError.
void fetch_stream(const ClientRequest& req,
                  const std::function<void(int status, const std::map<std::string, std::string>& headers)>& on_head,
                  const std::function<bool(std::string_view chunk)>& on_chunk);

}  // namespace servedeck::http
