// One proxied call is recorded exactly once: the request log row, the requests counter and the
// in-flight gauge, whichever way it ends. Driven through start_proxy with a Responder whose
// client goes away at a chosen write while its disconnect callback is still on its way (the race
// of a client hanging up as the stream ends).
#include <doctest/doctest.h>

#include <utility>  // before Boost.Asio: boost 1.74 awaitable.hpp needs std::exchange

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio.hpp>

#include "gateway/server/metrics.hpp"
#include "gateway/server/proxy.hpp"
#include "tests/gateway/server/gateway_rig.hpp"

using namespace servedeck;
using namespace servedeck::test::gateway_rig;

namespace {

/// A client that is gone from the write whose bytes contain `gone_at` on (write returns false);
/// the disconnect callback is kept, never run, as if it were still queued.
class HangingUpResponder final : public http::Responder {
 public:
  explicit HangingUpResponder(std::string gone_at) : gone_at_(std::move(gone_at)) {}
  void send(int status, std::string, std::string body, http::Headers) override {
    std::lock_guard lk(mu_);
    status_ = status;
    body_ += body;
    finished_ = true;
  }
  bool start_stream(int status, std::string, http::Headers) override {
    std::lock_guard lk(mu_);
    status_ = status;
    return !gone_;
  }
  bool write(std::string_view bytes) override {
    std::lock_guard lk(mu_);
    if (gone_ || bytes.find(gone_at_) != std::string_view::npos) {
      gone_ = true;
      finished_ = true;
      return false;
    }
    body_ += bytes;
    return true;
  }
  void end() override {
    std::lock_guard lk(mu_);
    finished_ = true;
  }
  bool client_gone() const override {
    std::lock_guard lk(mu_);
    return gone_;
  }
  void on_disconnect(std::function<void()> cb) override {
    std::lock_guard lk(mu_);
    disconnect_ = std::move(cb);
  }
  bool finished() const {
    std::lock_guard lk(mu_);
    return finished_;
  }
  /// Drops the kept callback (it holds the call, which holds this responder).
  void forget_disconnect() {
    std::lock_guard lk(mu_);
    disconnect_ = nullptr;
  }

 private:
  mutable std::mutex mu_;
  std::string gone_at_;
  std::string body_;
  int status_ = 0;
  bool gone_ = false;
  bool finished_ = false;
  std::function<void()> disconnect_;
};

}  // namespace

TEST_CASE("a client gone on the stream's last write is recorded once: 499, in-flight back to 0") {
  test::FakeEngine engine;
  engine.push(test::sse_script({role_ev(), content_ev("hi"), finish_ev(), "[DONE]"}, 1000));
  boost::asio::io_context ioc;
  auto work = boost::asio::make_work_guard(ioc);
  std::thread io([&] { ioc.run(); });
  gateway::Metrics metrics;
  gateway::ProxyShared shared;
  shared.upstream_ioc = &ioc;
  shared.metrics = &metrics;
  registry::ModelEntry model;
  model.name = "m";
  model.served_name = "m-served";
  model.ctx = 4096;

  for (const std::string gone_at : {"[DONE]", "\"hi\""}) {
    CAPTURE(gone_at);
    auto res = std::make_shared<HangingUpResponder>(gone_at);
    gateway::ProxyJob job;
    job.model = &model;
    job.requested_id = "m-served";
    job.body = json::parse(chat("m-served"));
    job.engine_port = engine.port();
    job.res = res;
    const int64_t before = metrics.requests("m", 499);
    gateway::start_proxy(shared, std::move(job));
    REQUIRE(wait_for([&] { return res->finished() && metrics.requests("m", 499) > before; }, 5000));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a second record would land by now
    CHECK(metrics.in_flight() == 0);
    CHECK(metrics.requests("m", 499) == before + 1);
    CHECK(metrics.requests("m", 200) == 0);
    res->forget_disconnect();
  }
  work.reset();
  ioc.stop();
  io.join();
}
