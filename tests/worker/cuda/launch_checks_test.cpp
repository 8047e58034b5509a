// Launcher preconditions of the fused decode kernels that are checked on the host before any
// CUDA call, so they run without a GPU (not labelled `gpu`): misaligned pointers the kernels
// would read with wide loads are refused with std::invalid_argument naming the launcher.
// The pointers are never dereferenced: the launchers throw before launching.
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>

#include "worker/cuda/fused.cuh"

using namespace servedeck::worker::cuda;

namespace {
template <class T>
T* fake(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}
}  // namespace

TEST_CASE("fused launchers refuse a norm weight vector that is not 8-byte aligned") {
  // prefetch_norm_weights reads four bf16 weights with one 8-byte load.
  const auto* W = fake<const __nv_bfloat16>(0x10000);
  const auto* x = fake<const float>(0x20000);
  float* y = fake<float>(0x30000);
  for (std::uintptr_t nw_at : {std::uintptr_t{0x40002}, std::uintptr_t{0x40004}, std::uintptr_t{0x40006}}) {
    CAPTURE(nw_at);
    const auto* nw = fake<const __nv_bfloat16>(nw_at);
    CHECK_THROWS_WITH_AS(launch_norm_gemv_bf16(W, x, nw, 1e-6f, y, 5120, 2048, false, nullptr, nullptr, true),
                         "launch_norm_gemv_bf16: norm_w must be 8-byte aligned", std::invalid_argument);
    const RouterOutputs o{fake<float>(0x50000), fake<int32_t>(0x60000), fake<float>(0x70000), fake<unsigned int>(0x80000),
                          fake<const uint8_t>(0x90000), fake<unsigned long long>(0xa0000), fake<unsigned long long>(0xb0000)};
    CHECK_THROWS_WITH_AS(launch_router_fused(W, x, nw, 1e-6f, y, 128, 2048, 8, true, o, nullptr, true),
                         "launch_router_fused: norm_w must be 8-byte aligned", std::invalid_argument);
  }
}

TEST_CASE("fused MoE down refuses activations that are not 16-byte aligned") {
  // Both down kernels read act as float4.
  const ExpertTable t{fake<const __nv_bfloat16* const>(0x10000), 2048, 768};
  for (std::uintptr_t act_at : {std::uintptr_t{0x20004}, std::uintptr_t{0x20008}}) {
    CAPTURE(act_at);
    CHECK_THROWS_WITH_AS(launch_moe_down_fused(t, fake<const float>(act_at), fake<const int32_t>(0x30000), fake<const float>(0x40000), 8,
                                               fake<float>(0x50000), nullptr, true),
                         "launch_moe_down_fused: act must be 16-byte aligned", std::invalid_argument);
  }
}

TEST_CASE("the folded router and the normalising gate/up refuse what their kernels cannot read") {
  const RouterOutputs o{fake<float>(0x50000), fake<int32_t>(0x60000), fake<float>(0x70000), fake<unsigned int>(0x80000),
                        fake<const uint8_t>(0x90000), fake<unsigned long long>(0xa0000), fake<unsigned long long>(0xb0000)};
  const StepSync sync{fake<const unsigned int>(0xc0000), fake<unsigned int>(0xc0004), fake<unsigned int>(0xc0008)};
  // float4 loads of the folded rows, the residual and the attention's output.
  CHECK_THROWS_WITH_AS(launch_router_folded(fake<const float>(0x10000), fake<const float>(0x20008), fake<const float>(0x30000), 128, 2048,
                                            4096, fake<float>(0x50000), sync, 32, nullptr, true),
                       "launch_router_folded: folded, h and a must be 16-byte aligned", std::invalid_argument);
  CHECK_THROWS_AS(launch_router_folded(fake<const float>(0x10000), fake<const float>(0x20000), fake<const float>(0x30000), 2048, 2048, 4096,
                                       fake<float>(0x50000), sync, 32, nullptr, true),
                  std::invalid_argument);  // more experts than 1024
  // The handshakes' counters (handshakes.cuh H2, H3) are not optional.
  CHECK_THROWS_AS(launch_router_folded(fake<const float>(0x10000), fake<const float>(0x20000), fake<const float>(0x30000), 128, 2048, 4096,
                                       fake<float>(0x50000), StepSync{}, 32, nullptr, true),
                  std::invalid_argument);
  // Every block normalises x with two float4 per thread: hidden <= 2048.
  const ExpertTable t{fake<const __nv_bfloat16* const>(0x10000), 4096, 768};
  CHECK_THROWS_AS(launch_moe_gate_up_normed(t, fake<const float>(0x20000), fake<const __nv_bfloat16>(0x30000), 1e-6f, 128, 8, true, o, sync,
                                            fake<float>(0x70000), nullptr, true),
                  std::invalid_argument);
  const ExpertTable t2{fake<const __nv_bfloat16* const>(0x10000), 2048, 768};
  CHECK_THROWS_WITH_AS(launch_moe_gate_up_normed(t2, fake<const float>(0x20000), fake<const __nv_bfloat16>(0x30002), 1e-6f, 128, 8, true, o,
                                                 sync, fake<float>(0x70000), nullptr, true),
                       "launch_moe_gate_up_normed: x must be 16-byte aligned and norm_w 8-byte aligned", std::invalid_argument);
  // The ranking runs in x's shared memory: at most hidden experts.
  const ExpertTable t3{fake<const __nv_bfloat16* const>(0x10000), 256, 96};
  CHECK_THROWS_AS(launch_moe_gate_up_normed(t3, fake<const float>(0x20000), fake<const __nv_bfloat16>(0x30000), 1e-6f, 512, 8, true, o, sync,
                                            fake<float>(0x70000), nullptr, true),
                  std::invalid_argument);
}
