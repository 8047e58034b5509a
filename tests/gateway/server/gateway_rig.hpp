// The gateway test rig shared by gateway_test.cpp (streams) and gateway_routes_test.cpp
// (routes, errors, switching): a registry of three models, the real Gateway in front of an
// in-process fake engine replaying scripted streams, a fake slot control, and client helpers.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/http/client.hpp"
#include "common/sse.hpp"
#include "gateway/server/gateway.hpp"
#include "gateway/server/metrics.hpp"
#include "gateway/state/store.hpp"
#include "tests/gateway/server/fake_engine.hpp"

namespace servedeck::test::gateway_rig {

using nlohmann::json;
using test::FakeEngine;
using test::FakeSlotControl;
using test::Script;

template <class F>
inline bool wait_for(F pred, int timeout_ms = 5000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

inline registry::Registry make_registry() {
  registry::Registry reg;
  registry::ModelEntry glm;
  glm.name = "glm53";
  glm.served_name = "glm53-flash";
  glm.aliases = {"glm"};
  glm.presets = {{"glm53-flash-low", json{{"reasoning_effort", "low"}}, std::nullopt},
                 {"glm53-flash-high", json{{"reasoning_effort", "high"}}, std::nullopt}};
  glm.ctx = 131072;
  // note: the registry's own deadlines (minutes) here; the deadline test tightens them. Tight
  // deadlines on every test tripped spuriously on a loaded 2-core CI box under ASan (a 300 ms
  // max_gap_ms cut the 10 MiB backpressure stream with upstream_gap_timeout).
  reg.models.push_back(glm);
  registry::ModelEntry qwen;
  qwen.name = "qwen";
  qwen.served_name = "qwen3.8-flash-next";
  qwen.ctx = 16384;
  reg.models.push_back(qwen);
  registry::ModelEntry lazy;
  lazy.name = "lazy";
  lazy.served_name = "lazy-model";
  lazy.ctx = 4096;
  lazy.switch_on_request = true;
  lazy.queue_max = 1;
  lazy.queue_timeout_s = 2;
  reg.models.push_back(lazy);
  reg.server.max_body_bytes = 4096;
  return reg;
}

struct TempDir {
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "servedeck-gw-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

/// Engine + slot + store + gateway, wired up.
struct Rig {
  explicit Rig(std::string running = "glm53", int heartbeat_ms = 5000,
               const std::function<void(registry::Registry&)>& tweak = nullptr)
      : reg([&] {
          auto r = make_registry();
          if (tweak) tweak(r);
          return r;
        }()),
        store(dir.path), slots(std::move(running), engine.port()),
        gw(reg, store, slots, [&] {
          gateway::GatewayOptions o;
          o.heartbeat_ms = heartbeat_ms;
          o.retry_after_s = 7;
          return o;
        }()) {
    gw.start();
  }
  http::ClientResponse post(const std::string& path, const std::string& body, http::Headers headers = {}) {
    http::ClientRequest r;
    r.port = gw.port();
    r.method = "POST";
    r.target = path;
    r.body = body;
    r.headers = std::move(headers);
    return http::fetch(r);
  }
  http::ClientResponse get(const std::string& path) {
    http::ClientRequest r;
    r.port = gw.port();
    r.target = path;
    return http::fetch(r);
  }
  TempDir dir;
  FakeEngine engine;
  registry::Registry reg;
  state::Store store;
  FakeSlotControl slots;
  gateway::Gateway gw;
};

inline std::string chat(const std::string& model = "glm53-flash", bool stream = true, const std::string& extra = "") {
  return R"({"model":")" + model + R"(","stream":)" + (stream ? "true" : "false") +
         R"(,"messages":[{"role":"user","content":"hi"}])" + extra + "}";
}

inline std::string role_ev() { return R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"glm53-flash","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})"; }
inline std::string content_ev(const std::string& t, const std::string& finish = "null") {
  return R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"glm53-flash","choices":[{"index":0,"delta":{"content":")" + t +
         R"("},"finish_reason":)" + finish + "}]}";
}
inline std::string finish_ev() { return R"({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})"; }
inline std::string usage_ev() { return R"({"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})"; }

/// Events the client received (data payloads) and the HTTP status.
struct Received {
  int status = 0;
  std::vector<std::string> data;
  std::vector<std::string> comments;
  bool done() const { return !data.empty() && data.back() == "[DONE]"; }
  json event(std::size_t i) const { return json::parse(data.at(i)); }
};

inline Received stream(Rig& rig, const std::string& body, std::function<bool(const Received&)> keep_going = nullptr) {
  http::ClientRequest r;
  r.port = rig.gw.port();
  r.method = "POST";
  r.target = "/v1/chat/completions";
  r.body = body;
  Received out;
  sse::Parser p;
  http::fetch_stream(
      r, [&](int s, const std::map<std::string, std::string>&) { out.status = s; },
      [&](std::string_view c) {
        for (auto& e : p.feed(c)) (e.comment ? out.comments : out.data).push_back(e.data);
        return keep_going ? keep_going(out) : true;
      });
  return out;
}


}  // namespace servedeck::test::gateway_rig
