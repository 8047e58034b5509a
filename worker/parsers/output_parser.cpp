#include "worker/parsers/output_parser.hpp"

#include <utility>

namespace servedeck::worker {

OutputParser::OutputParser(OutputParserOptions options)
    : reasoning_(options.reasoning, options.starts_in_reasoning),
      tools_(make_tool_call_parser(options.tool_parser, options.tools, std::move(options.ids))) {}

void OutputParser::route(std::vector<ParseDelta>& from_reasoning, std::vector<ParseDelta>& out) {
  for (auto& d : from_reasoning) {
    if (d.kind == DeltaKind::content) {
      std::vector<ParseDelta> tmp;
      tools_->push(d.text, tmp);
      for (auto& t : tmp) {
        if (t.kind == DeltaKind::content) append_text(out, t.kind, t.text);
        else out.push_back(std::move(t));
      }
    } else if (d.kind == DeltaKind::reasoning) {
      append_text(out, d.kind, d.text);
    } else {
      out.push_back(std::move(d));
    }
  }
}

std::vector<ParseDelta> OutputParser::push(std::string_view text) {
  std::vector<ParseDelta> r, out;
  reasoning_.push(text, r);
  route(r, out);
  return out;
}

std::vector<ParseDelta> OutputParser::finish() {
  std::vector<ParseDelta> r, out;
  reasoning_.finish(r);
  route(r, out);
  std::vector<ParseDelta> tail;
  tools_->finish(tail);
  for (auto& t : tail) {
    if (t.kind == DeltaKind::content) append_text(out, t.kind, t.text);
    else out.push_back(std::move(t));
  }
  return out;
}

ParsedOutput parse_whole(std::string_view text, OutputParserOptions options) {
  OutputParser p(std::move(options));
  ParsedOutput out;
  fold(p.push(text), out);
  fold(p.finish(), out);
  return out;
}

}  // namespace servedeck::worker
