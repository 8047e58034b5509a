// Linear time: 1 MiB hostile argument values and content through the request, the response and
// the stream pipeline (split into 4096 chunks). Each run's work is read off its WorkBudget (the
// steps every transducer charges for the bytes it examines) and must stay within
// kStepsPerByte × input bytes; a wall-clock guard of kGuardSeconds (generous: sanitizer builds
// are 3-10x slower) catches a hang the counter would not see. Before the transducers tracked a
// value's held edge as a state, a value's leading whitespace was re-scanned on every byte: 40 KB
// took 3 s, 1 MiB would have taken hours.
// The budget's exhausted path: a request, a body and a stream whose budget is too small for them
// end with the error naming the limit.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <string>

#include "common/json_limits.hpp"
#include "policies/pipeline.hpp"
#include "policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

constexpr std::size_t kMiB = 1u << 20;
constexpr std::uint64_t kStepsPerByte = 16;  // what the transducers may spend; WorkBudget allows 64
constexpr double kGuardSeconds = 20;
constexpr std::size_t kChunk = 256;          // 1 MiB in 4096 chunks

std::string repeat(std::string_view unit, std::size_t bytes) {
  std::string s;
  s.reserve(bytes + unit.size());
  while (s.size() < bytes) s += unit;
  return s;
}

/// One hostile argument text and what the repaired text must be.
struct Shape {
  const char* name;
  std::string arguments;
  std::function<bool(const std::string&)> repaired_ok;
  const char* response_error = nullptr;  // the response side's verdict, when the call is unrecoverable there
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  std::string ws = std::string(kMiB, ' ');
  out.push_back({"a value's leading whitespace run", "{\"path\": \"" + ws + "x\"}",
                 [ws](const std::string& r) { return r == "{\"path\": \"" + ws + "x\"}"; }});
  out.push_back({"leading <arg_value> tags between whitespace", "{\"path\": \"" + repeat("<arg_value>   ", kMiB) + "x\"}",
                 [](const std::string& r) { return r == "{\"path\": \"   x\"}"; }});
  std::string half = repeat("<arg_value", kMiB);
  out.push_back({"half tags: <arg_value repeated", "{\"path\": \"" + half + "\"}",
                 [half](const std::string& r) { return r == "{\"path\": \"" + half + "\"}"; }});
  out.push_back({"trailing </arg_value> tags", "{\"path\": \"x" + repeat("</arg_value> ", kMiB) + "\"}",
                 [](const std::string& r) { return r == "{\"path\": \"x\"}"; }});
  std::string esc = repeat("\\u003carg_value\\u003e", kMiB);
  out.push_back({"escaped tags (\\u003c) in a value", "{\"path\": \"" + esc + "x\"}",
                 [](const std::string& r) { return r == "{\"path\": \"x\"}"; }});
  std::string brackets = std::string(kMiB, '[');
  out.push_back({"unbalanced nested brackets", brackets, [brackets](const std::string& r) { return r == brackets; }});
  std::string nested = "{\"path\": \"a\", \"n\": " + std::string(kMiB / 2, '[') + std::string(kMiB / 2, ']') + "}";
  out.push_back({"balanced nesting 512 Ki deep", nested, [nested](const std::string& r) { return r == nested; }});
  std::string open_value = "{\"path\": \"" + std::string(kMiB, 'a');
  out.push_back({"an unterminated string value", open_value, [open_value](const std::string& r) { return r == open_value; }});
  std::string open_key = "{\"" + repeat("path</arg_key>", kMiB);
  out.push_back({"an unterminated key full of tags", open_key, [open_key](const std::string& r) { return r == open_key; }});
  out.push_back({"a key behind a run of tags", "{\"" + repeat("<arg_key></arg_key>", kMiB) + "path\": \"x\"}",
                 [](const std::string& r) { return r == "{\"path\": \"x\"}"; }});
  // G02: a key of many fragments is re-split on the response side, and "pa" is no parameter of
  // `read`: unrecoverable there. The request side keeps the first fragment (echoed history).
  out.push_back({"a key of 87381 fragments", "{\"" + repeat("pa</arg_key>", kMiB) + "th\": \"x\"}",
                 [](const std::string& r) { return r == "{\"pa\": \"x\"}"; }, "tool_call_unrecoverable"});
  return out;
}

json read_tool() {
  return {{"type", "function"},
          {"function", {{"name", "read"},
                        {"parameters", {{"type", "object"},
                                        {"properties", {{"path", {{"type", "string"}}}, {"n", {{"type", "array"}}}}},
                                        {"required", {"path"}}}}}}};
}

json tools_request() {
  return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"tools", json::array({read_tool()})}};
}

