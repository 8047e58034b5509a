// servedeck-equivalence-models OUT_DIR: writes the checkpoints of transformers_fixtures.hpp to
// OUT_DIR/<name>/ and OUT_DIR/prompts.json ({"prompts": [[ids], ...], "models": {name: fnv1a64
// of model.safetensors as 16 hex digits}}), the input of scripts/record_transformers_logits.py.
// Exit 0, or 1 with a message.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/worker/cpu/transformers_fixtures.hpp"

int main(int argc, char** argv) {
  using namespace servedeck::worker;
  if (argc != 2) {
    std::cerr << "usage: servedeck-equivalence-models OUT_DIR\n";
    return 1;
  }
  try {
    const std::filesystem::path out = argv[1];
    nlohmann::json manifest = {{"prompts", testing::equivalence_prompts()}, {"models", nlohmann::json::object()}};
    for (const auto& f : testing::equivalence_fixtures()) {
      write_model((out / f.name).string(), f.options);
      std::ifstream in(out / f.name / "model.safetensors", std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(testing::fnv1a64(ss.str())));
      manifest["models"][f.name] = hex;
    }
    std::ofstream(out / "prompts.json") << manifest.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "servedeck-equivalence-models: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
