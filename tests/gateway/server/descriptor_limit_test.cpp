#include <doctest/doctest.h>

#include <sys/resource.h>

#include "gateway/server/descriptor_limit.hpp"

using namespace servedeck::gateway;

TEST_CASE("max_connections fits the descriptor limit: half of what the daemon's own files leave, at least 4") {
  CHECK(connections_for_descriptors(1024, 4096) == (1024 - k_reserved_descriptors) / 2);
  CHECK(connections_for_descriptors(524288, 4096) == 4096);  // systemd's default hard limit: unchanged
  CHECK(connections_for_descriptors(300, 4096) == 22);
  CHECK(connections_for_descriptors(100, 4096) == 4);        // too few to run well, still answers
  CHECK(connections_for_descriptors(1024, 10) == 10);
}

TEST_CASE("raise_descriptor_limit leaves the soft limit at the hard one and says so") {
  const DescriptorLimit l = raise_descriptor_limit();
  CHECK(l.error.empty());
  rlimit rl{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  CHECK(l.soft == rl.rlim_cur);
  CHECK(l.soft >= l.soft_before);
  if (rl.rlim_max != RLIM_INFINITY) CHECK(l.soft == rl.rlim_max);
  CHECK(describe(DescriptorLimit{1024, 524288, 524288, ""}, 4096) ==
        "descriptors: soft limit 1024 raised to 524288 (hard 524288); max_connections 4096 (256 kept for the daemon, "
        "two per proxied connection)");
  CHECK(describe(DescriptorLimit{1024, 1024, 1024, ""}, 384).find("soft limit 1024 (hard 1024); max_connections 384") !=
        std::string::npos);
}
