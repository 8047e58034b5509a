#include "gateway/supervisor/supervisor.hpp"

#include <doctest/doctest.h>
#include <signal.h>

#include <thread>

#include "common/http/client.hpp"
#include "supervisor_fixture.hpp"

using namespace servedeck;
using gateway::SlotState;
using sdtest::Fixture;
using sdtest::Lines;

namespace {
using sdtest::health_status;
}  // namespace

TEST_CASE("supervisor: switch A -> B stops A completely, starts B, records both launches") {
  Fixture f;
  f.add("a");
  f.add("b");
  auto& sup = f.make();
  CHECK(sup.snapshot().state == SlotState::stopped);
  Lines lines;
  auto r = sup.switch_to("a", lines.sink());
  REQUIRE_MESSAGE(r.ok, r.error);
  auto s = sup.snapshot();
  CHECK(s.state == SlotState::ready);
  CHECK(s.model == "a");
  CHECK(s.pid > 0);
  CHECK(health_status(s.port) == 200);
  CHECK(lines.any("preflight: "));
  CHECK(lines.any("starting a: pid"));
  CHECK(lines.any("ready in"));
  CHECK(sup.acquire("a") != nullptr);
  CHECK(sup.acquire("a-served") != nullptr);  // served name resolves to the same model
  CHECK(sup.acquire("b") == nullptr);
  int64_t pid_a = s.pid;
  int port_a = s.port;
  int64_t launch_a = s.launch_id;

  CHECK(sup.switch_to("a").ok);  // already ready: no restart
  CHECK(sup.snapshot().pid == pid_a);

  auto r2 = sup.switch_to("b-served", lines.sink());
  REQUIRE_MESSAGE(r2.ok, r2.error);
  s = sup.snapshot();
  CHECK(s.model == "b");
  CHECK(s.state == SlotState::ready);
  CHECK(s.pid != pid_a);
  CHECK_FALSE(sdtest::alive(pid_a));
  CHECK(health_status(port_a) == 0);
  auto la = f.store->launch(launch_a);
  REQUIRE(la);
  CHECK(la->state == "stopped");
  CHECK(la->why == "switch to b");
  CHECK(la->stop_ms >= la->ready_ms);
  CHECK(la->ready_ms >= la->start_ms);
  CHECK(la->argv.size() >= 3);
  CHECK(la->pid == pid_a);
  CHECK(la->pid_start_time > 0);
  CHECK(la->preflight["checks"].size() == 1);
  CHECK(la->preflight["checks"][0]["check"] == "host_ram");
  auto lb = f.store->launch(s.launch_id);
  REQUIRE(lb);
  CHECK(lb->state == "ready");
  CHECK(f.store->last_measured_memory("b", 4096).has_value());
  CHECK(f.store->last_measured_memory("b", 4096)->host_rss_gib > 0);

  auto st = sup.status_json();
  CHECK(st["state"] == "ready");
  CHECK(st["model"] == "b");
  CHECK(st["ctx"] == 4096);
  CHECK(st["host_rss_gib"].get<double>() > 0);
  CHECK(st["vram_gib"].is_null());

  auto unknown = sup.switch_to("nope");
  CHECK_FALSE(unknown.ok);
  CHECK(unknown.error.find("unknown model 'nope'") != std::string::npos);
  CHECK(unknown.error.find("a, b") != std::string::npos);
}

