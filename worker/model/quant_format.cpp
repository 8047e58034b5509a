#include "worker/model/quant_format.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace servedeck::worker {

namespace {

using json = nlohmann::json;

constexpr std::size_t k_max_patterns = 1u << 20;
constexpr std::size_t k_max_pattern_bytes = 4096;
constexpr std::int64_t k_max_block = 1 << 20;

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw QuantConfigError(origin + ": " + what);
}

/// Appends the strings of array `key` of `obj` (absent or null: nothing) to `out`.
void read_patterns(const json& obj, const char* key, const std::string& origin, std::vector<std::string>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return;
  if (!it->is_array()) fail(origin, std::string("'") + key + "': expected an array of module names, got " + it->type_name());
  for (const auto& v : *it) {
    if (!v.is_string()) fail(origin, std::string("'") + key + "': expected module name strings, got " + v.type_name());
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() > k_max_pattern_bytes)
      fail(origin, std::string("'") + key + "': a module name of " + std::to_string(s.size()) + " bytes exceeds " +
                       std::to_string(k_max_pattern_bytes));
    if (out.size() >= k_max_patterns)
      fail(origin, std::string("'") + key + "': more than " + std::to_string(k_max_patterns) + " module names");
    out.push_back(s);
  }
}

std::string string_or(const json& obj, const char* key, const std::string& origin, const std::string& def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_string()) fail(origin, std::string("'") + key + "': expected a string, got " + it->dump());
  return it->get<std::string>();
}

void read_fp8(const json& q, const std::string& origin, QuantizationConfig& c) {
  c.format = WeightFormat::fp8_block;
  const std::string fmt = string_or(q, "fmt", origin, "e4m3");
  if (fmt != "e4m3") fail(origin, "'fmt' = \"" + fmt + "\": only \"e4m3\" FP8 weights are supported");
  auto bs = q.find("weight_block_size");
  if (bs == q.end() || bs->is_null())
    fail(origin, "quant_method \"fp8\" without 'weight_block_size' (per-tensor FP8) is not supported; supported: "
                 "block-scaled FP8 with weight_block_size [rows, cols] and *.weight_scale_inv");
  if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || !(*bs)[1].is_number_integer())
    fail(origin, "'weight_block_size': expected [rows, cols] of integers, got " + bs->dump());
  c.block_rows = (*bs)[0].get<std::int64_t>();
  c.block_cols = (*bs)[1].get<std::int64_t>();
  if (c.block_rows < 1 || c.block_rows > k_max_block || c.block_cols < 1 || c.block_cols > k_max_block)
    fail(origin, "'weight_block_size' = " + bs->dump() + ": expected each in [1, " + std::to_string(k_max_block) + "]");
  read_patterns(q, "modules_to_not_convert", origin, c.excluded);
  read_patterns(q, "ignored_layers", origin, c.excluded);
}

/// Reads a ModelOpt description (`q` holds quant_algo, group_size, exclude_modules / ignore).
void read_modelopt(const json& q, const std::string& origin, QuantizationConfig& c) {
  auto algo = q.find("quant_algo");
  if (algo == q.end() || algo->is_null()) return;  // e.g. an FP8 KV cache alone: weights unquantised
  if (!algo->is_string()) fail(origin, "'quant_algo': expected a string, got " + algo->dump());
  const auto a = algo->get<std::string>();
  if (a != "NVFP4")
    fail(origin, "'quant_algo' = \"" + a + "\" is not supported (supported: NVFP4; and quant_method \"fp8\" block-scaled)");
  if (c.format == WeightFormat::plain) c.format = WeightFormat::nvfp4;
  if (auto g = q.find("group_size"); g != q.end() && !g->is_null()) {
    if (!g->is_number_integer() || g->get<std::int64_t>() != 16)
      fail(origin, "'group_size' = " + g->dump() + ": NVFP4 scales groups of 16 elements");
  }
  read_patterns(q, "exclude_modules", origin, c.excluded);
  read_patterns(q, "ignore", origin, c.excluded);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw QuantConfigError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) throw QuantConfigError(path + ": not valid JSON");
  return j;
}

/// Wildcard match of the whole of `s` against `p` ('*' any run, '?' one character): the
/// greedy two-pointer algorithm, O(|s| * |p|) at worst.
bool glob_match(std::string_view s, std::string_view p) {
  std::size_t i = 0, j = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (j < p.size() && (p[j] == '?' || p[j] == s[i])) {
      ++i;
      ++j;
    } else if (j < p.size() && p[j] == '*') {
      star = j++;
      mark = i;
    } else if (star != std::string_view::npos) {
      j = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (j < p.size() && p[j] == '*') ++j;
  return j == p.size();
}

}  // namespace

