// Gateway overhead benchmark (issue 3): a fast in-process engine-like server, measured directly
// and through the gateway, in one run:
//   1. added latency of a small non-streaming request (p50, p99) over one keep-alive connection;
//   2. streamed events per second through one connection;
//   3. N concurrent streams (default 500), every byte checked.
// Each figure is printed beside the direct one with the ratio. Targets: < 0.5 ms p50 and
// < 2 ms p99 added; every stream delivered whole.
//
// usage: servedeck_gateway_bench [--requests N] [--events N] [--streams N] [--stream-events N]
#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/http/server.hpp"
#include "common/sse.hpp"
#include "gateway/server/gateway.hpp"
#include "gateway/state/store.hpp"

using namespace servedeck;
using nlohmann::json;
using clock_type = std::chrono::steady_clock;
namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

namespace {

std::string event_json(int i) {
  return R"({"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{"content":"tok)" +
         std::to_string(i) + R"( "},"finish_reason":null}]})";
}
const std::string k_role =
    R"({"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]})";
const std::string k_finish =
    R"({"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})";
const std::string k_small =
    R"({"id":"chatcmpl-b","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})";

std::string expected_content(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "tok" + std::to_string(i) + " ";
  return s;
}

/// Paced streams: one event per stream per tick (so that many streams are in flight at once).
class Pacer {
 public:
  explicit Pacer(int tick_us) : tick_us_(tick_us), thread_([this] { run(); }) {}
  ~Pacer() {
    stop_ = true;
    thread_.join();
  }
  void add(std::shared_ptr<http::Responder> res, int events) {
    std::lock_guard lk(mu_);
    streams_.push_back({std::move(res), events, 0});
  }

 private:
  struct S {
    std::shared_ptr<http::Responder> res;
    int events;
    int next;
  };
  void run() {
    while (!stop_) {
      std::vector<S> batch;
      {
        std::lock_guard lk(mu_);
        batch.swap(streams_);
      }
      std::vector<S> keep;
      for (auto& s : batch) {
        if (s.next < s.events) {
          s.res->write(sse::format_data(event_json(s.next++)));
          keep.push_back(std::move(s));
        } else {
          s.res->write(sse::format_data(k_finish) + std::string(sse::k_done));
          s.res->end();
        }
      }
      {
        std::lock_guard lk(mu_);
        for (auto& s : keep) streams_.push_back(std::move(s));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(tick_us_));
    }
  }
  int tick_us_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<S> streams_;
  std::thread thread_;
};

/// The engine: non-streaming → k_small at once; streaming with `n_events` → written at once;
/// with `paced: true` → through the Pacer.
struct Engine {
  Engine()
      : pacer(1000), server([] {
          http::ServerOptions o;
          o.threads = 2;
          o.max_pending_write_bytes = 1u << 30;
          o.max_connections = 100000;
          return o;
        }(),
               [this](http::Request req, std::shared_ptr<http::Responder> res) { handle(req, res); }) {
    server.start();
  }
  void handle(const http::Request& req, const std::shared_ptr<http::Responder>& res) {
    json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.value("stream", false)) return res->send(200, "application/json", k_small);
    int n = body.value("n_events", 10);
    res->start_stream(200);
    res->write(sse::format_data(k_role));
    if (body.value("paced", false)) return pacer.add(res, n);
    std::string batch;
    for (int i = 0; i < n; ++i) {
      batch += sse::format_data(event_json(i));
      if (batch.size() > 16384) {
        res->write(batch);
        batch.clear();
      }
    }
    batch += sse::format_data(k_finish);
    batch += sse::k_done;
    res->write(batch);
    res->end();
  }
  Pacer pacer;
  http::Server server;
};

