#include "registry/expert_footprint.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/json_limits.hpp"

namespace servedeck::registry {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t k_max_dim = int64_t{1} << 24;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Reads `path` as a bounded JSON object; "" error on success.
json read_object(const fs::path& path, std::string& error) {
  std::ifstream in(path);
  if (!in) {
    error = path.string() + ": cannot be opened";
    return json();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  JsonError perr;
  json j = parse_untrusted(ss.str(), &perr);
  if (j.is_discarded() || !j.is_object()) {
    error = path.string() + ": not a JSON object" + (j.is_discarded() ? " (" + perr.message + ")" : std::string());
    return json();
  }
  return j;
}

/// An integer key in [lo, k_max_dim]; false (error set) when present but mistyped.
bool read_int(const json& o, const char* key, int64_t lo, int64_t& out, std::string& error, const std::string& origin) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return false;
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > k_max_dim) {
    error = origin + ": '" + key + "' = " + dump_safe(*it) + " is not an integer in [" + std::to_string(lo) + ", " +
            std::to_string(k_max_dim) + "]";
    return false;
  }
  out = it->get<int64_t>();
  return true;
}

/// The string at `key`, "" when absent or not a string (never throws, unlike json::value).
std::string str_of(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool names_experts(const json& q) {
  for (const char* key : {"modules_to_not_convert", "exclude_modules", "ignore", "ignored_layers"}) {
    auto it = q.find(key);
    if (it == q.end() || !it->is_array()) continue;
    for (const auto& p : *it)
      if (p.is_string() && p.get_ref<const std::string&>().find("experts") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

uint64_t expert_bytes_in(const std::string& format, int64_t hidden, int64_t moe_intermediate, int64_t br, int64_t bc) {
  const auto H = static_cast<uint64_t>(hidden), I = static_cast<uint64_t>(moe_intermediate);
  if (format == "bf16") return 3 * I * H * 2;
  if (format == "fp8")
    return 3 * I * H + 4 * static_cast<uint64_t>(2 * ceil_div(moe_intermediate, br) * ceil_div(hidden, bc) +
                                                 ceil_div(hidden, br) * ceil_div(moe_intermediate, bc));
  if (format == "nvfp4") return 3 * (I * H / 2 + I * H / 16 + 4);
  return 0;
}

ExpertFootprint discover_expert_footprint(const std::string& checkpoint_dir) {
  ExpertFootprint f;
  if (checkpoint_dir.empty()) return f;
  const fs::path cfg_path = fs::path(checkpoint_dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(cfg_path, ec)) return f;
  json root = read_object(cfg_path, f.error);
  if (!f.error.empty()) return f;
  const json& cfg = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  const std::string origin = cfg_path.string();
  int64_t layers = 0, experts = 0;
  if (!read_int(cfg, "num_experts", 0, experts, f.error, origin) && f.error.empty())
    read_int(cfg, "n_routed_experts", 0, experts, f.error, origin);
  if (!f.error.empty() || experts == 0) return f;
  if (!read_int(cfg, "num_hidden_layers", 1, layers, f.error, origin) ||
      !read_int(cfg, "hidden_size", 1, f.hidden, f.error, origin) ||
      !read_int(cfg, "moe_intermediate_size", 1, f.moe_intermediate, f.error, origin)) {
    if (f.error.empty()) f.error = origin + ": routed experts without num_hidden_layers, hidden_size and moe_intermediate_size";
    return f;
  }
  f.experts = experts;
  // Which layers route: qwen3_moe's decoder_sparse_step and mlp_only_layers, glm4_moe's and
  // DeepSeek's first_k_dense_replace.
  int64_t step = 1, first_dense = 0;
  read_int(cfg, "decoder_sparse_step", 1, step, f.error, origin);
  read_int(cfg, "first_k_dense_replace", 0, first_dense, f.error, origin);
  if (!f.error.empty()) return f;
  std::vector<int64_t> mlp_only;
  if (auto it = cfg.find("mlp_only_layers"); it != cfg.end() && it->is_array())
    for (const auto& v : *it)
      if (v.is_number_integer()) mlp_only.push_back(v.get<int64_t>());
  for (int64_t i = 0; i < layers; ++i) {
    const bool dense = i < first_dense || (i + 1) % step != 0 ||
                       std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    f.moe_layers += dense ? 0 : 1;
  }
  // The format: quantization_config (fp8 / modelopt) or hf_quant_config.json.
  f.format = "bf16";
  int64_t br = 128, bc = 128;
  const json* q = nullptr;
  json hf;
  if (auto it = root.find("quantization_config"); it != root.end() && it->is_object()) q = &*it;
  const fs::path hf_path = fs::path(checkpoint_dir) / "hf_quant_config.json";
  if (fs::is_regular_file(hf_path, ec)) {
    hf = read_object(hf_path, f.error);
    if (!f.error.empty()) return f;
  }
  if (q && str_of(*q, "quant_method") == "fp8") {
    f.format = "fp8";
    if (auto bs = q->find("weight_block_size"); bs != q->end() && bs->is_array() && bs->size() == 2 &&
                                                 (*bs)[0].is_number_integer() && (*bs)[1].is_number_integer()) {
      br = std::clamp<int64_t>((*bs)[0].get<int64_t>(), 1, k_max_dim);
      bc = std::clamp<int64_t>((*bs)[1].get<int64_t>(), 1, k_max_dim);
    }
    if (names_experts(*q)) f.format = "bf16";
  } else {
    const json* mo = nullptr;
    if (q && str_of(*q, "quant_method") == "modelopt") {
      auto nested = q->find("quantization");
      mo = nested != q->end() && nested->is_object() ? &*nested : q;
    }
    if (hf.is_object())
      if (auto it = hf.find("quantization"); it != hf.end() && it->is_object()) mo = &*it;
    if (mo && str_of(*mo, "quant_algo") == "NVFP4") f.format = names_experts(*mo) ? "bf16" : "nvfp4";
  }
  f.bytes_per_expert = expert_bytes_in(f.format, f.hidden, f.moe_intermediate, br, bc);
  // Resident (bf16): embedding (+ lm_head unless tied), per layer attention q/k/v/o and norms,
  // the router on MoE layers, the dense MLP elsewhere.
  int64_t vocab = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0;
  read_int(cfg, "vocab_size", 1, vocab, f.error, origin);
  read_int(cfg, "num_attention_heads", 1, heads, f.error, origin);
  kv_heads = heads;
  read_int(cfg, "num_key_value_heads", 1, kv_heads, f.error, origin);
  head_dim = heads ? f.hidden / heads : 0;
  read_int(cfg, "head_dim", 1, head_dim, f.error, origin);
  read_int(cfg, "intermediate_size", 0, inter, f.error, origin);
  if (!f.error.empty()) return f;
  auto tie = cfg.find("tie_word_embeddings");
  const bool tied = tie != cfg.end() && tie->is_boolean() && tie->get<bool>();
  const auto H = static_cast<uint64_t>(f.hidden);
  uint64_t elems = static_cast<uint64_t>(vocab) * H * (tied ? 1 : 2);
  const uint64_t attn = H * static_cast<uint64_t>(2 * heads * head_dim + 2 * kv_heads * head_dim);
  elems += static_cast<uint64_t>(layers) * attn;
  elems += static_cast<uint64_t>(f.moe_layers) * static_cast<uint64_t>(experts) * H;
  elems += static_cast<uint64_t>(layers - f.moe_layers) * 3 * static_cast<uint64_t>(inter) * H;
  f.resident_bytes = 2 * elems;
  f.found = true;
  return f;
}

}  // namespace servedeck::registry
