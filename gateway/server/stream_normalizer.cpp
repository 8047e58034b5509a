#include "gateway/server/stream_normalizer.hpp"

#include <algorithm>
#include <array>

#include "common/json_limits.hpp"
#include "common/sse.hpp"
#include "common/stream_limits.hpp"

namespace servedeck::gateway {

using nlohmann::json;

namespace {

/// FNV-1a 64-bit (http://www.isthe.com/chongo/tech/comp/fnv/): a stable, dependency-free hash.
uint64_t fnv1a(std::string_view s, uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool is_empty_value(const json& v) {
  if (v.is_null()) return true;
  if (v.is_string()) return v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

/// Optional fields that clients choke on when present as null/empty (G11).
bool is_optional_field(std::string_view k) {
  return k == "tool_calls" || k == "function_call" || k == "refusal" || k == "audio" || k == "reasoning" ||
         k == "reasoning_content" || k == "annotations";
}

bool usable_id(const json& id) {
  if (!id.is_string()) return false;
  const auto& s = id.get_ref<const std::string&>();
  if (s.empty()) return false;
  return !std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
}

int64_t int_or(const json& j, std::string_view key, int64_t fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

std::string string_or(const json& j, std::string_view key, std::string fallback = {}) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

/// Argument text as a string: engines that send an object get it serialised.
std::string arguments_text(const json& fn) {
  if (!fn.is_object()) return {};
  auto it = fn.find("arguments");
  if (it == fn.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  return dump_safe(*it);
}

bool has_text(const json& obj, std::string_view key) {
  if (!obj.is_object()) return false;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}


}  // namespace

std::string make_tool_call_id(std::string_view seed, int64_t choice, int64_t index) {
  std::string key(seed);
  key += '/';
  key += std::to_string(choice);
  key += '/';
  key += std::to_string(index);
  uint64_t a = fnv1a(key);
  uint64_t b = fnv1a(key, a ^ 0x9e3779b97f4a7c15ull);
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "call_";
  for (int i = 0; i < 16; ++i) out += hex[(a >> (60 - 4 * i)) & 0xf];
  for (int i = 0; i < 8; ++i) out += hex[(b >> (60 - 4 * i)) & 0xf];
  return out;
}

StreamNormalizer::StreamNormalizer(Options opt) : opt_(std::move(opt)) {}

void StreamNormalizer::remember_meta(const json& chunk) {
  if (auto id = string_or(chunk, "id"); !id.empty() && id_.empty()) id_ = id;
  if (created_ == 0) created_ = int_or(chunk, "created", 0);
  if (auto m = string_or(chunk, "model"); !m.empty()) engine_model_ = m;
  if (auto fp = string_or(chunk, "system_fingerprint"); !fp.empty()) system_fingerprint_ = fp;
}

json StreamNormalizer::envelope() const {
  json e = json::object();
  e["id"] = id_.empty() ? std::string(opt_.chat ? "chatcmpl-servedeck" : "cmpl-servedeck") : id_;
  e["object"] = opt_.chat ? "chat.completion.chunk" : "text_completion";
  e["created"] = created_;
  e["model"] = opt_.model_id.empty() ? engine_model_ : opt_.model_id;
  if (!system_fingerprint_.empty()) e["system_fingerprint"] = system_fingerprint_;
  return e;
}

void StreamNormalizer::emit(const json& chunk, std::string& out) {
  out += sse::format_data(dump_safe(chunk));
  emitted_any_ = true;
}

bool StreamNormalizer::normalize_tool_calls(int64_t choice_index, json& tool_calls) {
  auto& cs = choices_[choice_index];
  json result = json::array();
  int64_t position = 0;
  for (const auto& tc : tool_calls) {
    int64_t index = int_or(tc, "index", position);
    ++position;
    if (!tc.is_object()) continue;
    if (!cs.tools.contains(index) && cs.tools.size() >= k_max_stream_tool_calls) {
      bound_error_ = "the engine streamed more than " + std::to_string(k_max_stream_tool_calls) +
                     " tool-call indexes in one choice (k_max_stream_tool_calls)";
      return false;
    }
    auto& ts = cs.tools[index];
    const json fn = tc.contains("function") ? tc["function"] : json::object();
    std::string name = string_or(fn, "name");
    std::string args = arguments_text(fn);
    json ntc = json::object();
    ntc["index"] = index;
    bool header_now = false;
    if (!ts.header_sent) {
      ntc["id"] = usable_id(tc.contains("id") ? tc["id"] : json()) ? tc["id"].get<std::string>()
                                                                   : make_tool_call_id(opt_.id_seed, choice_index, index);
      ntc["type"] = "function";
      ts.header_sent = true;
      header_now = true;
    }
    json nfn = json::object();
    if (!ts.name_sent && !name.empty()) {
      nfn["name"] = name;
      ts.name_sent = true;
    }
    if (!args.empty()) {
      // note: a final delta re-sending the whole argument document (some engines do this after
      // streaming it piecewise) would double the arguments on the client.
      bool resend = !ts.arguments.empty() && args == ts.arguments && !parse_untrusted(ts.arguments).is_discarded();
      if (!resend) {
        if (args.size() > k_max_stream_text_bytes - argument_bytes_) {
          bound_error_ = stream_text_bound_message();
          return false;
        }
        argument_bytes_ += args.size();
        nfn["arguments"] = args;
        ts.arguments += args;
      }
    } else if (header_now) {
      nfn["arguments"] = "";
    }
    if (!nfn.empty() || header_now) {
      ntc["function"] = std::move(nfn);
      result.push_back(std::move(ntc));
      cs.any_tool = true;
    }
  }
  tool_calls = std::move(result);
  return !tool_calls.empty();
}

void StreamNormalizer::on_chunk(const json& chunk, std::string& out) {
  if (ended_ != StreamEnd::none || !chunk.is_object()) return;
  remember_meta(chunk);
  if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object() && !u->empty()) usage_ = *u;
  if (auto t = chunk.find("timings"); t != chunk.end() && t->is_object()) timings_ = *t;
  auto ch = chunk.find("choices");
  if (ch == chunk.end() || !ch->is_array()) return;
  json out_choices = json::array();
  int64_t position = 0;
  for (const auto& c : *ch) {
    int64_t idx = int_or(c, "index", position);
    ++position;
    if (!c.is_object()) continue;
    if (!choices_.contains(idx) && choices_.size() >= k_max_stream_choices) {
      bound_error_ = "the engine streamed more than " + std::to_string(k_max_stream_choices) +
                     " choice indexes (k_max_stream_choices)";
      break;
    }
    auto& st = choices_[idx];
    if (auto f = c.find("finish_reason"); f != c.end() && f->is_string() && !f->get_ref<const std::string&>().empty()) {
      st.finish = f->get<std::string>();
      finish_reason_ = st.finish;
    }
    json nc = json::object();
    nc["index"] = idx;
    bool output = false;
    bool forward = false;
    if (opt_.chat) {
      json nd = json::object();
      if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
        for (const auto& [k, v] : d->items()) {
          if (v.is_null()) continue;
          if (k == "role") {
            if (st.role_sent) continue;
            st.role_sent = true;
            nd[k] = v;
            forward = true;
            continue;
          }
          if (k == "content") {
            if (!has_text(*d, k)) continue;
            output = true;
          } else if (k == "reasoning" || k == "reasoning_content") {
            if (!has_text(*d, k)) continue;  // G20: either spelling is output
            output = true;
          } else if (k == "tool_calls") {
            if (!v.is_array()) continue;
            json tcs = v;
            if (!normalize_tool_calls(idx, tcs)) {
              if (!bound_error_.empty()) break;
              continue;
            }
            nd[k] = std::move(tcs);
            output = true;
            continue;
          } else if (is_optional_field(k) && is_empty_value(v)) {
            continue;
          }
          nd[k] = v;
          forward = true;
        }
      }
      nc["delta"] = std::move(nd);
    } else {
      if (has_text(c, "text")) {
        nc["text"] = c["text"];
        output = true;
      }
    }
    if (auto lp = c.find("logprobs"); lp != c.end() && !lp->is_null()) {
      nc["logprobs"] = *lp;
      forward = true;
    }
    if (output || forward) {
      if (!opt_.chat && !nc.contains("text")) nc["text"] = "";
      nc["finish_reason"] = nullptr;  // the single finish chunk comes at the end (G21a)
      out_choices.push_back(std::move(nc));
    }
    if (output) {
      produced_output_ = true;
      ++output_chunks_;
    }
  }
  if (!bound_error_.empty()) {
    // note: the choices of this chunk before the bound are dropped with it: the stream ends here.
    fail(bound_error_, "server_error", "stream_too_large", ErrorSource::engine, out);
    return;
  }
  if (out_choices.empty()) return;
  json e = envelope();
  e["choices"] = std::move(out_choices);
  emit(e, out);
}

StreamEnd StreamNormalizer::finish(std::string& out) {
  if (ended_ != StreamEnd::none) return ended_;
  if (!produced_output_) {
    fail("the engine's stream ended without any content, reasoning or tool call", "server_error", "empty_stream",
         ErrorSource::engine, out);
    return ended_;
  }
  json e = envelope();
  json finishes = json::array();
  for (const auto& [idx, st] : choices_) {
    json c = json::object();
    c["index"] = idx;
    if (opt_.chat)
      c["delta"] = json::object();
    else
      c["text"] = "";
    c["finish_reason"] = st.finish ? *st.finish : (st.any_tool ? "tool_calls" : "stop");  // G21b
    finishes.push_back(std::move(c));
  }
  e["choices"] = std::move(finishes);
  emit(e, out);
  if (opt_.include_usage) {
    json u = envelope();
    u["choices"] = json::array();
    if (usage_) {
      u["usage"] = *usage_;
    } else {
      // G12: the engine reported no usage; the client still gets exactly one usage chunk.
      u["usage"] = synthesize_usage(timings_ ? *timings_ : json(), opt_.prompt_tokens_estimate, output_chunks_,
                                    "output_chunks");
      usage_synthesized_ = true;
    }
    emit(u, out);
  }
  out += sse::k_done;
  ended_ = StreamEnd::done;
  return ended_;
}

void StreamNormalizer::fail(std::string_view message, std::string_view type, std::string_view code,
                            ErrorSource source, std::string& out) {
  if (ended_ != StreamEnd::none) return;
  ended_ = StreamEnd::error;
  out += sse::format_data(dump_safe(make_error(message, type, code, source)));
  emitted_any_ = true;
}

void StreamNormalizer::fail_with_engine_error(const json& error, std::string& out) {
  std::string message = string_or(error, "message");
  if (message.empty()) message = error.is_string() ? error.get<std::string>() : dump_safe(error);
  std::string type = string_or(error, "type", "server_error");
  std::string code = string_or(error, "code");
  if (code.empty() && error.is_object()) {
    if (auto c = error.find("code"); c != error.end() && c->is_number()) code = dump_safe(*c);
  }
  if (code.empty()) code = "engine_error";
  fail(message, type, code, ErrorSource::engine, out);
}

bool StreamNormalizer::normalize_body(json& body, std::string_view model_id, std::string_view id_seed) {
  if (!body.is_object()) return false;
  if (!model_id.empty()) body["model"] = model_id;
  auto ch = body.find("choices");
  if (ch == body.end() || !ch->is_array()) return false;
  bool output = false;
  int64_t position = 0;
  for (auto& c : *ch) {
    int64_t idx = int_or(c, "index", position);
    ++position;
    if (!c.is_object()) continue;
    if (has_text(c, "text")) output = true;
    auto m = c.find("message");
    if (m == c.end() || !m->is_object()) continue;
    json nm = json::object();
    for (const auto& [k, v] : m->items()) {
      if (is_optional_field(k) && is_empty_value(v)) continue;  // G11
      nm[k] = v;
    }
    if (has_text(nm, "content") || has_text(nm, "reasoning") || has_text(nm, "reasoning_content")) output = true;
    if (auto tcs = nm.find("tool_calls"); tcs != nm.end() && tcs->is_array()) {
      int64_t i = 0;
      for (auto& tc : *tcs) {
        if (!tc.is_object()) continue;
        if (!usable_id(tc.contains("id") ? tc["id"] : json())) tc["id"] = make_tool_call_id(id_seed, idx, i);
        tc["type"] = "function";
        if (auto fn = tc.find("function"); fn != tc.end() && fn->is_object()) {
          if (auto a = fn->find("arguments"); a != fn->end() && !a->is_string())
            (*fn)["arguments"] = a->is_null() ? std::string() : dump_safe(*a);
        }
        ++i;
        output = true;
      }
    }
    *m = std::move(nm);
  }
  return output;
}

bool StreamNormalizer::add_missing_usage(json& body, int64_t prompt_tokens_estimate) {
  if (!body.is_object()) return false;
  if (auto u = body.find("usage"); u != body.end() && u->is_object() && !u->empty()) return false;
  auto t = body.find("timings");
  body["usage"] = synthesize_usage(t != body.end() ? *t : json(), prompt_tokens_estimate, estimate_answer_tokens(body),
                                   "output_bytes_estimate");
  return true;
}

}  // namespace servedeck::gateway
