#!/usr/bin/env python3
"""Equivalence against Hugging Face transformers at a real model's dimensions (GLM-4.5-Air, Qwen3).

A checkpoint of the real shape does not fit the GPU machine's disk, so this writes one with fewer
layers (every other dimension as the config says) and random weights, in the layout the published
checkpoints use, and compares servedeck's logits on it with transformers' own class.

  write CONFIG.json OUT_DIR --layers N [--seed S] [--set JSON_OBJECT]
      OUT_DIR/config.json: CONFIG, updated by --set's keys (e.g. a rope_scaling), with
      num_hidden_layers = N and no MTP layer; one safetensors
      shard per layer plus the embedding/head shard and model.safetensors.index.json; bf16.
      Tensor names and shapes come from transformers' class built from that config (on the meta
      device); routed experts its class fuses are written per expert
      (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight), as published. Values: linear
      weights and embeddings N(0, initializer_range); RMSNorm weights 1 + N(0, 0.1); biases
      N(0, 0.02); the router's e_score_correction_bias N(0, 0.1) (published checkpoints carry
      non-zero ones and zeros would hide a missed bias).
  compare CKPT_DIR PROMPTS.json CPU.json CUDA.json
      transformers on the GPU in fp64 (the reference: eager experts, RMSNorm and router in fp64 too,
      to_float64; fp32 where the class still cannot run in fp64, said in the output's "reference") and in
      fp32 (TF32 off, eager attention),
      weights filled strictly from the checkpoint (record_transformers_logits.fill). Against the
      fp64 reference, at every position of the prompts and the greedy tokens after them:
        transformers in fp32, the distance an fp32 implementation shows;
        CPU.json  servedeck-logits' output (the CPU backend, fp32, every prompt position);
        CUDA.json per prompt the worker's /v1/completions answer with prompt_logprobs = 20 (the
                  prefill path) and logprobs = 20 over greedy tokens (the decode path), tokens
                  named by id (return_tokens_as_token_ids).
      Per path: top-1 agreement, max |d log p| over servedeck's top-20, and the KL restricted to
      that top-20 (sum p_ours (log p_ours - log p_ref); the top-20 hold nearly all the mass),
      mean and max. Prints one JSON object; exit 1 when a path is over its bound (BOUNDS).

Needs torch, transformers (5.x), safetensors, and a GPU for `compare`.
"""

import gc
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The reference is transformers in fp64. CPU: fp32, where only rounding differs: top-1 and KL as
# compare_transformers.py's bounds; max |d log p| at most the larger of 5e-3 and twice
# transformers' own fp32 distance from its fp64 (a routing near-tie flips in fp32 at a few
# positions, in either implementation). The worst positions are printed with their margins.
# CUDA: bf16 activations and bf16 K/V against fp64, and a routing choice that a bf16 rounding can
# flip between near-tied experts; the bounds are those the CUDA backend meets against the CPU
# backend in tests/worker/cuda (top-1 >= 0.9) with the KL bounded where a flip lands.
BOUNDS = {
    "cpu": {"top1": 0.98, "max_dlogp": 5e-3, "kl_max": 1e-4},
    "cuda_prefill": {"top1": 0.9, "kl_mean": 1e-2, "kl_max": 0.2},
    "cuda_decode": {"top1": 0.9, "kl_mean": 1e-2, "kl_max": 0.2},
}


