#include "worker/server/tiny_chat_model.hpp"

#include <stdexcept>
#include <vector>

#include "worker/model/glm_chat_template.hpp"
#include "worker/model/glm_fixture_tokenizer.hpp"
#include "worker/model/tiny_model.hpp"
#include "worker/tokenizer/tokenizer.hpp"

namespace servedeck::worker {

namespace {

std::int64_t single_token(const Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text, /*parse_special=*/true);
  if (ids.size() != 1)
    throw std::runtime_error("tiny chat model: expected " + std::string(text == "\n" ? "\"\\n\"" : "\"\\n\\n\"") +
                             " to be one token of the tokenizer, got " + std::to_string(ids.size()));
  return ids[0];
}

TinyModelOptions chat_options(const Tokenizer& tok, const std::string& tokenizer_dir, std::uint64_t seed) {
  TinyModelOptions o;
  o.seed = seed;
  o.residual_scale = 0.05;
  // Qwen3's template ends its generation prompt with "\n" (thinking on) or "\n\n" (thinking off).
  o.planted_reply.after = {single_token(tok, "\n"), single_token(tok, "\n\n")};
  for (auto id : tok.encode(k_tiny_chat_reply, /*parse_special=*/false)) o.planted_reply.tokens.push_back(id);
  const auto end = tok.token_id("<|im_end|>");
  if (!end) throw std::runtime_error("tiny chat model: the tokenizer in '" + tokenizer_dir + "' has no <|im_end|>");
  o.planted_reply.end_token = *end;
  return o;
}

std::int64_t special_token(const Tokenizer& tok, const std::string& text, const std::string& dir) {
  const auto id = tok.token_id(text);
  if (!id) throw std::runtime_error("tiny model: the tokenizer in '" + dir + "' has no " + text);
  return *id;
}

}  // namespace

void write_tiny_glm_model(const std::string& out_dir, const std::string& tokenizer_dir, const std::string& variant,
                          std::uint64_t seed) {
  if (variant != "random" && variant != "chat" && variant != "tool")
    throw std::runtime_error("tiny GLM model: variant '" + variant + "' (expected random, chat or tool)");
  TinyModelOptions o = tiny_glm_options();
  o.seed = seed;
  o.chat_template = std::string(glm45_chat_template());
  if (variant == "random") {
    write_model(out_dir, o, tokenizer_dir);
    return;
  }
  // The planted reply is tokenised with the fixture tokenizer the checkpoint ships: write it
  // first (write_model writes it again, identically).
  write_glm_fixture_tokenizer(out_dir, tokenizer_dir);
  const auto tok = Tokenizer::from_file(out_dir + "/tokenizer.json");
  o.residual_scale = 0.05;
  o.planted_reply.after = {special_token(tok, "<|assistant|>", out_dir), special_token(tok, "</think>", out_dir)};
  const std::string reply = variant == "chat" ? k_tiny_chat_reply : k_tiny_glm_tool_call;
  for (auto id : tok.encode(reply, /*parse_special=*/true)) o.planted_reply.tokens.push_back(id);
  o.planted_reply.end_token = special_token(tok, variant == "chat" ? "<|user|>" : "<|observation|>", out_dir);
  write_model(out_dir, o, tokenizer_dir);
}

void write_tiny_chat_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed) {
  const auto tok = Tokenizer::from_file(tokenizer_dir + "/tokenizer.json");
  write_model(out_dir, chat_options(tok, tokenizer_dir, seed), tokenizer_dir);
}

void write_tiny_tool_model(const std::string& out_dir, const std::string& tokenizer_dir, std::uint64_t seed) {
  const auto tok = Tokenizer::from_file(tokenizer_dir + "/tokenizer.json");
  TinyModelOptions o = chat_options(tok, tokenizer_dir, seed);
  o.planted_switch.tokens = o.planted_reply.tokens;  // the answer, once a tool result is in the context
  o.planted_switch.marker = special_token(tok, "<tool_response>", tokenizer_dir);
  o.planted_reply.tokens.clear();
  for (auto id : tok.encode(k_tiny_tool_call, /*parse_special=*/true)) o.planted_reply.tokens.push_back(id);
  write_model(out_dir, o, tokenizer_dir);
}

}  // namespace servedeck::worker
