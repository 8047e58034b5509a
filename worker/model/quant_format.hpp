// The quantised weight formats the worker reads, as published checkpoints ship them, and the
// config that declares them.
//
// FP8 block-scaled (transformers' "finegrained FP8", the Qwen3 / DeepSeek-V3 layout):
//   config.json  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
//                "activation_scheme": "dynamic", "weight_block_size": [128, 128],
//                "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate", ...]}
//   tensors      M.weight            F8_E4M3 (rows, cols)
//                M.weight_scale_inv  F32 (ceil(rows / 128), ceil(cols / 128)); BF16 also read
//   value        w[r][c] = e4m3(weight[r][c]) * weight_scale_inv[r / 128][c / 128]
//   ("scale_inv" is the multiplier that undoes the quantiser's division; edge blocks are partial.)
//
// NVFP4 (NVIDIA ModelOpt, quant_algo "NVFP4"):
//   hf_quant_config.json  {"producer": {"name": "modelopt", ...}, "quantization": {"quant_algo":
//                "NVFP4", "group_size": 16, "kv_cache_quant_algo": null, "exclude_modules": [...]}}
//   config.json  "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", ...}
//                (either file declares it; both agree in published checkpoints)
//   tensors      M.weight          U8 (rows, cols / 2): two e2m1 values a byte, element 2j in the
//                                  low nibble, 2j + 1 in the high one
//                M.weight_scale    F8_E4M3 (rows, cols / 16): one scale per 16 elements of a row
//                M.weight_scale_2  F32, one element: the per-tensor scale
//                M.input_scale     F32, one element: the activation scale of W4A4 kernels (not
//                                  read: activations stay in fp32/bf16 here)
//   value        w[r][c] = e2m1(nibble) * (e4m3(weight_scale[r][c / 16]) * weight_scale_2)
//
// e4m3 is float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities,
// S.1111.111 is NaN, largest finite 448). e2m1 is 1 sign, 2 exponent, 1 mantissa bit: the
// magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
//
// Sources (read to learn the layouts): transformers integrations/finegrained_fp8.py
// (FP8Linear, Fp8Quantize/Fp8Dequantize), vLLM quantization/modelopt.py
// (ModelOptNvFp4LinearMethod.create_weights) and its nvfp4 emulation utils (break_fp4_bytes),
// NVIDIA's published hf_quant_config.json of Qwen3-30B-A3B-NVFP4.
//
// Unquantised modules: `modules_to_not_convert` (fp8), `exclude_modules` / `ignore` (modelopt),
// `ignored_layers` (the name vLLM/SGLang write). A tensor's stored dtype decides how it is read;
// a declared exclusion whose weight is stored quantised is a contradiction and refused. (Only
// declared names count: transformers also skips lm_head implicitly, but some FP8 checkpoints
// ship an FP8 lm_head, which is read as such.) Norms and embeddings are never quantised here.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker {

enum class WeightFormat {
  plain,      // BF16 / F16 / F32 as stored
  fp8_block,  // F8_E4M3 with a scale per block_rows x block_cols block
  nvfp4,      // packed e2m1 pairs, an e4m3 scale per 16 elements, an fp32 scale per tensor
};

/// "plain", "fp8", "nvfp4" (the spelling of `make-tiny-model --quantize`).
std::string_view to_string(WeightFormat f);

/// The quantisation a checkpoint declares.
struct QuantizationConfig {
  WeightFormat format = WeightFormat::plain;  // the format of its quantised linear weights
  std::string origin;                 // the file and key it was read from, for messages
  std::int64_t block_rows = 128;      // fp8_block: weight_block_size[0]
  std::int64_t block_cols = 128;      // fp8_block: weight_block_size[1]
  std::int64_t group_size = 16;       // nvfp4: elements per block scale (only 16 is accepted)
  std::vector<std::string> excluded;  // module patterns left unquantised (see module_matches)

  bool quantized() const { return format != WeightFormat::plain; }
  /// True when `module` (a weight's name without ".weight", e.g. "model.layers.3.mlp.gate")
  /// matches one of `excluded`.
  bool excludes(std::string_view module) const;
  /// "modules_to_not_convert" (fp8) or "exclude_modules" (nvfp4), for messages.
  std::string_view excluded_key() const;
};

/// Thrown for a quantization config this build cannot read: names the file, the key, what was
/// expected and what it holds.
struct QuantConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Reads the quantisation of a checkpoint from its parsed config.json (`config`) and, when the
/// directory has one, its parsed hf_quant_config.json (`hf_quant`, nullptr when absent). No
/// "quantization_config" and no hf_quant_config.json: WeightFormat::plain. Throws
/// QuantConfigError for an unsupported method or algorithm (compressed-tensors, FP8 without
/// weight_block_size, e5m2, ue8m0 scales, an NVFP4 group size other than 16, ...), a mistyped
/// key, a block size outside [1, 2^20], more than 2^20 exclusion patterns or one longer than
/// 4096 bytes, or the two files declaring different algorithms.
QuantizationConfig parse_quantization_config(const nlohmann::json& config, const nlohmann::json* hf_quant,
                                             const std::string& origin);

/// parse_quantization_config over `dir`/config.json and `dir`/hf_quant_config.json (when it
/// exists). Throws QuantConfigError (also for a file that is not valid JSON).
QuantizationConfig load_quantization_config(const std::string& dir);

/// Whether exclusion `pattern` names `module` (or a module containing it). A pattern with '*'
/// or '?' is a glob ('*' matches any run of characters, dots included; fnmatch as ModelOpt and
/// vLLM use it) that must match the whole name or a prefix ending at a '.'; a pattern without
/// wildcards matches at a path boundary: the name itself ("lm_head"), a prefix of it
/// ("model.layers.0" names everything in layer 0), or a trailing part ("mlp.gate" names
/// "model.layers.5.mlp.gate" but not "...mlp.gate_proj"). Linear in the lengths, per prefix.
bool module_matches(std::string_view module, std::string_view pattern);

/// float8_e4m3fn bits -> fp32 (exact; 0x7f / 0xff are NaN).
float e4m3_to_f32(std::uint8_t bits);
/// fp32 -> float8_e4m3fn, round to nearest even, saturating at +-448 (as the quantisers clamp
/// before the cast); NaN -> 0x7f.
std::uint8_t f32_to_e4m3(float x);
/// The low 4 bits as e2m1 -> fp32.
float e2m1_to_f32(std::uint8_t nibble);
/// fp32 -> e2m1 nibble, round to nearest even, saturating at +-6; NaN -> 0.
std::uint8_t f32_to_e2m1(float x);

}  // namespace servedeck::worker
