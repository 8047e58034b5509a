// Writing a checkpoint's linears in a published quantised layout (worker/model/quant_format.hpp):
// `make-tiny-model --quantize fp8|nvfp4` quantises the BF16 tiny model it generated.
//
// Which tensors: the weight of every linear — names ending in "_proj.weight" (attention,
// dense MLP, experts), ".mlp.gate.weight" (the router) and "lm_head.weight" — unless `exclude`
// names its module (quant_format.hpp's module_matches). The published checkpoints exclude the
// routers and lm_head (Qwen's FP8 and NVIDIA's Qwen3-30B-A3B-NVFP4 both do), which
// default_exclusions() lists.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/model/quant_format.hpp"
#include "worker/model/safetensors_writer.hpp"

namespace servedeck::worker {

/// "lm_head" and "model.layers.N.mlp.gate" for each of `num_layers` layers.
std::vector<std::string> default_exclusions(std::int64_t num_layers);

/// True when `name` is the weight of a linear a quantiser converts (see above).
bool is_linear_weight(const std::string& name);

/// Replaces each BF16 linear weight of `tensors` not named by `exclude` by the tensors of
/// `format` (fp8_block: weight F8_E4M3 + weight_scale_inv F32 at 128x128 blocks; nvfp4: weight
/// U8 + weight_scale F8_E4M3 + weight_scale_2 F32 + input_scale F32), values quantised from the
/// BF16 ones (quantize.hpp). Returns config.json's "quantization_config"; for nvfp4 `hf_quant`
/// receives hf_quant_config.json. Throws std::runtime_error for format plain, a linear that is
/// not BF16 or 2-D, or an nvfp4 input width that is not a multiple of 16.
nlohmann::json quantize_linears(std::vector<TensorToWrite>& tensors, WeightFormat format,
                                const std::vector<std::string>& exclude, nlohmann::json* hf_quant);

}  // namespace servedeck::worker