std::string_view to_string(WeightFormat f) {
  switch (f) {
    case WeightFormat::plain: return "plain";
    case WeightFormat::fp8_block: return "fp8";
    case WeightFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

bool module_matches(std::string_view module, std::string_view pattern) {
  if (pattern.empty()) return false;
  if (pattern.find_first_of("*?") != std::string_view::npos) {
    for (std::size_t i = 0; i <= module.size(); ++i)
      if ((i == module.size() || module[i] == '.') && glob_match(module.substr(0, i), pattern)) return true;
    return false;
  }
  if (module == pattern) return true;
  const std::size_t n = pattern.size();
  if (module.size() > n && module.substr(0, n) == pattern && module[n] == '.') return true;     // prefix
  if (module.size() > n && module.substr(module.size() - n) == pattern && module[module.size() - n - 1] == '.')
    return true;                                                                                 // trailing part
  for (std::size_t at = module.find(pattern); at != std::string_view::npos; at = module.find(pattern, at + 1))
    if (at > 0 && module[at - 1] == '.' && at + n < module.size() && module[at + n] == '.') return true;  // inner part
  return false;
}

bool QuantizationConfig::excludes(std::string_view module) const {
  for (const auto& p : excluded)
    if (module_matches(module, p)) return true;
  return false;
}

std::string_view QuantizationConfig::excluded_key() const {
  return format == WeightFormat::nvfp4 ? "exclude_modules" : "modules_to_not_convert";
}

QuantizationConfig parse_quantization_config(const json& config, const json* hf_quant, const std::string& origin) {
  QuantizationConfig c;
  const std::string qorigin = origin + " quantization_config";
  if (config.is_object())
    if (auto q = config.find("quantization_config"); q != config.end() && !q->is_null()) {
      if (!q->is_object()) fail(qorigin, std::string("expected an object, got ") + q->type_name());
      c.origin = qorigin;
      const std::string method = string_or(*q, "quant_method", qorigin, "");
      if (method == "fp8") {
        read_fp8(*q, qorigin, c);
      } else if (method == "modelopt") {
        if (auto nested = q->find("quantization"); nested != q->end() && nested->is_object())
          read_modelopt(*nested, qorigin, c);
        else
          read_modelopt(*q, qorigin, c);
      } else {
        fail(qorigin, "quant_method \"" + method +
                          "\" is not supported (supported: \"fp8\" with weight_block_size, \"modelopt\" with quant_algo NVFP4)");
      }
    }
  if (hf_quant) {
    const std::string horigin = origin.substr(0, origin.rfind('/') + 1) + "hf_quant_config.json";
    if (!hf_quant->is_object()) fail(horigin, "expected a JSON object");
    auto q = hf_quant->find("quantization");
    if (q == hf_quant->end() || !q->is_object()) fail(horigin, "expected an object \"quantization\"");
    if (c.format == WeightFormat::fp8_block) {
      auto algo = q->find("quant_algo");
      if (algo != q->end() && !algo->is_null())
        fail(horigin, "declares quant_algo " + algo->dump() + " but " + qorigin + " declares quant_method \"fp8\"");
      return c;
    }
    if (c.origin.empty()) c.origin = horigin;
    read_modelopt(*q, horigin, c);
  }
  return c;
}

QuantizationConfig load_quantization_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const json config = read_json_file(config_path);
  const std::string hf_path = (fs::path(dir) / "hf_quant_config.json").string();
  if (fs::exists(hf_path)) {
    const json hf = read_json_file(hf_path);
    return parse_quantization_config(config, &hf, config_path);
  }
  return parse_quantization_config(config, nullptr, config_path);
}

float e4m3_to_f32(std::uint8_t bits) {
  const int sign = bits & 0x80 ? -1 : 1;
  const int exp = (bits >> 3) & 0xf;
  const int mant = bits & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  const float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)  // subnormal: m/8 * 2^-6
                           : std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  return static_cast<float>(sign) * v;
}

std::uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < std::ldexp(1.0f, -6)) {  // subnormal range: steps of 2^-9
    const auto q = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));
    return static_cast<std::uint8_t>(sign | q);  // q == 8 is exponent 1, mantissa 0: the same bits
  }
  int e = 0;
  const float f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exp = e - 1 + 7;
  auto m = static_cast<int>(std::nearbyint((f * 2.0f - 1.0f) * 8.0f));
  if (m == 8) {
    m = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && m == 7)) return sign | 0x7e;
  return static_cast<std::uint8_t>(sign | (exp << 3) | m);
}

float e2m1_to_f32(std::uint8_t nibble) {
  static constexpr float k_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = k_mag[nibble & 0x7];
  return nibble & 0x8 ? -v : v;
}

std::uint8_t f32_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Midpoints between neighbours; a tie goes to the even code (0, 2, 4, 6 -> 0, 1.0, 2.0, 4.0).
  std::uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return static_cast<std::uint8_t>(sign | code);
}

}  // namespace servedeck::worker
