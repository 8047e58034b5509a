// libFuzzer target: the stream pipeline (every policy on) and the gateway's stream normaliser
// on a hostile engine stream, and ArgumentRepair's streamed == whole invariant.
//   input not starting with '\0': the engine's SSE bytes, fed to the SSE parser in pieces of
//   1, 7, 64, 3 and 200 bytes in turn; each data event is one chunk (as the gateway's proxy
//   reads them: parse_untrusted, [DONE] ends, an {"error":…} event ends);
//   input starting with '\0': fragments separated by '\1', each a delta whose first byte names
//   its field ('a' arguments, 'n' tool name, 'i' a new tool call, 'r' reasoning, else content),
//   then a finish chunk ("tool_calls" when the input ends with 't', else "stop").
// Invariants: fuzz_support.hpp; every SSE event the normaliser writes holds JSON; in fragment
// mode, ArgumentRepair over the argument fragments gives what it gives over their
// concatenation (text, error, flags), with and without coercion.
#include <vector>

#include "common/sse.hpp"
#include "gateway/server/stream_normalizer.hpp"
#include "policies/sanitize_tool_tags.hpp"
#include "policies/tool_schema.hpp"
#include "tests/policies/fuzz/fuzz_support.hpp"

using namespace servedeck;
using namespace servedeck::fuzz;

namespace {

struct Run {
  const registry::ModelEntry& model;
  policies::ReasoningStore& store;
  policies::ResponseContext ctx;
  policies::StreamPipeline pipeline;
  gateway::StreamNormalizer normalizer;
  std::string wire;

  Run(const registry::ModelEntry& m, policies::ReasoningStore& s)
      : model(m), store(s), ctx{&m, "glm53-flash", tools_request(), nullptr, &s}, pipeline(ctx),
        normalizer(gateway::StreamNormalizer::Options{.model_id = "glm53-flash", .include_usage = true, .id_seed = "fuzz"}) {}

  void on_chunk(const json& chunk) {
    for (const auto& c : pipeline.on_chunk(chunk)) {
      check_sendable(c);
      normalizer.on_chunk(c, wire);
    }
    check_budget(ctx.budget);
  }

  void finish() {
    std::optional<policies::PolicyError> err;
    auto rest = pipeline.finish(err);
    check_budget(ctx.budget);
    for (const auto& c : rest) {
      check_sendable(c);
      normalizer.on_chunk(c, wire);
    }
    if (err) {
      if (err->message.empty() || err->code.empty()) __builtin_trap();
      normalizer.fail(err->message, "server_error", err->code, ErrorSource::servedeck, wire);
    } else {
      normalizer.finish(wire);
    }
    sse::Parser p;
    auto events = p.feed(wire);
    if (auto last = p.finish()) events.push_back(*last);
    for (const auto& e : events) {
      if (e.comment || e.data == "[DONE]") continue;
      if (parse_untrusted(e.data).is_discarded()) __builtin_trap();
    }
  }
};

json delta_chunk(json delta, json finish = nullptr) {
  return {{"id", "chatcmpl-fuzz"}, {"object", "chat.completion.chunk"}, {"created", 1},
          {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}}})}};
}

void check_repair_split(const std::vector<std::string>& fragments) {
  static const std::vector<policies::DeclaredTool> declared = policies::declared_tools(tools_request());
  std::string whole;
  for (const auto& f : fragments) whole += f;
  for (bool coerce : {false, true}) {
    policies::ArgumentRepairOptions o{.sanitize = true, .coerce = coerce, .allow_resplit = true};
    auto at_once = policies::repair_arguments(whole, &declared[0], o);
    policies::ArgumentRepair r(&declared[0], o);
    std::string streamed;
    for (const auto& f : fragments) streamed += r.feed(f);
    streamed += r.finish();
    if (r.error() != at_once.error) __builtin_trap();
    if (!at_once.error && (streamed != at_once.text || r.sanitized() != at_once.sanitized || r.coerced() != at_once.coerced))
      __builtin_trap();
  }
}

void run_sse(std::string_view text, Run& run) {
  static constexpr std::size_t k_pieces[] = {1, 7, 64, 3, 200};
  sse::Parser parser;
  bool ended = false;
  auto take = [&](const sse::Event& ev) {
    if (ended || ev.comment) return;
    if (ev.data == "[DONE]") {
      ended = true;
      return;
    }
    json chunk = parse_untrusted(ev.data);
    if (chunk.is_discarded()) return;  // the gateway answers 502 engine_bad_event
    if (chunk.is_object() && chunk.contains("error")) {
      ended = true;
      return;
    }
    run.on_chunk(chunk);
  };
  std::size_t at = 0, i = 0;
  while (at < text.size() && !ended) {
    std::size_t n = k_pieces[i++ % std::size(k_pieces)];
    for (const auto& ev : parser.feed(text.substr(at, n))) take(ev);
    at += n;
  }
  if (!ended) {
    if (auto last = parser.finish()) take(*last);
  }
  run.finish();
}

void run_fragments(std::string_view text, Run& run) {
  std::vector<std::string> args;
  int index = 0;
  bool named = false;
  std::size_t at = 1;
  while (at <= text.size()) {
    std::size_t end = text.find('\1', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view f = text.substr(at, end - at);
    at = end + 1;
    if (f.empty()) continue;
    const char kind = f.front();
    std::string body(f.substr(1));
    json tc = {{"index", index}, {"function", json::object()}};
    switch (kind) {
      case 'a':
        if (index == 0) args.push_back(body);
        if (!named) tc["function"]["name"] = "read";
        named = true;
        tc["function"]["arguments"] = body;
        run.on_chunk(delta_chunk({{"tool_calls", json::array({tc})}}));
        break;
      case 'n':
        tc["function"]["name"] = body;
        named = true;
        run.on_chunk(delta_chunk({{"tool_calls", json::array({tc})}}));
        break;
      case 'i':
        ++index;
        named = false;
        break;
      case 'r':
        run.on_chunk(delta_chunk({{"reasoning_content", body}}));
        break;
      default:
        run.on_chunk(delta_chunk({{"content", std::string(f)}}));
        break;
    }
  }
  run.on_chunk(delta_chunk(json::object(), !text.empty() && text.back() == 't' ? "tool_calls" : "stop"));
  run.finish();
  check_repair_split(args);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const registry::ModelEntry model = all_policies_model();
  static policies::ReasoningStore store;
  const std::string_view text = text_of(data, size);
  Run run(model, store);
  if (!text.empty() && text.front() == '\0') {
    run_fragments(text, run);
  } else {
    run_sse(text, run);
  }
  return 0;
}
