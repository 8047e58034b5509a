#include "worker/server/cpu_model_loader.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/cpu/cpu_backend.hpp"
#if SERVEDECK_HAVE_CUDA
#include "worker/cuda/cuda_backend.hpp"
#endif
#include "worker/model/checkpoint.hpp"
#include "worker/model/config.hpp"
#include "worker/server/hf_text_model.hpp"

namespace servedeck::worker {

SamplingParams read_sampling_defaults(const std::string& dir) {
  SamplingParams s;
  std::ifstream in(std::filesystem::path(dir) / "generation_config.json");
  if (!in) return s;
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return s;
  if (j.contains("temperature") && j["temperature"].is_number()) s.temperature = j["temperature"].get<double>();
  if (j.contains("top_p") && j["top_p"].is_number()) s.top_p = j["top_p"].get<double>();
  if (j.contains("top_k") && j["top_k"].is_number_integer()) s.top_k = j["top_k"].get<int>();
  return s;
}

namespace {

#if SERVEDECK_HAVE_CUDA
// kv_cache_bytes: the pool the engine will allocate, counted in --vram-budget-gib.
cuda::CudaBackendOptions cuda_options(const CpuModelOptions& options, std::size_t kv_cache_bytes) {
  cuda::CudaBackendOptions co;
  co.hot_fraction = options.hot_fraction;
  co.vram_budget_gib = options.vram_budget_gib;
  co.kv_cache_bytes = kv_cache_bytes;
  co.stage_buffers = static_cast<int>(options.stage_buffers);
  co.profile_path = options.hot_profile;
  co.capture_profile_path = options.capture_profile;
  return co;
}
#endif

}  // namespace

std::unique_ptr<LoadedModel> load_cpu_model(const CpuModelOptions& options, const ProgressFn& progress) {
  auto m = std::make_unique<LoadedModel>();
  m->root = options.dir;
  progress(0.05);
  m->text = load_hf_text_model(options.dir);
  progress(0.3);
  std::shared_ptr<Checkpoint> checkpoint;
  ModelDescription desc;
  if (options.synthetic_seed) {
    if (options.backend != "cuda")
      throw std::runtime_error("--synthetic-weights needs --backend cuda (the CPU backend reads safetensors only)");
    desc = load_model_config((std::filesystem::path(options.dir) / "config.json").string());
  } else {
    checkpoint = std::make_shared<Checkpoint>(Checkpoint::open(options.dir));
    desc = checkpoint->description();
  }
  progress(0.6);
  const auto max_pos = static_cast<std::size_t>(desc.max_position_embeddings);
  m->max_model_len = options.max_model_len ? options.max_model_len : max_pos;
  if (max_pos > 0 && m->max_model_len > max_pos)
    throw std::runtime_error("--max-model-len " + std::to_string(m->max_model_len) + " exceeds the model's max_position_embeddings " +
                             std::to_string(max_pos) + " (" + options.dir + "/config.json)");
  if (m->max_model_len == 0) throw std::runtime_error("max_model_len is 0: give --max-model-len or max_position_embeddings in config.json");
  if (options.backend == "cuda") {
    // Refused before any device memory is taken (worker/model/config.hpp lists what and why).
    if (const std::string why = cuda_backend_unsupported(desc); !why.empty())
      throw std::runtime_error(options.dir + "/config.json: " + why);
#if SERVEDECK_HAVE_CUDA
    // The CUDA backend's bf16 K/V (CudaBackend::kv_bytes_per_token), known before it loads.
    const std::size_t per_token = static_cast<std::size_t>(desc.num_layers) * 2 * static_cast<std::size_t>(desc.num_kv_heads) *
                                  static_cast<std::size_t>(desc.head_dim) * 2;
    const std::size_t kv_bytes = options.kv_cache_bytes ? options.kv_cache_bytes : m->max_model_len * per_token;
    if (options.synthetic_seed) {
      // The experts' format is the one config.json's quantization config declares.
      const WeightFormat f = load_quantization_config(options.dir).format;
      const cuda::ExpertFormat experts = f == WeightFormat::fp8_block ? cuda::ExpertFormat::fp8_block
                                         : f == WeightFormat::nvfp4   ? cuda::ExpertFormat::nvfp4
                                                                      : cuda::ExpertFormat::bf16;
      auto b = cuda::make_synthetic_cuda_backend(desc, *options.synthetic_seed, cuda_options(options, kv_bytes), experts);
      m->warnings = b->warnings();
      m->backend = std::move(b);
    } else {
      auto b = cuda::make_cuda_backend(*checkpoint, cuda_options(options, kv_bytes));
      m->warnings = b->warnings();
      m->backend = std::move(b);
    }
#else
    throw std::runtime_error("--backend cuda: this servedeck-worker was built without CUDA (no toolkit at configure time)");
#endif
  } else if (options.backend == "cpu") {
    CpuBackendOptions bo;
    bo.threads = options.threads;
    m->backend = make_cpu_backend(*checkpoint, bo);
    if (!options.hot_profile.empty() || !options.capture_profile.empty())
      m->warnings.push_back("--hot-profile and --capture-profile apply to --backend cuda (the CPU backend keeps every expert in RAM "
                            "and has no hot-expert cache): ignored");
  } else {
    throw std::runtime_error("--backend " + options.backend + ": expected cpu or cuda");
  }
  m->keep_alive = checkpoint;
  progress(0.9);
  m->default_sampling = read_sampling_defaults(options.dir);
  EngineOptions eo;
  eo.max_model_len = m->max_model_len;
  eo.kv_cache_bytes = options.kv_cache_bytes ? options.kv_cache_bytes : m->max_model_len * m->backend->kv_bytes_per_token();
  eo.prefill_chunk = options.prefill_chunk;
  eo.eos_ids = checkpoint ? checkpoint->generation().eos_token_ids : load_generation_config(options.dir).eos_token_ids;
  if (eo.eos_ids.empty()) {
    if (auto id = m->text->token_id("<|im_end|>")) eo.eos_ids.push_back(*id);
  }
  eo.think_start_id = m->text->token_id("<think>");
  eo.think_end_id = m->text->token_id("</think>");
  m->engine = std::make_unique<Engine>(*m->backend, *m->text, eo);
  progress(1.0);
  return m;
}

}  // namespace servedeck::worker
