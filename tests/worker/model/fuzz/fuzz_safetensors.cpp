// libFuzzer target: the safetensors header parser on arbitrary bytes. It must either throw
// SafetensorsError or return a header whose every tensor lies inside the input with a byte size
// matching its shape and dtype, and no two spans overlapping. Anything else (another exception,
// a sanitizer report, a violated invariant) is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "worker/model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace servedeck::worker;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const SafetensorsHeader h = parse_safetensors_header(file, "fuzz");
    const std::uint64_t data_size = size - h.data_offset;
    std::uint64_t prev_end = 0;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > data_size) __builtin_trap();
      if (t.element_count() * dtype_size(t.dtype) != t.byte_size()) __builtin_trap();
      if (t.byte_size() && t.begin < prev_end) __builtin_trap();
      if (t.byte_size()) prev_end = t.end;
    }
  } catch (const SafetensorsError&) {
  }
  return 0;
}
