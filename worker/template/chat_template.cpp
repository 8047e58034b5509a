#include "worker/template/chat_template.hpp"

#include "worker/template/interpreter.hpp"
#include "worker/template/parser.hpp"

namespace servedeck::worker {

TemplateError::TemplateError(const std::string& msg, int line_, int column_)
    : std::runtime_error("chat template " + std::to_string(line_) + ":" + std::to_string(column_) + ": " + msg),
      line(line_),
      column(column_) {}

struct ChatTemplate::Impl {
  tmpl::Body program;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::parse(std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->program = tmpl::parse_template(source);
  tmpl::validate_program(impl->program);
  return ChatTemplate(std::move(impl));
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json::parse(context.dump()), RenderLimits{});
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const { return render(context, RenderLimits{}); }

std::string ChatTemplate::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  return tmpl::render_program(impl_->program, context, limits);
}

}  // namespace servedeck::worker
