// The daemon test rig: a real `servedeck serve` process (the daemon's own wiring: state store,
// supervisor, gateway, reasoning store) in front of tests/support/fake_engine, which answers
// scripted byte streams the test writes (fake_engine.cpp: --script-dir, "script:NAME") and logs
// every request body it received (--request-log). Clients: the blocking/streaming HTTP client
// of common/http, and a raw socket for bytes no HTTP client would send.
//
// Every Daemon has its own temporary directory (models.toml, state, scripts, logs) and port 0;
// the destructor sends SIGTERM (the daemon stops its engine) and SIGKILLs after 10 s.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <optional>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/sse.hpp"
#include "gateway/supervisor/launch_log.hpp"
#include "gateway/supervisor/process_group.hpp"
#include "tests/gateway/cli/cli_run.hpp"
#include "tests/gateway/supervisor/test_util.hpp"

namespace sdtest::daemon {

using nlohmann::json;
namespace fs = std::filesystem;

// --- what the fake engine sends -------------------------------------------------------------

/// One SSE event carrying `payload` (a chunk object, or any text such as "[DONE]").
inline std::string sse(const json& chunk) { return "data: " + chunk.dump() + "\n\n"; }
inline std::string sse_text(const std::string& payload) { return "data: " + payload + "\n\n"; }

inline json chunk_with(json delta, json finish = nullptr) {
  return {{"id", "chatcmpl-fake"},
          {"object", "chat.completion.chunk"},
          {"created", 1767000000},
          {"model", "engine-model"},
          {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}}})}};
}
inline json role_chunk() { return chunk_with({{"role", "assistant"}, {"content", ""}}); }
inline json content_chunk(const std::string& text) { return chunk_with({{"content", text}}); }
inline json reasoning_chunk(const std::string& text) { return chunk_with({{"reasoning_content", text}}); }
inline json finish_chunk(const std::string& reason = "stop") { return chunk_with(json::object(), reason); }
/// A tool-call delta (index 0): the header (id, name) when `name` is given, then `args`.
inline json tool_chunk(const std::string& args, const std::string& name = "", const std::string& id = "") {
  json tc = {{"index", 0}, {"function", {{"arguments", args}}}};
  if (!name.empty()) {
    tc["type"] = "function";
    tc["function"]["name"] = name;
  }
  if (!id.empty()) tc["id"] = id;
  return chunk_with({{"tool_calls", json::array({tc})}});
}

/// A script piece: `text` after `delay_ms`.
inline json piece(const std::string& text, int delay_ms = 0) { return {{"text", text}, {"delay_ms", delay_ms}}; }
/// A script piece of raw bytes given in hex ("ff00").
inline json hex_piece(const std::string& hex, int delay_ms = 0) { return {{"hex", hex}, {"delay_ms", delay_ms}}; }

/// A streamed answer: role chunk, `events` (chunk objects), finish, [DONE] — one piece each.
inline json stream_script(const std::vector<json>& events, const std::string& finish = "stop", int delay_ms = 0) {
  json pieces = json::array({piece(sse(role_chunk()))});
  for (const auto& e : events) pieces.push_back(piece(sse(e), delay_ms));
  pieces.push_back(piece(sse(finish_chunk(finish))));
  pieces.push_back(piece(sse_text("[DONE]")));
  return {{"pieces", pieces}};
}

/// A non-streamed chat.completion answer holding `message`.
inline json body_script(json message, const std::string& finish = "stop", int delay_ms = 0) {
  message["role"] = "assistant";
  json body = {{"id", "chatcmpl-fake"},
               {"object", "chat.completion"},
               {"created", 1767000000},
               {"model", "engine-model"},
               {"choices", json::array({{{"index", 0}, {"message", message}, {"finish_reason", finish}}})},
               {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 3}, {"total_tokens", 8}}}};
  return {{"chunked", false}, {"content_type", "application/json"}, {"pieces", json::array({piece(body.dump(), delay_ms)})}};
}

// --- what the client sees ---------------------------------------------------------------------

