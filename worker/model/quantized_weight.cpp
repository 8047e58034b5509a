#include "worker/model/quantized_weight.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "worker/model/checkpoint.hpp"

namespace servedeck::worker {

namespace {

/// The 256 float8_e4m3fn values, built once.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[static_cast<std::size_t>(i)] = e4m3_to_f32(static_cast<std::uint8_t>(i));
    return a;
  }();
  return t;
}

float read_scalar(const TensorRef& t, std::uint64_t i) {
  const std::byte* p = t.bytes.data();
  switch (t.info->dtype) {
    case Dtype::f32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case Dtype::bf16: {
      std::uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case Dtype::f8_e4m3: return e4m3_table()[static_cast<std::uint8_t>(p[i])];
    default: return std::nanf("");  // not reached: dtypes are checked at resolution
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Check {
  const std::string& dir;

  [[noreturn]] void fail(const std::string& what) const { throw CheckpointError(dir + ": " + what); }

  TensorRef require(const TensorSet& set, const std::string& name, const std::string& why) const {
    TensorRef t = set.find(name);
    if (!t.info) fail("missing tensor '" + name + "' (" + why + ")");
    return t;
  }
  void shape(const TensorRef& t, const std::vector<std::int64_t>& want, const std::string& why) const {
    if (t.info->shape != want)
      fail("tensor '" + t.info->name + "': expected shape " + shape_to_string(want) +
           (why.empty() ? std::string() : " (" + why + ")") + ", got " + shape_to_string(t.info->shape));
  }
  void dtype(const TensorRef& t, std::initializer_list<Dtype> allowed) const {
    std::string names;
    for (auto d : allowed) {
      if (t.info->dtype == d) return;
      names += (names.empty() ? "" : " or ") + std::string(to_string(d));
    }
    fail("tensor '" + t.info->name + "': expected dtype " + names + ", got " + std::string(to_string(t.info->dtype)));
  }
};

}  // namespace

float QuantizedWeight::block_scale(std::int64_t row, std::int64_t col) const {
  return read_scalar(scale, static_cast<std::uint64_t>((row / block_rows) * scale_cols() + col / block_cols));
}

std::uint64_t QuantizedWeight::stored_bytes() const {
  return weight.bytes.size() + scale.bytes.size() + (format == WeightFormat::nvfp4 ? 4 : 0);
}

void dequantize_rows(const QuantizedWeight& w, std::int64_t row0, std::int64_t n, float* out) {
  const auto& lut = e4m3_table();
  const auto* q = reinterpret_cast<const std::uint8_t*>(w.weight.bytes.data());
  const std::int64_t cols = w.cols;
  for (std::int64_t r = row0; r < row0 + n; ++r) {
    float* o = out + (r - row0) * cols;
    if (w.format == WeightFormat::fp8_block) {
      const std::uint8_t* row = q + r * cols;
      for (std::int64_t c0 = 0; c0 < cols; c0 += w.block_cols) {
        const float s = w.block_scale(r, c0);
        const std::int64_t c1 = std::min(cols, c0 + w.block_cols);
        for (std::int64_t c = c0; c < c1; ++c) o[c] = lut[row[c]] * s;
      }
    } else {
      const std::uint8_t* row = q + r * (cols / 2);
      for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
        const float s = w.block_scale(r, c0) * w.global_scale;
        for (std::int64_t c = c0; c < c0 + 16; c += 2) {
          const std::uint8_t b = row[c / 2];
          o[c] = e2m1_to_f32(b & 0xf) * s;
          o[c + 1] = e2m1_to_f32(b >> 4) * s;
        }
      }
    }
  }
}

std::uint64_t linear_bytes(WeightFormat format, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                           std::int64_t block_cols) {
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  switch (format) {
    case WeightFormat::plain: return 2 * r * c;
    case WeightFormat::fp8_block:
      return r * c + 4 * static_cast<std::uint64_t>(ceil_div(rows, block_rows) * ceil_div(cols, block_cols));
    case WeightFormat::nvfp4: return r * c / 2 + r * c / 16 + 4;
  }
  return 0;
}

ResolvedLinear resolve_linear(const TensorSet& set, const QuantizationConfig& config, const std::string& module,
                              std::int64_t rows, std::int64_t cols, const std::string& dir) {
  const Check ck{dir};
  const std::string wname = module + ".weight";
  const TensorRef w = ck.require(set, wname, "expected shape " + shape_to_string(std::vector<std::int64_t>{rows, cols}));
  ResolvedLinear out;
  static_cast<TensorRef&>(out.ref) = w;
  const Dtype dt = w.info->dtype;
  if (is_plain_float(dt)) {
    ck.shape(w, {rows, cols}, "");
    return out;
  }
  const WeightFormat stored = dt == Dtype::f8_e4m3 ? WeightFormat::fp8_block : WeightFormat::nvfp4;
  const char* declaration = stored == WeightFormat::fp8_block ? "quantization_config.quant_method \"fp8\""
                                                              : "quant_algo \"NVFP4\" (quantization_config or hf_quant_config.json)";
  if (config.format != stored)
    ck.fail("tensor '" + wname + "' is " + std::string(to_string(dt)) + " but the checkpoint declares " +
            (config.quantized() ? std::string(to_string(config.format)) + " weights (" + config.origin + ")"
                                : std::string("no quantization")) +
            "; a " + std::string(to_string(dt)) + " weight needs " + declaration);
  if (config.excludes(module))
    ck.fail("tensor '" + wname + "' is " + std::string(to_string(dt)) + " but module '" + module + "' is listed in " +
            std::string(config.excluded_key()) + " (" + config.origin + "): expected BF16, F16 or F32");
  auto q = std::make_unique<QuantizedWeight>();
  q->format = stored;
  q->module = module;
  q->rows = rows;
  q->cols = cols;
  q->weight = w;
  if (stored == WeightFormat::fp8_block) {
    q->block_rows = config.block_rows;
    q->block_cols = config.block_cols;
    ck.shape(w, {rows, cols}, "the linear's (out, in), one F8_E4M3 a weight");
    const std::vector<std::int64_t> sshape{ceil_div(rows, q->block_rows), ceil_div(cols, q->block_cols)};
    const std::string sname = module + ".weight_scale_inv";
    q->scale = ck.require(set, sname, "F32, shape " + shape_to_string(sshape) + ": the block scales of the F8_E4M3 weight '" + wname + "'");
    ck.dtype(q->scale, {Dtype::f32, Dtype::bf16});
    ck.shape(q->scale, sshape,
             "ceil of " + shape_to_string(std::vector<std::int64_t>{rows, cols}) + " / weight_block_size " +
                 shape_to_string(std::vector<std::int64_t>{q->block_rows, q->block_cols}));
  } else {
    q->block_rows = 1;
    q->block_cols = 16;
    if (cols % 16 != 0)
      ck.fail("tensor '" + wname + "': NVFP4 needs the input width to be a multiple of 16, got " + std::to_string(cols));
    ck.shape(w, {rows, cols / 2}, "U8, two e2m1 values a byte of " + shape_to_string(std::vector<std::int64_t>{rows, cols}));
    const std::vector<std::int64_t> sshape{rows, cols / 16};
    const std::string sname = module + ".weight_scale";
    q->scale = ck.require(set, sname, "F8_E4M3, shape " + shape_to_string(sshape) + ": the block scales of the NVFP4 weight '" + wname + "'");
    ck.dtype(q->scale, {Dtype::f8_e4m3});
    ck.shape(q->scale, sshape, "one scale per 16 inputs");
    const std::string gname = module + ".weight_scale_2";
    const TensorRef g = ck.require(set, gname, "F32, one element: the per-tensor scale of the NVFP4 weight '" + wname + "'");
    ck.dtype(g, {Dtype::f32});
    if (g.info->element_count() != 1)
      ck.fail("tensor '" + gname + "': expected one F32 element, got shape " + shape_to_string(g.info->shape));
    q->global_scale = read_scalar(g, 0);
    if (!std::isfinite(q->global_scale) || !(q->global_scale > 0.0f))
      ck.fail("tensor '" + gname + "' = " + std::to_string(q->global_scale) + ": expected a finite positive scale");
  }
  out.ref.quant = q.get();
  out.owned = std::move(q);
  return out;
}

}  // namespace servedeck::worker
