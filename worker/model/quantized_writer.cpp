#include "worker/model/quantized_writer.hpp"

#include <cstring>
#include <stdexcept>

#include "worker/model/quantize.hpp"

namespace servedeck::worker {

namespace {

using json = nlohmann::json;

// note: ModelOpt writes input_scale = amax(activation) / (6 * 448) from calibration; there is no
// calibration here, and these loaders never read it (weights are dequantised, activations stay
// fp32/bf16). 16 is about the largest |x| a normed hidden state of the tiny model reaches.
constexpr float k_input_amax = 16.0f;

bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::vector<float> bf16_values(const TensorToWrite& t) {
  std::vector<float> v(t.data.size() / 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t bits = (static_cast<std::uint32_t>(t.data[2 * i + 1]) << 24) |
                               (static_cast<std::uint32_t>(t.data[2 * i]) << 16);
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TensorToWrite scalar_f32(const std::string& name, float v) {
  return TensorToWrite{name, Dtype::f32, {}, as_bytes(std::vector<float>{v})};
}

}  // namespace

std::vector<std::string> default_exclusions(std::int64_t num_layers) {
  std::vector<std::string> out{"lm_head"};
  for (std::int64_t i = 0; i < num_layers; ++i) out.push_back("model.layers." + std::to_string(i) + ".mlp.gate");
  return out;
}

bool is_linear_weight(const std::string& name) {
  return ends_with(name, "_proj.weight") || ends_with(name, ".mlp.gate.weight") || name == "lm_head.weight";
}

json quantize_linears(std::vector<TensorToWrite>& tensors, WeightFormat format, const std::vector<std::string>& exclude,
                      json* hf_quant) {
  if (format == WeightFormat::plain) throw std::runtime_error("quantize_linears: format plain");
  std::vector<TensorToWrite> out;
  out.reserve(tensors.size() * 2);
  QuantizationConfig skip;
  skip.excluded = exclude;
  for (auto& t : tensors) {
    const std::string module = t.name.substr(0, t.name.size() - std::strlen(".weight"));
    if (!is_linear_weight(t.name) || skip.excludes(module)) {
      out.push_back(std::move(t));
      continue;
    }
    if (t.dtype != Dtype::bf16 || t.shape.size() != 2 || t.shape[0] < 1 || t.shape[1] < 1)
      throw std::runtime_error("quantize_linears: tensor '" + t.name + "' is " + std::string(to_string(t.dtype)) + " " +
                               shape_to_string(t.shape) + ": expected a 2-D BF16 weight with at least one row and column");
    const std::int64_t rows = t.shape[0], cols = t.shape[1];
    const std::vector<float> w = bf16_values(t);
    if (format == WeightFormat::fp8_block) {
      const auto q = quantize_fp8_block(w.data(), rows, cols, 128, 128);
      out.push_back({t.name, Dtype::f8_e4m3, t.shape, as_bytes(q.weight)});
      out.push_back({module + ".weight_scale_inv", Dtype::f32, {(rows + 127) / 128, (cols + 127) / 128}, as_bytes(q.scale_inv)});
    } else {
      if (cols % 16 != 0)
        throw std::runtime_error("quantize_linears: tensor '" + t.name + "': NVFP4 needs an input width that is a multiple of 16, got " +
                                 std::to_string(cols));
      const auto q = quantize_nvfp4(w.data(), rows, cols);
      out.push_back({t.name, Dtype::u8, {rows, cols / 2}, as_bytes(q.weight)});
      out.push_back({module + ".weight_scale", Dtype::f8_e4m3, {rows, cols / 16}, as_bytes(q.scale)});
      out.push_back(scalar_f32(module + ".weight_scale_2", q.global_scale));
      out.push_back(scalar_f32(module + ".input_scale", k_input_amax / (6.0f * 448.0f)));
    }
  }
  tensors = std::move(out);
  if (format == WeightFormat::fp8_block)
    return {{"activation_scheme", "dynamic"},
            {"fmt", "e4m3"},
            {"quant_method", "fp8"},
            {"weight_block_size", {128, 128}},
            {"modules_to_not_convert", exclude}};
  const json quantization = {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                             {"exclude_modules", exclude}};
  // The layout is ModelOpt's; the version says which tool wrote it.
  const json producer = {{"name", "modelopt"}, {"version", "0.0.0+servedeck-make-tiny-model"}};
  if (hf_quant) *hf_quant = {{"producer", producer}, {"quantization", quantization}};
  json qc = quantization;
  qc["quant_method"] = "modelopt";
  qc["producer"] = producer;
  return qc;
}

}  // namespace servedeck::worker
