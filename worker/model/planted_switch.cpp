#include "worker/model/planted_switch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace servedeck::worker {

namespace {

using Vec = std::vector<double>;

float bf16_value(const TensorToWrite& t, std::uint64_t i) {
  const auto lo = static_cast<std::uint32_t>(t.data[2 * i]);
  const auto hi = static_cast<std::uint32_t>(t.data[2 * i + 1]);
  const std::uint32_t bits = (hi << 24) | (lo << 16);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void set_value(TensorToWrite& t, std::uint64_t i, double v) {
  const std::uint16_t b = float_to_bf16(static_cast<float>(v));
  t.data[2 * i] = static_cast<std::byte>(b & 0xff);
  t.data[2 * i + 1] = static_cast<std::byte>(b >> 8);
}

TensorToWrite& find(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("planted switch: tensor '" + name + "' is not in the first shard");
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
Vec scaled(Vec a, double k) {
  for (auto& x : a) x *= k;
  return a;
}
Vec plus(Vec a, const Vec& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}
Vec unit(const Vec& a) {
  const double n = std::sqrt(dot(a, a));
  if (n < 1e-9) throw std::runtime_error("planted switch: a direction vanished (tokens' embeddings are dependent)");
  return scaled(a, 1.0 / n);
}
/// `v` minus its projection on the orthonormal `basis`.
Vec orthogonal(Vec v, const std::vector<Vec>& basis) {
  for (const auto& b : basis) v = plus(v, scaled(b, -dot(v, b)));
  return v;
}
/// Adds `v`'s part orthogonal to `basis` to it, when it is not (numerically) inside it.
void extend(std::vector<Vec>& basis, const Vec& v) {
  Vec r = orthogonal(v, basis);
  if (std::sqrt(dot(r, r)) > 1e-6 * std::sqrt(dot(v, v))) basis.push_back(unit(r));
}

/// Deterministic uniform values in [-1, 1) (splitmix64).
struct Random {
  std::uint64_t state;
  double next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
  }
  /// A random vector of length `len` orthogonal to `basis`.
  Vec orthogonal_to(const std::vector<Vec>& basis, std::size_t n, double len) {
    Vec v(n);
    for (auto& x : v) x = next();
    return scaled(unit(orthogonal(v, basis)), len);
  }
};

}  // namespace

void plant_switch(const TinyModelOptions& o, const PlantedSwitch& sw, std::vector<TensorToWrite>& shard0) {
  const auto& first = o.planted_reply;
  const auto h = static_cast<std::size_t>(o.hidden_size);
  const auto hd = static_cast<std::size_t>(o.head_dim);
  const auto nh = static_cast<std::size_t>(o.num_heads), nkv = static_cast<std::size_t>(o.num_kv_heads);
  if (first.tokens.empty()) throw std::runtime_error("planted switch: needs a planted reply to switch from");
  if (nkv < 2 || hd < 4 || nh % nkv != 0)
    throw std::runtime_error("planted switch: needs at least 2 KV heads of at least 4 dimensions");
  auto in_vocab = [&](std::int64_t id) { return id >= 0 && id < o.vocab_size; };
  if (!in_vocab(sw.marker)) throw std::runtime_error("planted switch: marker id " + std::to_string(sw.marker) + " is outside the vocabulary");
  for (std::size_t i = 0; i < sw.tokens.size(); ++i) {
    const auto id = sw.tokens[i];
    auto has = [&](const std::vector<std::int64_t>& v) { return std::find(v.begin(), v.end(), id) != v.end(); };
    if (!in_vocab(id) || has(first.tokens) || has(first.after) || id == first.end_token || id == sw.marker ||
        std::find(sw.tokens.begin(), sw.tokens.begin() + static_cast<std::ptrdiff_t>(i), id) != sw.tokens.begin() + static_cast<std::ptrdiff_t>(i))
      throw std::runtime_error("planted switch: token id " + std::to_string(id) +
                               " is repeated, outside the vocabulary, or used by the first reply, its start or end tokens, or the marker");
  }

  const auto& embed = find(shard0, "model.embed_tokens.weight");
  auto& lm_head = find(shard0, "lm_head.weight");
  const auto& final_norm = find(shard0, "model.norm.weight");
  const auto& in_norm = find(shard0, "model.layers.0.input_layernorm.weight");
  auto& q_proj = find(shard0, "model.layers.0.self_attn.q_proj.weight");
  auto& k_proj = find(shard0, "model.layers.0.self_attn.k_proj.weight");
  auto& v_proj = find(shard0, "model.layers.0.self_attn.v_proj.weight");
  auto& o_proj = find(shard0, "model.layers.0.self_attn.o_proj.weight");
  auto& q_norm = find(shard0, "model.layers.0.self_attn.q_norm.weight");
  auto& k_norm = find(shard0, "model.layers.0.self_attn.k_norm.weight");

  auto row_of = [&](const TensorToWrite& t, std::int64_t id) {
    Vec v(h);
    for (std::size_t k = 0; k < h; ++k) v[k] = bf16_value(t, static_cast<std::uint64_t>(id) * h + k);
    return v;
  };
  // Layer 0's attention input for a token: its embedding through the input RMSNorm.
  auto normed = [&](std::int64_t id) {
    Vec e = row_of(embed, id);
    const double rms = std::sqrt(dot(e, e) / static_cast<double>(h) + o.rms_norm_eps);
    for (std::size_t k = 0; k < h; ++k) e[k] = e[k] / rms * bf16_value(in_norm, k);
    return e;
  };
  auto set_row = [&](TensorToWrite& t, std::size_t row, std::size_t cols, const Vec& v) {
    for (std::size_t k = 0; k < cols; ++k) set_value(t, row * cols + k, v[k]);
  };

  std::vector<std::int64_t> decoded = first.tokens;  // tokens whose query must never look
  decoded.insert(decoded.end(), sw.tokens.begin(), sw.tokens.end());
  Random rng{o.seed ^ 0x5eedc0ffee5eedull};
  const std::size_t d_sig = hd / 2 - 1;  // RoPE's lowest frequency (pairs with d_sig + hd/2)
  const std::size_t d_sink = 0;
  const double k_other = 3.0;            // length of the other key and query rows (dilution)

  // Query heads reading KV head 1: a query along d_sig at the start tokens only.
  std::vector<Vec> quiet;
  for (auto id : decoded) extend(quiet, normed(id));
  Vec u(h, 0.0);
  for (auto a : first.after) u = plus(u, unit(normed(a)));
  u = unit(orthogonal(u, quiet));
  for (auto a : first.after)
    if (dot(u, unit(normed(a))) < 0.3)
      throw std::runtime_error("planted switch: start token " + std::to_string(a) + " cannot be told from the reply tokens");
  std::vector<Vec> q_forbid = quiet;
  for (auto a : first.after) extend(q_forbid, normed(a));
  const std::size_t group = nh / nkv;
  for (std::size_t head = group; head < 2 * group; ++head)
    for (std::size_t j = 0; j < hd; ++j)
      set_row(q_proj, head * hd + j, h, j == d_sig ? u : rng.orthogonal_to(q_forbid, h, k_other));

  // KV head 1's keys: the marker on d_sig alone, "\n" (the sink) at ~45 degrees, the rest diluted.
  const Vec m = normed(sw.marker);
  const Vec mh = unit(m);
  const Vec nl = normed(first.after[0]);
  const Vec nt = unit(orthogonal(nl, {mh}));
  for (std::size_t j = 0; j < hd; ++j) {
    Vec row = j == d_sig ? plus(mh, nt) : j == d_sink ? nt : rng.orthogonal_to({mh, nt}, h, k_other);
    set_row(k_proj, hd + j, h, row);
  }
  for (std::size_t j = 0; j < hd; ++j) {
    const double w = j == d_sig ? 6.0 : 1.0;  // sharpens only the scores the start-token query sees
    set_value(q_norm, j, j == d_sig ? w : bf16_value(q_norm, j));
    set_value(k_norm, j, j == d_sig ? w : bf16_value(k_norm, j));
  }
  // Its value: the marker's input, orthogonal to the sink's, on dimension 0; nothing else.
  const Vec mv = unit(orthogonal(m, {unit(nl)}));
  const double v_marker = dot(m, mv);
  for (std::size_t j = 0; j < hd; ++j) set_row(v_proj, hd + j, h, j == 0 ? mv : Vec(h, 0.0));

  // o_proj writes the signal along z, orthogonal to every planted token's weighted embedding.
  std::vector<Vec> planted;
  std::vector<std::int64_t> all = decoded;
  all.insert(all.end(), first.after.begin(), first.after.end());
  all.push_back(first.end_token);
  for (auto id : all) {
    Vec e = row_of(embed, id);
    for (std::size_t k = 0; k < h; ++k) e[k] *= bf16_value(final_norm, k);
    extend(planted, e);
  }
  const Vec z = rng.orthogonal_to(planted, h, 1.0);
  const std::size_t qd = nh * hd;
  for (std::size_t head = group; head < 2 * group; ++head)
    for (std::size_t i = 0; i < h; ++i)
      set_value(o_proj, i * qd + head * hd, sw.signal * z[i] / (static_cast<double>(group) * v_marker));

  // lm_head: the switch reply's chain; its first row trails the first reply's unless z is there.
  set_row(lm_head, static_cast<std::size_t>(sw.tokens[0]), h,
          plus(scaled(row_of(lm_head, first.tokens[0]), 1.0 - sw.epsilon), scaled(z, sw.gain_z)));
  for (std::size_t i = 1; i < sw.tokens.size(); ++i)
    set_row(lm_head, static_cast<std::size_t>(sw.tokens[i]), h, scaled(row_of(embed, sw.tokens[i - 1]), first.gain));
  set_row(lm_head, static_cast<std::size_t>(first.end_token), h,
          scaled(plus(row_of(embed, first.tokens.back()), row_of(embed, sw.tokens.back())), first.gain));
}

}  // namespace servedeck::worker