/// A streamed answer as the client received it.
struct Received {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string raw;                    // the body bytes
  std::vector<std::string> data;      // data payloads, in order
  std::vector<std::string> comments;  // heartbeats
  std::vector<double> data_ms;        // when each data payload arrived, ms after the request
  std::vector<double> comment_ms;
  double total_ms = 0;
  std::string client_error;           // the client's exception text, if any
  bool done() const { return !data.empty() && data.back() == "[DONE]"; }
  /// The parsed data payloads that are objects (chunks, error events).
  std::vector<json> events() const {
    std::vector<json> out;
    for (const auto& d : data) {
      auto j = json::parse(d, nullptr, false);
      if (j.is_object()) out.push_back(j);
    }
    return out;
  }
  /// The error event's `error` object, or null.
  json error() const {
    for (const auto& e : events())
      if (e.contains("error")) return e["error"];
    return nullptr;
  }
  /// Content of every chunk, concatenated (choice 0), and the same for a delta field.
  std::string delta_text(const std::string& field = "content") const {
    std::string out;
    for (const auto& e : events()) {
      if (!e.contains("choices") || !e["choices"].is_array() || e["choices"].empty()) continue;
      const auto& d = e["choices"][0].value("delta", json::object());
      if (d.contains(field) && d[field].is_string()) out += d[field].get<std::string>();
    }
    return out;
  }
  /// Tool calls assembled from the deltas (choice 0): index → {"id","name","arguments"}.
  std::map<int, json> tool_calls() const {
    std::map<int, json> calls;
    for (const auto& e : events()) {
      if (!e.contains("choices") || !e["choices"].is_array() || e["choices"].empty()) continue;
      const auto& d = e["choices"][0].value("delta", json::object());
      if (!d.contains("tool_calls")) continue;
      for (const auto& tc : d["tool_calls"]) {
        auto& c = calls[tc.value("index", 0)];
        if (tc.contains("id")) c["id"] = tc["id"];
        if (tc.contains("function")) {
          const auto& f = tc["function"];
          if (f.contains("name")) c["name"] = c.value("name", std::string()) + f["name"].get<std::string>();
          if (f.contains("arguments")) c["arguments"] = c.value("arguments", std::string()) + f["arguments"].get<std::string>();
        }
      }
    }
    return calls;
  }
  std::string finish_reason() const {
    std::string r;
    for (const auto& e : events())
      if (e.contains("choices") && e["choices"].is_array() && !e["choices"].empty() &&
          e["choices"][0].contains("finish_reason") && e["choices"][0]["finish_reason"].is_string())
        r = e["choices"][0]["finish_reason"].get<std::string>();
    return r;
  }
};

/// A chat request body: `messages` for model `model`, streamed or not, plus `extra` top-level keys.
inline std::string chat_body(const std::string& model, json messages, bool stream, json extra = json::object()) {
  json b = extra;
  b["model"] = model;
  b["messages"] = std::move(messages);
  b["stream"] = stream;
  return b.dump();
}
/// The messages of a scripted turn: one user message "script:NAME".
inline json script_messages(const std::string& name) {
  return json::array({{{"role", "user"}, {"content", "script:" + name}}});
}

/// Reply of a raw socket exchange.
struct RawReply {
  std::string bytes;  // everything read until the peer closed or the timeout
  bool closed = false;
  /// The status code of the first response, 0 when none.
  int status() const {
    if (bytes.rfind("HTTP/1.1 ", 0) != 0 || bytes.size() < 12) return 0;
    return std::atoi(bytes.substr(9, 3).c_str());
  }
  /// The header block of the first response (lower-cased names are not applied).
  std::string head() const { return bytes.substr(0, bytes.find("\r\n\r\n")); }
};

