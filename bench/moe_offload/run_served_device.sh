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
#   BIN=DIR [LAYERS=3] bash bench/moe_offload/run_served_device.sh real-shape
#                                                             GLM-4.5-Air's dimensions cut to LAYERS layers and
#                                                             Qwen3-30B-A3B's with YaRN cut to 4, random bf16 weights
#                                                             (scripts/compare_real_shape.py): CPU and CUDA logits
#                                                             against transformers, then models.toml's glm45-air
#                                                             entry on the GLM cut through `servedeck switch` and a
#                                                             streamed chat with tools
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

# equivalence NAME CONFIG LAYERS TOKENIZER_DIR CONFIG_OVERRIDES_JSON ID_LIMIT [WORKER FLAGS...]: a
# LAYERS-layer cut of CONFIG's shape with random weights (scripts/compare_real_shape.py write) and
# TOKENIZER_DIR's tokenizer files; the CPU backend's logits (servedeck-logits), the CUDA worker's
# prompt_logprobs and greedy logprobs (25% hot), then both against transformers in fp64;
# $OUT/equivalence-NAME.json.
equivalence() {
  local name=$1 config=$2 n=$3 tok=$4 set=$5 limit=$6 ck=/tmp/cut-$1 wport=18431
  shift 6
  stamp "[$name] write a $n-layer checkpoint of $config's shape"
  python3 scripts/compare_real_shape.py write "$config" $ck --layers "$n" --seed 7 --set "$set" || return 1
  for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
    [ -f "$tok/$f" ] && cp "$tok/$f" $ck/
  done
  du -sh $ck
  python3 -c "import json,random; r=random.Random(11); json.dump([[r.randrange($limit) for _ in range(n)] for n in (1,37,160,700)], open('/tmp/gp.json','w'))"
  stamp "[$name] CPU backend logits"
  servedeck-logits $ck /tmp/gp.json /tmp/cpu.json --top-k 20 --threads 16 | tail -1
  stamp "[$name] CUDA backend: the worker alone, 25% hot"
  servedeck-worker serve --model $ck --host 127.0.0.1 --port $wport --served-model-name cut --max-model-len 4096 \
    --kv-cache-bytes 134217728 --backend cuda --hot-fraction 0.25 "$@" > "$OUT/worker-$name.log" 2>&1 &
  local wpid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$wport/health" > /dev/null && break; sleep 1; done
  python3 - $wport <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
out = []
for p in json.load(open("/tmp/gp.json")):
    body = {"model": "cut", "prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 20,
            "prompt_logprobs": 20, "return_tokens_as_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    out.append(json.load(urllib.request.urlopen(req, timeout=300)))
json.dump(out, open("/tmp/cuda.json", "w"))
print("CUDA answers:", [len(a["choices"][0]["logprobs"]["tokens"]) for a in out], "tokens each")
PY
  kill $wpid; wait $wpid 2>/dev/null
  stamp "[$name] transformers"
  # Its exit status is not the run's: the verdict is the printed "failed" list, and the next shape
  # and the daemon part run whatever it says.
  python3 scripts/compare_real_shape.py compare $ck /tmp/gp.json /tmp/cpu.json /tmp/cuda.json > "$OUT/equivalence-$name.json"
  python3 -c "
import json; d = json.load(open('$OUT/equivalence-$name.json'))
for k in ('transformers_fp32', 'cpu', 'cuda_prefill', 'cuda_decode'): print('$name', k, json.dumps(d[k]))
print('$name failed:', d['failed'], 'cpu bound', d['bounds']['cpu'])" || cat "$OUT/equivalence-$name.json"
  return 0
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
  real-shape)
    st=/tmp/sd-glm-shape/state layers=${LAYERS:-3}
    mkdir -p "$st"
    servedeck-worker make-tiny-model --model-type glm4_moe --out /tmp/tg --tokenizer-dir "$d/tok" > /dev/null || exit 1
    equivalence glm45-air bench/moe_offload/glm-4.5-air/config.json "$layers" /tmp/tg '{}' 151329 --tool-parser glm || exit 1
    equivalence qwen3-30b-yarn bench/moe_offload/qwen3-30b-a3b/config.json 4 "$d/tok" \
      '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, "max_position_embeddings": 131072}' 151643 || exit 1
    ck=/tmp/cut-glm45-air
    stamp "models.toml's glm45-air entry on the cut, through the daemon"
    python3 - "$st" "$layers" <<'PY'
import math, sys
st, layers = sys.argv[1], int(sys.argv[2])
s = open('models.toml').read()
i = s.index('[models.glm45-air]'); j = s.index('# ----', i)
e = s[i:j].replace('checkpoint = "~/models/GLM-4.5-Air"', 'checkpoint = "/tmp/cut-glm45-air"')
offload = math.ceil((layers - 1) * 128 * 3 * 4096 * 1408 * 2 / 2**30)
for a, b in (('ctx = 65536', 'ctx = 4096'), ('kv_cache_bytes_per_token = 188416', f'kv_cache_bytes_per_token = {layers * 4096}'),
             ('util = 0.79', 'util = 0.30'), ('cpu_offload_gib = 186', f'cpu_offload_gib = {offload}'),
             ('host_ram_gib = 216', f'host_ram_gib = {offload + 30}'), ('start_timeout_s = 1800', 'start_timeout_s = 600')):
    assert a in e, a
    e = e.replace(a, b)
open('/tmp/glm-shape.toml', 'w').write(f'[server]\nlisten = "127.0.0.1:0"\nstate_dir = "{st}"\n\n' + e)
PY
    servedeck --config /tmp/glm-shape.toml lint || exit 1
    port=$(daemon_start /tmp/glm-shape.toml "$st")
    servedeck --config /tmp/glm-shape.toml switch glm45-air | tail -1
    tools='[{"type":"function","function":{"name":"Bash","description":"Run a shell command.","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]'
    t0=$(date +%s.%N)
    curl -sN --max-time 300 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"glm45-air\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\":0,\"max_tokens\":64,\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"Create ran.txt.\"}]}" \
      > "$OUT/glm-shape-stream.txt"
    echo "stream: $(grep -c '^data:' "$OUT/glm-shape-stream.txt") data lines in $(python3 -c "import time; print(round(time.time() - $t0, 2))") s, last: $(tail -c 14 "$OUT/glm-shape-stream.txt" | tr '\n' ' ')"
    echo "finish: $(grep -o '"finish_reason":"[a-z_]*"' "$OUT/glm-shape-stream.txt" | tail -1); usage: $(grep -o '"usage":{[^}]*}' "$OUT/glm-shape-stream.txt" | tail -1)"
    grep -h "min_output_tokens\|sanitize_tool_tags\|answer_rescue" "$st.daemon.log" 2>/dev/null | tail -3
    servedeck --config /tmp/glm-shape.toml stop | tail -1
    ;;
  *) echo "usage: BIN=DIR run_served_device.sh quant|glm|real-shape" >&2; exit 2 ;;
esac
kill %1 2>/dev/null
wait
