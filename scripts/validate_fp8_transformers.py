#!/usr/bin/env python3
"""Validate a block-scaled FP8 checkpoint written by `make-tiny-model --quantize fp8` with
Hugging Face transformers, and compare its logits with servedeck's CPU backend.

1. Loads the checkpoint as published FP8 (transformers' finegrained FP8: FP8Linear/FP8Expert,
   W8A8 with dynamic activation quantisation) on the GPU and runs a forward pass: the layout
   (names, dtypes, scale shapes, quantization_config) is what transformers reads.
2. Loads it again with FineGrainedFP8Config(dequantize=True) in fp32 (the weights dequantised at
   load, as servedeck's CPU backend does) and compares the logits of every position with
   `servedeck-logits` output (OUT.json: per position the top-k ids, logits and logsumexp):
   top-1 agreement, max |Δ log p| over the reference's top-k, and KL restricted to that top-k
   (Σ p_ours (log p_ours − log p_hf) over it; the top-20 hold nearly all the mass).
Prints one JSON object; exit 1 when the dequantised comparison is over its thresholds.
Usage: validate_fp8_transformers.py CHECKPOINT_DIR SERVEDECK_LOGITS.json PROMPTS.json
"""

import json
import sys

import torch


def main():
    ckpt, ours_path, prompts_path = sys.argv[1:4]
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    prompts = json.load(open(prompts_path))
    ours = json.load(open(ours_path))
    out = {"checkpoint": ckpt, "transformers": __import__("transformers").__version__}
    torch.backends.cuda.matmul.allow_tf32 = False
    # 1. As published: FP8 weights on the GPU.
    try:
        m = AutoModelForCausalLM.from_pretrained(ckpt, device_map="cuda")
        fp8 = [n for n, p in m.named_parameters() if p.dtype == torch.float8_e4m3fn]
        scales = [n for n, _ in m.named_parameters() if "scale_inv" in n]
        with torch.no_grad():
            logits = m(torch.tensor([prompts[0]], device="cuda")).logits.float()
        out["fp8_load"] = {"ok": bool(torch.isfinite(logits).all()), "fp8_parameters": len(fp8),
                           "scale_parameters": len(scales), "example_fp8": fp8[:2]}
        del m
    except Exception as e:  # reported, not hidden: the layout check failed
        out["fp8_load"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    # 2. Dequantised in fp32, against servedeck's CPU logits.
    m = AutoModelForCausalLM.from_pretrained(
        ckpt, device_map="cuda", dtype=torch.float32,
        quantization_config=FineGrainedFP8Config(dequantize=True), attn_implementation="eager")
    agree = total = 0
    max_dlp = kl_max = 0.0
    for p, theirs in zip(prompts, ours["prompts"]):
        with torch.no_grad():
            lp = torch.log_softmax(m(torch.tensor([p], device="cuda")).logits[0].double(), -1).cpu()
        for t, pos in enumerate(theirs["positions"]):
            ids = [i for i, _ in pos["top"]]
            mine = torch.tensor([v for _, v in pos["top"]], dtype=torch.float64) - pos["logsumexp"]
            hf = lp[t, ids]
            agree += int(int(torch.argmax(lp[t])) == ids[0])
            total += 1
            max_dlp = max(max_dlp, float((mine - hf).abs().max()))
            kl_max = max(kl_max, float((mine.exp() * (mine - hf)).sum()))
    out["dequantized_vs_servedeck"] = {"positions": total, "top1_agreement": agree / total,
                                       "max_abs_dlogprob_topk": max_dlp, "kl_topk_max": kl_max}
    print(json.dumps(out))
    ok = agree / total >= 0.98 and max_dlp < 5e-3 and kl_max < 1e-4
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