TEST_CASE("supervisor: a switch drains an in-flight stream before stopping its engine") {
  Fixture f;
  // ~1.5 s of stream after its first token: the switch below must find it still in flight.
  f.add("a", {"--chunks", "25", "--stream-delay-ms", "60"});
  f.add("b");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  int port = sup.snapshot().port;
  auto lease = sup.acquire("a");
  REQUIRE(lease);
  CHECK(sup.snapshot().in_flight == 1);
  std::string body;  // the client thread's until it is joined
  int status = 0;
  std::atomic<bool> started{false};
  std::atomic<bool> done{false};
  int64_t stream_end_ms = 0;
  std::thread client([&, lease]() mutable {
    http::ClientRequest r;
    r.port = port;
    r.method = "POST";
    r.target = "/v1/chat/completions";
    r.body = R"({"model":"a-served","stream":true,"messages":[{"role":"user","content":"hi"}]})";
    r.timeout_ms = 5000;
    try {
      http::fetch_stream(r, [&](int st, const auto&) { status = st; },
                         [&](std::string_view c) {
                           body += c;
                           if (body.find("tok1") != std::string::npos) started = true;
                           return true;
                         });
    } catch (const std::exception& e) {
      body += std::string("CLIENT ERROR ") + e.what();
    }
    started = true;
    stream_end_ms = state::now_ms();
    lease.reset();  // the request is over
    done = true;
  });
  lease.reset();
  // Let the stream begin, then switch. (Polling `body` itself raced with the client thread's
  // appends: ThreadSanitizer reported it, and a reallocation mid-find is a use-after-free.)
  REQUIRE(sdtest::wait_for([&] { return started.load(); }, 5000));
  Lines lines;
  auto r = sup.switch_to("b", lines.sink());
  client.join();
  REQUIRE_MESSAGE(r.ok, r.error);
  CHECK(status == 200);
  CHECK(body.find("tok24") != std::string::npos);
  CHECK(body.find("data: [DONE]") != std::string::npos);
  CHECK(lines.any("draining 1 in-flight request(s) on a"));
  CHECK(lines.any("drained"));
  auto launches = f.store->recent_launches(2);
  REQUIRE(launches.size() == 2);
  CHECK(launches[1].model == "a");
  CHECK(launches[1].stop_ms >= stream_end_ms);
  CHECK(sup.acquire("a") == nullptr);
}

TEST_CASE("supervisor: a failed start leaves the slot failed with the log tail; the retry succeeds") {
  Fixture f;
  f.add("bad", {"--slow-start-ms", "200", "--exit-during-start", "7"});
  f.add("good");
  auto& sup = f.make();
  Lines lines;
  auto r = sup.switch_to("bad", lines.sink());
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("exited during start with status 7") != std::string::npos);
  CHECK(r.error.find("CUDA out of memory") != std::string::npos);  // the engine's own words, from the log tail
  auto s = sup.snapshot();
  CHECK(s.state == SlotState::failed);
  CHECK(s.last_error.find("engine log tail") != std::string::npos);
  auto rec = f.store->launch(s.launch_id);
  REQUIRE(rec);
  CHECK(rec->state == "failed");
  REQUIRE(rec->exit_status);
  CHECK(*rec->exit_status == 7);
  CHECK(sup.acquire("bad") == nullptr);

  // The failed slot does not wedge: the same model is retried (and fails the same way), then another starts.
  CHECK_FALSE(sup.switch_to("bad").ok);
  auto ok = sup.switch_to("good");
  REQUIRE_MESSAGE(ok.ok, ok.error);
  CHECK(sup.snapshot().state == SlotState::ready);
  CHECK(sup.snapshot().last_error.empty());
}

TEST_CASE("supervisor: G26 health 200 but completions 500 is not ready") {
  Fixture f;
  f.add("oom", {"--health-ok-but-completions-fail"});
  auto& sup = f.make();
  Lines lines;
  auto r = sup.switch_to("oom", lines.sink());
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("health answered 200 but the one-token warm-up failed (HTTP 500)") != std::string::npos);
  CHECK(r.error.find("engine log tail") != std::string::npos);
  CHECK(lines.any("health 200; warm-up"));
  auto s = sup.snapshot();
  CHECK(s.state == SlotState::failed);
  auto rec = f.store->launch(s.launch_id);
  REQUIRE(rec);
  CHECK_FALSE(sdtest::alive(rec->pid));  // the half-working engine was stopped
  CHECK(rec->ready_ms == 0);
}

