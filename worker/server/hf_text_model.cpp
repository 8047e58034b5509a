#include "worker/server/hf_text_model.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "worker/template/chat_template.hpp"
#include "worker/tokenizer/tokenizer.hpp"

namespace servedeck::worker {

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

class HfTextModel final : public TextModel {
 public:
  HfTextModel(Tokenizer tok, ChatTemplate tmpl, std::string bos, std::string eos)
      : tok_(std::move(tok)), tmpl_(std::move(tmpl)), bos_(std::move(bos)), eos_(std::move(eos)) {}

  std::string token_bytes(int32_t id) const override {
    if (id < 0 || static_cast<std::size_t>(id) >= tok_.vocab_size()) return {};
    try {
      return tok_.token_bytes(id);
    } catch (const std::exception&) {
      return {};
    }
  }
  bool is_special(int32_t id) const override { return tok_.is_special(id); }
  std::vector<int32_t> encode(std::string_view text) const override { return tok_.encode(text, true); }
  std::optional<std::string> decode(std::span<const int32_t> ids, bool skip_special, std::string& error) const override {
    try {
      return tok_.decode(ids, skip_special);
    } catch (const std::exception& e) {
      error = e.what();
      return std::nullopt;
    }
  }
  std::optional<int32_t> token_id(std::string_view token) const override { return tok_.token_id(token); }
  std::size_t vocab_size() const override { return tok_.vocab_size(); }
  std::string render_chat(const nlohmann::json& context) const override {
    nlohmann::json ctx = context;
    if (!ctx.contains("bos_token")) ctx["bos_token"] = bos_;
    if (!ctx.contains("eos_token")) ctx["eos_token"] = eos_;
    try {
      return tmpl_.render(ctx);
    } catch (const TemplateRaised& e) {
      throw ChatRenderError(e.what());
    } catch (const TemplateError& e) {
      // note: the template parsed at load, so a render error comes from this request's values
      // (a kwarg that shadows `namespace`, a tool schema deeper than tojson's bound): the
      // client's 400, as vLLM answers a failed apply_chat_template.
      throw ChatRenderError(e.what());
    }
  }

 private:
  Tokenizer tok_;
  ChatTemplate tmpl_;
  std::string bos_;
  std::string eos_;
};

}  // namespace

std::unique_ptr<TextModel> load_hf_text_model(const std::string& dir) {
  const std::filesystem::path root(dir);
  Tokenizer tok = Tokenizer::from_file((root / "tokenizer.json").string());
  nlohmann::json config = nlohmann::json::object();
  const auto config_path = root / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    config = nlohmann::json::parse(read_file(config_path), nullptr, false);
    if (config.is_discarded() || !config.is_object())
      throw std::runtime_error(config_path.string() + ": not a JSON object");
  }
  std::string source;
  const auto jinja = root / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    source = read_file(jinja);
  } else if (config.contains("chat_template")) {
    const auto& t = config["chat_template"];
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {
      for (const auto& e : t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          source = e["template"].get<std::string>();
    }
  }
  if (source.empty())
    throw std::runtime_error("no chat template in " + dir + ": expected chat_template.jinja or a \"chat_template\" string in tokenizer_config.json");
  ChatTemplate tmpl = [&] {
    try {
      return ChatTemplate::parse(source);
    } catch (const std::exception& e) {
      throw std::runtime_error("chat template of " + dir + ": " + e.what());
    }
  }();
  return std::make_unique<HfTextModel>(std::move(tok), std::move(tmpl), token_text(config.value("bos_token", nlohmann::json())),
                                       token_text(config.value("eos_token", nlohmann::json())));
}

}  // namespace servedeck::worker
