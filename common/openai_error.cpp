#include "common/openai_error.hpp"

namespace servedeck {

std::string_view to_string(ErrorSource s) {
  switch (s) {
    case ErrorSource::servedeck: return "servedeck";
    case ErrorSource::engine: return "engine";
  }
  return "servedeck";
}

nlohmann::json make_error(std::string_view message, std::string_view type, std::string_view code,
                          ErrorSource source, std::string_view param) {
  return nlohmann::json{{"error",
                         {{"message", message},
                          {"type", type},
                          {"code", code},
                          {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                          {"source", to_string(source)}}}};
}

}  // namespace servedeck
