#include "worker/model/config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

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

constexpr std::string_view k_supported[] = {"qwen3_moe", "qwen3", "glm4_moe"};

/// get_mscale of transformers' YaRN: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double yarn_mscale(double scale, double mscale = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

/// Reads the YaRN fields of `obj` ("rope_scaling" or transformers 5's "rope_parameters").
RopeScaling read_yarn(const Reader& r, const json& obj, const std::string& key, std::int64_t max_position_embeddings) {
  RopeScaling y;
  y.kind = RopeScalingKind::yarn;
  auto num = [&](const char* k, double def) {
    auto it = obj.find(k);
    return it == obj.end() || it->is_null() ? def : r.number(*it, key + "." + k);
  };
  auto it = obj.find("factor");
  if (it == obj.end() || it->is_null()) r.fail("'" + key + "': rope_type \"yarn\" needs a 'factor'");
  y.factor = r.number(*it, key + ".factor");
  if (!(y.factor > 0.0)) r.fail("'" + key + "'.factor = " + std::to_string(y.factor) + ": expected > 0");
  y.original_max_position_embeddings = max_position_embeddings;
  if (auto o = obj.find("original_max_position_embeddings"); o != obj.end() && !o->is_null()) {
    if (!o->is_number_integer() || o->get<std::int64_t>() < 1)
      r.fail("'" + key + "'.original_max_position_embeddings: expected a positive integer, got " + o->dump());
    y.original_max_position_embeddings = o->get<std::int64_t>();
  }
  // transformers: `beta_fast or 32`, `beta_slow or 1` (0 means the default too).
  y.beta_fast = num("beta_fast", 0.0);
  if (y.beta_fast == 0.0) y.beta_fast = 32.0;
  y.beta_slow = num("beta_slow", 0.0);
  if (y.beta_slow == 0.0) y.beta_slow = 1.0;
  if (!(y.beta_fast > 0.0 && y.beta_slow > 0.0))
    r.fail("'" + key + "': beta_fast and beta_slow must be > 0, got " + std::to_string(y.beta_fast) + " and " +
           std::to_string(y.beta_slow));
  if (auto t = obj.find("truncate"); t != obj.end() && !t->is_null()) {
    if (!t->is_boolean()) r.fail("'" + key + "'.truncate: expected true or false, got " + t->dump());
    y.truncate = t->get<bool>();
  }
  const double mscale = num("mscale", 0.0), mscale_all_dim = num("mscale_all_dim", 0.0);
  if (auto a = obj.find("attention_factor"); a != obj.end() && !a->is_null()) {
    y.attention_factor = r.number(*a, key + ".attention_factor");
  } else if (mscale != 0.0 && mscale_all_dim != 0.0) {
    y.attention_factor = yarn_mscale(y.factor, mscale) / yarn_mscale(y.factor, mscale_all_dim);
  } else {
    y.attention_factor = yarn_mscale(y.factor);
  }
  if (!(y.attention_factor > 0.0)) r.fail("'" + key + "': attention_factor must be > 0");
  return y;
}

void read_rope(const Reader& r, ModelDescription& d, double default_rotary_fraction) {
  // transformers < 5 writes rope_theta, partial_rotary_factor and rope_scaling at top level; 5.x
  // writes "rope_parameters": {"rope_type": ..., "rope_theta": ..., "partial_rotary_factor": ...,
  // and the scaling's own fields}.
  d.rope_theta = r.number_or("rope_theta", 10000.0);
  d.rotary_fraction = r.number_or("partial_rotary_factor", default_rotary_fraction);
  auto scaling = [&](const json& obj, const std::string& key) {
    if (!obj.is_object()) r.fail("'" + key + "': expected an object or null, got " + obj.dump());
    auto t = obj.find("rope_type");
    if (t == obj.end()) t = obj.find("type");
    if (t == obj.end() || (t->is_string() && t->get<std::string>() == "default")) return;
    if (t->is_string() && t->get<std::string>() == "yarn") {
      d.rope_scaling = read_yarn(r, obj, key, d.max_position_embeddings);
      return;
    }
    r.fail("'" + key + "'.rope_type = " + t->dump() + ": supported are \"default\" and \"yarn\"");
  };
  if (r.has("rope_scaling")) scaling(r.cfg.at("rope_scaling"), "rope_scaling");
  if (r.has("rope_parameters")) {
    const json& p = r.cfg.at("rope_parameters");
    scaling(p, "rope_parameters");
    if (auto it = p.find("rope_theta"); it != p.end()) d.rope_theta = r.number(*it, "rope_parameters.rope_theta");
    if (auto it = p.find("partial_rotary_factor"); it != p.end())
      d.rotary_fraction = r.number(*it, "rope_parameters.partial_rotary_factor");
  }
  if (!(d.rope_theta > 1.0)) r.fail("rope_theta = " + std::to_string(d.rope_theta) + ": expected > 1");
  if (!(d.rotary_fraction > 0.0 && d.rotary_fraction <= 1.0))
    r.fail("partial_rotary_factor = " + std::to_string(d.rotary_fraction) + ": expected in (0, 1]");
  if (d.rotary_dim() < 2 || d.rotary_dim() % 2 != 0)
    r.fail("partial_rotary_factor = " + std::to_string(d.rotary_fraction) + " rotates " + std::to_string(d.rotary_dim()) +
           " of head_dim " + std::to_string(d.head_dim) + " dimensions: expected an even number >= 2");
}

