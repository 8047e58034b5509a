// The registry's data model: what `models.toml` says, after parsing, defaults and derivation.
// Parsing, linting and discovery live in registry/registry.{hpp,cpp}; this header is the shared
// vocabulary of the daemon (supervisor, gateway, preflight, policies).
//
// Units are in the field names or comments: *_gib are GiB (2^30 bytes), *_bytes bytes, *_ms
// milliseconds, *_s seconds, ctx and *_ctx tokens. See docs/registry.md for every key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::registry {

/// The largest KV cap (ctx × kv_cache_bytes_per_token) a model may declare: 256 TiB, far above
/// any GPU's memory, so a larger product is a typo (or an overflow), not a plan.
inline constexpr int64_t k_max_kv_cache_bytes = int64_t{1} << 48;

/// Which kind of engine process a slot runs. `command` is any program speaking the OpenAI HTTP API.
enum class EngineKind { native, vllm, llama_cpp, command };

/// "native" | "vllm" | "llama.cpp" | "command"
std::string_view to_string(EngineKind k);
/// Inverse of to_string; nullopt for any other text.
std::optional<EngineKind> engine_kind_from_string(std::string_view s);

/// Where a value came from in models.toml, for error messages ("models.toml:41").
struct SourceLocation {
  std::string file;
  int line = 0;    // 1-based; 0 when the value is a default or derived
  int column = 0;  // 1-based; 0 when unknown
};

/// An effort preset: an alias that reaches the same base model with gap-filling
/// `chat_template_kwargs` (and optionally other request defaults). What the client sent wins.
struct EffortPreset {
  std::string alias;                   // e.g. "glm53-flash-low"
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // e.g. {"reasoning_effort":"low"}
  std::optional<int64_t> thinking_token_budget;  // default budget for this preset, tokens
};

/// Per-model policy configuration ([models.X.policies] in models.toml). Every policy is off
/// unless set; see docs/policies.md.
struct PolicyConfig {
  std::optional<int64_t> min_output_tokens;     // floor for max_tokens, tokens (GLM: 8192)
  bool sanitize_tool_tags = false;
  bool restore_reasoning = false;
  bool mirror_content = false;                  // emit reasoning as both `reasoning` and `reasoning_content`
  bool answer_rescue = false;
  bool flatten_content = false;                 // join array-of-text content for string-only templates
  bool capture = false;                         // also needs SERVEDECK_CAPTURE=1
  std::vector<std::string> accepted_reasoning_efforts;  // values the template accepts, e.g. ["low","high","max"]
  std::optional<std::string> default_reasoning_effort;  // mapping target for unaccepted values
  std::vector<std::string> unsupported_kwargs;  // chat_template_kwargs the template ignores (G16)
  bool thinking_token_budget = false;           // engine supports thinking_token_budget
  bool coerce_tool_argument_types = false;      // G07: coerce streamed args to schema types
  bool fit_output_budget = true;                // lower budgets that cannot fit ctx − prompt
  int64_t fit_output_budget_floor = 256;        // never lower a budget below this, tokens
  bool strip_billing_header = true;             // /v1/messages: drop Claude Code's x-anthropic-billing-header block
  nlohmann::json extra = nlohmann::json::object();  // policy-specific settings, by policy name
};

/// One [models.NAME] table.
struct ModelEntry {
  std::string name;                 // table key, e.g. "glm53"; what `servedeck switch` takes
  SourceLocation location;          // where the table starts
  std::string config_dir;           // absolute directory of the models.toml it came from
  EngineKind engine = EngineKind::command;
  std::string served_name;          // the id clients send and /v1/models lists, e.g. "glm53-flash"
  std::vector<std::string> aliases; // extra ids that reach this model with no preset
  std::vector<EffortPreset> presets;
  std::string description;
  bool vision = false;              // the model accepts images (/v1/messages refuses image blocks otherwise)

  // Checkpoint and engine.
  std::string checkpoint;           // directory in Hugging Face layout (or a GGUF file for llama.cpp)
  std::string program;              // executable, or a venv interpreter for vllm
  std::vector<std::string> args;    // argv[1..], with placeholders {port} {ctx} {model} {kv_cache_bytes} ...
  std::map<std::string, std::string> env;  // extra environment, placeholders allowed
  std::string host = "127.0.0.1";   // where the engine listens
  int port = 0;                     // engine port; 0 = pick a free port at launch
  int gpu = 0;                      // GPU index (CUDA_VISIBLE_DEVICES for the engine)
  std::optional<bool> requires_gpu; // declared; when unset see needs_gpu()

  // Context and memory.
  int64_t ctx = 0;                  // context served, tokens
  std::optional<int64_t> validated_ctx;   // largest context the launch was validated at, tokens
  std::optional<int64_t> prefilled_ctx;   // largest prompt actually prefilled, tokens (informational)
  std::optional<int64_t> model_max_ctx;   // checkpoint limit, tokens (declared, or discovered)
  bool model_max_ctx_discovered = false;  // true when read from config.json max_position_embeddings
  std::optional<int64_t> kv_cache_bytes_per_token;  // bytes per token of context
  std::optional<double> util;       // fraction of total VRAM the engine may take, (0, 1]
  std::optional<double> host_ram_gib;     // MemAvailable needed before launch, GiB
  std::optional<double> cpu_offload_gib;  // expert weight kept in host RAM, GiB
  std::optional<double> shm_gib;          // /dev/shm space the engine needs, GiB
  std::optional<double> load_floor_offload_gib;  // below this offload the load OOMs, GiB
  bool pins_host_memory = false;    // engine pins host pages (cudaHostRegister): no other CUDA process
  bool uses_cuda_ipc = false;       // hands CUDA IPC handles between processes: needs ptrace_scope 0
  std::string hot_profile;          // hot-expert profile path (optional)
  std::optional<double> hot_profile_offload_gib;  // offload the profile was captured at, GiB

