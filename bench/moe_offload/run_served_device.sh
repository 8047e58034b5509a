#!/bin/bash
# Runs on the GPU machine (device tool) from the repository root: tiny real-layout checkpoints served
# by the daemon on the CUDA backend, each through `servedeck switch`, then requests through the
# gateway. Output under $OUT.
#   BIN=DIR bash bench/moe_offload/run_served_device.sh quant   make-tiny-model --quantize fp8|nvfp4 --shape aligned:
#                                                             a streamed chat and a timed 256-token completion each,
#                                                             and transformers' reading of the FP8 layout
#                                                             (scripts/validate_fp8_transformers.py)
#   BIN=DIR bash bench/moe_offload/run_served_device.sh glm     models.toml's tiny-glm-tool entry with --backend cuda:
#                                                             a chat with a Bash tool, streamed and not (tool_calls)
# DIR holds servedeck, servedeck-worker, servedeck-logits, lib/ (libraries the device lacks:
# libtomlplusplus.so.3, libsqlite3.so.0, libsystemd.so.0, libpcre2-8.so.0) and tok/ (Qwen3's
# tokenizer.json and tokenizer_config.json), built on the dev machine (Release, sm_90a).
set -o pipefail
d=$(cd "${BIN:?BIN: the carried binaries}" && pwd)
OUT=${OUT:-/tmp}
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$d/lib:${cublas_dir}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$d:$PATH
stamp() { echo "[$(date +%T)] $*"; }

daemon_start() {  # daemon_start TOML STATE_DIR: serve in the background, print the gateway's port
  servedeck --config "$1" serve --port 0 > "$2.daemon.log" 2>&1 &
  for _ in $(seq 1 50); do [ -s "$2/daemon.json" ] && break; sleep 0.2; done
  python3 -c "import json; print(json.load(open('$2/daemon.json'))['port'])"
}

case "${1:-}" in
  quant)
    st=/tmp/sd-quant/state
    for f in fp8 nvfp4; do
      servedeck-worker make-tiny-model --out /tmp/q-$f --tokenizer-dir "$d/tok" --quantize $f --shape aligned > /dev/null || exit 1
    done
    python3 -c 'import json,random; r=random.Random(3); json.dump([[r.randrange(151643) for _ in range(n)] for n in (1,24,64)], open("/tmp/prompts.json","w"))'
    servedeck-logits /tmp/q-fp8 /tmp/prompts.json /tmp/ours.json --threads 16 | tail -1
    PYTHONUNBUFFERED=1 python3 scripts/validate_fp8_transformers.py /tmp/q-fp8 /tmp/ours.json /tmp/prompts.json 2> "$OUT/hf_err.log" |
      tee "$OUT/hf.json"
    printf '[server]\nlisten = "127.0.0.1:0"\nstate_dir = "%s"\n' "$st" > /tmp/quant.toml
    for f in fp8 nvfp4; do cat >> /tmp/quant.toml <<TOML

[models.tiny-$f]
engine = "native"
served_name = "tiny-$f"
description = "make-tiny-model --quantize $f --shape aligned on the CUDA backend"
checkpoint = "/tmp/q-$f"
program = "servedeck-worker"
args = ["serve", "--model", "{model}", "--host", "{host}", "--port", "{port}", "--served-model-name", "{served_name}",
        "--max-model-len", "{ctx}", "--kv-cache-bytes", "{kv_cache_bytes}", "--backend", "cuda", "--hot-fraction", "0"]
port = 0
ctx = 4096
kv_cache_bytes_per_token = 8192
requires_gpu = true
util = 0.05
health_path = "/health"
start_timeout_s = 120
TOML
    done
    servedeck --config /tmp/quant.toml lint || exit 1
    port=$(daemon_start /tmp/quant.toml "$st")
    for f in fp8 nvfp4; do
      stamp "switch tiny-$f"
      servedeck --config /tmp/quant.toml switch tiny-$f | tail -1
      curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"tiny-$f\",\"stream\":true,\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}" > "$OUT/stream-$f.txt"
      echo "stream: $(grep -c '^data:' "$OUT/stream-$f.txt") data lines, last: $(tail -c 14 "$OUT/stream-$f.txt" | tr '\n' ' ')"
      python3 - "$port" "tiny-$f" <<'PY'
import json, sys, time, urllib.request
port, m = sys.argv[1], sys.argv[2]
body = {"model": m, "max_tokens": 256, "temperature": 0, "ignore_eos": True, "messages": [{"role": "user", "content": "Write a story."}]}
t = time.time()
r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
    headers={"content-type": "application/json"}), timeout=120))
u = r["usage"]
print(f"{m}: prompt {u['prompt_tokens']}, completion {u['completion_tokens']} tokens in {time.time() - t:.3f} s wall, "
      f"finish {r['choices'][0]['finish_reason']}")
PY
    done
    servedeck --config /tmp/quant.toml stop | tail -1
    ;;
  glm)
    st=/tmp/sd-glm/state
    servedeck-worker make-tiny-model --model-type glm4_moe --variant tool --out /tmp/tiny-glm-tool --tokenizer-dir "$d/tok" > /dev/null || exit 1
    python3 - "$st" <<'PY'
import sys
s = open('models.toml').read()
i = s.index('[models.tiny-glm-tool]'); j = s.index('# ----', i)
e = s[i:j].replace('checkpoint = "models/tiny-glm-tool"', 'checkpoint = "/tmp/tiny-glm-tool"')
e = e.replace('"--tool-parser", "glm",', '"--tool-parser", "glm", "--backend", "cuda",')
e = e.replace('requires_gpu = false', 'requires_gpu = true\nutil = 0.05')
open('/tmp/glm.toml', 'w').write(f'[server]\nlisten = "127.0.0.1:0"\nstate_dir = "{sys.argv[1]}"\n\n' + e)
PY
    servedeck --config /tmp/glm.toml lint || exit 1
    port=$(daemon_start /tmp/glm.toml "$st")
    servedeck --config /tmp/glm.toml switch tiny-glm-tool | tail -1
    tools='[{"type":"function","function":{"name":"Bash","description":"Run a shell command.","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]'
    for stream in true false; do
      curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"tiny-glm-tool\",\"stream\":$stream,\"temperature\":0,\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"Create ran.txt.\"}]}" \
        > "$OUT/glm-stream-$stream.txt"
      echo "stream $stream: finish $(grep -o '"finish_reason":"[a-z_]*"' "$OUT/glm-stream-$stream.txt" | tail -1), tool_calls in $(grep -c tool_calls "$OUT/glm-stream-$stream.txt") line(s)"
    done
    servedeck --config /tmp/glm.toml stop | tail -1
    ;;
  *) echo "usage: BIN=DIR run_served_device.sh quant|glm" >&2; exit 2 ;;
esac
kill %1 2>/dev/null
wait
