// servedeck-worker: the native inference worker.
//   servedeck-worker serve --model DIR [--host 127.0.0.1] [--port N] [--served-model-name NAME]
//                          [--max-model-len N] [--kv-cache-bytes N] [--prefill-chunk N] [--tool-parser hermes|glm|qwen3_coder|none]
//                          [--reasoning-parser qwen3|none] [--threads N] [--default-max-tokens N]
//                          [--backend cpu|cuda] [--hot-fraction F] [--vram-budget-gib G] [--stage-buffers N]
//                          [--hot-profile FILE] [--capture-profile FILE] [--synthetic-weights SEED]
//   servedeck-worker make-tiny-model --out DIR --tokenizer-dir DIR [--seed N] [--variant random|chat|tool]
//                          [--model-type qwen3_moe|glm4_moe] [--quantize plain|fp8|nvfp4] [--shape tiny|aligned]
//     random (default): the random tiny model; chat: the same shape with a planted reply that
//     ends its turn (worker/server/tiny_chat_model.hpp). --quantize (random only) writes the
//     linears in a published quantised layout (worker/model/quantized_writer.hpp); --shape
//     aligned makes every linear dimension a multiple of 128 (hidden 128, heads of 64, experts
//     of 128), which FP8 kernels with 128x128 blocks (transformers') require.
//   servedeck-worker quantize --model DIR --out DIR --format fp8|nvfp4
//     writes DIR's BF16 checkpoint with its linears in a published quantised layout
//     (worker/model/checkpoint_quantizer.hpp), one shard in memory at a time.
// serve prints "listening on HOST:PORT" on stdout once the listener is bound (--port 0 picks a
// free port), loads the model in the background (/health 503 with progress until loaded), and
// runs until SIGINT/SIGTERM. A model that fails to load ends the process with status 1 after
// printing the error on stderr.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <pthread.h>

#include "worker/model/checkpoint_quantizer.hpp"
#include "worker/model/tiny_model.hpp"
#include "worker/server/cpu_model_loader.hpp"
#include "worker/server/tiny_chat_model.hpp"
#include "worker/server/worker_server.hpp"

namespace {

using namespace servedeck::worker;

constexpr const char* k_usage =
    "usage:\n"
    "  servedeck-worker serve --model DIR [--host 127.0.0.1] [--port N] [--served-model-name NAME]\n"
    "                         [--max-model-len N] [--kv-cache-bytes N] [--prefill-chunk N] [--tool-parser hermes|glm|qwen3_coder|none]\n"
    "                         [--reasoning-parser qwen3|none] [--threads N] [--default-max-tokens N]\n"
    "                         [--backend cpu|cuda] [--hot-fraction F] [--vram-budget-gib G] [--stage-buffers N]\n"
    "                         [--hot-profile FILE] [--capture-profile FILE] [--synthetic-weights SEED]\n"
    "  servedeck-worker make-tiny-model --out DIR --tokenizer-dir DIR [--seed N] [--variant random|chat|tool]\n"
    "                                  [--model-type qwen3_moe|glm4_moe] [--quantize plain|fp8|nvfp4] [--shape tiny|aligned]\n"
    "  servedeck-worker quantize --model DIR --out DIR --format fp8|nvfp4\n";

struct Args {
  std::map<std::string, std::string> values;
  bool ok = true;
};

// Parses "--name value" / "--name=value" pairs; every flag takes a value.
Args parse_flags(int argc, char** argv, int first, const std::vector<std::string>& known) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << k_usage;
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) {
      std::cerr << "servedeck-worker: unexpected argument '" << arg << "'; expected --flag value\n" << k_usage;
      a.ok = false;
      return a;
    }
    std::string name = arg.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::cerr << "servedeck-worker: --" << name << " needs a value\n";
      a.ok = false;
      return a;
    }
    bool found = false;
    for (const auto& k : known) found = found || k == name;
    if (!found) {
      std::cerr << "servedeck-worker: unknown flag --" << name << "\n" << k_usage;
      a.ok = false;
      return a;
    }
    a.values[name] = value;
  }
  return a;
}