registry::ModelEntry repairing_model() {
  auto m = glm_entry();  // sanitize_tool_tags on
  m.policies.coerce_tool_argument_types = true;
  m.policies.answer_rescue = true;
  return m;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string call_arguments(const json& message) {
  return message["tool_calls"][0]["function"]["arguments"].get<std::string>();
}

/// The engine's stream of one call with these arguments, kChunk bytes a chunk, then the finish.
std::vector<json> call_stream(const std::string& arguments) {
  std::vector<json> in;
  for (std::size_t i = 0; i < arguments.size(); i += kChunk) in.push_back(args_chunk(arguments.substr(i, kChunk), i == 0 ? "read" : ""));
  in.push_back(chunk(json::object(), "tool_calls"));
  return in;
}

/// Concatenates the streamed argument fragments of call 0 (assemble() re-copies per fragment).
std::string streamed_arguments(const std::vector<json>& out) {
  std::string args;
  for (const auto& c : out) {
    if (!c.contains("choices")) continue;
    for (const auto& ch : c["choices"]) {
      if (!ch.contains("delta") || !ch["delta"].contains("tool_calls")) continue;
      for (const auto& tc : ch["delta"]["tool_calls"]) {
        if (tc.contains("function") && tc["function"].contains("arguments"))
          args += tc["function"]["arguments"].get<std::string>();
      }
    }
  }
  return args;
}

}  // namespace

TEST_CASE("linear time: 1 MiB argument values through the request pipeline (echoed history)") {
  auto model = repairing_model();
  for (const auto& s : shapes()) {
    CAPTURE(s.name);
    RequestContext ctx;
    ctx.model = &model;
    ctx.requested_id = "glm53-flash";
    ctx.prompt_tokens = 1000;
    json body = tools_request();
    body["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                                {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                                             {"function", {{"name", "read"}, {"arguments", s.arguments}}}}})}});
    auto t0 = std::chrono::steady_clock::now();
    RequestPipeline p(ctx);
    auto err = p.apply(body);
    const double secs = seconds_since(t0);
    CHECK_FALSE(err.has_value());
    CHECK(s.repaired_ok(call_arguments(body["messages"][1])));
    MESSAGE(std::string(s.name) << ": " << ctx.budget.steps() << " steps for " << s.arguments.size() << " bytes, " << secs << " s");
    CHECK(ctx.budget.steps() <= kStepsPerByte * s.arguments.size());
    CHECK(secs < kGuardSeconds);
  }
}

TEST_CASE("linear time: 1 MiB argument values through the response pipeline (non-streamed body)") {
  auto model = repairing_model();
  Counter counter;
  for (const auto& s : shapes()) {
    CAPTURE(s.name);
    ResponseContext ctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    json body = {{"choices", json::array({{{"index", 0}, {"finish_reason", "tool_calls"},
                                           {"message", {{"role", "assistant"}, {"content", ""},
                                                        {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                            {"function", {{"name", "read"}, {"arguments", s.arguments}}}}})}}}}})}};
    auto t0 = std::chrono::steady_clock::now();
    ResponsePipeline p(ctx);
    auto err = p.apply_body(body);
    const double secs = seconds_since(t0);
    if (s.response_error) {
      REQUIRE(err.has_value());
      CHECK(err->code == s.response_error);
    } else {
      REQUIRE_FALSE(err.has_value());
      CHECK(s.repaired_ok(call_arguments(body["choices"][0]["message"])));
    }
    MESSAGE(std::string(s.name) << ": " << ctx.budget.steps() << " steps for " << s.arguments.size() << " bytes, " << secs << " s");
    CHECK(ctx.budget.steps() <= kStepsPerByte * s.arguments.size());
    CHECK(secs < kGuardSeconds);
  }
}

TEST_CASE("linear time: 1 MiB argument values streamed in 4096 chunks") {
  auto model = repairing_model();
  Counter counter;
  for (const auto& s : shapes()) {
    CAPTURE(s.name);
    ResponseContext ctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    auto in = call_stream(s.arguments);
    auto t0 = std::chrono::steady_clock::now();
    std::optional<PolicyError> err;
    auto out = run_stream(ctx, in, &err);
    const double secs = seconds_since(t0);
    if (s.response_error) {
      REQUIRE(err.has_value());
      CHECK(err->code == s.response_error);
    } else {
      REQUIRE_FALSE(err.has_value());
      CHECK(s.repaired_ok(streamed_arguments(out)));
    }
    MESSAGE(std::string(s.name) << ": " << ctx.budget.steps() << " steps for " << s.arguments.size() << " bytes, " << secs << " s");
    CHECK(ctx.budget.steps() <= kStepsPerByte * s.arguments.size());
    CHECK(secs < kGuardSeconds);
  }
}

