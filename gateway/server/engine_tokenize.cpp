#include "gateway/server/engine_tokenize.hpp"

#include <memory>

#include "common/json_limits.hpp"
#include "gateway/server/upstream.hpp"

namespace servedeck::gateway {

using nlohmann::json;

namespace {
constexpr std::size_t k_max_answer_bytes = 16u * 1024 * 1024;  // a /tokenize answer lists every token id
}  // namespace

bool engine_tokenizes_chat(const registry::ModelEntry& model) {
  return model.engine != registry::EngineKind::llama_cpp;
}

json tokenize_request(const json& chat_body, const std::string& served_name) {
  json t = {{"model", served_name}, {"add_generation_prompt", true}};
  if (!chat_body.is_object()) return t;
  for (const char* key : {"messages", "tools", "chat_template_kwargs"})
    if (auto it = chat_body.find(key); it != chat_body.end() && !it->is_null()) t[key] = *it;
  return t;
}

void count_chat_tokens(boost::asio::any_io_executor executor, const std::string& host, int port,
                       const registry::ModelEntry& model, const json& chat_body, int timeout_ms,
                       std::function<void(TokenCount)> done) {
  struct State {
    int status = 0;
    std::string body;
    bool too_large = false;
    std::function<void(TokenCount)> done;
  };
  auto st = std::make_shared<State>();
  st->done = std::move(done);
  UpstreamRequest req;
  req.host = host;
  req.port = port;
  req.target = "/tokenize";
  req.body = dump_safe(tokenize_request(chat_body, model.served_name));
  req.connect_timeout_ms = model.connect_timeout_ms;
  req.first_byte_timeout_ms = timeout_ms;
  req.max_gap_ms = timeout_ms;
  UpstreamCallbacks cb;
  cb.on_head = [st](int status, const std::map<std::string, std::string>&) { st->status = status; };
  cb.on_data = [st](std::string_view bytes) {
    if (st->body.size() + bytes.size() > k_max_answer_bytes) {
      st->too_large = true;
      return;
    }
    st->body.append(bytes);
  };
  cb.on_end = [st](UpstreamFailure f, const std::string& detail) {
    TokenCount c;
    if (f != UpstreamFailure::none) {
      c.why = "/tokenize failed: " + std::string(to_string(f)) + (detail.empty() ? "" : " (" + detail + ")");
    } else if (st->status != 200) {
      c.why = "the engine answered /tokenize with HTTP " + std::to_string(st->status);
    } else if (st->too_large) {
      c.why = "the /tokenize answer exceeds " + std::to_string(k_max_answer_bytes) + " bytes";
    } else {
      JsonError err;
      const json j = parse_untrusted(st->body, &err);
      auto it = j.is_object() ? j.find("count") : j.end();
      if (j.is_object() && it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0)
        c.tokens = it->get<int64_t>();
      else
        c.why = "the /tokenize answer has no integer `count`" + (err.message.empty() ? "" : ": " + err.message);
    }
    auto fn = std::move(st->done);
    if (fn) fn(std::move(c));
  };
  cb.should_pause = [] { return false; };
  (void)start_upstream(std::move(executor), std::move(req), std::move(cb));
}

}  // namespace servedeck::gateway
