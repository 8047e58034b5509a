#include "worker/model/checkpoint_quantizer.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/json_limits.hpp"
#include "worker/model/quantized_writer.hpp"
#include "worker/model/safetensors.hpp"
#include "worker/model/safetensors_writer.hpp"

namespace servedeck::worker {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using servedeck::dump_safe;
using servedeck::JsonError;
using servedeck::parse_untrusted;

/// A JSON file of the checkpoint (config.json, the index), bounded as every untrusted document
/// (common/json_limits.hpp: depth, size), so that writing it back cannot recurse without limit.
json read_json(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) throw std::runtime_error("quantize: " + p.string() + " is not a regular file");
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) throw std::runtime_error("quantize: cannot read " + p.string());
  JsonError err;
  json j = parse_untrusted(ss.str(), &err);
  if (j.is_discarded()) throw std::runtime_error("quantize: " + p.string() + ": " + err.message);
  return j;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();  // a full disk may show only when the buffer is flushed
  if (!out) throw std::runtime_error("quantize: cannot write " + p.string());
}

/// The shard files of `dir` in index order (each once), or {"model.safetensors"} without an index.
std::vector<std::string> shard_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    if (!fs::exists(dir / "model.safetensors"))
      throw std::runtime_error("quantize: " + dir.string() + " has neither model.safetensors nor model.safetensors.index.json");
    return {"model.safetensors"};
  }
  const json j = read_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw std::runtime_error("quantize: " + index.string() + ": expected an object \"weight_map\"");
  std::vector<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw std::runtime_error("quantize: " + index.string() + ": weight_map[\"" + name + "\"] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f == ".." || f == "." || f.empty())
      throw std::runtime_error("quantize: " + index.string() + ": weight_map names \"" + f + "\", expected a file in the directory");
    if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// config[key] as an integer in [lo, hi]; `fallback` when absent. Throws naming the value otherwise.
std::int64_t int_field(const json& config, const char* key, std::int64_t fallback, std::int64_t lo, std::int64_t hi,
                       const fs::path& origin) {
  if (!config.contains(key)) return fallback;
  const json& v = config[key];
  if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    throw std::runtime_error("quantize: " + origin.string() + ": '" + key + "' = " + dump_safe(v) + ": expected an integer in [" +
                             std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v.get<std::int64_t>();
}

/// quantize_linears over `tensors`, one tensor at a time on each of up to 16 threads; the result
/// keeps the input's order (each tensor followed by its scales), so it is the single-threaded
/// result. The first error (in tensor order) is rethrown.
std::vector<TensorToWrite> quantize_in_parallel(std::vector<TensorToWrite> tensors, WeightFormat format,
                                                const std::vector<std::string>& exclude, json& quantization_config, json& hf_quant) {
  std::vector<std::vector<TensorToWrite>> one(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) one[i].push_back(std::move(tensors[i]));
  std::vector<std::exception_ptr> errors(one.size());
  std::vector<json> configs(one.size()), hf(one.size());
  std::atomic<std::size_t> next{0};
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n_threads; ++t)
    pool.emplace_back([&] {
      for (std::size_t i = next++; i < one.size(); i = next++) {
        try {
          configs[i] = quantize_linears(one[i], format, exclude, format == WeightFormat::nvfp4 ? &hf[i] : nullptr);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<TensorToWrite> out;
  for (std::size_t i = 0; i < one.size(); ++i) {
    for (auto& t : one[i]) out.push_back(std::move(t));
    if (!configs[i].is_null()) quantization_config = configs[i];
    if (!hf[i].is_null()) hf_quant = hf[i];
  }
  return out;
}

}  // namespace

QuantizeSummary quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, WeightFormat format) {
  if (format == WeightFormat::plain) throw std::runtime_error("quantize: expected format fp8 or nvfp4, got plain");
  const fs::path in(in_dir), out(out_dir);
  if (!fs::is_directory(in)) throw std::runtime_error("quantize: " + in_dir + " is not a directory");
  if (fs::exists(out) && fs::equivalent(in, out)) throw std::runtime_error("quantize: the output directory is the input " + in_dir);
  // A new or empty output directory: nothing an earlier run left (a stale shard or index, a link
  // to an input file that writing would truncate) can mix with this run's files.
  if (fs::exists(out) && (!fs::is_directory(out) || !fs::is_empty(out)))
    throw std::runtime_error("quantize: " + out_dir + " exists and is not an empty directory; expected a new or empty output directory");
  json config = read_json(in / "config.json");
  if (config.contains("quantization_config"))
    throw std::runtime_error("quantize: " + (in / "config.json").string() +
                             " already declares a quantization_config; expected a BF16 checkpoint");
  if (!config.contains("num_hidden_layers"))
    throw std::runtime_error("quantize: " + (in / "config.json").string() + ": no 'num_hidden_layers'");
  const std::int64_t layers = int_field(config, "num_hidden_layers", 0, 1, 100000, in / "config.json") +
                              int_field(config, "num_nextn_predict_layers", 0, 0, 64, in / "config.json");
  const std::vector<std::string> exclude = default_exclusions(layers);
  const std::vector<std::string> shards = shard_files(in);
  fs::create_directories(out);

  QuantizeSummary sum;
  json quantization_config, hf_quant;
  json weight_map = json::object();
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  for (const std::string& shard : shards) {
    std::vector<TensorToWrite> tensors;
    {
      const auto file = SafetensorsFile::open((in / shard).string());
      for (const TensorInfo& t : file->header().tensors) {
        const auto bytes = file->bytes(t);
        tensors.push_back({t.name, t.dtype, t.shape, std::vector<std::byte>(bytes.begin(), bytes.end())});
        sum.bytes_in += bytes.size();
      }
    }
    const std::size_t n_in = tensors.size();
    tensors = quantize_in_parallel(std::move(tensors), format, exclude, quantization_config, hf_quant);
    // A name twice (an input that already holds a scale tensor of a BF16 linear) would let one
    // of the two values win silently.
    std::set<std::string_view> names;
    for (const auto& t : tensors)
      if (!names.insert(t.name).second)
        throw std::runtime_error("quantize: " + (in / shard).string() + ": tensor '" + t.name +
                                 "' would be written twice (the input already holds a tensor of that name)");
    // Each converted weight became 2 (fp8: weight, weight_scale_inv) or 4 (nvfp4) tensors.
    sum.linears_quantized += static_cast<std::int64_t>(tensors.size() - n_in) / (format == WeightFormat::fp8_block ? 1 : 3);
    write_safetensors((out / shard).string(), tensors, meta);
    for (const auto& t : tensors) {
      weight_map[t.name] = shard;
      sum.bytes_out += t.data.size();
    }
    ++sum.shards;
  }
  if (sum.linears_quantized == 0)
    throw std::runtime_error("quantize: " + in_dir + " holds no linear weight to quantise (names ending in _proj.weight)");
  // A file a run of another format or input left in out_dir would contradict this one's.
  if (fs::exists(in / "model.safetensors.index.json"))
    write_text(out / "model.safetensors.index.json",
               dump_safe(json{{"metadata", {{"total_size", sum.bytes_out}}}, {"weight_map", weight_map}}, 2) + "\n");
  config["quantization_config"] = quantization_config;
  write_text(out / "config.json", dump_safe(config, 2) + "\n");
  if (format == WeightFormat::nvfp4) write_text(out / "hf_quant_config.json", dump_safe(hf_quant, 2) + "\n");
  // Every other regular file of the top directory (tokenizer, chat template, generation config)
  // as it is; the shards, whatever their names, are this run's.
  for (const auto& e : fs::directory_iterator(in)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name == "model.safetensors.index.json" || name == "hf_quant_config.json" ||
        e.path().extension() == ".safetensors" || std::find(shards.begin(), shards.end(), name) != shards.end())
      continue;
    fs::copy_file(e.path(), out / name);
  }
  return sum;
}

}  // namespace servedeck::worker