TEST_CASE("linear time: 1 MiB of content with an unclosed <tool_call> block, streamed in 4096 chunks") {
  // answer_rescue holds a <tool_call> block until it closes; the search for the closing tag
  // resumed from the start of the held text on every chunk before.
  auto model = repairing_model();
  Counter counter;
  const std::string opening = "<tool_call>read<arg_key>path</arg_key><arg_value>";
  // Qwen3-Coder's XML form too: a megabyte of parameters without their closing tags, and one
  // value that runs to </function>.
  const std::string xml = "<tool_call>\n<function=read>\n";
  for (const std::string& content : {opening + std::string(kMiB, 'a'), repeat("<tool_call>", kMiB),
                                     opening + "a.txt</arg_value>" + std::string(kMiB, ' ') + "</tool_call>",
                                     xml + repeat("<parameter=path>\n", kMiB) + "</function>\n</tool_call>",
                                     xml + "<parameter=path>\n" + std::string(kMiB, 'a') + "\n</function>\n</tool_call>",
                                     xml + repeat("<parameter=", kMiB)}) {
    ResponseContext ctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
    std::vector<json> in = {chunk({{"reasoning_content", "thinking"}})};
    for (std::size_t i = 0; i < content.size(); i += kChunk) in.push_back(chunk({{"content", content.substr(i, kChunk)}}));
    in.push_back(chunk(json::object(), "stop"));
    auto t0 = std::chrono::steady_clock::now();
    std::optional<PolicyError> err;
    auto out = run_stream(ctx, in, &err);
    const double secs = seconds_since(t0);
    REQUIRE_FALSE(err.has_value());
    std::string got;
    bool call = false;
    for (const auto& c : out) {
      const auto& d = c["choices"][0]["delta"];
      if (d.contains("content")) got += d["content"].get<std::string>();
      if (d.contains("tool_calls")) call = true;
    }
    const bool complete = content.find("</tool_call>") != std::string::npos;
    CHECK(call == complete);                 // the complete block became the call (answer rescue)
    if (!complete) CHECK(got == content);    // an unclosed block is content, all of it, in order
    MESSAGE(ctx.budget.steps() << " steps for " << content.size() << " bytes, " << secs << " s");
    CHECK(ctx.budget.steps() <= kStepsPerByte * content.size());
    CHECK(secs < kGuardSeconds);
  }
}

TEST_CASE("work budget: a request, a body and a stream over budget end with the error naming the limit") {
  auto model = repairing_model();
  Counter counter;
  const std::string args = "{\"path\": \"" + std::string(4096, ' ') + "x\"}";

  RequestContext rctx;
  rctx.model = &model;
  rctx.requested_id = "glm53-flash";
  rctx.prompt_tokens = 1000;
  rctx.budget = WorkBudget(1, 0);  // one step per input byte: less than any repair spends
  json body = tools_request();
  body["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                              {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                           {"function", {{"name", "read"}, {"arguments", args}}}}})}});
  RequestPipeline rp(rctx);
  auto rerr = rp.apply(body);
  REQUIRE(rerr.has_value());
  CHECK(rerr->find("work budget of") != std::string::npos);
  CHECK(rerr->find("1 per byte of its") != std::string::npos);

  json answer = {{"choices", json::array({{{"index", 0}, {"finish_reason", "tool_calls"},
                                           {"message", {{"role", "assistant"}, {"content", ""},
                                                        {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                            {"function", {{"name", "read"}, {"arguments", args}}}}})}}}}})}};
  ResponseContext bctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr, WorkBudget(1, 0)};
  ResponsePipeline bp(bctx);
  json again = answer;
  auto berr = bp.apply_body(answer);
  REQUIRE(berr.has_value());
  CHECK(berr->code == k_work_budget_code);
  CHECK(berr->message.find("work budget of") != std::string::npos);

  ResponseContext sctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr, WorkBudget(1, 0)};
  StreamPipeline sp(sctx);
  bool stopped = false;
  for (const auto& c : call_stream(args)) {
    (void)sp.on_chunk(c);
    if (sp.error()) {
      stopped = true;
      break;
    }
  }
  REQUIRE(stopped);  // known while streaming, so the gateway can end the stream at once
  CHECK(sp.error()->code == k_work_budget_code);
  std::optional<PolicyError> serr;
  CHECK(sp.finish(serr).empty());
  REQUIRE(serr.has_value());
  CHECK(serr->code == k_work_budget_code);

  // The default budget leaves the same inputs far inside it.
  ResponseContext dctx{&model, "glm53-flash", tools_request(), counter.fn(), nullptr};
  ResponsePipeline dp(dctx);
  CHECK_FALSE(dp.apply_body(again).has_value());
  CHECK(dctx.budget.steps() * 4 < dctx.budget.limit());
}
