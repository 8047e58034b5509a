#include "worker/model/checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace servedeck::worker {

namespace {

using json = nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Resolves tensors by name, checking their shapes and dtypes; collects the directory for
/// messages and the quantised weights' descriptions.
struct Resolver {
  const TensorSet& set;
  const std::string& dir;
  const QuantizationConfig& quantization;
  std::vector<std::unique_ptr<QuantizedWeight>>& quantized;

  /// A plain tensor (norm, embedding): BF16, F16 or F32 of `shape`.
  TensorRef get(const std::string& name, std::vector<std::int64_t> shape) const {
    TensorRef t = set.find(name);
    if (!t.info)
      throw CheckpointError(dir + ": missing tensor '" + name + "' (expected shape " + shape_to_string(shape) + ")");
    if (!is_plain_float(t.info->dtype))
      throw CheckpointError(dir + ": tensor '" + name + "': expected dtype BF16, F16 or F32, got " +
                            std::string(to_string(t.info->dtype)));
    if (t.info->shape != shape)
      throw CheckpointError(dir + ": tensor '" + name + "': expected shape " + shape_to_string(shape) + ", got " +
                            shape_to_string(t.info->shape));
    return t;
  }
  /// A linear `module` (module.weight + the format's scales) of logical shape (rows, cols).
  WeightRef linear(const std::string& module, std::int64_t rows, std::int64_t cols) const {
    ResolvedLinear r = resolve_linear(set, quantization, module, rows, cols, dir);
    if (r.owned) quantized.push_back(std::move(r.owned));
    return r.ref;
  }
};

void add_ids(const json& v, std::vector<std::int32_t>& out, const std::string& origin, const char* key) {
  auto bad = [&] { throw CheckpointError(origin + ": '" + key + "': expected a token id or a list of token ids, got " + v.dump()); };
  if (v.is_number_integer()) {
    if (v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > INT32_MAX) bad();
    out.push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
  } else if (v.is_array()) {
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 0 || x.get<std::int64_t>() > INT32_MAX) bad();
      out.push_back(static_cast<std::int32_t>(x.get<std::int64_t>()));
    }
  } else if (!v.is_null()) {
    bad();
  }
}

GenerationConfig generation_from(const json& j, const std::string& origin) {
  GenerationConfig g;
  if (!j.is_object()) throw CheckpointError(origin + ": expected a JSON object");
  if (auto it = j.find("eos_token_id"); it != j.end()) add_ids(*it, g.eos_token_ids, origin, "eos_token_id");
  if (auto it = j.find("bos_token_id"); it != j.end() && !it->is_null()) {
    std::vector<std::int32_t> b;
    add_ids(*it, b, origin, "bos_token_id");
    if (b.size() != 1) throw CheckpointError(origin + ": 'bos_token_id': expected one token id, got " + it->dump());
    g.bos_token_id = b[0];
  }
  return g;
}

}  // namespace

GenerationConfig parse_generation_config(const std::string& json_text, const std::string& origin) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) throw CheckpointError(origin + ": not valid JSON");
  return generation_from(j, origin);
}

GenerationConfig load_generation_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) return parse_generation_config(read_file(gen_path), gen_path);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  return parse_generation_config(read_file(config_path), config_path);
}

Checkpoint Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint c;
  c.dir_ = dir;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw CheckpointError(dir + ": no config.json");
  c.description_ = load_model_config(config_path);
  c.generation_ = load_generation_config(dir);
  c.quantization_ = load_quantization_config(dir);
  c.tensors_ = TensorSet::open_dir(dir);

  const auto& d = c.description_;
  const Resolver r{c.tensors_, dir, c.quantization_, c.quantized_};
  const std::int64_t h = d.hidden_size;
  c.embed_ = r.get("model.embed_tokens.weight", {d.vocab_size, h});
  c.final_norm_ = r.get("model.norm.weight", {h});
  if (d.tie_word_embeddings)
    static_cast<TensorRef&>(c.lm_head_) = c.embed_;
  else
    c.lm_head_ = r.linear("lm_head", d.vocab_size, h);
  c.layers_.resize(static_cast<std::size_t>(d.num_layers));
  for (std::int64_t i = 0; i < d.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto& L = c.layers_[static_cast<std::size_t>(i)];
    const auto& desc = d.layers[static_cast<std::size_t>(i)];
    L.input_norm = r.get(p + "input_layernorm.weight", {h});
    L.post_attn_norm = r.get(p + "post_attention_layernorm.weight", {h});
    L.q_proj = r.linear(p + "self_attn.q_proj", d.num_heads * d.head_dim, h);
    L.k_proj = r.linear(p + "self_attn.k_proj", d.num_kv_heads * d.head_dim, h);
    L.v_proj = r.linear(p + "self_attn.v_proj", d.num_kv_heads * d.head_dim, h);
    L.o_proj = r.linear(p + "self_attn.o_proj", h, d.num_heads * d.head_dim);
    if (d.attention_bias) {
      L.q_bias = r.get(p + "self_attn.q_proj.bias", {d.num_heads * d.head_dim});
      L.k_bias = r.get(p + "self_attn.k_proj.bias", {d.num_kv_heads * d.head_dim});
      L.v_bias = r.get(p + "self_attn.v_proj.bias", {d.num_kv_heads * d.head_dim});
    }
    if (d.qk_norm) {
      L.q_norm = r.get(p + "self_attn.q_norm.weight", {d.head_dim});
      L.k_norm = r.get(p + "self_attn.k_norm.weight", {d.head_dim});
    }
    if (desc.mlp == MlpKind::dense) {
      L.mlp_gate = r.linear(p + "mlp.gate_proj", d.intermediate_size, h);
      L.mlp_up = r.linear(p + "mlp.up_proj", d.intermediate_size, h);
      L.mlp_down = r.linear(p + "mlp.down_proj", h, d.intermediate_size);
    } else {
      const std::int64_t m = d.moe.intermediate_size;
      L.router = r.linear(p + "mlp.gate", d.moe.num_experts, h);
      if (d.moe.router == RouterKind::sigmoid_bias_topk)
        L.router_bias = r.get(p + "mlp.gate.e_score_correction_bias", {d.moe.num_experts});
      if (d.moe.shared_experts > 0) {
        const std::int64_t s = d.moe.shared_intermediate_size;
        L.shared.gate = r.linear(p + "mlp.shared_experts.gate_proj", s, h);
        L.shared.up = r.linear(p + "mlp.shared_experts.up_proj", s, h);
        L.shared.down = r.linear(p + "mlp.shared_experts.down_proj", h, s);
      }
      L.experts.resize(static_cast<std::size_t>(d.moe.num_experts));
      for (std::int64_t e = 0; e < d.moe.num_experts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        auto& E = L.experts[static_cast<std::size_t>(e)];
        E.gate = r.linear(q + "gate_proj", m, h);
        E.up = r.linear(q + "up_proj", m, h);
        E.down = r.linear(q + "down_proj", h, m);
      }
    }
  }
  if (d.num_nextn_predict_layers > 0) {
    const std::vector<std::string> names = c.tensors_.names();
    for (std::int64_t i = 0; i < d.num_nextn_predict_layers; ++i) {
      const std::string mtp = "model.layers." + std::to_string(d.num_layers + i) + ".";
      for (const auto& name : names)
        if (name.compare(0, mtp.size(), mtp) == 0) ++c.skipped_mtp_tensors_;
    }
  }
  return c;
}

}  // namespace servedeck::worker
