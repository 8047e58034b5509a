// Registry keys the supervisor reads: log_max_bytes up to its documented maximum, the liveness
// keys and restart_on_failure, and /dev/shm globs that would reach other programs' files.
#include <doctest/doctest.h>

#include <string>

#include "registry/registry.hpp"
#include "registry/shm_glob.hpp"

using namespace servedeck::registry;

namespace {

const char* kModel = R"([models.m]
engine = "native"
program = "servedeck-worker"
ctx = 1024
)";

std::string errors_of(const std::string& text) {
  std::vector<Diagnostic> d;
  parse_registry(text, "models.toml", d);
  std::string out;
  for (const auto& x : d)
    if (x.severity == "error") out += x.to_string() + "\n";
  return out;
}

}  // namespace

TEST_CASE("server.log_max_bytes takes its documented maximum (2^31) without overflowing") {
  Registry reg = parse_registry(std::string("[server]\nlog_max_bytes = 2147483648\n") + kModel, "models.toml");
  CHECK(reg.server.log_max_bytes == 2147483648LL);
  CHECK(reg.server.log_max_bytes > 0);
  CHECK(errors_of(std::string("[server]\nlog_max_bytes = 2147483649\n") + kModel).find("log_max_bytes") !=
        std::string::npos);
}

TEST_CASE("liveness keys and restart_on_failure: defaults, values, ranges") {
  Registry d = parse_registry(kModel, "models.toml");
  CHECK(d.models[0].liveness_interval_s == 10);
  CHECK(d.models[0].liveness_idle_s == 60);
  CHECK(d.models[0].liveness_timeout_s == 30);
  CHECK_FALSE(d.models[0].restart_on_failure);
  Registry r = parse_registry(std::string(kModel) +
                                  "liveness_interval_s = 0\nliveness_idle_s = 5\nliveness_timeout_s = 2\n"
                                  "restart_on_failure = true\n",
                              "models.toml");
  CHECK(r.models[0].liveness_interval_s == 0);
  CHECK(r.models[0].liveness_idle_s == 5);
  CHECK(r.models[0].liveness_timeout_s == 2);
  CHECK(r.models[0].restart_on_failure);
  CHECK(errors_of(std::string(kModel) + "liveness_timeout_s = 0\n").find("models.m.liveness_timeout_s") !=
        std::string::npos);
}

TEST_CASE("shm_globs that would reach other programs' files are refused with the reason") {
  for (const char* glob : {"/dev/shm/*", "/dev/shm/?*", "/dev/shm/a*", "/dev/shm/*-kv", "/dev/shm/[a-z]*"}) {
    CAPTURE(glob);
    std::string e = errors_of(std::string(kModel) + "shm_globs = [\"" + glob + "\"]\n");
    CHECK(e.find("models.m.shm_globs[0] = \"" + std::string(glob) + "\" is too broad") != std::string::npos);
    CHECK(e.find("at least 3 literal characters") != std::string::npos);
  }
  CHECK(errors_of(std::string(kModel) + "shm_globs = [\"/dev/shm/sub/kv-*\"]\n").find("directly in /dev/shm/") !=
        std::string::npos);
  CHECK(errors_of(std::string(kModel) + "shm_globs = [\"/tmp/kv-*\"]\n").find("must start with /dev/shm/") !=
        std::string::npos);
  CHECK(errors_of(std::string(kModel) + "shm_globs = [\"/dev/shm/flashnext-kv-*\", \"/dev/shm/abc?\"]\n").empty());
  CHECK_FALSE(shm_glob_problem("/dev/shm/vllm-*"));
}

TEST_CASE("server.shm_keep_unverifiable: off by default, a boolean") {
  CHECK_FALSE(parse_registry(kModel, "models.toml").server.shm_keep_unverifiable);
  CHECK(parse_registry(std::string("[server]\nshm_keep_unverifiable = true\n") + kModel, "models.toml")
            .server.shm_keep_unverifiable);
  CHECK(errors_of(std::string("[server]\nshm_keep_unverifiable = \"yes\"\n") + kModel).find("shm_keep_unverifiable") !=
        std::string::npos);
}