TEST_CASE("supervisor: G30 the start deadline is extended while the log shows load progress") {
  Fixture f;
  // The logging engine needs 3 s, past its 2 s start_timeout_s: it is ready only because each
  // progress line extends the deadline. (A 1 s window failed under load: on a busy 2-core box
  // the engine went silent for a second between two 100 ms progress lines.)
  auto& slow_logging = f.add("slow-logging", {"--slow-start-ms", "3000", "--log-progress"});
  slow_logging.start_timeout_s = 2;
  auto& slow_silent = f.add("slow-silent", {"--slow-start-ms", "2500"});
  slow_silent.start_timeout_s = 1;
  auto& sup = f.make();
  Lines lines;
  auto r = sup.switch_to("slow-logging", lines.sink());
  REQUIRE_MESSAGE(r.ok, (r.error + "\n" + lines.all()));
  CHECK(r.seconds >= 3.0);  // past start_timeout_s (2 s)
  CHECK(lines.any("loading: "));
  auto silent = sup.switch_to("slow-silent");
  CHECK_FALSE(silent.ok);
  CHECK(silent.error.find("not ready after") != std::string::npos);
  CHECK(silent.error.find("start_timeout_s = 1") != std::string::npos);
  // The failure was this attempt only: the logging model starts again.
  auto again = sup.switch_to("slow-logging");
  CHECK_MESSAGE(again.ok, again.error);
}

TEST_CASE("supervisor: SIGTERM ignored -> the group is killed; a setpgid grandchild is reaped too") {
  Fixture f;
  std::string gc_file = f.state_dir + "/gc.pid";
  auto& m = f.add("stubborn", {"--ignore-sigterm", "--fork-grandchild", "setpgid", "--grandchild-pid-file", gc_file});
  m.stop_timeout_s = 1;
  auto& sup = f.make();
  REQUIRE(sup.switch_to("stubborn").ok);
  int64_t pid = sup.snapshot().pid;
  int64_t gc = sdtest::read_pid_file(gc_file);
  REQUIRE(gc > 0);
  CHECK(sup.status_json()["processes"] == 2);
  Lines lines;
  auto r = sup.stop("test", lines.sink());
  REQUIRE_MESSAGE(r.ok, r.error);
  CHECK(lines.any("SIGKILL"));
  CHECK_FALSE(sdtest::alive(pid));
  CHECK_FALSE(sdtest::alive(gc));
  CHECK(sup.snapshot().state == SlotState::stopped);
  auto ev = f.store->recent_events(20);
  bool saw = false;
  for (const auto& e : ev)
    if (e["kind"] == "stop" && e["detail"]["sigkill"] == true) saw = true;
  CHECK(saw);
}

TEST_CASE("supervisor: liveness - an engine dying after ready sets failed; the next switch recovers") {
  Fixture f;
  f.add("flaky", {"--exit-after-ready-ms", "800"});
  f.add("good");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("flaky").ok);
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::failed; }, 5000));
  auto s = sup.snapshot();
  CHECK(s.last_error.find("exited after ready with status 3") != std::string::npos);
  CHECK(s.last_error.find("exiting on purpose") != std::string::npos);
  CHECK(sup.acquire("flaky") == nullptr);
  auto rec = f.store->launch(s.launch_id);
  REQUIRE(rec);
  CHECK(rec->state == "failed");
  CHECK(sup.switch_to("good").ok);
}

TEST_CASE("supervisor: preflight refusal stops the switch with the table; nothing is launched") {
  Fixture f;
  f.add("big");
  auto& sup = f.make();
  f.refuse_preflight = true;
  Lines lines;
  auto r = sup.switch_to("big", lines.sink());
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("preflight refused big") != std::string::npos);
  CHECK(r.error.find("155") != std::string::npos);
  CHECK(lines.any("preflight: "));
  CHECK(f.store->recent_launches(5).empty());
  CHECK(sup.snapshot().state == SlotState::failed);
  f.refuse_preflight = false;
  CHECK(sup.switch_to("big").ok);
}

TEST_CASE("supervisor: restore_previous_on_failed_start brings the previous model back") {
  Fixture f;
  f.reg.server.restore_previous_on_failed_start = true;
  f.add("a");
  f.add("bad", {"--exit-during-start", "1"});
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  Lines lines;
  auto r = sup.switch_to("bad", lines.sink());
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("previous model a restored") != std::string::npos);
  CHECK(lines.any("restoring the previous model a"));
  CHECK(sup.snapshot().state == SlotState::ready);
  CHECK(sup.snapshot().model == "a");
}

