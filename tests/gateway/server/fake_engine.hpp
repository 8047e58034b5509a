// Test doubles for the gateway: an in-process engine-like server replaying canned responses
// (SSE bodies cut at awkward boundaries, with delays; cut connections; hangs), and a
// SlotControl whose "slot" points at it.
#pragma once

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"
#include "gateway/supervisor/slot_control.hpp"

namespace servedeck::test {

/// One canned engine answer.
struct Script {
  int status = 200;
  std::string content_type = "text/event-stream";
  struct Piece {
    std::string bytes;
    int delay_ms = 0;  // before this piece
  };
  std::vector<Piece> pieces;
  enum class Ending { end, cut, hang } ending = Ending::end;
  bool chunked = true;  // false: one Content-Length body (pieces joined)
  http::Headers headers;  // added to the response head (a Content-Encoding, say)
};

/// Splits an SSE wire text into pieces of `step` bytes (awkward boundaries: inside "data:",
/// inside JSON, between \n and \n).
inline std::vector<Script::Piece> split_pieces(const std::string& wire, std::size_t step, int delay_ms = 0) {
  std::vector<Script::Piece> out;
  for (std::size_t i = 0; i < wire.size(); i += step) out.push_back({wire.substr(i, step), delay_ms});
  return out;
}

inline Script sse_script(const std::vector<std::string>& data_events, std::size_t step = 7) {
  std::string wire;
  for (const auto& d : data_events) wire += "data: " + d + "\n\n";
  Script s;
  s.pieces = split_pieces(wire, step);
  return s;
}

inline Script json_script(int status, const std::string& body) {
  Script s;
  s.status = status;
  s.content_type = "application/json";
  s.pieces = {{body, 0}};
  s.chunked = false;
  return s;
}

class FakeEngine {
 public:
  FakeEngine() : server_(http::ServerOptions{}, [this](http::Request req, std::shared_ptr<http::Responder> res) {
                   handle(std::move(req), std::move(res));
                 }) {
    server_.start();
  }
  ~FakeEngine() {
    server_.stop();
    for (auto& t : threads_) t.join();
  }

  int port() const { return server_.port(); }

  /// Scripts are answered in order; the last one repeats.
  void push(Script s) {
    std::lock_guard lk(mu_);
    scripts_.push_back(std::move(s));
  }
  int requests() const { return requests_.load(); }
  int disconnects() const { return disconnects_.load(); }
  nlohmann::json last_body() const {
    std::lock_guard lk(mu_);
    return last_body_;
  }
  /// The Accept-Encoding of the last request ("" when it had none).
  std::string last_accept_encoding() const {
    std::lock_guard lk(mu_);
    return last_accept_encoding_;
  }

 private:
  void handle(http::Request req, std::shared_ptr<http::Responder> res) {
    Script s;
    {
      std::lock_guard lk(mu_);
      ++requests_;
      last_body_ = nlohmann::json::parse(req.body, nullptr, false);
      last_accept_encoding_ = req.header("accept-encoding");
      if (scripts_.empty()) {
        res->send(500, "application/json", R"({"error":{"message":"no script","type":"server_error","code":500}})");
        return;
      }
      s = scripts_.front();
      if (scripts_.size() > 1) scripts_.pop_front();
    }
    res->on_disconnect([this] { ++disconnects_; });
    std::lock_guard lk(mu_);
    threads_.emplace_back([s, res]() mutable {
      if (!s.chunked) {
        std::string body;
        for (const auto& p : s.pieces) {
          std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
          body += p.bytes;
        }
        res->send(s.status, s.content_type, body, s.headers);
        return;
      }
      res->start_stream(s.status, s.content_type, s.headers);
      for (const auto& p : s.pieces) {
        if (p.delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
        // Like a real engine, wait for the reader instead of queueing without bound.
        while (res->queued_bytes() > 2 * 1024 * 1024 && !res->client_gone())
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!res->write(p.bytes)) return;
      }
      if (s.ending == Script::Ending::end) {
        res->end();
      } else if (s.ending == Script::Ending::hang) {
        // Holds the stream open until the gateway hangs up (bounded: 10 s).
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!res->client_gone() && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      // Ending::cut: dropping the responder mid-stream closes the connection without the
      // final chunk.
    });
  }

  mutable std::mutex mu_;
  std::deque<Script> scripts_;
  std::vector<std::thread> threads_;
  nlohmann::json last_body_;
  std::string last_accept_encoding_;
  std::atomic<int> requests_{0};
  std::atomic<int> disconnects_{0};
  http::Server server_;  // last: stopped first
};

/// A slot that is `ready` with `model` at the fake engine, or switches on ensure_running.
class FakeSlotControl : public gateway::SlotControl {
 public:
  FakeSlotControl(std::string model, int port) {
    snap_.state = model.empty() ? gateway::SlotState::stopped : gateway::SlotState::ready;
    snap_.model = std::move(model);
    snap_.host = "127.0.0.1";
    snap_.port = port;
  }
  ~FakeSlotControl() override {
    for (auto& t : threads_) t.join();
  }

