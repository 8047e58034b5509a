#!/usr/bin/env python3
"""Record Hugging Face transformers' logits on the checkpoints of tests/worker/cpu/transformers_fixtures.hpp.

The checkpoints are written by servedeck-equivalence-models (tests/worker/cpu) into MODELS_DIR,
with MODELS_DIR/prompts.json ({"prompts": [[ids]...], "models": {name: fnv1a64 hex}}). For each
model this builds transformers' own class from the checkpoint's config.json
(AutoModelForCausalLM.from_config, fp32, eager attention), fills every parameter and buffer from
model.safetensors (strictly: a model tensor the checkpoint lacks, a shape that differs, or a
checkpoint tensor left over is an error, except the MTP layers' model.layers.{num_hidden_layers + i}.*,
which transformers does not build either), runs every prompt in one forward pass, and writes
  OUT/<name>.f32        the logits, little-endian fp32, prompts in order, (positions, vocab) each
  OUT/reference.json    versions, per model: the fnv1a64 of the model.safetensors read, vocab,
                        positions, the MTP tensors skipped, how experts were mapped
Routed experts stored per expert (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, as the
published checkpoints and servedeck's writer store them) are stacked into transformers 5's fused
gate_up_proj / down_proj when its class keeps them fused.

Needs: torch, transformers (written against 5.x), safetensors, numpy. CPU is enough for these sizes.
Usage: python3 scripts/record_transformers_logits.py MODELS_DIR OUT_DIR
Exit status 0, or 1 with the reason.
"""

import json
import os
import re
import sys


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def log(*a):
    print(*a, flush=True)


def fill(model, ckpt, num_layers, nextn):
    """Copies checkpoint tensors into the model's state dict; returns (notes, skipped MTP names)."""
    import torch

    state = model.state_dict()
    used = set()
    notes = []
    for key, target in state.items():
        if key in ckpt:
            src = ckpt[key]
            used.add(key)
        else:
            m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$", key)
            if not m:
                raise RuntimeError(f"model tensor {key} {tuple(target.shape)} is not in the checkpoint")
            prefix, kind = m.groups()
            n = target.shape[0]
            parts = []
            for e in range(n):
                if kind == "gate_up_proj":
                    g, u = f"{prefix}.{e}.gate_proj.weight", f"{prefix}.{e}.up_proj.weight"
                    used.update((g, u))
                    w = torch.cat([ckpt[g], ckpt[u]], dim=0)  # (2I, H)
                else:
                    d = f"{prefix}.{e}.down_proj.weight"
                    used.add(d)
                    w = ckpt[d]  # (H, I)
                if tuple(w.shape) != tuple(target.shape[1:]):
                    w = w.t()
                parts.append(w)
            src = torch.stack(parts)
            if "fused" not in notes:
                notes.append("fused")
        if tuple(src.shape) != tuple(target.shape):
            raise RuntimeError(f"{key}: checkpoint shape {tuple(src.shape)}, model shape {tuple(target.shape)}")
        target.copy_(src.to(target.dtype))
    mtp = [f"model.layers.{num_layers + i}." for i in range(nextn)]
    skipped = sorted(k for k in ckpt if k not in used and any(k.startswith(p) for p in mtp))
    left = sorted(k for k in ckpt if k not in used and k not in skipped)
    if left:
        raise RuntimeError(f"checkpoint tensors the model has no place for: {left[:8]} ({len(left)} in all)")
    return notes, skipped


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 1
    models_dir, out_dir = sys.argv[1], sys.argv[2]
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    torch.set_float32_matmul_precision("highest")
    manifest = json.load(open(os.path.join(models_dir, "prompts.json")))
    prompts = manifest["prompts"]
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {len(prompts)} prompts "
        f"of {[len(p) for p in prompts]} tokens")
    os.makedirs(out_dir, exist_ok=True)
    ref = {"torch": torch.__version__, "transformers": transformers.__version__, "device": "cpu",
           "prompts": [len(p) for p in prompts], "models": {}}
    for name, expected_hash in manifest["models"].items():
        mdir = os.path.join(models_dir, name)
        raw = open(os.path.join(mdir, "model.safetensors"), "rb").read()
        got = fnv1a64(raw)
        if got != expected_hash:
            raise RuntimeError(f"{name}: model.safetensors fnv1a64 {got}, manifest {expected_hash}")
        try:
            config = AutoConfig.from_pretrained(mdir)
            try:
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
            except TypeError:
                model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32, attn_implementation="eager")
            model = model.float().eval()
            ckpt = load_file(os.path.join(mdir, "model.safetensors"))
            with torch.no_grad():
                nextn = getattr(config, "num_nextn_predict_layers", 0) or 0
                notes, skipped = fill(model, ckpt, config.num_hidden_layers, nextn)
                rows = []
                for p in prompts:
                    logits = model(input_ids=torch.tensor([p], dtype=torch.long)).logits[0].float().numpy()
                    rows.append(logits)
            allrows = np.concatenate(rows, axis=0).astype("<f4")
            allrows.tofile(os.path.join(out_dir, f"{name}.f32"))
            rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
            rotary = getattr(model.model, "rotary_emb", None)
            inv_freq = rotary.inv_freq.float().tolist() if rotary is not None else None
            scaling = float(getattr(rotary, "attention_scaling", 1.0)) if rotary is not None else None
            ref["models"][name] = {"fnv1a64": got, "vocab_size": int(allrows.shape[1]),
                                   "positions": int(allrows.shape[0]), "class": type(model).__name__,
                                   "experts": notes or ["per-expert modules"], "mtp_tensors_skipped": len(skipped),
                                   "rope": rope, "inv_freq": inv_freq, "attention_scaling": scaling,
                                   "logit_std": float(allrows.std())}
            log(f"[{name}] {type(model).__name__}: {allrows.shape[0]} positions x {allrows.shape[1]}, experts "
                f"{notes or 'per-expert'}, {len(skipped)} MTP tensors skipped, rope {rope}, "
                f"{len(inv_freq or [])} rotary pairs, attention scaling {scaling}, logit std {allrows.std():.3f}")
            del model
        except Exception as e:  # one model's failure does not lose the others
            import traceback

            traceback.print_exc()
            ref["models"][name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"[{name}] FAILED: {e}")
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2, default=str)
    failed = [n for n, m in ref["models"].items() if "error" in m]
    log("RECORDED" if not failed else f"RECORDED with failures: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # report and fail; the device run's log is all that comes back
        import traceback

        traceback.print_exc()
        print(f"FAILED: {e}", flush=True)
        sys.exit(1)
