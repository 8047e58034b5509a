"""Decode and prefill tok/s of the same Qwen3-30B-A3B shape in PyTorch/transformers, resident on the GPU.

The reference rows for bench_moe_offload: a random-initialised Qwen3MoeForCausalLM (bf16, on
cuda), batch 1. Decode: a 128-token prompt, N new tokens greedy. Prefill: one forward of a
P-token prompt for each P in --prefill (logits of the last position only, as the benchmark's
prefill rows), after a warm-up at the smallest size. Timed with torch.cuda.synchronize().
Run on the GPU machine (transformers and torch are installed there):
    python3 bench/moe_offload/transformers_decode.py [--layers 48] [--new 64] [--prefill 512,4096,16384]
Prints one line per figure and writes JSON to $OUT if set.
"""
import argparse
import json
import os
import time

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prefill", default="", help="comma-separated prompt lengths (empty: none)")
    ap.add_argument("--reps", type=int, default=3, help="timed forwards per prefill size (the median is printed)")
    ap.add_argument("--profile", type=int, default=0,
                    help="also profile one prefill forward of this many tokens (torch.profiler: top CUDA kernels)")
    a = ap.parse_args()
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=a.layers,
                         num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                         num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                         max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=False)
    torch.manual_seed(1)
    t0 = time.time()
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    load_s = time.time() - t0
    ids = torch.tensor([[(i * 7919 + 11) % 151643 for i in range(a.prompt)]], device="cuda")
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
        torch.cuda.synchronize()
        t1 = time.time()
        out = model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False)
        torch.cuda.synchronize()
        dt = time.time() - t1
    new = out.shape[1] - ids.shape[1]
    # Prefill is included in dt; measure it alone and subtract for a decode-only figure.
    with torch.no_grad():
        torch.cuda.synchronize()
        t2 = time.time()
        model(ids)
        torch.cuda.synchronize()
        prefill_s = time.time() - t2
    decode_tok_s = (new - 1) / max(dt - prefill_s, 1e-9)
    print(f"transformers resident decode: {decode_tok_s:.2f} tok/s ({new} new tokens, prefill {prefill_s*1000:.0f} ms, "
          f"load {load_s:.0f} s, torch {torch.__version__}, layers {a.layers})")
    prefill_rows = []
    sizes = [int(x) for x in a.prefill.split(",") if x]
    with torch.no_grad():
        for i, n in enumerate(sorted(sizes)):
            p = torch.tensor([[(j * 7919 + 17) % 151643 for j in range(n)]], device="cuda")
            if i == 0:
                model(p, logits_to_keep=1)  # warm-up
            times = []
            for _ in range(max(1, a.reps)):
                torch.cuda.synchronize()
                t3 = time.time()
                model(p, logits_to_keep=1)
                torch.cuda.synchronize()
                times.append(time.time() - t3)
            s = sorted(times)[len(times) // 2]
            prefill_rows.append({"tokens": n, "seconds": s, "tok_s": n / s, "all_seconds": times})
            print(f"transformers resident prefill {n}: {n / s:.1f} tok/s ({s:.3f} s, median of {len(times)}: "
                  + ", ".join(f"{t:.3f}" for t in times) + ")")
        if a.profile > 0:
            p = torch.tensor([[(j * 7919 + 17) % 151643 for j in range(a.profile)]], device="cuda")
            print(f"attention implementation: {model.config._attn_implementation}")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                model(p, logits_to_keep=1)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "transformers_decode.json"), "w") as f:
            json.dump({"decode_tok_s": decode_tok_s, "new_tokens": new, "prefill_s": prefill_s, "layers": a.layers,
                       "prefill_rows": prefill_rows}, f)


if __name__ == "__main__":
    main()
