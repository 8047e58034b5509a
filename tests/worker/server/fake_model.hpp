// A LoadedModel made of fakes for the server tests: the FakeBackend/FakeVocab of the engine
// tests, a text model with a tiny ChatML-like template, and a script that answers by the last
// user message (byte tokens): "weather" → reasoning + a hermes tool call, "pick a tool" → a hermes call
// that follows a forced start (tool_choice), "glm" → a GLM call, "long" → 'a' forever, anything
// else → "Hello there!". Chat template kwarg open_thinking: the prompt ends inside "<think>\n".
#pragma once

#include <future>
#include <memory>
#include <string>

#include "tests/worker/engine/fake_backend.hpp"
#include "worker/server/worker_server.hpp"

namespace servedeck::worker::testing {

class FakeTextModel : public TextModel {
 public:
  std::string token_bytes(int32_t id) const override { return vocab_.token_bytes(id); }
  bool is_special(int32_t id) const override { return vocab_.is_special(id); }
  std::vector<int32_t> encode(std::string_view text) const override { return vocab_.encode(text); }
  std::optional<std::string> decode(std::span<const int32_t> ids, bool skip_special, std::string& error) const override {
    for (int32_t id : ids) {
      if (id < 0 || id >= k_fake_vocab) {
        error = "token id " + std::to_string(id) + " is out of range [0, " + std::to_string(k_fake_vocab) + ")";
        return std::nullopt;
      }
    }
    return vocab_.decode(std::vector<int32_t>(ids.begin(), ids.end()), skip_special);
  }
  std::optional<int32_t> token_id(std::string_view token) const override {
    for (int32_t id = 256; id < k_fake_vocab; ++id)
      if (vocab_.token_bytes(id) == token) return id;
    return std::nullopt;
  }
  std::size_t vocab_size() const override { return k_fake_vocab; }
  std::string render_chat(const nlohmann::json& ctx) const override {
    std::string out;
    if (ctx.contains("tools")) {
      out += "<|im_start|>system\ntools:";
      for (const auto& t : ctx["tools"]) out += " " + t["function"]["name"].get<std::string>();
      out += "<|im_end|>\n";
    }
    for (const auto& m : ctx["messages"]) {
      const std::string content = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
      if (content == "raise") throw ChatRenderError("Conversation roles must alternate user/assistant");
      out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + content + "<|im_end|>\n";
    }
    if (ctx.value("add_generation_prompt", false)) {
      out += "<|im_start|>assistant\n";
      if (ctx.contains("enable_thinking") && ctx["enable_thinking"] == false) out += "<think>\n\n</think>\n\n";
      if (ctx.value("open_thinking", false)) out += "<think>\n";  // a template that opens the block
    }
    return out;
  }

 private:
  FakeVocab vocab_;
};

/// Next byte of the scripted answer for this context, EOS at its end.
inline int32_t chat_script(const std::vector<int32_t>& ctx) {
  static const FakeVocab vocab;
  const std::string text = vocab.decode(ctx);
  const std::string marker = "<|im_start|>assistant\n";
  const auto a = text.rfind(marker);
  if (a == std::string::npos) return -1;
  const auto u = text.rfind("<|im_start|>user\n", a);
  const std::string user = u == std::string::npos ? "" : text.substr(u, a - u);
  std::string produced = text.substr(a + marker.size());
  if (produced.rfind("<think>\n\n</think>\n\n", 0) == 0) produced.erase(0, 19);
  if (user.find("long") != std::string::npos) return 'a';
  std::string answer = "Hello there!";
  if (user.find("weather") != std::string::npos)
    answer = "<think>need a tool</think>Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  else if (user.find("pick a tool") != std::string::npos) {
    // A hermes call to get_weather; when the answer's start was forced (tool_choice), it goes on
    // from that start: after "<tool_call>" (whatever preceded it), or after a forced name.
    const std::string head = "<tool_call>\n{\"name\": \"", args = "\"arguments\": {";
    const auto open = produced.find("<tool_call>");
    std::string start = head + "get_weather\", " + args;
    if (const auto h = produced.find(head); h != std::string::npos) {
      if (const auto at = produced.find(args, h); at != std::string::npos) start = produced.substr(h, at + args.size() - h);
    }
    answer = (open == std::string::npos ? "" : produced.substr(0, open)) + start + "\"city\": \"Paris\"}}\n</tool_call>";
  } else if (user.find("coder") != std::string::npos)
    answer = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
             "</parameter>\n</function>\n</tool_call>";
  else if (user.find("glm") != std::string::npos)
    answer = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
  if (produced.size() < answer.size() && answer.compare(0, produced.size(), produced) == 0)
    return static_cast<unsigned char>(answer[produced.size()]);
  return k_eos;
}

struct FakeModelHandles {
  FakeBackend* backend = nullptr;
  Engine* engine = nullptr;
};

/// A loader building the fake model; it reports progress 0.5 and then waits for `gate` (when
/// given) before finishing, so tests can observe /health while loading.
inline ModelLoader fake_loader(std::size_t kv_cache_bytes, FakeModelHandles* handles,
                               std::shared_future<void> gate = {}, int delay_ms = 0,
                               std::size_t prefill_chunk = EngineOptions{}.prefill_chunk) {
  return [=](const ProgressFn& progress) {
    progress(0.5);
    if (gate.valid()) gate.wait();
    auto m = std::make_unique<LoadedModel>();
    m->root = "/fake/model";
    m->max_model_len = 4096;
    m->text = std::make_unique<FakeTextModel>();
    auto backend = std::make_unique<FakeBackend>(chat_script, 256);
    backend->delay_ms = delay_ms;
    handles->backend = backend.get();
    m->backend = std::move(backend);
    EngineOptions eo;
    eo.kv_cache_bytes = kv_cache_bytes;
    eo.prefill_chunk = prefill_chunk;
    eo.max_model_len = m->max_model_len;
    eo.eos_ids = {k_eos};
    eo.think_start_id = k_think;
    eo.think_end_id = k_think_end;
    m->engine = std::make_unique<Engine>(*m->backend, *m->text, eo);
    handles->engine = m->engine.get();
    return m;
  };
}

}  // namespace servedeck::worker::testing
