// Liveness after ready: an engine that answers /health but hangs on completions, or whose /health
// hangs, becomes `unhealthy` within a bounded time with the reason; a first-byte report from the
// proxy does the same; restart_on_failure restarts it; probes that pass again make it ready. The
// launch log stays bounded while the engine runs and while it is stopped.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>

#include "gateway/supervisor/supervisor.hpp"
#include "supervisor_fixture.hpp"

using namespace servedeck;
using gateway::SlotState;
using sdtest::Fixture;

namespace {

bool becomes(supervisor::Supervisor& sup, SlotState want, int timeout_ms) {
  return sdtest::wait_for([&] { return sup.snapshot().state == want; }, timeout_ms);
}

}  // namespace

TEST_CASE("liveness: health 200 but completions hang -> unhealthy after the idle probe's deadline") {
  Fixture f;
  auto& m = f.add("wedged", {"--completions-hang-after-ms", "300"});
  m.liveness_interval_s = 0;  // health stays 200 anyway
  m.liveness_idle_s = 1;
  m.liveness_timeout_s = 1;
  auto& sup = f.make();
  auto t0 = state::now_ms();
  REQUIRE(sup.switch_to("wedged").ok);
  REQUIRE(becomes(sup, SlotState::unhealthy, 8000));
  CHECK(state::now_ms() - t0 < 8000);  // idle 1 s + deadline 1 s, not first_byte_timeout_ms (600 s)
  auto s = sup.snapshot();
  CHECK(s.last_error.find("liveness: a one-token completion got no answer within 1000 ms") != std::string::npos);
  CHECK(sup.acquire("wedged") == nullptr);  // no new requests reach it
  CHECK(sdtest::health_status(s.port) == 200);
  auto st = sup.status_json();
  CHECK(st["state"] == "unhealthy");
  CHECK(st["pid"] == s.pid);  // still running, still ours
  bool event = false;
  for (const auto& e : f.store->recent_events(20))
    if (e["kind"] == "unhealthy" && e["model"] == "wedged") event = true;
  CHECK(event);
  CHECK(f.daemon_log.any("wedged is unhealthy: liveness"));
  // A switch (here: to the same model) takes it down and starts it again.
  auto again = sup.switch_to("wedged");
  CHECK_MESSAGE(again.ok, again.error);
  CHECK(sup.snapshot().pid != s.pid);
  CHECK_FALSE(sdtest::alive(s.pid));
}

TEST_CASE("liveness: a health endpoint that hangs -> unhealthy") {
  Fixture f;
  auto& m = f.add("mute", {"--health-hang-after-ms", "300"});
  m.liveness_interval_s = 1;
  m.liveness_idle_s = 0;
  m.liveness_timeout_s = 1;
  auto& sup = f.make();
  REQUIRE(sup.switch_to("mute").ok);
  REQUIRE(becomes(sup, SlotState::unhealthy, 8000));
  CHECK(sup.snapshot().last_error.find("liveness: GET /health got no answer within 1000 ms") != std::string::npos);
}

TEST_CASE("liveness: restart_on_failure restarts an unhealthy engine") {
  Fixture f;
  auto& m = f.add("wedged", {"--completions-hang-after-ms", "300"});
  m.liveness_interval_s = 0;
  m.liveness_idle_s = 1;
  m.liveness_timeout_s = 1;
  m.restart_on_failure = true;
  auto& sup = f.make();
  REQUIRE(sup.switch_to("wedged").ok);
  int64_t first = sup.snapshot().pid;
  REQUIRE(sdtest::wait_for([&] { return f.store->recent_launches(5).size() >= 2; }, 15000));
  REQUIRE(sdtest::wait_for([&] {
    auto s = sup.snapshot();
    return s.pid != first && s.pid != 0 && s.state == SlotState::ready;
  }, 15000));
  CHECK_FALSE(sdtest::alive(first));
  CHECK(f.daemon_log.any("restart_on_failure: restarting wedged"));
  auto old = f.store->recent_launches(5).back();
  CHECK(old.state == "stopped");
  CHECK(old.why == "switch to wedged");
}

