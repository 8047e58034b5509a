// gateway/server/access: the Host, Origin, credential and Content-Type rules, from heads alone.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "gateway/server/access.hpp"

using namespace servedeck;
using namespace servedeck::gateway;

namespace {

http::Request head(std::string method, std::string path, http::Headers headers = {},
                   std::string peer = "127.0.0.1:40000") {
  http::Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.target = r.path;
  r.remote_address = std::move(peer);
  for (auto& [k, v] : headers) {
    std::string name = k;
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = v;
  }
  return r;
}

AccessRules rules() {
  AccessRules r;
  r.admin_token = "adm-0123456789";
  r.admin_token_path = "/state/admin.token";
  r.listen_host = "127.0.0.1";
  return r;
}

/// The refusal's status and error code, or {0, ""} when the head may proceed.
std::pair<int, std::string> verdict(const AccessRules& rules, const http::Request& h) {
  auto r = check_access(rules, h);
  if (!r) return {0, ""};
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  return {r->status, j["error"]["code"].get<std::string>()};
}

const http::Headers json_type = {{"Content-Type", "application/json"}};

}  // namespace

TEST_CASE("access: the planes") {
  CHECK(plane_of("/admin/switch") == Plane::admin);
  CHECK(plane_of("/admin") == Plane::admin);
  CHECK(plane_of("/administrator") == Plane::data);
  CHECK(plane_of("/health") == Plane::health);
  CHECK(plane_of("/v1/chat/completions") == Plane::data);
  CHECK(plane_of("/metrics") == Plane::data);
}

TEST_CASE("access: host names are read from Host values and URL authorities") {
  CHECK(host_of_authority("LocalHost.:8090") == "localhost");
  CHECK(host_of_authority("[::1]:8090") == "::1");
  CHECK(host_of_authority("::1") == "::1");
  CHECK(host_of_authority("127.0.0.1:80") == "127.0.0.1");
  CHECK(host_of_authority("evil.example") == "evil.example");
  CHECK(host_of_authority("[::1") == "");
  CHECK(host_of_authority("user@evil.example") == "");
  // Regression: userinfo after the port read as localhost ("localhost:80@evil.example" is
  // evil.example to a URL parser).
  CHECK(host_of_authority("localhost:80@evil.com") == "");
  CHECK(host_of_authority("localhost:@evil.com") == "");
  CHECK(host_of_authority("[::1]:80@evil.com") == "");
  for (const char* bad : {"local%68ost", "localhost:8o", "localhost:123456", "local host", "localhost/x", "evil.com\\",
                          "a,b", "localhost;x", "[::1%25eth0]", "[::g]", "::1@x", ":8090", "[]:80"}) {
    CAPTURE(bad);
    CHECK(host_of_authority(bad) == "");
  }
  CHECK(host_of_authority("localhost:") == "localhost");
  CHECK(host_of_authority("my_host.lan:65535") == "my_host.lan");
  CHECK(host_of_authority("[::ffff:127.0.0.1]:80") == "::ffff:127.0.0.1");
  CHECK(is_ip_literal("192.168.1.5"));
  CHECK(is_ip_literal("fe80::1"));
  CHECK_FALSE(is_ip_literal("localhost"));
  CHECK(is_loopback_host("127.3.4.5"));
  CHECK(is_loopback_host("::1"));
  CHECK(is_loopback_host("::ffff:127.0.0.1"));
  CHECK_FALSE(is_loopback_host("::ffff:10.0.0.1"));
  CHECK_FALSE(is_loopback_host("192.168.1.5"));
}

TEST_CASE("access: Host must be an address, localhost or an allowed name (DNS rebinding)") {
  auto r = rules();
  for (const char* ok : {"127.0.0.1:8090", "localhost:8090", "localhost", "[::1]:8090", "192.168.1.5:8090"}) {
    CAPTURE(ok);
    CHECK(verdict(r, head("GET", "/v1/models", {{"Host", ok}})).first == 0);
  }
  CHECK(verdict(r, head("GET", "/v1/models")).first == 0);  // no Host: not a browser
  for (const char* path : {"/v1/models", "/health", "/metrics", "/admin/logs"}) {
    CAPTURE(path);
    CHECK(verdict(r, head("GET", path, {{"Host", "rebind.evil.example:8090"}})) ==
          std::pair<int, std::string>{403, "host_not_allowed"});
    CHECK(verdict(r, head("GET", path, {{"Host", "localhost:80@evil.example"}})) ==
          std::pair<int, std::string>{403, "host_not_allowed"});
  }
  r.allowed_hosts = {"workstation.lan"};
  CHECK(verdict(r, head("GET", "/v1/models", {{"Host", "Workstation.LAN:8090"}})).first == 0);
}