class ReadySlot : public gateway::SlotControl {
 public:
  explicit ReadySlot(int port) : port_(port) {}
  gateway::SlotSnapshot snapshot() const override {
    gateway::SlotSnapshot s;
    s.state = gateway::SlotState::ready;
    s.model = "bench";
    s.host = "127.0.0.1";
    s.port = port_;
    return s;
  }
  gateway::Lease acquire(const std::string& model) override {
    return model == "bench" ? gateway::Lease(new int(0), [](void* p) { delete static_cast<int*>(p); }) : nullptr;
  }
  void ensure_running(const std::string& model, std::function<void(gateway::Lease, std::string)> done) override {
    done(acquire(model), "");
  }

 private:
  int port_;
};

/// A keep-alive client on one connection (synchronous Beast).
class KeepAliveClient {
 public:
  explicit KeepAliveClient(int port) : stream_(ioc_) {
    stream_.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    stream_.socket().set_option(asio::ip::tcp::no_delay(true));
  }
  int post(const std::string& body, std::string& out) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/chat/completions", 11};
    req.set(bhttp::field::host, "127.0.0.1");
    req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    bhttp::write(stream_, req);
    bhttp::response<bhttp::string_body> res;
    bhttp::read(stream_, buf_, res);
    out = std::move(res.body());
    return static_cast<int>(res.result_int());
  }

 private:
  asio::io_context ioc_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buf_;
};

struct Latency {
  double p50_ms = 0, p99_ms = 0;
  int errors = 0;
};

Latency measure_latency(int port, int n) {
  KeepAliveClient c(port);
  std::string body = R"({"model":"bench","stream":false,"messages":[{"role":"user","content":"hi"}]})";
  std::string out;
  Latency l;
  for (int i = 0; i < n / 10; ++i) c.post(body, out);  // warm-up
  std::vector<double> ms;
  ms.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto t0 = clock_type::now();
    int status = c.post(body, out);
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
    if (status != 200 || out.find("\"ok\"") == std::string::npos) ++l.errors;
  }
  std::sort(ms.begin(), ms.end());
  l.p50_ms = ms[ms.size() / 2];
  l.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  return l;
}

/// Streams one request; returns the number of content events and whether everything arrived.
struct StreamResult {
  int events = 0;
  bool complete = false;
};

