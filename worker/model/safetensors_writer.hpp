// Writing .safetensors files (the tiny model generator and tests).
//
// Output is deterministic: header keys sorted by name (nlohmann::json objects are ordered maps),
// data in the order given, the header padded with spaces to a multiple of 8 bytes as the
// reference writer does so the data section stays aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "worker/model/safetensors.hpp"

namespace servedeck::worker {

/// One tensor to write: raw little-endian bytes of `dtype` elements in row-major `shape`.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;  // size must be product(shape) * dtype_size(dtype)
};

/// Writes `tensors` to `path`. Throws std::runtime_error when a tensor's data size does not
/// match its shape or the file cannot be written.
void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Builds the raw bytes of a safetensors file from an already-serialised JSON header and a data
/// section (tests use this to craft invalid files). No validation.
std::vector<std::byte> raw_safetensors(const std::string& header_json, std::span<const std::byte> data);

/// fp32 -> bf16 with round-to-nearest-even (NaN kept quiet).
std::uint16_t float_to_bf16(float f);

}  // namespace servedeck::worker