TEST_CASE("access: a foreign Origin is refused on every plane; local ones and apps pass") {
  auto r = rules();
  const std::pair<int, std::string> refused{403, "origin_not_allowed"};
  for (const char* origin : {"https://evil.example", "http://192.168.1.9:3000", "null", "http://localhost.evil.example",
                             "http://localhost:80@evil.example", "http://127.0.0.1@evil.example/"}) {
    CAPTURE(origin);
    CHECK(verdict(r, head("GET", "/v1/models", {{"Origin", origin}})) == refused);
    CHECK(verdict(r, head("GET", "/health", {{"Origin", origin}})) == refused);
    CHECK(verdict(r, head("POST", "/admin/stop",
                          {{"Origin", origin}, {"Authorization", "Bearer adm-0123456789"}, json_type[0]})) == refused);
  }
  for (const char* origin : {"http://localhost:3000", "http://127.0.0.1:8090", "http://[::1]:8090", "vscode-webview://abc"}) {
    CAPTURE(origin);
    CHECK(verdict(r, head("GET", "/v1/models", {{"Origin", origin}})).first == 0);
  }
  // A page on another site that sends no Origin (an <img> or a no-cors GET) says so itself.
  CHECK(verdict(r, head("GET", "/v1/models", {{"Sec-Fetch-Site", "cross-site"}})) == refused);
  CHECK(verdict(r, head("GET", "/v1/models", {{"Sec-Fetch-Site", "none"}})).first == 0);
  // The listen address and allowed_hosts are origins of this server too.
  r.listen_host = "192.168.1.5";
  r.allowed_hosts = {"workstation.lan"};
  CHECK(verdict(r, head("GET", "/v1/models", {{"Origin", "http://192.168.1.5:3000"}})).first == 0);
  CHECK(verdict(r, head("GET", "/v1/models", {{"Origin", "https://workstation.lan"}})).first == 0);
  CHECK(verdict(r, head("GET", "/v1/models", {{"Origin", "http://192.168.1.9:3000"}})) == refused);
}

TEST_CASE("access: the admin plane needs the admin token; client API keys are not admin keys") {
  auto r = rules();
  r.api_keys = {"sk-client"};
  auto admin = [&](http::Headers h, std::string peer = "127.0.0.1:5000") {
    h.push_back(json_type[0]);
    return verdict(r, head("POST", "/admin/switch", h, peer));
  };
  CHECK(admin({{"Authorization", "Bearer adm-0123456789"}}).first == 0);
  CHECK(admin({{"Authorization", "bearer adm-0123456789"}}).first == 0);
  CHECK(admin({}) == std::pair<int, std::string>{401, "admin_credential_required"});
  CHECK(admin({{"Authorization", "Bearer sk-client"}}) == std::pair<int, std::string>{401, "not_an_admin_credential"});
  CHECK(admin({{"Authorization", "Bearer adm-012345678"}}) == std::pair<int, std::string>{401, "invalid_admin_token"});
  CHECK(admin({{"Authorization", "Basic YWRtOng="}}) == std::pair<int, std::string>{401, "admin_credential_required"});
  // The token does not open the data plane, and the admin plane needs no client key.
  CHECK(verdict(r, head("GET", "/v1/models", {{"Authorization", "Bearer adm-0123456789"}})) ==
        std::pair<int, std::string>{401, "invalid_api_key"});
  CHECK(verdict(r, head("GET", "/v1/models", {{"Authorization", "Bearer sk-client"}})).first == 0);
  CHECK(verdict(r, head("GET", "/health")).first == 0);
  // The 401 says where the token is.
  auto msg = check_access(r, head("GET", "/admin/status"));
  REQUIRE(msg);
  CHECK(msg->body.find("/state/admin.token") != std::string::npos);
  CHECK(msg->extra_headers == http::Headers{{"WWW-Authenticate", "Bearer"}});
  // Listening beyond loopback: admin only from loopback peers, token or not.
  r.listen_host = "0.0.0.0";
  CHECK(admin({{"Authorization", "Bearer adm-0123456789"}}, "192.168.1.9:5000") ==
        std::pair<int, std::string>{403, "admin_loopback_only"});
  CHECK(admin({{"Authorization", "Bearer adm-0123456789"}}, "::1:5000").first == 0);
  CHECK(admin({{"Authorization", "Bearer adm-0123456789"}}, "::ffff:127.0.0.1:5000").first == 0);
  // No token configured: the admin plane is closed.
  r.admin_token.clear();
  r.listen_host = "127.0.0.1";
  CHECK(admin({{"Authorization", "Bearer "}}) == std::pair<int, std::string>{403, "admin_disabled"});
}

TEST_CASE("access: POST bodies must be application/json") {
  auto r = rules();
  CHECK(verdict(r, head("POST", "/v1/chat/completions", json_type)).first == 0);
  CHECK(verdict(r, head("POST", "/v1/chat/completions", {{"Content-Type", "Application/JSON; charset=utf-8"}})).first == 0);
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                           "application/jsonp"}) {
    CAPTURE(type);
    CHECK(verdict(r, head("POST", "/v1/chat/completions", {{"Content-Type", type}})) ==
          std::pair<int, std::string>{415, "unsupported_media_type"});
  }
  CHECK(verdict(r, head("POST", "/v1/responses")) == std::pair<int, std::string>{415, "unsupported_media_type"});
  CHECK(verdict(r, head("POST", "/admin/stop", {{"Authorization", "Bearer adm-0123456789"}, {"Content-Type", "text/plain"}})) ==
        std::pair<int, std::string>{415, "unsupported_media_type"});
  CHECK(verdict(r, head("GET", "/v1/models")).first == 0);  // only POST carries a body to check
}