  gateway::SlotSnapshot snapshot() const override {
    std::lock_guard lk(mu_);
    auto s = snap_;
    s.in_flight = leases_.load();
    return s;
  }
  gateway::Lease acquire(const std::string& model) override {
    std::lock_guard lk(mu_);
    if (snap_.state != gateway::SlotState::ready || snap_.model != model || snap_.draining) return nullptr;
    ++leases_;
    return gateway::Lease(new int(0), [this](void* p) {
      delete static_cast<int*>(p);
      --leases_;
    });
  }
  void ensure_running(const std::string& model, std::function<void(gateway::Lease, std::string)> done) override {
    ++ensure_calls_;
    std::lock_guard lk(mu_);
    int delay = switch_delay_ms;
    bool ok = switch_ok;
    threads_.emplace_back([this, model, done, delay, ok] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      gateway::Lease lease;
      if (ok) {
        {
          std::lock_guard lk2(mu_);
          snap_.model = model;
          snap_.state = gateway::SlotState::ready;
          ++starts_;
        }
        lease = acquire(model);  // as the supervisor does: taken the moment the slot is ready
      }
      done(lease, ok ? "" : "preflight refused: host RAM 100 GiB < 155 GiB");
    });
  }
  void report_unresponsive(const std::string& model, int port, const std::string& why) override {
    std::lock_guard lk(mu_);
    unresponsive_.push_back(model + " " + std::to_string(port) + ": " + why);
  }
  std::vector<std::string> unresponsive() const {
    std::lock_guard lk(mu_);
    return unresponsive_;
  }
  void set_draining(bool draining, std::string switching_to) {
    std::lock_guard lk(mu_);
    snap_.draining = draining;
    snap_.switching_to = std::move(switching_to);
  }
  void set_state(gateway::SlotState s, std::string model) {
    std::lock_guard lk(mu_);
    snap_.state = s;
    snap_.model = std::move(model);
  }

  void set_last_error(std::string e) {
    std::lock_guard lk(mu_);
    snap_.last_error = std::move(e);
  }

  /// A switch to `model` refused by preflight before the stop (SlotSnapshot::refusal).
  void set_refusal(std::string model, std::string refusal) {
    std::lock_guard lk(mu_);
    snap_.refused_model = std::move(model);
    snap_.refusal = std::move(refusal);
  }

  int ensure_calls() const { return ensure_calls_.load(); }
  int starts() const { return starts_.load(); }
  int leases() const { return leases_.load(); }
  int switch_delay_ms = 50;
  bool switch_ok = true;

 private:
  mutable std::mutex mu_;
  gateway::SlotSnapshot snap_;
  std::vector<std::thread> threads_;
  std::vector<std::string> unresponsive_;
  std::atomic<int> ensure_calls_{0};
  std::atomic<int> starts_{0};
  std::atomic<int> leases_{0};
};

}  // namespace servedeck::test