TEST_CASE("supervisor: concurrent ensure_running calls share one switch") {
  Fixture f;
  f.add("a", {"--slow-start-ms", "300"});
  auto& sup = f.make();
  std::atomic<int> oks{0}, calls{0};
  for (int i = 0; i < 3; ++i)
    sup.ensure_running("a", [&](gateway::Lease lease, std::string) {
      oks += lease != nullptr;  // each caller gets its own lease on the one launch
      ++calls;
    });
  REQUIRE(sdtest::wait_for([&] { return calls == 3; }, 10000));
  CHECK(oks == 3);
  CHECK(f.store->recent_launches(10).size() == 1);
}

TEST_CASE("supervisor: daemon restart adopts a live engine and reaps a dead one's files") {
  Fixture f;
  f.add("a", {"--hold-shm", f.shm_dir + "/sdtest-a"});
  std::string gc_file = f.state_dir + "/gc.pid";
  f.add("b", {"--hold-shm", f.shm_dir + "/sdtest-b", "--fork-grandchild", "setpgid", "--grandchild-pid-file",
              gc_file});

  // 1. The daemon dies while "a" is ready: the next daemon adopts it (same pid, no restart).
  auto& sup1 = f.make();
  REQUIRE(sup1.switch_to("a").ok);
  auto s1 = sup1.snapshot();
  f.sup.reset();  // daemon gone, engine left running
  REQUIRE(sdtest::alive(s1.pid));
  auto& sup2 = f.make();
  Lines lines;
  sup2.recover(lines.sink());
  auto s2 = sup2.snapshot();
  CHECK(s2.state == SlotState::ready);
  CHECK(s2.pid == s1.pid);
  CHECK(s2.launch_id == s1.launch_id);
  CHECK(lines.any("adopting a"));
  CHECK(std::filesystem::exists(f.shm_dir + "/sdtest-a"));  // still mapped by the adopted engine
  CHECK(sup2.acquire("a") != nullptr);

  // 2. Switch to "b", then the daemon dies and so does b's leader (its grandchild survives).
  REQUIRE(sup2.switch_to("b").ok);
  CHECK_FALSE(sdtest::alive(s1.pid));                          // the adopted engine was stopped...
  CHECK_FALSE(std::filesystem::exists(f.shm_dir + "/sdtest-a"));  // ...and its buffer reaped
  auto sb = sup2.snapshot();
  int64_t gc = sdtest::read_pid_file(gc_file);
  REQUIRE(gc > 0);
  f.sup.reset();
  ::kill(static_cast<pid_t>(sb.pid), SIGKILL);
  REQUIRE(sdtest::wait_for([&] { return !sdtest::alive(sb.pid); }, 3000));
  REQUIRE(sdtest::alive(gc));
  CHECK(std::filesystem::exists(f.shm_dir + "/sdtest-b"));

  auto& sup3 = f.make();
  Lines lines3;
  sup3.recover(lines3.sink());
  CHECK(sup3.snapshot().state == SlotState::stopped);
  CHECK_FALSE(sdtest::alive(gc));                               // the leftover grandchild is reaped
  CHECK_FALSE(std::filesystem::exists(f.shm_dir + "/sdtest-b"));  // and the dead engine's file
  CHECK(lines3.any("shm: reaped 1 file"));
  auto rec = f.store->launch(sb.launch_id);
  REQUIRE(rec);
  CHECK(rec->state == "stopped");
  CHECK(rec->why.find("gone at daemon start") != std::string::npos);
  CHECK(f.store->unfinished_launches().empty());
}