bool to_size(const Args& a, const std::string& name, std::size_t& out) {
  auto it = a.values.find(name);
  if (it == a.values.end()) return true;
  try {
    std::size_t pos = 0;
    const unsigned long long v = std::stoull(it->second, &pos);
    if (pos != it->second.size() || it->second.find('-') != std::string::npos) throw std::invalid_argument("x");
    out = static_cast<std::size_t>(v);
    return true;
  } catch (const std::exception&) {
    std::cerr << "servedeck-worker: --" << name << " " << it->second << ": expected a non-negative integer\n";
    return false;
  }
}

bool to_double(const Args& a, const std::string& name, double lo, double hi, double& out) {
  auto it = a.values.find(name);
  if (it == a.values.end()) return true;
  try {
    std::size_t pos = 0;
    const double v = std::stod(it->second, &pos);
    if (pos != it->second.size() || !(v >= lo && v <= hi)) throw std::invalid_argument("x");
    out = v;
    return true;
  } catch (const std::exception&) {
    std::cerr << "servedeck-worker: --" << name << " " << it->second << ": expected a number in [" << lo << ", " << hi << "]\n";
    return false;
  }
}

int quantize(int argc, char** argv) {
  const Args a = parse_flags(argc, argv, 2, {"model", "out", "format"});
  if (!a.ok) return 2;
  if (!a.values.count("model") || !a.values.count("out") || !a.values.count("format")) {
    std::cerr << "servedeck-worker quantize: --model, --out and --format are required\n" << k_usage;
    return 2;
  }
  const std::string f = a.values.at("format");
  if (f != "fp8" && f != "nvfp4") {
    std::cerr << "servedeck-worker quantize: --format " << f << ": expected fp8 or nvfp4\n";
    return 2;
  }
  try {
    const QuantizeSummary s = quantize_checkpoint(a.values.at("model"), a.values.at("out"), f == "fp8" ? WeightFormat::fp8_block : WeightFormat::nvfp4);
    std::cout << "quantized " << s.linears_quantized << " linears to " << f << " in " << s.shards << " shard(s): " << s.bytes_in
              << " -> " << s.bytes_out << " bytes, written to " << a.values.at("out") << "\n";
  } catch (const std::exception& e) {
    std::cerr << "servedeck-worker quantize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

int make_tiny_model(int argc, char** argv) {
  const Args a = parse_flags(argc, argv, 2, {"out", "tokenizer-dir", "seed", "variant", "model-type", "quantize", "shape"});
  if (!a.ok) return 2;
  if (!a.values.count("out") || !a.values.count("tokenizer-dir")) {
    std::cerr << "servedeck-worker make-tiny-model: --out and --tokenizer-dir are required\n" << k_usage;
    return 2;
  }
  std::size_t seed = 0;
  if (!to_size(a, "seed", seed)) return 2;
  const std::string variant = a.values.count("variant") ? a.values.at("variant") : "random";
  if (variant != "random" && variant != "chat" && variant != "tool") {
    std::cerr << "servedeck-worker make-tiny-model: --variant " << variant << ": expected random, chat or tool\n";
    return 2;
  }
  const std::string model_type = a.values.count("model-type") ? a.values.at("model-type") : "qwen3_moe";
  if (model_type != "qwen3_moe" && model_type != "glm4_moe") {
    std::cerr << "servedeck-worker make-tiny-model: --model-type " << model_type << ": expected qwen3_moe or glm4_moe\n";
    return 2;
  }
  const std::string quantize = a.values.count("quantize") ? a.values.at("quantize") : "plain";
  const std::string shape = a.values.count("shape") ? a.values.at("shape") : "tiny";
  TinyModelOptions o;
  o.seed = seed;
  if (quantize == "fp8") {
    o.quantize = WeightFormat::fp8_block;
  } else if (quantize == "nvfp4") {
    o.quantize = WeightFormat::nvfp4;
  } else if (quantize != "plain") {
    std::cerr << "servedeck-worker make-tiny-model: --quantize " << quantize << ": expected plain, fp8 or nvfp4\n";
    return 2;
  }
  if (shape == "aligned") {
    o.hidden_size = 128;
    o.head_dim = 64;
    o.intermediate_size = 256;
    o.moe_intermediate_size = 128;
  } else if (shape != "tiny") {
    std::cerr << "servedeck-worker make-tiny-model: --shape " << shape << ": expected tiny or aligned\n";
    return 2;
  }
  if ((variant != "random" || model_type != "qwen3_moe") && (o.quantize != WeightFormat::plain || shape != "tiny")) {
    std::cerr << "servedeck-worker make-tiny-model: --quantize and --shape apply to --variant random only (qwen3_moe)\n";
    return 2;
  }
  try {
    if (model_type == "glm4_moe")
      write_tiny_glm_model(a.values.at("out"), a.values.at("tokenizer-dir"), variant, seed);
    else if (variant == "chat")
      write_tiny_chat_model(a.values.at("out"), a.values.at("tokenizer-dir"), seed);
    else if (variant == "tool")
      write_tiny_tool_model(a.values.at("out"), a.values.at("tokenizer-dir"), seed);
    else
      write_model(a.values.at("out"), o, a.values.at("tokenizer-dir"));
  } catch (const std::exception& e) {
    std::cerr << "servedeck-worker make-tiny-model: " << e.what() << "\n";
    return 1;
  }
  std::cout << "wrote the tiny " << model_type << " " << variant << " model (" << quantize << ", shape " << shape
            << ") to " << a.values.at("out") << "\n";
  return 0;
}

int serve(int argc, char** argv) {
  const Args a = parse_flags(argc, argv, 2,
                             {"model", "host", "port", "served-model-name", "max-model-len", "kv-cache-bytes",
                              "tool-parser", "reasoning-parser", "threads", "default-max-tokens", "backend",
                              "hot-fraction", "vram-budget-gib", "hot-profile", "capture-profile", "synthetic-weights",
                              "stage-buffers", "prefill-chunk"});
  if (!a.ok) return 2;
  if (!a.values.count("model")) {
    std::cerr << "servedeck-worker serve: --model DIR is required\n" << k_usage;
    return 2;
  }
  WorkerServerOptions so;
  CpuModelOptions mo;
  mo.dir = a.values.at("model");
  so.host = a.values.count("host") ? a.values.at("host") : "127.0.0.1";
  std::size_t port = 8000;
  if (!to_size(a, "port", port) || !to_size(a, "max-model-len", mo.max_model_len) ||
      !to_size(a, "kv-cache-bytes", mo.kv_cache_bytes) || !to_size(a, "threads", mo.threads) ||
      !to_size(a, "default-max-tokens", so.default_max_tokens) || !to_double(a, "hot-fraction", 0.0, 1.0, mo.hot_fraction) ||
      !to_double(a, "vram-budget-gib", 0.0, 1e6, mo.vram_budget_gib) || !to_size(a, "stage-buffers", mo.stage_buffers) ||
      !to_size(a, "prefill-chunk", mo.prefill_chunk))
    return 2;
  if (mo.prefill_chunk == 0) {
    std::cerr << "servedeck-worker: --prefill-chunk 0: expected at least 1 token per chunk\n";
    return 2;
  }
  if (a.values.count("stage-buffers") && (mo.stage_buffers < 2 || mo.stage_buffers > 4096)) {
    std::cerr << "servedeck-worker: --stage-buffers " << mo.stage_buffers << ": expected 2 to 4096\n";
    return 2;
  }
  if (a.values.count("backend")) mo.backend = a.values.at("backend");
  if (mo.backend != "cpu" && mo.backend != "cuda") {
    std::cerr << "servedeck-worker: --backend " << mo.backend << ": expected cpu or cuda\n";
    return 2;
  }
  if (a.values.count("synthetic-weights")) {
    std::size_t seed = 0;
    if (!to_size(a, "synthetic-weights", seed)) return 2;
    if (mo.backend != "cuda") {
      std::cerr << "servedeck-worker: --synthetic-weights needs --backend cuda\n";
      return 2;
    }
    mo.synthetic_seed = seed;
    std::cerr << "servedeck-worker: weights SYNTHESISED in memory from seed " << seed << " (no safetensors read; "
              << mo.dir << " gives only config.json and the tokenizer): the text is noise; for benchmark shapes\n";
  }
  if (a.values.count("hot-profile")) mo.hot_profile = a.values.at("hot-profile");
  if (a.values.count("capture-profile")) mo.capture_profile = a.values.at("capture-profile");
  if (port > 65535) {
    std::cerr << "servedeck-worker: --port " << port << ": expected 0..65535\n";
    return 2;
  }
  so.port = static_cast<int>(port);
  so.served_model_name = a.values.count("served-model-name") ? a.values.at("served-model-name") : mo.dir;
  if (a.values.count("tool-parser") && !parse_tool_parser_kind(a.values.at("tool-parser"), so.tool_parser)) {
    std::cerr << "servedeck-worker: --tool-parser " << a.values.at("tool-parser") << ": expected hermes, glm, qwen3_coder or none\n";
    return 2;
  }
  if (a.values.count("reasoning-parser")) {
    const std::string r = a.values.at("reasoning-parser");
    if (r == "qwen3" || r == "deepseek_r1" || r == "glm45") so.reasoning_parser = true;
    else if (r == "none") so.reasoning_parser = false;
    else {
      std::cerr << "servedeck-worker: --reasoning-parser " << r << ": expected qwen3 or none\n";
      return 2;
    }
  }

  // Signals are taken synchronously by this thread: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  WorkerServer server(so, [mo](const ProgressFn& progress) { return load_cpu_model(mo, progress); });
  try {
    server.start();
  } catch (const std::exception& e) {
    std::cerr << "servedeck-worker: " << e.what() << "\n";
    return 1;
  }
  std::cout << "listening on " << so.host << ":" << server.port() << std::endl;
  bool announced = false;
  for (;;) {
    timespec tick{0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::cerr << "servedeck-worker: signal " << sig << ", stopping\n";
      server.stop();
      return 0;
    }
    const LoadState s = server.state();
    if (s == LoadState::failed) {
      std::cerr << "servedeck-worker: loading " << mo.dir << " failed: " << server.load_error() << "\n";
      server.stop();
      return 1;
    }
    if (s == LoadState::ready && !announced) {
      announced = true;
      const LoadedModel* m = server.model();
      for (const std::string& w : m->warnings) std::cerr << "servedeck-worker: warning: " << w << "\n";
      std::cerr << "servedeck-worker: model " << mo.dir << " loaded (backend " << m->backend->name()
                << ", max_model_len " << m->max_model_len << ", KV pool " << m->engine->kv_capacity_tokens()
                << " tokens in blocks of " << m->engine->options().kv_block_tokens << ", prefill chunk "
                << m->engine->options().prefill_chunk << ")\n";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << k_usage;
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "serve") return serve(argc, argv);
  if (cmd == "make-tiny-model") return make_tiny_model(argc, argv);
  if (cmd == "quantize") return quantize(argc, argv);
  if (cmd == "-h" || cmd == "--help") {
    std::cout << k_usage;
    return 0;
  }
  std::cerr << "servedeck-worker: unknown command '" << cmd << "'; expected serve, make-tiny-model or quantize\n" << k_usage;
  return 2;
}
