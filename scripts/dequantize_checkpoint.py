#!/usr/bin/env python3
"""Write a quantised checkpoint's linears back as fp32: the reference transformers runs where it has
no reader for the format (ModelOpt NVFP4 on the device), so that a comparison measures the kernels
against the exact dequantised values and not the quantisation error.

Formats, as their publishers define them (read independently of worker/model/quantized_weight.cpp,
so that this is a cross-check of it):
  NVFP4 (ModelOpt, quant_algo NVFP4): `weight` uint8 (rows, cols / 2), two e2m1 values per byte, the
    low nibble first; e2m1 = sign bit 3, magnitude code 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6;
    `weight_scale` float8_e4m3fn (rows, cols / 16), one per 16 consecutive inputs; `weight_scale_2`
    fp32 scalar. w[r, c] = e2m1[r, c] * weight_scale[r, c // 16] * weight_scale_2. `input_scale` is
    dropped (activations are not quantised by servedeck).
  FP8 block (quant_method fp8): `weight` float8_e4m3fn, `weight_scale_inv` fp32 per 128 x 128 block
    (weight_block_size); w = weight * weight_scale_inv[r // br, c // bc].
Every other tensor is copied as it is; config.json loses its quantization_config; the other files
are copied.

Usage: python3 scripts/dequantize_checkpoint.py IN_DIR OUT_DIR
Needs: torch, safetensors.
"""

import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4(packed, scale, scale_2):
    lo, hi = packed & 0x0F, packed >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1).long()  # low nibble first
    values = E2M1[codes & 7] * torch.where(codes & 8 != 0, -1.0, 1.0)
    per = scale.float().repeat_interleave(16, dim=1)[:, : values.shape[1]]
    return values * per * scale_2.float()


def fp8_block(weight, scale_inv, br, bc):
    s = scale_inv.float().repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return weight.float() * s[: weight.shape[0], : weight.shape[1]]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, dst = sys.argv[1:]
    config = json.load(open(os.path.join(src, "config.json")))
    qc = config.pop("quantization_config", None)
    if qc is None:
        print(f"{src}/config.json declares no quantization_config: nothing to dequantise", file=sys.stderr)
        return 2
    block = qc.get("weight_block_size", [128, 128])
    os.makedirs(dst, exist_ok=True)
    index_path = os.path.join(src, "model.safetensors.index.json")
    shards = sorted(set(json.load(open(index_path))["weight_map"].values())) if os.path.exists(index_path) else ["model.safetensors"]
    weight_map, total, converted = {}, 0, 0
    for shard in shards:
        out = {}
        with safe_open(os.path.join(src, shard), "pt") as f:
            names = set(f.keys())
            for name in sorted(names):
                module = name[: -len(".weight")] if name.endswith(".weight") else None
                if name.endswith((".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".input_scale")):
                    continue
                t = f.get_tensor(name)
                if module and module + ".weight_scale_2" in names:
                    t = nvfp4(t, f.get_tensor(module + ".weight_scale"), f.get_tensor(module + ".weight_scale_2"))
                    converted += 1
                elif module and module + ".weight_scale_inv" in names:
                    t = fp8_block(t, f.get_tensor(module + ".weight_scale_inv"), block[0], block[1])
                    converted += 1
                out[name] = t.contiguous()
        save_file(out, os.path.join(dst, shard), metadata={"format": "pt"})
        for name, t in out.items():
            weight_map[name] = shard
            total += t.numel() * t.element_size()
    if os.path.exists(index_path):
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
                  open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=2)
    json.dump(config, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for name in os.listdir(src):
        if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json", "hf_quant_config.json"):
            continue
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    print(f"dequantised {converted} linears to fp32 in {len(shards)} shard(s): {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