TEST_CASE("liveness: the proxy's first-byte report makes the slot unhealthy; passing probes make it ready again") {
  Fixture f;
  auto& m = f.add("a");
  m.liveness_interval_s = 1;
  m.liveness_timeout_s = 2;
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  auto s = sup.snapshot();
  sup.report_unresponsive("a", s.port + 1, "no first byte within 5 ms");  // another engine's port: ignored
  CHECK(sup.snapshot().state == SlotState::ready);
  sup.report_unresponsive("a-served", s.port, "no first byte within 5 ms (first_byte_timeout_ms)");
  auto u = sup.snapshot();
  CHECK(u.state == SlotState::unhealthy);
  CHECK(u.last_error.find("a proxied request got no first byte in time: no first byte within 5 ms") !=
        std::string::npos);
  CHECK(sup.acquire("a") == nullptr);
  // This engine is fine: the next health + completion probe pair brings it back.
  REQUIRE(becomes(sup, SlotState::ready, 8000));
  CHECK(sup.snapshot().pid == s.pid);
  CHECK(sup.snapshot().last_error.empty());
  CHECK(sup.acquire("a") != nullptr);
}

TEST_CASE("monitor: rotating a large launch log does not hold the supervisor's mutex") {
  Fixture f;
  f.reg.server.log_max_bytes = 4096;
  f.add("a");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  const std::string log = sup.log_path();
  REQUIRE_FALSE(log.empty());
  // 128 MiB of log appear at once (renamed over the log's path), so the monitor's next tick
  // copies 128 MiB to <log>.1. How long such a copy takes here:
  const std::string big = f.state_dir + "/big.log";
  {
    std::ofstream out(big, std::ios::binary);
    std::string block(1 << 20, '\0');
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>('a' + i % 26);
    for (int i = 0; i < 128; ++i) out << block;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::filesystem::copy_file(big, big + ".copy");
  const auto copy_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove(big + ".copy");
  std::filesystem::rename(big, log);
  int64_t worst_us = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::error_code ec;
  while (std::chrono::steady_clock::now() < deadline) {
    auto s0 = std::chrono::steady_clock::now();
    (void)sup.snapshot();
    worst_us = std::max<int64_t>(
        worst_us, std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - s0).count());
    if (std::filesystem::file_size(log + ".1", ec) >= (128u << 20) && std::filesystem::file_size(log, ec) < 4096) break;
  }
  REQUIRE(std::filesystem::file_size(log + ".1", ec) >= (128u << 20));  // it did rotate
  INFO("copy of 128 MiB took " << copy_ms << " ms; slowest snapshot() during the rotation " << worst_us << " us");
  // A snapshot() that waited for the mutex waited for the whole copy; one that did not takes
  // microseconds (plus whatever the scheduler adds on a loaded box).
  if (copy_ms < 20) {
    MESSAGE("this disk copies 128 MiB in " << copy_ms << " ms: too fast to tell a held mutex from a free one");
  } else {
    CHECK(worst_us < copy_ms * 1000 / 2);
  }
}

TEST_CASE("stop: an engine flooding its log while it dies is held to log_max_bytes, during the stop and after") {
  Fixture f;
  f.reg.server.log_max_bytes = 1 << 20;
  auto& m = f.add("flood", {"--flood-on-sigterm"});
  m.stop_timeout_s = 2;  // ~128 MB written before the SIGKILL, unbounded
  auto& sup = f.make();
  REQUIRE(sup.switch_to("flood").ok);
  const std::string log = sup.log_path();
  REQUIRE_FALSE(log.empty());
  auto r = sup.stop("test");
  CHECK_MESSAGE(r.ok, r.error);
  std::error_code ec;
  const auto now_bytes = std::filesystem::file_size(log, ec);
  REQUIRE_FALSE(ec);
  CHECK(now_bytes <= (1u << 20));
  // The rotated copy holds at most one poll's worth (~50 ms, ~3 MB here) past the bound.
  const auto rotated = std::filesystem::file_size(log + ".1", ec);
  REQUIRE_FALSE(ec);  // it did rotate
  CHECK(rotated < (16u << 20));
}
