// StreamPipeline: the response policies applied to a stream of chat.completion.chunk objects.
//
// Per choice, in arrival order:
//   reasoning deltas  → passed on at once (mirror_content: under both names); never dropped (G20)
//   content deltas    → passed on as they arrive; answer_rescue cuts a stray </think> out of them
//                       while no reasoning came (only a tail that could be the tag's start waits
//                       for the next delta), and holds a <tool_call>…</tool_call> block naming a
//                       declared tool (extracted at the end when no real call came; otherwise
//                       sent on as content)
//   tool_call deltas  → the name is held until the arguments start (G04: never emit an undeclared
//                       name); the arguments go through ArgumentRepair (sanitize_tool_tags, G02,
//                       G07), and are held while they are only "{" for a tool with required
//                       parameters (G03: never forward {})
//   finish            → open calls end; extraction, G05, answer rescue; held text flushed; then
//                       the finish chunk (withheld when the stream is unrepairable: see error()).
// Each chunk grants the context's work budget its text bytes; held text is searched only from
// where the last search stopped, so the work stays linear in the stream however it is split.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>

#include "common/stream_limits.hpp"
#include "policies/answer_rescue.hpp"
#include "policies/effort_presets.hpp"
#include "policies/pipeline.hpp"
#include "policies/reasoning_dialects.hpp"
#include "policies/repair_count.hpp"
#include "policies/restore_reasoning.hpp"
#include "policies/sanitize_tool_tags.hpp"
#include "policies/tag_markup.hpp"
#include "policies/tool_call_repair.hpp"

