// The hot-expert profile through the CUDA backend: a launch whose --hot-profile and
// --capture-profile name one missing file warns and starts in id order, writes its
// routing there when it is destroyed, and the next launch fills its hot cache from that file and
// leaves the sum of both runs (worker/offload/expert_profile.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <string>

#include "tests/worker/cuda/gpu_test_support.hpp"
#include "worker/cuda/cuda_backend.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/tiny_model.hpp"
#include "worker/offload/expert_profile.hpp"

using namespace servedeck::worker;

namespace {

bool has_warning(const cuda::CudaBackend& b, const std::string& text) {
  const auto& w = b.warnings();
  return std::any_of(w.begin(), w.end(), [&](const std::string& s) { return s.find(text) != std::string::npos; });
}

uint64_t total(const offload::ExpertProfile& p) {
  uint64_t n = 0;
  for (const auto& row : p.counts) n = std::accumulate(row.begin(), row.end(), n);
  return n;
}

struct Routed {
  uint64_t picks = 0, hits = 0;
};

/// Decodes `steps` tokens greedily from an empty sequence (every token through the decode step,
/// which is what counts routing); the experts routed and how many were hot.
Routed decode(cuda::CudaBackend& b, int steps) {
  auto pool = gpu_test::make_pool(b, 64);
  gpu_test::Seq s(b, pool);
  const cuda::RoutingStats before = b.stats();
  int32_t t = 35;
  for (int i = 0; i < steps; ++i) t = s.greedy(t);
  const cuda::RoutingStats after = b.stats();
  return {after.hot_hits + after.misses - before.hot_hits - before.misses, after.hot_hits - before.hot_hits};
}

}  // namespace

TEST_CASE("a missing hot profile warns, is captured at exit, and the next launch fills from it and adds to it") {
  gpu_test::skip_without_gpu();
  const std::string dir = gpu_test::temp_dir("hot-profile");
  TinyModelOptions o;
  o.vocab_size = 1024;
  o.hidden_size = 128;
  o.num_experts = 8;
  o.top_k = 2;
  write_model(dir, o);
  Checkpoint ck = Checkpoint::open(dir);
  const std::string path = dir + "/state/hot-profiles/tiny.json";  // the directory does not exist yet
  cuda::CudaBackendOptions opt;
  opt.hot_fraction = 0.25;
  opt.profile_path = opt.capture_profile_path = path;

  Routed first, second;
  {
    auto b = cuda::make_cuda_backend(ck, opt);
    CHECK(has_warning(*b, "does not exist"));
    CHECK(has_warning(*b, "written there at exit"));
    first = decode(*b, 12);
    CHECK(first.picks > 0);
  }
  const auto p1 = offload::read_expert_profile(path);
  REQUIRE(p1.has_value());
  CHECK(p1->layout == offload::expert_profile_layout(static_cast<int>(p1->counts.size()), o.num_experts));
  CHECK(!p1->counts.empty());
  CHECK(total(*p1) == first.picks);

  {
    auto b = cuda::make_cuda_backend(ck, opt);
    CHECK_FALSE(has_warning(*b, "does not exist"));
    CHECK_FALSE(has_warning(*b, "captured at layout"));
    second = decode(*b, 12);
    // The same tokens route the same way (hot or not, the logits are bit-identical), and the
    // cache now holds each layer's most routed experts: at least the hits id order gave.
    CHECK(second.picks == first.picks);
    CHECK(second.hits >= first.hits);
  }
  const auto p2 = offload::read_expert_profile(path);
  REQUIRE(p2.has_value());
  CHECK(total(*p2) == first.picks + second.picks);
  for (std::size_t l = 0; l < p2->counts.size(); ++l)
    for (std::size_t e = 0; e < p2->counts[l].size(); ++e) CHECK(p2->counts[l][e] == 2 * p1->counts[l][e]);
  std::filesystem::remove_all(dir);
}
