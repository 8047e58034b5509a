#include "worker/model/safetensors_writer.hpp"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace servedeck::worker {

std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

std::vector<std::byte> raw_safetensors(const std::string& header_json, std::span<const std::byte> data) {
  std::vector<std::byte> out(8 + header_json.size() + data.size());
  std::uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header_json.data(), header_json.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header_json.size(), data.data(), data.size());
  return out;
}

void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    std::uint64_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
    if (n != t.data.size())
      throw std::runtime_error("write_safetensors: tensor '" + t.name + "' shape " + shape_to_string(t.shape) +
                               " needs " + std::to_string(n) + " bytes, got " + std::to_string(t.data.size()));
    header[t.name] = {{"dtype", std::string(to_string(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("write_safetensors: cannot open '" + path + "' for writing");
  std::uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  out.close();  // a full disk may show only when the buffer is flushed
  if (!out) throw std::runtime_error("write_safetensors: write to '" + path + "' failed");
}

}  // namespace servedeck::worker