StreamResult stream_once(int port, int n_events, bool paced) {
  http::ClientRequest r;
  r.port = port;
  r.method = "POST";
  r.target = "/v1/chat/completions";
  r.timeout_ms = 60000;
  r.body = R"({"model":"bench","stream":true,"n_events":)" + std::to_string(n_events) + R"(,"paced":)" +
           (paced ? "true" : "false") + R"(,"messages":[{"role":"user","content":"hi"}]})";
  sse::Parser p;
  std::string content;
  StreamResult out;
  bool done = false;
  bool finished = false;
  try {
    http::fetch_stream(r, nullptr, [&](std::string_view chunk) {
      for (auto& e : p.feed(chunk)) {
        if (e.comment) continue;
        if (e.data == "[DONE]") {
          done = true;
          continue;
        }
        json j = json::parse(e.data, nullptr, false);
        if (!j.is_object() || !j.contains("choices") || j["choices"].empty()) continue;
        const auto& c = j["choices"][0];
        if (c.contains("delta") && c["delta"].contains("content")) {
          content += c["delta"]["content"].get<std::string>();
          ++out.events;
        }
        if (c.contains("finish_reason") && c["finish_reason"] == "stop") finished = true;
      }
      return true;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stream failed: %s\n", e.what());
  }
  out.complete = done && finished && content == expected_content(n_events);
  return out;
}

struct Throughput {
  double events_per_s = 0;
  bool complete = false;
};

Throughput measure_events(int port, int n) {
  auto t0 = clock_type::now();
  auto r = stream_once(port, n, false);
  double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  return {r.events / s, r.complete && r.events == n};
}

struct Concurrent {
  double wall_s = 0;
  int complete = 0;
  int64_t events = 0;
};

Concurrent measure_concurrent(int port, int streams, int events) {
  std::vector<std::thread> threads;
  std::atomic<int> complete{0};
  std::atomic<int64_t> total{0};
  auto t0 = clock_type::now();
  for (int i = 0; i < streams; ++i)
    threads.emplace_back([&] {
      auto r = stream_once(port, events, true);
      total += r.events;
      if (r.complete) ++complete;
    });
  for (auto& t : threads) t.join();
  return {std::chrono::duration<double>(clock_type::now() - t0).count(), complete.load(), total.load()};
}

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  int requests = arg(argc, argv, "--requests", 5000);
  int events = arg(argc, argv, "--events", 200000);
  int streams = arg(argc, argv, "--streams", 500);
  int stream_events = arg(argc, argv, "--stream-events", 100);

  // 500 streams need ~4 descriptors each in this one process (client, gateway in/out, engine).
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);

  Engine engine;
  registry::Registry reg;
  registry::ModelEntry m;
  m.name = "bench";
  m.served_name = "bench";
  m.ctx = 32768;
  reg.models.push_back(m);
  std::string tmpl = (std::filesystem::temp_directory_path() / "servedeck-bench-XXXXXX").string();
  std::string dir = mkdtemp(tmpl.data());
  int rc = 0;
  {
    state::Store store(dir);
    ReadySlot slot(engine.server.port());
    gateway::GatewayOptions opt;
    opt.threads = 2;
    gateway::Gateway gw(reg, store, slot, opt);
    gw.start();
    int direct = engine.server.port();
    int via = gw.port();
    std::printf("servedeck gateway benchmark (%u hardware threads; gateway 2+2 threads, engine 2)\n",
                std::thread::hardware_concurrency());

    auto ld = measure_latency(direct, requests);
    auto lg = measure_latency(via, requests);
    std::printf("\n1. small non-streaming request, %d sequential on one keep-alive connection\n", requests);
    std::printf("   %-8s %10s %10s %10s\n", "", "direct", "gateway", "ratio");
    std::printf("   %-8s %8.3f ms %8.3f ms %9.2fx   added %.3f ms (target < 0.5)\n", "p50", ld.p50_ms, lg.p50_ms,
                lg.p50_ms / ld.p50_ms, lg.p50_ms - ld.p50_ms);
    std::printf("   %-8s %8.3f ms %8.3f ms %9.2fx   added %.3f ms (target < 2)\n", "p99", ld.p99_ms, lg.p99_ms,
                lg.p99_ms / ld.p99_ms, lg.p99_ms - ld.p99_ms);
    std::printf("   errors: direct %d, gateway %d\n", ld.errors, lg.errors);

    auto td = measure_events(direct, events);
    auto tg = measure_events(via, events);
    std::printf("\n2. one stream of %d events\n", events);
    std::printf("   direct %.0f events/s, gateway %.0f events/s, ratio %.2f; complete: direct %s, gateway %s\n",
                td.events_per_s, tg.events_per_s, tg.events_per_s / td.events_per_s, td.complete ? "yes" : "NO",
                tg.complete ? "yes" : "NO");

    auto cd = measure_concurrent(direct, streams, stream_events);
    auto cg = measure_concurrent(via, streams, stream_events);
    std::printf("\n3. %d concurrent streams x %d events (paced 1 event/ms/stream)\n", streams, stream_events);
    std::printf("   direct: %d/%d complete, %lld events, %.2f s\n", cd.complete, streams,
                static_cast<long long>(cd.events), cd.wall_s);
    std::printf("   gateway: %d/%d complete, %lld events, %.2f s (wall ratio %.2f)\n", cg.complete, streams,
                static_cast<long long>(cg.events), cg.wall_s, cg.wall_s / cd.wall_s);
    bool ok = lg.errors == 0 && tg.complete && cg.complete == streams;
    std::printf("\n%s\n", ok ? "all delivered" : "LOSS OR ERRORS (see above)");
    rc = ok ? 0 : 1;
    gw.stop();
  }
  std::filesystem::remove_all(dir);
  return rc;
}
