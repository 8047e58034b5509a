#include "worker/model/config.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace servedeck::worker {

namespace {

using json = nlohmann::json;

struct Reader {
  const json& cfg;
  std::string origin;
  std::string model_type;

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(origin + ": " + what + " (model_type " + model_type + ")");
  }
  bool has(const char* key) const {
    auto it = cfg.find(key);
    return it != cfg.end() && !it->is_null();
  }
  std::int64_t integer(const char* key, std::int64_t min_value) const {
    if (!has(key)) fail(std::string("missing key '") + key + "'");
    const json& v = cfg.at(key);
    if (!v.is_number_integer()) fail(std::string("'") + key + "': expected an integer, got " + v.dump());
    const auto x = v.get<std::int64_t>();
    if (x < min_value)
      fail(std::string("'") + key + "' = " + std::to_string(x) + ": expected >= " + std::to_string(min_value));
    return x;
  }
  std::int64_t integer_or(const char* key, std::int64_t def, std::int64_t min_value) const {
    return has(key) ? integer(key, min_value) : def;
  }
  double number(const json& v, const std::string& key) const {
    if (!v.is_number()) fail("'" + key + "': expected a number, got " + v.dump());
    return v.get<double>();
  }
  double number_or(const char* key, double def) const { return has(key) ? number(cfg.at(key), key) : def; }
  bool boolean_or(const char* key, bool def) const {
    if (!has(key)) return def;
    const json& v = cfg.at(key);
    if (!v.is_boolean()) fail(std::string("'") + key + "': expected true or false, got " + v.dump());
    return v.get<bool>();
  }
};

constexpr std::string_view k_supported[] = {"qwen3_moe", "qwen3"};

void read_rope(const Reader& r, ModelDescription& d) {
  // transformers < 5 writes rope_theta and rope_scaling at top level; 5.x writes
  // "rope_parameters": {"rope_type": "default", "rope_theta": ...}.
  d.rope_theta = r.number_or("rope_theta", 10000.0);
  auto check_type = [&](const json& obj, const std::string& key) {
    if (!obj.is_object()) r.fail("'" + key + "': expected an object or null, got " + obj.dump());
    auto t = obj.find("rope_type");
    if (t == obj.end()) t = obj.find("type");
    if (t != obj.end() && !(t->is_string() && t->get<std::string>() == "default"))
      r.fail("'" + key + "'.rope_type = " + t->dump() + ": only \"default\" RoPE is supported");
  };
  if (r.has("rope_scaling")) check_type(r.cfg.at("rope_scaling"), "rope_scaling");
  if (r.has("rope_parameters")) {
    const json& p = r.cfg.at("rope_parameters");
    check_type(p, "rope_parameters");
    if (auto it = p.find("rope_theta"); it != p.end()) d.rope_theta = r.number(*it, "rope_parameters.rope_theta");
    if (auto it = p.find("partial_rotary_factor"); it != p.end())
      d.rotary_fraction = r.number(*it, "rope_parameters.partial_rotary_factor");
  }
  if (!(d.rope_theta > 1.0)) r.fail("rope_theta = " + std::to_string(d.rope_theta) + ": expected > 1");
  if (d.rotary_fraction != 1.0)
    r.fail("partial_rotary_factor = " + std::to_string(d.rotary_fraction) + ": only 1.0 is supported for Qwen3");
}

}  // namespace

std::string_view to_string(AttentionKind k) {
  switch (k) {
    case AttentionKind::gqa: return "gqa";
  }
  return "?";
}
std::string_view to_string(MlpKind k) {
  switch (k) {
    case MlpKind::dense: return "dense";
    case MlpKind::moe: return "moe";
  }
  return "?";
}
std::string_view to_string(RouterKind k) {
  switch (k) {
    case RouterKind::softmax_topk: return "softmax_topk";
    case RouterKind::sigmoid_bias_topk: return "sigmoid_bias_topk";
  }
  return "?";
}

std::int64_t ModelDescription::kv_bytes_per_token_f32() const {
  return num_layers * 2 * num_kv_heads * head_dim * 4;
}

std::string supported_model_types() {
  std::string s;
  for (auto t : k_supported) {
    if (!s.empty()) s += ", ";
    s += t;
  }
  return s;
}

