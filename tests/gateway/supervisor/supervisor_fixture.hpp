// A Supervisor over a registry built in code whose models run tests/support/fake_engine with
// different switches; a temp state dir and a temp shm dir.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/http/client.hpp"
#include "gateway/state/store.hpp"
#include "gateway/supervisor/supervisor.hpp"
#include "preflight/preflight.hpp"
#include "registry/registry.hpp"
#include "test_util.hpp"

namespace sdtest {

/// Readings of a machine without a GPU (the supervisor only needs the interface).
class NoGpuReadings : public servedeck::preflight::Readings {
 public:
  std::optional<double> mem_available_gib() override { return 64.0; }
  std::optional<double> gpu_total_gib(int) override { return std::nullopt; }
  std::optional<double> gpu_used_gib(int) override { return std::nullopt; }
  std::optional<int> gpu_compute_capability(int) override { return std::nullopt; }
  std::vector<servedeck::preflight::GpuProcess> gpu_processes(int) override { return {}; }
  std::string gpu_error() override { return "no GPU (test)"; }
  std::optional<double> shm_free_gib() override { return 10.0; }
  std::optional<int> ptrace_scope() override { return 0; }
  std::optional<double> memlock_limit_gib() override { return 1e9; }
  // The real file system: the fake engine exists, a program the test names but never wrote does not.
  bool path_exists(const std::string& p) override { return ::access(p.c_str(), F_OK) == 0; }
  bool is_executable(const std::string& p) override { return ::access(p.c_str(), X_OK) == 0; }
};

/// Collects progress lines (thread-safe).
struct Lines {
  std::mutex mu;
  std::vector<std::string> v;
  servedeck::supervisor::Progress sink() {
    return [this](const std::string& s) {
      std::lock_guard lk(mu);
      v.push_back(s);
    };
  }
  bool any(const std::string& needle) {
    std::lock_guard lk(mu);
    for (const auto& s : v)
      if (s.find(needle) != std::string::npos) return true;
    return false;
  }
  std::string all() {
    std::lock_guard lk(mu);
    std::string out;
    for (const auto& s : v) out += s + "\n";
    return out;
  }
};

/// A GPU whose processes hold 512 MiB until `held_until_ms` (epoch ms), then nothing.
class FakeGpuProbe : public servedeck::supervisor::GpuMemoryProbe {
 public:
  explicit FakeGpuProbe(std::shared_ptr<std::atomic<int64_t>> held_until) : held_until_(std::move(held_until)) {}
  std::optional<double> used_mib(const std::vector<int64_t>& pids) override {
    if (pids.empty()) return 0.0;
    return servedeck::state::now_ms() < held_until_->load() ? 512.0 : 0.0;
  }

 private:
  std::shared_ptr<std::atomic<int64_t>> held_until_;
};

struct Fixture {
  std::string state_dir = temp_dir("state");
  std::string shm_dir = temp_dir("shm");
  servedeck::registry::Registry reg;
  NoGpuReadings readings;
  std::unique_ptr<servedeck::state::Store> store = std::make_unique<servedeck::state::Store>(state_dir);
  std::unique_ptr<servedeck::supervisor::Supervisor> sup;
  std::atomic<bool> refuse_preflight{false};
  bool fake_gpu = false;  // make(): FakeGpuProbe instead of NoGpuProbe
  bool real_preflight = false;  // make(): preflight::run_preflight on `readings` instead of the one-row fake
  /// make(): SupervisorOptions::cgroup_parent (nullopt: the daemon's default; "": no launch cgroups).
  std::optional<std::string> cgroup_parent;
  Lines daemon_log;             // SupervisorOptions::log
  std::shared_ptr<std::atomic<int64_t>> gpu_held_until = std::make_shared<std::atomic<int64_t>>(0);

  Fixture() {
    reg.path = "test-models.toml";
    reg.server.state_dir = state_dir;
    reg.server.log_keep = 3;
  }
  ~Fixture() {
    gpu_held_until->store(0);
    if (sup) sup->stop("test end");
    sup.reset();
    store.reset();
    std::filesystem::remove_all(state_dir);
    std::filesystem::remove_all(shm_dir);
  }

  /// Adds a model running the fake engine with `extra` switches.
  servedeck::registry::ModelEntry& add(const std::string& name, std::vector<std::string> extra = {}) {
    servedeck::registry::ModelEntry m;
    m.name = name;
    m.served_name = name + "-served";
    m.engine = servedeck::registry::EngineKind::command;
    m.program = fake_engine();
    m.args = {"--port", "{port}", "--served-name", "{served_name}"};
    m.args.insert(m.args.end(), extra.begin(), extra.end());
    m.ctx = 4096;
    m.start_timeout_s = 10;
    m.stop_timeout_s = 2;
    m.drain_timeout_s = 10;
    m.vram_release_timeout_s = 1;
    m.shm_globs = {"/dev/shm/sdtest-*"};
    reg.models.push_back(m);
    return reg.models.back();
  }

  servedeck::supervisor::Supervisor& make() {
    servedeck::supervisor::SupervisorOptions opt;
    opt.state_dir = state_dir;
    opt.shm_dir = shm_dir;
    opt.poll_ms = 50;
    opt.kill_wait_ms = 3000;
    opt.cgroup_parent = cgroup_parent;
    opt.log = daemon_log.sink();
    if (!real_preflight) opt.preflight = [this](const servedeck::registry::ModelEntry& m, int port) {
      servedeck::preflight::Report r;
      r.model = m.name;
      servedeck::preflight::CheckResult c;
      c.check = "host_ram";
      c.verdict = refuse_preflight ? servedeck::preflight::Verdict::refuse : servedeck::preflight::Verdict::pass;
      c.reading = "MemAvailable 64.0 GiB";
      c.limit = refuse_preflight ? "host_ram_gib 155 GiB" : "host_ram_gib 1 GiB";
      c.message = refuse_preflight ? "MemAvailable 64.0 GiB < host_ram_gib 155 GiB" : "ok";
      r.checks.push_back(c);
      r.launch = servedeck::registry::render_launch(m, port, reg.server);
      return r;
    };
    sup = std::make_unique<servedeck::supervisor::Supervisor>(
        reg, *store, readings,
        fake_gpu ? std::unique_ptr<servedeck::supervisor::GpuMemoryProbe>(std::make_unique<FakeGpuProbe>(gpu_held_until))
                 : std::make_unique<servedeck::supervisor::NoGpuProbe>(),
        opt);
    return *sup;
  }
};

/// HTTP status of GET /health on 127.0.0.1:port, 0 when nothing answers within 2 s.
inline int health_status(int port) {
  try {
    servedeck::http::ClientRequest r;
    r.port = port;
    r.target = "/health";
    r.timeout_ms = 2000;
    return servedeck::http::fetch(r).status;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace sdtest