  // Supervision.
  std::string health_path = "/health";
  int start_timeout_s = 600;        // load deadline, extended while the log shows progress
  int stop_timeout_s = 30;          // SIGTERM → SIGKILL grace
  int drain_timeout_s = 30;         // wait for in-flight requests before a switch stops the engine
  int vram_release_timeout_s = 60;  // wait for NVML to show the memory freed after stop
  std::vector<std::string> shm_globs;  // /dev/shm files this engine owns, e.g. "/dev/shm/flashnext-kv-*"
  bool warmup = true;               // ready = health 200 AND a one-token completion succeeded
  // Liveness after ready (docs/supervisor.md): any failure makes the slot `unhealthy`.
  int liveness_interval_s = 10;     // GET health_path this often while ready; 0 = never
  int liveness_idle_s = 60;         // a one-token completion after this long without a request; 0 = never
  int liveness_timeout_s = 30;      // deadline of each liveness probe
  bool restart_on_failure = false;  // restart an engine that became unhealthy or died after ready

  // Gateway behaviour.
  bool switch_on_request = false;   // queue requests for this model while the daemon switches to it
  int queue_max = 16;               // waiting requests when switch_on_request
  int queue_timeout_s = 300;        // give up (503 + Retry-After) after this
  int min_residency_s = 0;          // do not evict this model sooner than this after ready
  int connect_timeout_ms = 5000;
  int first_byte_timeout_ms = 600000;  // TTFT deadline (long prefill at 300k context ≈ 205 s)
  int max_gap_ms = 120000;          // longest silence between streamed events
  // note: a non-streamed answer arrives whole at its end: 16k tokens at GLM's ~16 tok/s take
  // ~1000 s after a prefill of up to ~205 s (docs seed), so the default leaves room for both.
  int request_timeout_s = 1800;     // a non-streaming request's whole exchange with the engine

  PolicyConfig policies;

  /// KV cap derived from the context: ctx × kv_cache_bytes_per_token, bytes.
  /// (GLM: 327,680 × 17,200 = 5,636,096,000.) nullopt when kv_cache_bytes_per_token is unset;
  /// INT64_MAX when the product overflows (the registry refuses a cap above k_max_kv_cache_bytes).
  std::optional<int64_t> kv_cache_bytes() const {
    if (!kv_cache_bytes_per_token) return std::nullopt;
    int64_t bytes = 0;
    if (__builtin_mul_overflow(ctx, *kv_cache_bytes_per_token, &bytes)) return INT64_MAX;
    return bytes;
  }

  /// Every id that reaches this model: served_name, aliases, preset aliases.
  std::vector<std::string> all_ids() const;

  /// Whether a launch needs a GPU: `requires_gpu` when declared; otherwise true for vllm, true for
  /// llama.cpp when args offload layers (-ngl/--n-gpu-layers/--gpu-layers > 0), false for native
  /// (the CPU reference engine) and command.
  bool needs_gpu() const;
};

/// Global settings ([server] table).
struct ServerConfig {
  std::string listen_host = "127.0.0.1";
  int listen_port = 8090;           // 0 = ephemeral (tests)
  std::string state_dir = "/var/lib/servedeck";
  std::vector<std::string> api_keys;  // empty = no auth (loopback default)
  std::string default_model;        // started when the daemon starts; empty = none
  std::size_t max_body_bytes = 32 * 1024 * 1024;
  int64_t log_max_bytes = 64 * 1024 * 1024;  // per-launch engine log rotation size, bytes (up to 2^31)
  int log_keep = 5;                 // rotated launch logs kept per model
  bool restore_previous_on_failed_start = false;
  // The /dev/shm reaper keeps a file owned by the uid of a process whose maps or fds it cannot
  // read (docs/supervisor.md, "/dev/shm"); by default such a process does not stop a reap.
  bool shm_keep_unverifiable = false;
  /// Host names, besides IP addresses and `localhost`, that the Host header may carry, and that an
  /// Origin header may name (lower-cased). See docs/operations.md "Security".
  std::vector<std::string> allowed_hosts;
  /// How long a stored /v1/responses turn is kept for previous_response_id, seconds; 0 = never
  /// stored. Enforced by deletion (at start and periodically).
  int64_t responses_retention_s = 7 * 24 * 3600;
  /// The request log and the events table: rows older than this are deleted, seconds.
  int64_t history_retention_s = 30 * 24 * 3600;
  /// The request log and the events table: at most this many rows each (the newest are kept).
  int64_t history_max_rows = 100000;
};

/// A known-bad setting, as data ([[rules]]). See preflight/rules.{hpp,cpp}.
struct Rule {
  std::string id;
  SourceLocation location;
  std::string action;               // "refuse" | "warn"
  std::string reason;               // why, with the measured figure
  nlohmann::json match;             // match expression (engine, env, argv, numeric comparisons, ...)
};

/// The whole file.
struct Registry {
  std::string path;                 // the models.toml read
  std::string config_dir;           // absolute directory of `path`; relative paths resolve here
  ServerConfig server;
  std::vector<ModelEntry> models;   // in file order
  std::vector<Rule> rules;

  /// The model whose served_name, alias or preset alias is `id`; nullptr when none.
  const ModelEntry* find_by_id(std::string_view id) const;
  /// The model whose table key is `name`; nullptr when none.
  const ModelEntry* find_by_name(std::string_view name) const;
  /// The preset for `id` when `id` is a preset alias; nullptr otherwise.
  const EffortPreset* find_preset(std::string_view id) const;
};

}  // namespace servedeck::registry