/// The fields every supported model_type shares (attention, vocabulary, norms).
void read_common(const Reader& r, ModelDescription& d, double default_eps) {
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
  d.rms_norm_eps = r.number_or("rms_norm_eps", default_eps);
  if (!(d.rms_norm_eps > 0)) r.fail("rms_norm_eps must be > 0");
  d.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  if (r.boolean_or("use_sliding_window", false)) r.fail("use_sliding_window = true is not supported");
  if (r.has("hidden_act")) {
    const json& a = r.cfg.at("hidden_act");
    if (!a.is_string() || a.get<std::string>() != "silu") r.fail("hidden_act = " + a.dump() + ": expected \"silu\"");
  }
  d.layers.assign(static_cast<std::size_t>(d.num_layers), LayerDescription{});
}

void read_qwen3_moe(const Reader& r, ModelDescription& d) {
  // A layer is MoE when it is not in mlp_only_layers, num_experts > 0 and
  // (layer + 1) % decoder_sparse_step == 0 (transformers Qwen3MoeDecoderLayer).
  d.intermediate_size = r.integer_or("intermediate_size", 0, 0);
  d.moe.num_experts = r.integer("num_experts", 0);
  d.moe.top_k = r.integer("num_experts_per_tok", 1);
  d.moe.intermediate_size = r.integer("moe_intermediate_size", 1);
  d.moe.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
  d.moe.router = RouterKind::softmax_topk;
  d.decoder_sparse_step = r.integer_or("decoder_sparse_step", 1, 1);
  if (r.has("mlp_only_layers")) {
    const json& m = r.cfg.at("mlp_only_layers");
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
}

void read_glm4_moe(const Reader& r, ModelDescription& d) {
  // transformers Glm4MoeDecoderLayer: layer i is MoE when i >= first_k_dense_replace.
  d.qk_norm = r.boolean_or("use_qk_norm", false);
  d.attention_bias = r.boolean_or("attention_bias", false);
  d.moe.router = RouterKind::sigmoid_bias_topk;
  d.moe.num_experts = r.has("n_routed_experts") ? r.integer("n_routed_experts", 1) : r.integer("num_experts", 1);
  d.moe.top_k = r.integer("num_experts_per_tok", 1);
  d.moe.intermediate_size = r.integer("moe_intermediate_size", 1);
  d.moe.norm_topk_prob = r.boolean_or("norm_topk_prob", true);
  d.moe.shared_experts = r.integer_or("n_shared_experts", 1, 0);
  d.moe.shared_intermediate_size = d.moe.intermediate_size * d.moe.shared_experts;
  d.moe.routed_scaling_factor = r.number_or("routed_scaling_factor", 1.0);
  d.moe.n_group = r.integer_or("n_group", 1, 1);
  d.moe.topk_group = r.integer_or("topk_group", 1, 1);
  d.first_k_dense_replace = r.integer_or("first_k_dense_replace", 1, 0);
  d.num_nextn_predict_layers = r.integer_or("num_nextn_predict_layers", 0, 0);
  for (const char* key : {"scoring_func", "topk_method"}) {
    if (!r.has(key)) continue;
    const json& v = r.cfg.at(key);
    const std::string expected = std::string(key) == "scoring_func" ? "sigmoid" : "noaux_tc";
    if (!v.is_string() || v.get<std::string>() != expected)
      r.fail(std::string("'") + key + "' = " + v.dump() + ": glm4_moe routes with \"" + expected + "\"");
  }
  const std::int64_t e = d.moe.num_experts, g = d.moe.n_group;
  if (!(d.moe.routed_scaling_factor > 0.0))
    r.fail("routed_scaling_factor = " + std::to_string(d.moe.routed_scaling_factor) + ": expected > 0");
  if (e % g != 0)
    r.fail("n_routed_experts = " + std::to_string(e) + " is not a multiple of n_group = " + std::to_string(g));
  if (g > 1 && e / g < 2)
    r.fail("n_group = " + std::to_string(g) + " leaves " + std::to_string(e / g) +
           " expert per group: a group is scored by its best two");
  if (d.moe.topk_group > g)
    r.fail("topk_group = " + std::to_string(d.moe.topk_group) + " exceeds n_group = " + std::to_string(g));
  if (d.moe.top_k > d.moe.topk_group * (e / g))
    r.fail("num_experts_per_tok = " + std::to_string(d.moe.top_k) + " exceeds the " +
           std::to_string(d.moe.topk_group * (e / g)) + " experts of topk_group = " + std::to_string(d.moe.topk_group) +
           " groups");
  if (d.first_k_dense_replace > d.num_layers)
    r.fail("first_k_dense_replace = " + std::to_string(d.first_k_dense_replace) + " exceeds num_hidden_layers = " +
           std::to_string(d.num_layers));
  d.intermediate_size = r.integer_or("intermediate_size", 0, 0);
  if (d.first_k_dense_replace > 0 && d.intermediate_size < 1)
    r.fail("first_k_dense_replace = " + std::to_string(d.first_k_dense_replace) + " dense layers need intermediate_size, got " +
           std::to_string(d.intermediate_size));
  for (std::int64_t i = 0; i < d.num_layers; ++i)
    d.layers[static_cast<std::size_t>(i)].mlp = i < d.first_k_dense_replace ? MlpKind::dense : MlpKind::moe;
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

std::int64_t ModelDescription::rotary_dim() const {
  return static_cast<std::int64_t>(static_cast<double>(head_dim) * rotary_fraction);
}

std::vector<float> ModelDescription::rope_inv_freq() const {
  return worker::rope_inv_freq(rope_theta, rotary_dim(), rope_scaling);
}

std::string cuda_backend_unsupported(const ModelDescription& d) {
  // The kernels' own limits (worker/cuda: attention_decode, router_sigmoid, the routers).
  std::vector<std::string> why;
  const std::int64_t group = d.num_kv_heads > 0 ? d.num_heads / d.num_kv_heads : 0;
  if (group > 16) why.push_back("a GQA group of " + std::to_string(group) + " query heads per KV head (at most 16)");
  const bool moe = std::any_of(d.layers.begin(), d.layers.end(), [](const LayerDescription& l) { return l.mlp == MlpKind::moe; });
  if (moe && d.moe.num_experts > 1024) why.push_back(std::to_string(d.moe.num_experts) + " experts (at most 1024)");
  if (moe && d.moe.router == RouterKind::sigmoid_bias_topk && d.moe.n_group > 64)
    why.push_back("n_group " + std::to_string(d.moe.n_group) + " (the sigmoid router takes at most 64 groups)");
  if (why.empty()) return {};
  std::string s = "the CUDA backend does not run ";
  for (std::size_t i = 0; i < why.size(); ++i) s += (i ? ", " : "") + why[i];
  return s + "; use --backend cpu";
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
  const bool glm = model_type == "glm4_moe";
  read_common(r, d, glm ? 1e-5 : 1e-6);
  read_rope(r, d, glm ? 0.5 : 1.0);
  if (!glm && d.rotary_fraction != 1.0)
    r.fail("partial_rotary_factor = " + std::to_string(d.rotary_fraction) + ": Qwen3 rotates the whole head (expected 1.0)");
  if (!glm && r.boolean_or("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (model_type == "qwen3") {
    d.intermediate_size = r.integer("intermediate_size", 1);
  } else if (model_type == "qwen3_moe") {
    read_qwen3_moe(r, d);
  } else {
    read_glm4_moe(r, d);
  }
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

ModelDescription model_cut_to_layers(ModelDescription d, int layers) {
  if (layers < 1 || layers > d.num_layers)
    throw std::invalid_argument("model_cut_to_layers: " + std::to_string(layers) + " layers asked of a model of " +
                                std::to_string(d.num_layers));
  d.num_layers = layers;
  d.layers.resize(static_cast<std::size_t>(layers));
  d.first_k_dense_replace = std::min<std::int64_t>(d.first_k_dense_replace, layers);
  return d;
}

}  // namespace servedeck::worker