TEST_CASE("supervisor: stopped means the GPU memory was released; memory never released blocks the next launch") {
  Fixture f;
  f.fake_gpu = true;
  auto& a = f.add("a");
  a.vram_release_timeout_s = 1;
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  CHECK(sup.status_json()["vram_gib"] == doctest::Approx(0.0));

  // Released 600 ms after the stop begins: the stop waits for it.
  f.gpu_held_until->store(state::now_ms() + 600);
  Lines lines;
  auto t0 = state::now_ms();
  auto r = sup.stop("test", lines.sink());
  REQUIRE_MESSAGE(r.ok, r.error);
  CHECK(state::now_ms() - t0 >= 550);
  CHECK(lines.any("waiting for the GPU to release 512.0 MiB"));
  CHECK(lines.any("GPU memory released"));
  CHECK(sup.snapshot().state == SlotState::stopped);

  // Never released within vram_release_timeout_s: failed, and the next launch is blocked.
  REQUIRE(sup.switch_to("a").ok);
  int64_t pid = sup.snapshot().pid;
  f.gpu_held_until->store(state::now_ms() + 3600 * 1000);
  auto stuck = sup.stop("test");
  CHECK_FALSE(stuck.ok);
  CHECK(stuck.error.find("GPU memory not released 1 s after a exited: 512.0 MiB still held") != std::string::npos);
  CHECK(sup.snapshot().state == SlotState::failed);
  CHECK_FALSE(sdtest::alive(pid));
  CHECK(sup.status_json()["blocker"].get<std::string>().find("GPU memory not released") != std::string::npos);
  auto blocked = sup.switch_to("a");
  CHECK_FALSE(blocked.ok);
  CHECK(blocked.error.find("GPU memory not released") != std::string::npos);
  CHECK(f.store->recent_launches(10).size() == 2);  // nothing launched while blocked

  // Once the memory is back, the slot recovers.
  f.gpu_held_until->store(0);
  auto ok = sup.switch_to("a");
  REQUIRE_MESSAGE(ok.ok, ok.error);
  CHECK(sup.status_json()["blocker"] == "");
}

TEST_CASE("supervisor: G28 a request-triggered switch waits out the running model's min_residency_s") {
  Fixture f;
  auto& a = f.add("a");
  a.min_residency_s = 1;
  f.add("b");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  int64_t a_ready = f.store->latest_launch()->ready_ms;
  std::atomic<bool> done{false}, ok{false};
  sup.ensure_running("b", [&](gateway::Lease lease, std::string) {
    ok = lease != nullptr;
    done = true;
  });
  REQUIRE(sdtest::wait_for([&] { return done.load(); }, 10000));
  CHECK(ok);
  auto b = f.store->latest_launch();
  REQUIRE(b);
  CHECK(b->model == "b");
  CHECK(b->start_ms - a_ready >= 950);
  // The operator's switch is not held back by residency.
  auto& sup_ref = sup;
  f.reg.models[1].min_residency_s = 60;
  auto t0 = state::now_ms();
  REQUIRE(sup_ref.switch_to("a").ok);
  CHECK(state::now_ms() - t0 < 5000);
}

TEST_CASE("supervisor: an engine crashing mid-stream is noticed; the slot fails with its log tail") {
  Fixture f;
  f.add("crashy", {"--crash-mid-stream-after", "2"});
  auto& sup = f.make();
  REQUIRE(sup.switch_to("crashy").ok);
  int port = sup.snapshot().port;
  std::string body;
  http::ClientRequest r;
  r.port = port;
  r.method = "POST";
  r.target = "/v1/chat/completions";
  r.body = R"({"model":"crashy-served","stream":true,"messages":[{"role":"user","content":"hi"}]})";
  r.timeout_ms = 5000;
  try {
    http::fetch_stream(r, [](int, const auto&) {}, [&](std::string_view c) {
      body += c;
      return true;
    });
  } catch (const std::exception&) {
    // the connection may be reset by the crash
  }
  CHECK(body.find("data: [DONE]") == std::string::npos);
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::failed; }, 5000));
  CHECK(sup.snapshot().last_error.find("exited after ready with status 1") != std::string::npos);
  CHECK(sup.snapshot().last_error.find("crashing mid-stream after 2 chunks") != std::string::npos);
}

TEST_CASE("supervisor: stop during a long start abandons the start instead of waiting for it") {
  Fixture f;
  auto& slow = f.add("slow", {"--slow-start-ms", "30000", "--log-progress"});
  slow.start_timeout_s = 60;
  auto& sup = f.make();
  std::atomic<bool> done{false};
  std::string error;
  std::thread starter([&] {
    auto r = sup.switch_to("slow");
    error = r.error;
    done = true;
  });
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::starting; }, 5000));
  int64_t pid = sup.snapshot().pid;
  auto t0 = state::now_ms();
  auto r = sup.stop("operator");
  starter.join();
  CHECK(r.ok);
  CHECK(state::now_ms() - t0 < 10000);
  CHECK(error.find("start aborted by stop") != std::string::npos);
  CHECK_FALSE(sdtest::alive(pid));
  CHECK(sup.snapshot().state == SlotState::stopped);
}
