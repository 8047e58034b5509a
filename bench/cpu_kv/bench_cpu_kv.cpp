// The CPU backend's KV pool: what bf16 K/V storage costs against f32 (prefill tok/s, decode
// ms/token at a long context) and what it changes (logits of the same decode steps), and what
// prefix reuse saves (the time to first token of a prompt whose head is cached vs a cold one).
//
//   bench_cpu_kv [--model DIR] [--context 8192] [--decode 64] [--suffix 512] [--threads 2]
//
// Without --model it writes the served tiny model's shape (TinyModelOptions{}: 2 layers, hidden
// 64, 4/2 heads x 16, 8 experts top-2, vocab 151,936) with seed 0 to a temporary directory.
// Per dtype: a cold prefill of `context` tokens (chunks of 4096, the last row's logits), then
// `decode` greedy steps; the bf16 steps are fed the f32 run's tokens, so both compute the same
// context and their logits compare position by position. Then, on bf16: the last `suffix`
// tokens prefilled after the cached context - suffix (whole blocks), vs the whole prompt cold.
// Numbers are medians of 3 runs. Results: docs/performance.md, "CPU worker: KV pool".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "worker/cpu/cpu_backend.hpp"
#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/kv_sequence.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/model/checkpoint.hpp"
#include "worker/model/tiny_model.hpp"

using namespace servedeck::worker;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> prompt_ids(std::size_t n, std::size_t vocab) {
  std::vector<int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % std::min<std::size_t>(vocab, 151643));
  return ids;
}

std::vector<float> prefill(Backend& be, KvSequence& seq, std::span<const int32_t> ids) {
  std::vector<float> last;
  for (std::size_t at = 0; at < ids.size(); at += 4096) last = forward_sequence(be, seq, ids.subspan(at, std::min<std::size_t>(4096, ids.size() - at)), false);
  return last;
}

struct DtypeRun {
  double prefill_s = 0, decode_ms = 0;
  std::vector<std::vector<float>> rows;  // the decode steps' logits
  std::vector<int32_t> tokens;           // greedy picks (of the f32 run)
};

DtypeRun run_dtype(const Checkpoint& ck, KvDtype dtype, std::size_t threads, const std::vector<int32_t>& ids,
                   std::size_t decode, const std::vector<int32_t>* feed) {
  auto be = make_cpu_backend(ck, {threads, dtype});
  KvBlockPool pool({(ids.size() + decode + 15) / 16 + 1, 16});
  be->allocate_kv_pool(pool.shape());
  std::vector<double> pre, dec;
  DtypeRun out;
  for (int rep = 0; rep < 3; ++rep) {
    KvSequence seq(pool, false);
    auto t0 = clock_type::now();
    auto row = prefill(*be, seq, ids);
    pre.push_back(seconds_since(t0));
    out.rows.clear();
    out.tokens.clear();
    t0 = clock_type::now();
    for (std::size_t i = 0; i < decode; ++i) {
      const int32_t next = feed ? (*feed)[i] : argmax(std::span<const float>(row.data(), be->vocab_size()));
      out.tokens.push_back(next);
      row = forward_sequence(*be, seq, std::span<const int32_t>(&next, 1), false);
      out.rows.push_back(row);
    }
    dec.push_back(1000.0 * seconds_since(t0) / static_cast<double>(decode));
  }
  out.prefill_s = median(pre);
  out.decode_ms = median(dec);
  return out;
}

std::size_t arg(int argc, char** argv, const char* name, std::size_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name) return static_cast<std::size_t>(std::stoull(argv[i + 1]));
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
  const std::size_t context = arg(argc, argv, "--context", 8192), decode = arg(argc, argv, "--decode", 64);
  const std::size_t suffix = arg(argc, argv, "--suffix", 512), threads = arg(argc, argv, "--threads", 2);
  std::filesystem::path tmp;
  if (model.empty()) {
    tmp = std::filesystem::temp_directory_path() / ("bench-cpu-kv-" + std::to_string(::getpid()));
    write_model(tmp.string(), TinyModelOptions{});
    model = tmp.string();
  }
  const Checkpoint ck = Checkpoint::open(model);
  const auto ids = prompt_ids(context, static_cast<std::size_t>(ck.description().vocab_size));
  std::printf("model %s, context %zu tokens, %zu decode steps, %zu threads\n", model.c_str(), context, decode, threads);

  const DtypeRun f32 = run_dtype(ck, KvDtype::f32, threads, ids, decode, nullptr);
  const DtypeRun b16 = run_dtype(ck, KvDtype::bf16, threads, ids, decode, &f32.tokens);
  std::printf("\nK/V dtype  prefill s  prefill tok/s  decode ms/token (at %zu..%zu)\n", context, context + decode);
  for (const auto* r : {&f32, &b16}) {
    std::printf("%-9s  %9.3f  %13.0f  %15.2f\n", r == &f32 ? "f32" : "bf16", r->prefill_s,
                static_cast<double>(context) / r->prefill_s, r->decode_ms);
  }
  float worst = 0;
  std::size_t agree = 0;
  for (std::size_t i = 0; i < decode; ++i) {
    const auto& a = f32.rows[i];
    const auto& b = b16.rows[i];
    for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::fabs(a[j] - b[j]));
    agree += argmax(std::span<const float>(a)) == argmax(std::span<const float>(b));
  }
  std::printf("bf16 vs f32, the same %zu decode steps: max |logit difference| %.4f, top-1 agreement %zu/%zu\n", decode, worst,
              agree, decode);

  // Prefix reuse on bf16: the cold prompt vs its last `suffix` tokens after the cached head.
  auto be = make_cpu_backend(ck, {threads, KvDtype::bf16});
  KvBlockPool pool({2 * ((context + 15) / 16) + 2, 16});
  be->allocate_kv_pool(pool.shape());
  {
    KvSequence warm(pool, true);
    prefill(*be, warm, ids);
  }
  std::vector<double> cold_s, reuse_s;
  std::size_t reused = 0;
  for (int rep = 0; rep < 3; ++rep) {
    KvSequence cold(pool, false);
    auto t0 = clock_type::now();
    prefill(*be, cold, ids);
    cold_s.push_back(seconds_since(t0));
    cold.release();
    KvSequence seq(pool, true);
    t0 = clock_type::now();
    reused = seq.attach_prefix(ids, context - suffix);
    prefill(*be, seq, std::span<const int32_t>(ids).subspan(reused));
    reuse_s.push_back(seconds_since(t0));
  }
  std::printf("\nprefix reuse (bf16): %zu-token prompt cold %.3f s; %zu cached + %zu prefilled %.3f s (%.1fx)\n", context,
              median(cold_s), reused, context - reused, median(reuse_s), median(cold_s) / median(reuse_s));
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return 0;
}