ModelDescription parse_model_config(const json& cfg, std::string_view origin) {
  if (!cfg.is_object()) throw ConfigError(std::string(origin) + ": expected a JSON object");
  auto mt = cfg.find("model_type");
  if (mt == cfg.end() || !mt->is_string())
    throw ConfigError(std::string(origin) + ": missing string 'model_type' (supported: " + supported_model_types() + ")");
  const std::string model_type = mt->get<std::string>();
  if (std::find(std::begin(k_supported), std::end(k_supported), model_type) == std::end(k_supported))
    throw ConfigError(std::string(origin) + ": model_type '" + model_type + "' is not supported (supported: " +
                      supported_model_types() + ")");
  Reader r{cfg, std::string(origin), model_type};
  ModelDescription d;
  d.model_type = model_type;
  d.num_layers = r.integer("num_hidden_layers", 1);
  d.hidden_size = r.integer("hidden_size", 1);
  d.num_heads = r.integer("num_attention_heads", 1);
  d.num_kv_heads = r.integer_or("num_key_value_heads", d.num_heads, 1);
  if (d.num_heads % d.num_kv_heads != 0)
    r.fail("num_attention_heads = " + std::to_string(d.num_heads) + " is not a multiple of num_key_value_heads = " +
           std::to_string(d.num_kv_heads));
  d.head_dim = r.integer_or("head_dim", d.hidden_size / d.num_heads, 2);
  if (d.head_dim % 2 != 0) r.fail("head_dim = " + std::to_string(d.head_dim) + ": expected an even number");
  d.vocab_size = r.integer("vocab_size", 1);
  d.max_position_embeddings = r.integer("max_position_embeddings", 1);
  d.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  if (!(d.rms_norm_eps > 0)) r.fail("rms_norm_eps must be > 0");
  d.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  read_rope(r, d);
  if (r.boolean_or("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (r.boolean_or("use_sliding_window", false)) r.fail("use_sliding_window = true is not supported");
  if (r.has("hidden_act")) {
    const json& a = cfg.at("hidden_act");
    if (!a.is_string() || a.get<std::string>() != "silu") r.fail("hidden_act = " + a.dump() + ": expected \"silu\"");
  }

  d.layers.assign(static_cast<std::size_t>(d.num_layers), LayerDescription{});
  if (model_type == "qwen3") {
    d.intermediate_size = r.integer("intermediate_size", 1);
    return d;
  }

  // qwen3_moe. A layer is MoE when it is not in mlp_only_layers, num_experts > 0 and
  // (layer + 1) % decoder_sparse_step == 0 (transformers Qwen3MoeDecoderLayer).
  d.intermediate_size = r.integer_or("intermediate_size", 0, 0);
  d.moe.num_experts = r.integer("num_experts", 0);
  d.moe.top_k = r.integer("num_experts_per_tok", 1);
  d.moe.intermediate_size = r.integer("moe_intermediate_size", 1);
  d.moe.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
  d.moe.router = RouterKind::softmax_topk;
  d.decoder_sparse_step = r.integer_or("decoder_sparse_step", 1, 1);
  if (r.has("mlp_only_layers")) {
    const json& m = cfg.at("mlp_only_layers");
    if (!m.is_array()) r.fail("'mlp_only_layers': expected an array of layer indices, got " + m.dump());
    for (const auto& v : m) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= d.num_layers)
        r.fail("'mlp_only_layers': entry " + v.dump() + " is not a layer index in [0, " + std::to_string(d.num_layers) + ")");
      d.mlp_only_layers.push_back(v.get<std::int64_t>());
    }
  }
  if (d.moe.num_experts > 0 && d.moe.top_k > d.moe.num_experts)
    r.fail("num_experts_per_tok = " + std::to_string(d.moe.top_k) + " exceeds num_experts = " +
           std::to_string(d.moe.num_experts));
  bool any_dense = false;
  for (std::int64_t i = 0; i < d.num_layers; ++i) {
    const bool mlp_only = std::find(d.mlp_only_layers.begin(), d.mlp_only_layers.end(), i) != d.mlp_only_layers.end();
    const bool moe = !mlp_only && d.moe.num_experts > 0 && (i + 1) % d.decoder_sparse_step == 0;
    d.layers[static_cast<std::size_t>(i)].mlp = moe ? MlpKind::moe : MlpKind::dense;
    any_dense = any_dense || !moe;
  }
  if (any_dense && d.intermediate_size < 1)
    r.fail("a dense layer exists (mlp_only_layers / decoder_sparse_step) but intermediate_size is " +
           std::to_string(d.intermediate_size));
  return d;
}

ModelDescription load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json cfg = json::parse(ss.str(), nullptr, false);
  if (cfg.is_discarded()) throw ConfigError(path + ": not valid JSON");
  return parse_model_config(cfg, path);
}

}  // namespace servedeck::worker