def write(config_path, out_dir, layers, seed, overrides):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.load(open(config_path))
    cfg.update(overrides)
    cfg["num_hidden_layers"] = layers
    if "num_nextn_predict_layers" in cfg:
        cfg["num_nextn_predict_layers"] = 0
    cfg["torch_dtype"] = "bfloat16"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    config = AutoConfig.from_pretrained(out_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    std = float(cfg.get("initializer_range", 0.02))
    hidden = cfg["hidden_size"]
    inter = cfg.get("moe_intermediate_size")
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def draw(name, shape):
        if name.endswith("e_score_correction_bias"):
            t = torch.randn(shape, generator=gen, device="cuda") * 0.1
        elif name.endswith("norm.weight"):
            t = 1 + torch.randn(shape, generator=gen, device="cuda") * 0.1
        elif name.endswith(".bias"):
            t = torch.randn(shape, generator=gen, device="cuda") * 0.02
        else:
            t = torch.randn(shape, generator=gen, device="cuda") * std
        return t.to(torch.bfloat16).cpu()

    shards = {}
    for key, p in model.state_dict().items():
        layer = key.split(".")[2] if key.startswith("model.layers.") else "rest"
        shard = shards.setdefault(layer, {})
        if key.endswith(".experts.gate_up_proj") or key.endswith(".experts.down_proj"):
            prefix, kind = key.rsplit(".", 1)
            for e in range(p.shape[0]):
                if kind == "gate_up_proj":
                    shard[f"{prefix}.{e}.gate_proj.weight"] = draw("w", (inter, hidden))
                    shard[f"{prefix}.{e}.up_proj.weight"] = draw("w", (inter, hidden))
                else:
                    shard[f"{prefix}.{e}.down_proj.weight"] = draw("w", (hidden, inter))
        else:
            shard[key] = draw(key, tuple(p.shape))
    index = {"metadata": {}, "weight_map": {}}
    for layer, tensors in shards.items():
        fname = f"model-{layer}.safetensors"
        save_file(tensors, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for k in tensors:
            index["weight_map"][k] = fname
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    n = sum(t.numel() for s in shards.values() for t in s.values())
    print(json.dumps({"written": out_dir, "layers": layers, "tensors": len(index["weight_map"]), "parameters": n}))


def load_reference(ckpt, dtype):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from record_transformers_logits import fill

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = AutoConfig.from_pretrained(ckpt)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    model = model.to(dtype).eval()
    restore = None
    if dtype == torch.float64:
        changed, restore = to_float64(model)
        print("fp64 reference, recompiled with fp64 casts: " + ", ".join(changed), file=sys.stderr)
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
    ckpt_tensors = {}
    for fname in sorted(set(index["weight_map"].values())):
        ckpt_tensors.update(load_file(os.path.join(ckpt, fname), device="cuda"))
    with torch.no_grad():
        notes, _ = fill(model, ckpt_tensors, config.num_hidden_layers, 0)
    del ckpt_tensors
    return model, type(model).__name__, notes, restore


def fp64_variant(fn):
    """fn (a function of a transformers model module) recompiled from its own source with every
    fp32 cast (torch.float32, torch.float, .float()) made fp64; None if it has none, if its source
    cannot be recompiled alone (it uses super()), or if a decorator other than no_grad and the
    rope update wraps it."""
    import inspect
    import re
    import textwrap

    fn = inspect.unwrap(fn)  # a decorated method: its own source and module globals, not the wrapper's
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    new = re.sub(r"torch\.float32\b|torch\.float\b", "torch.float64", src).replace(".float()", ".double()")
    if new == src or "super()" in new:
        return None
    lines = new.splitlines()
    while lines and lines[0].lstrip().startswith("@"):
        if not any(k in lines[0] for k in ("torch.no_grad", "dynamic_rope_update")):
            return None  # a decorator that changes the call (inputs, outputs): leave the function as it is
        lines.pop(0)
    scope = {}
    try:
        exec(compile("\n".join(lines), f"<fp64 {fn.__qualname__}>", "exec"), fn.__globals__, scope)
    except (SyntaxError, NameError):
        return None
    return scope.get(fn.__name__)


def to_float64(model):
    """Makes an fp64 model fp64 throughout but for the rotary inverse frequencies (computed in
    fp32 when the model is built, then widened), and returns (what it changed, a function that
    undoes its change to the modeling file): the experts through transformers' eager loop (its
    grouped matmul takes no float64), and every module method and the attention function of the
    model's modeling file that cast to fp32 (RMSNorm, the router, the rotary table, the eager
    softmax) recompiled with fp64 casts (fp64_variant). Without this the fp64 reference still
    rounds every norm, router logit and attention weight to fp32. A rotary module of a dynamic
    or longrope type keeps its forward (fp64_variant drops the decorator that updates it)."""
    import sys
    import types

    changed = []
    undo = []
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        config._experts_implementation = "eager"
    variants = {}
    for module in model.modules():
        cls = type(module)
        if getattr(module, "rope_type", "default") in ("dynamic", "longrope"):
            continue
        for name in ("forward", "route_tokens_to_experts"):
            fn = cls.__dict__.get(name)
            if fn is None:
                continue
            key = (cls, name)
            if key not in variants:
                variants[key] = fp64_variant(fn)
                if variants[key] is not None:
                    changed.append(f"{cls.__name__}.{name}")
            if variants[key] is not None:
                setattr(module, name, types.MethodType(variants[key], module))
    modeling = sys.modules[type(model).__module__]
    for name in ("eager_attention_forward",):
        fn = getattr(modeling, name, None)
        v = fp64_variant(fn) if fn is not None else None
        if v is not None:
            undo.append((name, fn))
            setattr(modeling, name, v)
            changed.append(name)

    def restore():
        for n, f in undo:
            setattr(modeling, n, f)

    return changed, restore


def routing_margins(model):
    """Hooks every MoE layer's router; returns a list the forward fills with, per call, the
    (positions,) tensor of the routing margin there: the gap between the k-th and (k+1)-th expert's
    choice score (sigmoid(logit) + e_score_correction_bias, as glm4_moe chooses; softmax(logit)
    for a router without the bias), the minimum over the layers. A position whose margin is
    within fp32 rounding can route differently in two correct implementations."""
    import torch

    calls = []

    def hook(module, args, out):
        logits = (out[0] if isinstance(out, tuple) else out).double()
        logits = logits.reshape(-1, logits.shape[-1])
        bias = getattr(module, "e_score_correction_bias", None)
        score = torch.sigmoid(logits) + bias.double() if bias is not None else torch.softmax(logits, -1)
        top = torch.topk(score, module.top_k + 1 if hasattr(module, "top_k") else 9, dim=-1).values
        calls.append((top[:, -2] - top[:, -1]).detach())

    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight") and gate.weight.dim() == 2:
            gate.register_forward_hook(hook)
    return calls


def finite(x):
    """x to 3 significant digits, or None where it is infinite (no margin: a dense model, a first
    position), which JSON cannot hold."""
    return float(f"{x:.3g}") if math.isfinite(x) else None


class Tally:
    """Top-1 agreement, max |d log p| and top-k KL over positions of one path."""

    def __init__(self):
        self.n = self.agree = 0
        self.max_dlp = self.kl_sum = self.kl_max = 0.0
        self.worst = []  # (dlogp, kl, routing margin, earlier positions' least margin) per position

    def add(self, ref_lp, ours, margin, upstream=float("inf")):
        """ref_lp: (vocab,) float64 log-probs; ours: [(id, logprob)] best first; margin: the
        position's routing margin in the reference (routing_margins); upstream: the least margin
        at the sequence's earlier positions (prompt and generated), whose flips reach this one
        through attention."""
        import torch

        ids = [i for i, _ in ours]
        mine = torch.tensor([v for _, v in ours], dtype=torch.float64)
        ref = ref_lp[ids]
        self.n += 1
        self.agree += int(int(torch.argmax(ref_lp)) == ids[0])
        dlp = float((mine - ref).abs().max())
        self.max_dlp = max(self.max_dlp, dlp)
        kl = float((mine.exp() * (mine - ref)).sum())
        self.kl_sum += kl
        self.kl_max = max(self.kl_max, kl)
        self.worst.append((dlp, kl, margin, upstream))

    def result(self):
        worst = sorted(self.worst, reverse=True)[:5]
        return {"positions": self.n, "top1": self.agree / max(self.n, 1), "max_dlogp": self.max_dlp,
                "kl_mean": self.kl_sum / max(self.n, 1), "kl_max": self.kl_max,
                "worst_dlogp_kl_margin_upstream": [[round(d, 6), float(f"{k:.3g}"), finite(m), finite(u)] for d, k, m, u in worst]}


def token_id(name):
    if not name.startswith("token_id:"):
        raise ValueError(f"logprob token {name!r}: expected 'token_id:<id>' (return_tokens_as_token_ids)")
    return int(name[len("token_id:"):])


def compare(ckpt, prompts_path, cpu_path, cuda_path):
    import torch
    import transformers

    prompts = json.load(open(prompts_path))
    cpu = json.load(open(cpu_path))["prompts"]
    cuda = json.load(open(cuda_path))
    seqs = [p + [token_id(t) for t in a["choices"][0]["logprobs"]["tokens"]] for p, a in zip(prompts, cuda)]
    # transformers in fp32 first: its own distance from the fp64 reference is the floor that an
    # fp32 implementation's routing near-ties produce (BOUNDS["cpu"] is set from it).
    model, cls, notes, _ = load_reference(ckpt, torch.float32)
    fp32_top = []
    with torch.no_grad():
        for seq in seqs:
            lp = torch.log_softmax(model(input_ids=torch.tensor([seq], device="cuda")).logits[0].double(), -1)
            v, i = torch.topk(lp, 20, dim=-1)
            fp32_top.append((i.cpu(), v.cpu()))
    del model
    torch.cuda.empty_cache()
    reference = "float64 throughout (eager experts; the modeling code's fp32 casts made fp64: to_float64)"
    model = restore = failure = None
    try:
        model, _, _, restore = load_reference(ckpt, torch.float64)
        with torch.no_grad():
            model(input_ids=torch.tensor([seqs[0][:2]], device="cuda"))
    except Exception as e:  # a class that cannot run in fp64: fp32 is the reference, said so
        failure = f"{type(e).__name__}: {e}"
    if failure is not None:  # outside the except: its traceback no longer holds the fp64 model
        reference = f"float32 (float64 failed: {failure})"[:300]
        if restore is not None:
            restore()
        model = None
        gc.collect()  # the recompiled methods hold their modules in cycles
        torch.cuda.empty_cache()
        model, _, _, _ = load_reference(ckpt, torch.float32)
    margin_calls = routing_margins(model)
    tallies = {"transformers_fp32": Tally(), "cpu": Tally(), "cuda_prefill": Tally(), "cuda_decode": Tally()}
    for p, seq, (ids32, lp32), ours_cpu, answer in zip(prompts, seqs, fp32_top, cpu, cuda):
        choice = answer["choices"][0]
        margin_calls.clear()
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=torch.tensor([seq], device="cuda")).logits[0], -1).cpu()
        # The routing margin behind row t: the minimum over the layers at position t (a flip there
        # moves row t most; earlier positions reach it only through attention).
        margin = (torch.stack(margin_calls).min(0).values.cpu().tolist() if margin_calls
                  else [float("inf")] * len(seq))
        upstream = list(itertools.accumulate([float("inf")] + margin[:-1], min))
        for t in range(len(seq) if reference.startswith("float64") else 0):  # no floor without fp64
            tallies["transformers_fp32"].add(ref[t], list(zip(ids32[t].tolist(), lp32[t].tolist())), margin[t], upstream[t])
        for t, pos in enumerate(ours_cpu["positions"]):
            tallies["cpu"].add(ref[t], [(i, v - pos["logsumexp"]) for i, v in pos["top"]], margin[t], upstream[t])
        for t, entry in enumerate(choice.get("prompt_logprobs") or []):
            if entry is None:
                continue
            ranked = sorted(((int(k), v["logprob"]) for k, v in entry.items() if v["rank"] <= 20),
                            key=lambda x: -x[1])
            tallies["cuda_prefill"].add(ref[t - 1], ranked[:20], margin[t - 1], upstream[t - 1])
        for j, top in enumerate(choice["logprobs"]["top_logprobs"]):
            ranked = sorted(((token_id(k), v) for k, v in top.items()), key=lambda x: -x[1])
            tallies["cuda_decode"].add(ref[len(p) - 1 + j], ranked, margin[len(p) - 1 + j], upstream[len(p) - 1 + j])
    generated = [len(s) - len(p) for s, p in zip(seqs, prompts)]
    floor = tallies["transformers_fp32"].result()
    BOUNDS["cpu"]["max_dlogp"] = max(5e-3, 2 * floor["max_dlogp"] if floor["positions"] else 0.0)
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "class": cls, "reference": reference,
           "experts": notes or ["per-expert modules"], "prompts": [len(p) for p in prompts],
           "generated": generated, "bounds": BOUNDS}
    failed = []
    for name, tally in tallies.items():
        r = tally.result()
        out[name] = r
        b = BOUNDS.get(name, {})
        if b and (r["positions"] == 0 or r["top1"] < b["top1"] or any(r[k] > v for k, v in b.items() if k != "top1")):
            failed.append(name)
    out["failed"] = failed
    print(json.dumps(out, indent=1))
    return 1 if failed else 0


def main():
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "write":
        layers = int(args[args.index("--layers") + 1]) if "--layers" in args else 3
        seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
        overrides = json.loads(args[args.index("--set") + 1]) if "--set" in args else {}
        write(args[1], args[2], layers, seed, overrides)
        return 0
    if len(args) == 5 and args[0] == "compare":
        return compare(*args[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