/// A TCP connection to the daemon for hand-written requests.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  /// Sends every byte; false when the peer closed.
  bool send(const std::string& bytes) {
    std::size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<std::size_t>(n);
    }
    return true;
  }
  /// Reads until the peer closes, `stop(bytes so far)` says enough, or `timeout_ms` passes.
  RawReply read(int timeout_ms, const std::function<bool(const std::string&)>& stop = nullptr) {
    RawReply r;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    char buf[65536];
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        r.closed = true;
        break;
      }
      r.bytes.append(buf, static_cast<std::size_t>(n));
      if (stop && stop(r.bytes)) break;
    }
    return r;
  }
  /// Reads one complete response with a Content-Length body (or until close / timeout).
  RawReply read_response(int timeout_ms) {
    return read(timeout_ms, [](const std::string& b) {
      auto end = b.find("\r\n\r\n");
      if (end == std::string::npos) return false;
      std::string head = b.substr(0, end);
      for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      auto cl = head.find("content-length:");
      if (cl == std::string::npos) return head.find("transfer-encoding") == std::string::npos;
      return b.size() >= end + 4 + static_cast<std::size_t>(std::atoll(head.c_str() + cl + 15));
    });
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// --- the daemon --------------------------------------------------------------------------------

/// `[models.NAME]` for a fake engine: served name NAME-served, the rig's scripts and request
/// log, `extra` more TOML lines (policies as a `[models.NAME.policies]` table after it).
inline std::string fake_model(const std::string& name, const std::string& extra = "", const std::string& engine_args = "") {
  return "[models." + name + "]\nengine = \"command\"\nserved_name = \"" + name + "-served\"\nprogram = \"" +
         std::string(SERVEDECK_FAKE_ENGINE) +
         "\"\nargs = [\"--port\", \"{port}\", \"--served-name\", \"{served_name}\", \"--script-dir\", "
         "\"{state_dir}/../scripts\", \"--request-log\", \"{state_dir}/../engine.jsonl\"" +
         engine_args + "]\nctx = 32768\nstart_timeout_s = 20\nstop_timeout_s = 3\n" + extra + "\n";
}

class Daemon {
 public:
  struct Options {
    std::string models;                       // [models.*] tables (fake_model())
    std::string default_model;                // started at serve and waited for ("" = none)
    std::string server_extra;                 // more [server] lines
    std::map<std::string, std::string> env;   // the daemon's extra environment
    bool wait_ready = true;                   // wait for default_model to be ready
    std::string shell_prefix;                 // sh commands run before exec'ing the daemon ("ulimit -n 300")
  };

  explicit Daemon(Options o) : opt_(std::move(o)) {
    dir_ = fs::canonical(sdtest::temp_dir("daemon")).string();
    fs::create_directories(dir_ + "/scripts");
    fs::create_directories(dir_ + "/state");
    config_ = dir_ + "/models.toml";
    std::ofstream(config_) << "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"" << dir_ << "/state\"\n"
                           << (opt_.default_model.empty() ? "" : "default_model = \"" + opt_.default_model + "\"\n")
                           << opt_.server_extra << "\n"
                           << opt_.models;
    try {
      start();
    } catch (...) {  // a failed REQUIRE: the destructor will not run
      clean_up();
      throw;
    }
  }
  ~Daemon() { clean_up(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  /// Spawns `servedeck serve` and waits up to `listen_timeout_ms` for it to listen (then for the
  /// default model).
  void start(int listen_timeout_ms = 20000) {
    log_fd_ = ::open((dir_ + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    fs::remove(dir_ + "/state/daemon.json");
    std::vector<std::string> argv = {SERVEDECK_CLI, "--config", config_, "serve"};
    std::string program = SERVEDECK_CLI;
    if (!opt_.shell_prefix.empty()) {
      program = "/bin/sh";
      argv.insert(argv.begin(), {"sh", "-c", opt_.shell_prefix + " && exec \"$0\" \"$@\""});
    }
    proc_ = servedeck::supervisor::EngineProcess::spawn({program, argv, opt_.env, log_fd_});
    REQUIRE_MESSAGE(sdtest::wait_for([&] { return fs::exists(dir_ + "/state/daemon.json"); }, listen_timeout_ms), log());
    auto info = json::parse(std::ifstream(dir_ + "/state/daemon.json"), nullptr, false);
    REQUIRE(info.is_object());
    port_ = info["port"];
    if (!opt_.default_model.empty() && opt_.wait_ready) REQUIRE_MESSAGE(wait_model(opt_.default_model, 20000), log());
  }
  /// SIGTERM, wait; SIGKILL after 10 s.
  void stop() {
    if (!proc_) return;
    ::kill(static_cast<pid_t>(proc_->pid()), SIGTERM);
    if (!proc_->wait_exit(std::chrono::seconds(10))) servedeck::supervisor::terminate(*proc_, std::chrono::seconds(1), std::chrono::seconds(2));
    proc_.reset();
    if (log_fd_ >= 0) ::close(log_fd_);
    log_fd_ = -1;
  }
  /// SIGKILL: the daemon dies without stopping its engine (which a later daemon adopts).
  void kill_hard() {
    if (!proc_) return;
    ::kill(static_cast<pid_t>(proc_->pid()), SIGKILL);
    proc_->wait_exit(std::chrono::seconds(5));
    proc_.reset();
    if (log_fd_ >= 0) ::close(log_fd_);
    log_fd_ = -1;
  }

  /// True when `model` holds the ready slot, within `timeout_ms`.
  bool wait_model(const std::string& model, int timeout_ms) {
    return sdtest::wait_for([&] {
      auto h = health();
      return h.is_object() && h["slot"]["state"] == "ready" && h["slot"]["model"] == model && !h.contains("recovering");
    }, timeout_ms);
  }
  json health() {
    try {
      auto r = get("/health");
      return r.status == 200 ? json::parse(r.body, nullptr, false) : json();
    } catch (const std::exception&) {
      return json();
    }
  }

  servedeck::http::ClientResponse get(const std::string& target, int timeout_ms = 10000) {
    servedeck::http::ClientRequest r;
    r.port = port_;
    r.target = target;
    r.timeout_ms = timeout_ms;
    return servedeck::http::fetch(r);
  }
  servedeck::http::ClientResponse post(const std::string& target, const std::string& body, int timeout_ms = 30000,
                                       const std::string& content_type = "application/json") {
    servedeck::http::ClientRequest r;
    r.port = port_;
    r.method = "POST";
    r.target = target;
    r.body = body;
    r.content_type = content_type;
    r.timeout_ms = timeout_ms;
    return servedeck::http::fetch(r);
  }
  /// A streamed POST, read to its end (or until `keep_going` says stop).
  Received stream(const std::string& body, const std::function<bool(const Received&)>& keep_going = nullptr,
                  const std::string& target = "/v1/chat/completions", int gap_timeout_ms = 30000) {
    servedeck::http::ClientRequest r;
    r.port = port_;
    r.method = "POST";
    r.target = target;
    r.body = body;
    r.timeout_ms = gap_timeout_ms;
    Received out;
    servedeck::sse::Parser p;
    auto t0 = std::chrono::steady_clock::now();
    auto ms = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    try {
      servedeck::http::fetch_stream(
          r,
          [&](int s, const std::map<std::string, std::string>& h) {
            out.status = s;
            out.headers = h;
          },
          [&](std::string_view c) {
            out.raw.append(c);
            for (auto& e : p.feed(c)) {
              (e.comment ? out.comments : out.data).push_back(e.data);
              (e.comment ? out.comment_ms : out.data_ms).push_back(ms());
            }
            return keep_going ? keep_going(out) : true;
          });
    } catch (const std::exception& e) {
      out.client_error = e.what();
    }
    out.total_ms = ms();
    return out;
  }

  /// Writes the fake engine's script NAME.
  void script(const std::string& name, const json& s) { std::ofstream(dir_ + "/scripts/" + name + ".json") << s.dump(); }
  /// Every line of the fake engines' request log, parsed.
  std::vector<json> engine_log() const {
    std::vector<json> out;
    std::ifstream in(dir_ + "/engine.jsonl");
    for (std::string l; std::getline(in, l);) {
      auto j = json::parse(l, nullptr, false);
      if (!j.is_discarded()) out.push_back(j);
    }
    return out;
  }
  /// The body of the last completion request the engine received whose last user message is
  /// "script:NAME" (null when none).
  json engine_request(const std::string& name) const {
    json found;
    for (const auto& l : engine_log()) {
      if (!l.contains("body") || !l["body"].contains("messages")) continue;
      for (const auto& m : l["body"]["messages"])
        if (m.value("role", "") == "user" && m.contains("content") && m["content"] == "script:" + name) found = l["body"];
    }
    return found;
  }
  /// The engine's report of how script NAME's answer ended (null when it has not yet).
  json script_report(const std::string& name) const {
    json found;
    for (const auto& l : engine_log())
      if (l.value("script", "") == name) found = l;
    return found;
  }

  /// A value from /metrics: the first line starting with `series` ("name{labels}" or "name").
  std::optional<double> metric(const std::string& series) {
    auto r = get("/metrics");
    std::istringstream in(r.body);
    for (std::string l; std::getline(in, l);)
      if (l.rfind(series + " ", 0) == 0) return std::stod(l.substr(series.size() + 1));
    return std::nullopt;
  }

  /// True when servedeck_in_flight_requests is 0 within 3 s (a call's row is written just after
  /// the client saw its end); a gauge left above or below 0 (a call recorded twice) stays false.
  bool in_flight_settles() {
    return sdtest::wait_for([&] { return metric("servedeck_in_flight_requests") == 0; }, 3000);
  }

  /// Runs the servedeck CLI against this daemon's config, stdout and stderr captured.
  sdtest::Run cli(const std::string& args) const {
    return sdtest::cli_cmd(std::string(SERVEDECK_CLI) + " --config " + config_ + " " + args + " 2>&1");
  }

  /// A plain scripted streamed turn still gets a complete answer: the daemon keeps serving.
  void check_still_serving(const std::string& model) {
    script("still_serving", stream_script({content_chunk("still "), content_chunk("here")}));
    auto r = stream(chat_body(model, script_messages("still_serving"), true));
    CHECK_MESSAGE(r.status == 200, log());
    CHECK(r.delta_text() == "still here");
    CHECK(r.done());
    CHECK(alive());
  }

  bool alive() const { return proc_ && !proc_->exit_status().has_value() && sdtest::alive(proc_->pid()); }

  /// Stops the daemon, then SIGKILLs any engine it left (one that died, or was killed, leaves
  /// its engine running): every process whose command line names this rig's directory.
  void clean_up() {
    stop();
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(e.path() / "cmdline");
      std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (cmdline.find(dir_ + "/") != std::string::npos) ::kill(static_cast<pid_t>(std::stol(name)), SIGKILL);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string log() const { return servedeck::supervisor::tail_lines(dir_ + "/daemon.log", 60); }
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  const std::string& config() const { return config_; }

 private:
  Options opt_;
  std::string dir_, config_;
  int port_ = 0;
  int log_fd_ = -1;
  std::shared_ptr<servedeck::supervisor::EngineProcess> proc_;
};

}  // namespace sdtest::daemon