namespace servedeck::policies {
namespace {

using json = nlohmann::json;

struct CallState {
  int64_t index = 0;
  std::string id;
  std::string name_raw;
  std::string raw_pending;  // raw arguments received before the name was resolved
  bool resolved = false;
  std::string name;
  std::optional<std::string> split_param;  // G04
  std::string split_raw;                   // G04: the whole raw arguments, wrapped at the end
  const DeclaredTool* tool = nullptr;
  std::unique_ptr<ArgumentRepair> repair;
  std::string out_pending;   // repaired text not yet emitted
  std::string args_emitted;
  bool quote_seen = false;   // a '"' was produced: the arguments are more than "{" (G03 hold ends)
  bool g03 = false;          // G03: the tool has required parameters, so "{}" is never forwarded
  bool header_emitted = false;
  bool ended = false;
};

struct EmittedCall {
  std::string id, name, arguments;
};

struct ChoiceState {
  std::map<int64_t, CallState> calls;  // by the engine's tool-call index
  std::vector<int64_t> order;
  int64_t current = -1;
  std::string reasoning_all;
  std::string content_all;   // every content byte received
  std::string content_sent;  // content passed on
  bool think_watch = false;   // answer_rescue: content is watched for a stray </think> (G16)
  std::string think_tail;    // the end of the content that could still begin a think tag
  bool trim_lead = false;    // after a stray </think>: leading whitespace of the answer dropped
  std::string scan_hold;          // content held: a partial "<tool_call>", or a block not yet closed
  bool in_block = false;          // scan_hold starts with "<tool_call>"
  std::size_t close_from = 0;     // in a block: where the search for "</tool_call>" resumes
  std::vector<std::string> candidates;  // held <tool_call> blocks naming a declared tool
  std::vector<EmittedCall> emitted_calls;
  bool finished = false;
};

std::size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (std::size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

struct StreamPipeline::State {
  std::map<int64_t, ChoiceState> choices;  // by the engine's choice index
  std::vector<DeclaredTool> tools;
  bool repair_on = false, sanitize = false, coerce = false, rescue = false, mirror = false;
  std::optional<PolicyError> error;
  json last_chunk = json::object();
  std::uint64_t stream_bytes = 0;  // text bytes of the chunks with choices (json_text_bytes), whole stream

  ResponseContext* ctx = nullptr;

  void fail(std::string message, std::string code) {
    if (!error) error = PolicyError{"servedeck: " + std::move(message), std::move(code)};
  }

  json make_chunk(int64_t idx, json delta, json finish = nullptr) const {
    json c = last_chunk.is_object() ? last_chunk : json::object();
    c.erase("usage");
    c["choices"] = json::array({{{"index", idx}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}}});
    echo_requested_model(c, ctx->requested_id);
    return c;
  }

  void fail_work() {
    if (!error) error = PolicyError{ctx->budget.message(), std::string(k_work_budget_code)};
  }
  WorkBudget* budget() const { return &ctx->budget; }

  void emit_call_text(CallState& c, std::string_view text, json& deltas) {
    c.out_pending += text;
    if (!c.quote_seen && text.find('"') != std::string_view::npos) c.quote_seen = true;
    if (!c.ended && c.g03 && !c.quote_seen) return;
    if (c.out_pending.empty() && (c.header_emitted || !c.ended)) return;
    json d = {{"index", c.index}};
    if (!c.header_emitted) {
      if (c.id.empty()) c.id = new_tool_call_id();
      d["id"] = c.id;
      d["type"] = "function";
      d["function"]["name"] = c.name;
      c.header_emitted = true;
    }
    d["function"]["arguments"] = c.out_pending;
    c.args_emitted += c.out_pending;
    c.out_pending.clear();
    deltas.push_back(std::move(d));
  }

  void resolve(CallState& c) {
    c.resolved = true;
    c.name = c.name_raw;
    const auto& config = ctx->model->policies;
    if (!tools.empty() && (repair_on || sanitize)) {
      auto res = resolve_tool_name(c.name_raw, tools, sanitize, budget());
      if (ctx->budget.exhausted()) return fail_work();
      if (res.error) {
        if (repair_on) {
          fail(*res.error, "tool_call_unknown_name");
          return;
        }
      } else {
        if (res.sanitized) count_repair(*ctx, "sanitize_tool_tags");
        c.name = res.name;
        c.split_param = res.split_param;
        if (c.split_param && !repair_on) c.split_param.reset();
        if (c.split_param) count_repair(*ctx, "tool_call_repair");
      }
    } else if (sanitize) {
      if (auto n = sanitize_tool_name(c.name_raw)) {
        c.name = *n;
        count_repair(*ctx, "sanitize_tool_tags");
      }
    }
    c.tool = find_tool(tools, c.name, budget());
    c.g03 = repair_on && c.tool && !c.tool->required().empty();
    c.repair = std::make_unique<ArgumentRepair>(
        c.tool, ArgumentRepairOptions{.sanitize = sanitize,
                                      .coerce = config.coerce_tool_argument_types && c.tool != nullptr,
                                      .allow_resplit = true,
                                      .budget = budget()});
  }

  void feed_args(CallState& c, std::string_view raw, json& deltas) {
    if (c.split_param) {
      c.split_raw += raw;
      return;
    }
    std::string out = c.repair->feed(raw);
    if (ctx->budget.exhausted()) return fail_work();
    if (c.repair->error()) {
      fail("tool call '" + c.name + "' has corrupted arguments that cannot be repaired: " + *c.repair->error(),
           "tool_call_unrecoverable");
      return;
    }
    emit_call_text(c, out, deltas);
  }

  void on_call_delta(CallState& c, std::string_view name, std::string_view args, json& deltas) {
    c.name_raw += name;
    if (!c.resolved) {
      c.raw_pending += args;
      if (c.raw_pending.empty()) return;  // the name may still be growing
      resolve(c);
      if (error) return;
      std::string pending = std::move(c.raw_pending);
      c.raw_pending.clear();
      feed_args(c, pending, deltas);
      return;
    }
    if (!args.empty()) feed_args(c, args, deltas);
  }

  void end_call(ChoiceState& st, CallState& c, json& deltas) {
    if (c.ended || error) return;
    if (!c.resolved) {
      resolve(c);
      if (error) return;
      std::string pending = std::move(c.raw_pending);
      c.raw_pending.clear();
      feed_args(c, pending, deltas);
      if (error) return;
    }
    std::string out;
    if (c.split_param && c.tool)
      out = c.repair->feed(arguments_after_split(c.split_raw, *c.tool, *c.split_param, budget()));
    out += c.repair->finish();
    if (ctx->budget.exhausted()) return fail_work();
    if (c.repair->error()) {
      fail("tool call '" + c.name + "' has corrupted arguments that cannot be repaired: " + *c.repair->error(),
           "tool_call_unrecoverable");
      return;
    }
    if (c.repair->sanitized()) count_repair(*ctx, "sanitize_tool_tags");
    if (c.repair->coerced()) count_repair(*ctx, "tool_call_repair");
    std::string full = c.args_emitted + c.out_pending + out;
    if (c.g03 && c.args_emitted.empty() && is_empty_arguments(full, budget())) {
      std::optional<RecoveredCall> rec;
      for (std::size_t i = 0; i < st.candidates.size() && !rec; ++i) {
        rec = recover_call(st.candidates[i], tools, c.name, budget());
        if (rec) st.candidates.erase(st.candidates.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (!rec) rec = recover_call(st.content_all, tools, c.name, budget());
      if (!rec) rec = recover_call(st.reasoning_all, tools, c.name, budget());
      if (ctx->budget.exhausted()) return fail_work();
      if (!rec) {
        std::string req;
        for (const auto& q : c.tool->required()) req += (req.empty() ? "" : ", ") + q;
        fail("the engine called '" + c.name + "' with empty arguments, but it requires (" + req +
                 ") and no raw tool-call text held them", "tool_call_unrecoverable");
        return;
      }
      c.out_pending.clear();
      out = rec->arguments;
      count_repair(*ctx, "tool_call_repair");
    }
    c.ended = true;
    emit_call_text(c, out, deltas);
    st.emitted_calls.push_back({c.id, c.name, c.args_emitted});
  }

  // Content through the <tool_call> block scanner: text outside blocks passes on (but for a
  // partial "<tool_call>" at its end), a complete block naming a declared tool is held as a
  // candidate. scan_hold is read once: `cur` walks it, an open block resumes its search for the
  // closing tag at close_from, and the consumed prefix is erased once at the end.
  std::string scan_content(ChoiceState& st, std::string_view text) {
    if (tools.empty() || !(rescue || repair_on)) return std::string(text);
    constexpr std::string_view open = "<tool_call>";
    constexpr std::string_view close = "</tool_call>";
    st.scan_hold += text;
    const std::string& h = st.scan_hold;
    std::string out;
    std::size_t cur = 0;
    while (cur < h.size()) {
      if (!st.in_block) {
        std::size_t pos = h.find(open, cur);
        if (!ctx->budget.charge((pos == std::string::npos ? h.size() : pos + open.size()) - cur)) break;
        if (pos == std::string::npos) {
          std::size_t keep = partial_suffix(std::string_view(h).substr(cur), open);
          out.append(h, cur, h.size() - cur - keep);
          cur = h.size() - keep;
          break;
        }
        out.append(h, cur, pos - cur);
        cur = pos;
        st.in_block = true;
        st.close_from = pos + open.size();
      }
      std::size_t end = h.find(close, st.close_from);
      if (end == std::string::npos) {
        ctx->budget.charge(h.size() - st.close_from);
        st.close_from = std::max(st.close_from, h.size() - std::min(h.size(), close.size() - 1));
        break;
      }
      if (!ctx->budget.charge(end + close.size() - st.close_from)) break;
      std::string block = h.substr(cur, end + close.size() - cur);
      cur = end + close.size();
      st.in_block = false;
      if (!extract_calls(block, tools, budget()).empty()) {
        st.candidates.push_back(std::move(block));
      } else {
        out += block;
      }
    }
    st.scan_hold.erase(0, cur);
    if (st.in_block) st.close_from -= cur;
    return out;
  }

  std::string release_think_watch(ChoiceState& st) {
    st.think_watch = false;
    std::string tail = std::move(st.think_tail);
    st.think_tail.clear();
    return scan_content(st, tail);
  }

  // G16 in a stream: the content before a stray </think> was passed on as it arrived and stays
  // content (a stream cannot take text back); the tag is cut out, the answer after it follows a
  // blank line. The non-streamed body is split properly (split_stray_think).
  std::string content_in(ChoiceState& st, std::string_view text) {
    st.content_all += text;
    std::string piece;
    if (st.think_watch) {
      st.think_tail += text;
      const std::size_t open = st.think_tail.find(markup::kThinkOpen);
      const std::size_t close = st.think_tail.find(markup::kThinkClose);
      if (close != std::string::npos && (open == std::string::npos || close < open)) {
        piece = st.think_tail.substr(0, close);
        std::string after = st.think_tail.substr(close + markup::kThinkClose.size());
        st.think_tail.clear();
        st.think_watch = false;
        count_repair(*ctx, "answer_rescue");
        if (!markup::trim(st.content_sent + piece).empty()) piece += "\n\n";
        st.trim_lead = true;
        std::string out = scan_content(st, piece);
        return out + answer_after_think(st, after);
      }
      if (open != std::string::npos) return release_think_watch(st);  // the model opened its own block
      const std::size_t keep = std::max(partial_suffix(st.think_tail, markup::kThinkClose),
                                        partial_suffix(st.think_tail, markup::kThinkOpen));
      piece = st.think_tail.substr(0, st.think_tail.size() - keep);
      st.think_tail.erase(0, st.think_tail.size() - keep);
      return scan_content(st, piece);
    }
    return answer_after_think(st, text);
  }

  // Content after a stray </think>: its leading whitespace dropped, as split_stray_think does.
  std::string answer_after_think(ChoiceState& st, std::string_view text) {
    if (st.trim_lead) {
      const std::size_t lead = text.find_first_not_of(" \n\r\t");
      if (lead == std::string_view::npos) return {};
      text.remove_prefix(lead);
      st.trim_lead = false;
    }
    return scan_content(st, text);
  }

  void finalize(ChoiceState& st, int64_t idx, std::optional<std::string> finish, const json* upstream_choice,
                std::vector<json>& out) {
    st.finished = true;
    json deltas = json::array();
    std::string content_out;
    if (st.think_watch) content_out += release_think_watch(st);
    for (int64_t i : st.order) {
      end_call(st, st.calls[i], deltas);
      if (error) return;
    }
    bool any_calls = !st.order.empty();
    std::string fin = finish.value_or("");
    if (!any_calls && !tools.empty() && (rescue || (repair_on && fin == "tool_calls"))) {
      std::vector<RecoveredCall> found;
      for (const auto& b : st.candidates) {
        auto calls = extract_calls(b, tools, budget());
        found.insert(found.end(), calls.begin(), calls.end());
      }
      if (!found.empty()) {
        st.candidates.clear();
      } else {
        found = extract_calls(st.reasoning_all, tools, budget());
      }
      if (ctx->budget.exhausted()) return fail_work();
      int index = 0;
      for (const auto& c : found) {
        std::string id = new_tool_call_id();
        deltas.push_back({{"index", index++}, {"id", id}, {"type", "function"},
                          {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        st.emitted_calls.push_back({id, c.name, c.arguments});
      }
      if (!found.empty()) {
        count_repair(*ctx, fin == "tool_calls" ? "tool_call_repair" : "answer_rescue");
        any_calls = true;
        if (finish) fin = "tool_calls";
      }
    }
    for (const auto& b : st.candidates) content_out += b;
    st.candidates.clear();
    content_out += st.scan_hold;
    st.scan_hold.clear();
    st.in_block = false;
    st.close_from = 0;
    if (repair_on && fin == "tool_calls" && !any_calls) {
      fail("the engine finished with tool_calls but sent no tool call, and none could be recovered from its text",
           "tool_call_missing");
      return;
    }
    bool saw_close = st.content_all.find(markup::kThinkClose) != std::string::npos ||
                     st.reasoning_all.find(markup::kThinkClose) != std::string::npos;
    if (rescue && finish &&
        reasoning_is_the_answer(fin, any_calls, st.content_sent + content_out, st.reasoning_all, saw_close)) {
      content_out += st.reasoning_all;
      count_repair(*ctx, "answer_rescue");
    }
    json delta = json::object();
    if (!content_out.empty()) delta["content"] = content_out;
    if (!deltas.empty()) delta["tool_calls"] = deltas;
    st.content_sent += content_out;
    if (!delta.empty()) out.push_back(make_chunk(idx, std::move(delta)));
    remember(st);
    if (finish) {
      json c = last_chunk;
      json ch = upstream_choice ? *upstream_choice : json::object();
      ch["index"] = idx;
      ch["delta"] = json::object();
      ch["finish_reason"] = fin;
      c["choices"] = json::array({ch});
      echo_requested_model(c, ctx->requested_id);
      out.push_back(std::move(c));
    }
  }

  void remember(const ChoiceState& st) {
    if (!ctx->model->policies.restore_reasoning || !ctx->reasoning_store || st.reasoning_all.empty()) return;
    json msg = {{"role", "assistant"}, {"content", st.content_sent}};
    if (!st.emitted_calls.empty()) {
      json calls = json::array();
      for (const auto& c : st.emitted_calls) {
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      msg["tool_calls"] = calls;
    }
    ctx->reasoning_store->remember(msg, st.reasoning_all);
  }
};

StreamPipeline::StreamPipeline(ResponseContext& ctx) : state_(std::make_unique<State>()), ctx_(&ctx) {
  state_->ctx = &ctx;
  state_->tools = declared_tools(ctx.request);
  if (ctx.model) {
    const auto& config = ctx.model->policies;
    state_->repair_on = tool_call_repair_enabled(config);
    state_->sanitize = config.sanitize_tool_tags;
    state_->coerce = config.coerce_tool_argument_types;
    state_->rescue = config.answer_rescue;
    state_->mirror = config.mirror_content;
  }
}

StreamPipeline::~StreamPipeline() = default;
StreamPipeline::StreamPipeline(StreamPipeline&&) noexcept = default;

const std::optional<PolicyError>& StreamPipeline::error() const { return state_->error; }

std::vector<json> StreamPipeline::on_chunk(const json& chunk) {
  State& s = *state_;
  if (s.error) return {};
  const std::uint64_t bytes = json_text_bytes(chunk);
  ctx_->budget.grant(bytes);
  if (!chunk.is_object()) return {chunk};
  s.last_chunk = chunk;
  if (!ctx_->model || !chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) {
    json c = chunk;
    echo_requested_model(c, ctx_->requested_id);
    return {c};
  }
  // Everything kept whole below (content_all, reasoning_all, held text and calls) is part of
  // what the chunks brought.
  s.stream_bytes += bytes;
  if (s.stream_bytes > k_max_stream_text_bytes) {
    s.fail(stream_text_bound_message(), std::string(k_stream_too_large_code));
    return {};
  }
  std::vector<json> out;
  for (const auto& choice : chunk["choices"]) {
    if (!choice.is_object()) continue;
    // note: the gateway checked the indexes' ranges (gateway/server/engine_chunk.hpp); read whole
    // here all the same, so 4294967296 can never alias 0.
    int64_t idx = choice.contains("index") && choice["index"].is_number_integer() ? choice["index"].get<int64_t>() : 0;
    auto [it, inserted] = s.choices.try_emplace(idx);
    ChoiceState& st = it->second;
    if (inserted) st.think_watch = s.rescue;
    const json delta = choice.contains("delta") && choice["delta"].is_object() ? choice["delta"] : json::object();
    json out_delta = json::object();
    for (auto d = delta.begin(); d != delta.end(); ++d) {
      if (d.key() != "content" && d.key() != "reasoning" && d.key() != "reasoning_content" && d.key() != "tool_calls") {
        out_delta[d.key()] = d.value();
      }
    }
    std::string reasoning_out, content_out;
    bool upstream_named_reasoning = delta.contains("reasoning") && !delta.contains("reasoning_content");
    if (auto r = reasoning_of(delta); r && !r->empty()) {
      st.reasoning_all += *r;
      if (st.think_watch) content_out += s.release_think_watch(st);
      reasoning_out += *r;
    }
    if (delta.contains("content") && delta["content"].is_string()) {
      content_out += s.content_in(st, delta["content"].get<std::string>());
    }
    json tool_deltas = json::array();
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
      for (const auto& tc : delta["tool_calls"]) {
        if (!tc.is_object()) continue;
        int64_t i = tc.contains("index") && tc["index"].is_number_integer() ? tc["index"].get<int64_t>()
                                                                          : (st.current < 0 ? 0 : st.current);
        if (st.current >= 0 && i != st.current) s.end_call(st, st.calls[st.current], tool_deltas);
        if (s.error) break;
        st.current = i;
        auto [cit, fresh] = st.calls.try_emplace(i);
        CallState& c = cit->second;
        if (fresh) {
          c.index = i;
          st.order.push_back(i);
        }
        if (tc.contains("id") && tc["id"].is_string() && c.id.empty()) c.id = tc["id"].get<std::string>();
        std::string name, args;
        if (tc.contains("function") && tc["function"].is_object()) {
          const auto& f = tc["function"];
          if (f.contains("name") && f["name"].is_string()) name = f["name"].get<std::string>();
          if (f.contains("arguments") && f["arguments"].is_string()) args = f["arguments"].get<std::string>();
        }
        if (c.ended) {
          // A fragment for a call already closed (another call came between): its repaired
          // arguments went out whole, so the fragment can be neither added nor dropped.
          if (args.empty() && name.empty()) continue;
          s.fail("the engine sent more of tool call " + std::to_string(i) + " ('" + c.name +
                     "') after the call had ended (a later call or the finish came between); its arguments "
                     "were already sent whole",
                 "tool_call_interleaved");
          break;
        }
        s.on_call_delta(c, name, args, tool_deltas);
        if (s.error) break;
      }
    }
    if (ctx_->budget.exhausted()) s.fail_work();
    if (s.error) return out;
    if (!reasoning_out.empty()) {
      if (s.mirror) {
        set_reasoning(out_delta, reasoning_out, true);
      } else {
        out_delta[upstream_named_reasoning ? "reasoning" : "reasoning_content"] = reasoning_out;
      }
    }
    if (!content_out.empty()) {
      out_delta["content"] = content_out;
      st.content_sent += content_out;
    }
    if (!tool_deltas.empty()) out_delta["tool_calls"] = tool_deltas;
    const bool has_finish = choice.contains("finish_reason") && choice["finish_reason"].is_string();
    if (!out_delta.empty() || (delta.empty() && !has_finish)) {
      json c = chunk;
      if (has_finish) c.erase("usage");
      json ch = choice;
      ch["delta"] = out_delta;
      ch["finish_reason"] = nullptr;
      c["choices"] = json::array({ch});
      echo_requested_model(c, ctx_->requested_id);
      out.push_back(std::move(c));
    }
    if (has_finish && !st.finished) {
      s.finalize(st, idx, choice["finish_reason"].get<std::string>(), &choice, out);
      if (ctx_->budget.exhausted()) s.fail_work();
      if (s.error) return out;
    }
  }
  return out;
}

std::vector<json> StreamPipeline::finish(std::optional<PolicyError>& error) {
  State& s = *state_;
  std::vector<json> out;
  if (!s.error && ctx_->model) {
    for (auto& [idx, st] : s.choices) {
      if (!st.finished) s.finalize(st, idx, std::nullopt, nullptr, out);
      if (ctx_->budget.exhausted()) s.fail_work();
      if (s.error) break;
    }
  }
  error = s.error;
  if (error) out.clear();
  return out;
}

}  // namespace servedeck::policies
