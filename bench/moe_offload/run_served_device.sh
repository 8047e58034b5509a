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
#   BIN=DIR [LAYERS=3] bash bench/moe_offload/run_served_device.sh equivalence
#                                                             real-shape's two comparisons with transformers only
#   BIN=DIR [LAYERS=3] bash bench/moe_offload/run_served_device.sh nvfp4-shape
#                                                             the same GLM cut quantised by `servedeck-worker quantize
#                                                             --format nvfp4`: CPU and CUDA against transformers on
#                                                             its fp32 dequantisation (scripts/dequantize_checkpoint.py),
#                                                             then models.toml's glm45-air-nvfp4 entry on it through
#                                                             the daemon
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

# write_cut NAME CONFIG LAYERS TOKENIZER_DIR CONFIG_OVERRIDES_JSON: a LAYERS-layer cut of CONFIG's
# shape with random bf16 weights (scripts/compare_real_shape.py write) and TOKENIZER_DIR's
# tokenizer files, in /tmp/cut-NAME.
write_cut() {
  local name=$1 config=$2 n=$3 tok=$4 set=$5 ck=/tmp/cut-$1
  stamp "[$name] write a $n-layer checkpoint of $config's shape"
  python3 scripts/compare_real_shape.py write "$config" $ck --layers "$n" --seed 7 --set "$set" || return 1
  for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
    [ -f "$tok/$f" ] && cp "$tok/$f" $ck/
  done
  du -sh $ck
}

# equivalence NAME REFERENCE_DIR ID_LIMIT [WORKER FLAGS...]: on /tmp/cut-NAME, the CPU backend's
# logits (servedeck-logits), the CUDA worker's prompt_logprobs and greedy logprobs (25% hot), then
# both against transformers on REFERENCE_DIR (the cut itself, or its dequantised copy);
# $OUT/equivalence-NAME.json.
equivalence() {
  local name=$1 ref=$2 limit=$3 ck=/tmp/cut-$1 wport=18431
  shift 3
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
  python3 scripts/compare_real_shape.py compare "$ref" /tmp/gp.json /tmp/cpu.json /tmp/cuda.json > "$OUT/equivalence-$name.json"
  python3 -c "
import json; d = json.load(open('$OUT/equivalence-$name.json'))
for k in ('transformers_fp32', 'cpu', 'cuda_prefill', 'cuda_decode'): print('$name', k, json.dumps(d[k]))
print('$name failed:', d['failed'], 'cpu bound', d['bounds']['cpu'])" || cat "$OUT/equivalence-$name.json"
  return 0
}

# serve_entry ENTRY CUT LAYERS EXPERT_BYTES: models.toml's ENTRY verbatim but for its checkpoint
# (CUT, a LAYERS-layer cut whose routed experts are EXPERT_BYTES each), ctx 4096 and the sizes that
# follow; `servedeck switch`, then a streamed chat with a Bash tool through the gateway.
serve_entry() {
  local entry=$1 cut=$2 layers=$3 eb=$4 st=/tmp/sd-$1/state
  mkdir -p "$st"
  stamp "models.toml's $entry entry on $cut, through the daemon"
  python3 - "$entry" "$cut" "$st" "$layers" "$eb" <<'PY' || return 1
import math, re, sys
entry, cut, st, layers, eb = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
s = open('models.toml').read()
i = s.index(f'[models.{entry}]'); j = s.index('# ----', i)
e = re.sub(r'checkpoint = "[^"]*"', f'checkpoint = "{cut}"', s[i:j], count=1)
offload = math.ceil((layers - 1) * 128 * eb / 2**30)
for pat, rep in ((r'ctx = \d+', 'ctx = 4096'), (r'kv_cache_bytes_per_token = \d+', f'kv_cache_bytes_per_token = {layers * 4096}'),
                 (r'util = [0-9.]+', 'util = 0.30'), (r'cpu_offload_gib = \d+', f'cpu_offload_gib = {offload}'),
                 (r'host_ram_gib = \d+', f'host_ram_gib = {offload + 30}'), (r'start_timeout_s = \d+', 'start_timeout_s = 600')):
    e, n = re.subn(pat, rep, e, count=1)
    assert n == 1, pat
open(f'/tmp/{entry}.toml', 'w').write(f'[server]\nlisten = "127.0.0.1:0"\nstate_dir = "{st}"\n\n' + e)
PY
  servedeck --config /tmp/$entry.toml lint || return 1
  local port
  port=$(daemon_start /tmp/$entry.toml "$st")
  servedeck --config /tmp/$entry.toml switch $entry | tail -1
  local tools='[{"type":"function","function":{"name":"Bash","description":"Run a shell command.","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]'
  local t0
  t0=$(date +%s.%N)
  curl -sN --max-time 300 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"$entry\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\":0,\"max_tokens\":64,\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"Create ran.txt.\"}]}" \
    > "$OUT/$entry-stream.txt"
  echo "stream: $(grep -c '^data:' "$OUT/$entry-stream.txt") data lines in $(python3 -c "import time; print(round(time.time() - $t0, 2))") s, last: $(tail -c 14 "$OUT/$entry-stream.txt" | tr '\n' ' ')"
  echo "finish: $(grep -o '"finish_reason":"[a-z_]*"' "$OUT/$entry-stream.txt" | tail -1); usage: $(grep -o '"usage":{[^}]*}' "$OUT/$entry-stream.txt" | tail -1)"
  grep -h "min_output_tokens\|sanitize_tool_tags\|answer_rescue" "$st.daemon.log" 2>/dev/null | tail -3
  servedeck --config /tmp/$entry.toml stop | tail -1
}

mode=${1:-}
case "$mode" in
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
  real-shape|equivalence)
    st=/tmp/sd-glm-shape/state layers=${LAYERS:-3}
    mkdir -p "$st"
    servedeck-worker make-tiny-model --model-type glm4_moe --out /tmp/tg --tokenizer-dir "$d/tok" > /dev/null || exit 1
    write_cut glm45-air bench/moe_offload/glm-4.5-air/config.json "$layers" /tmp/tg '{}' || exit 1
    equivalence glm45-air /tmp/cut-glm45-air 151329 --tool-parser glm || exit 1
    if [ "$mode" = real-shape ]; then serve_entry glm45-air /tmp/cut-glm45-air "$layers" $((3 * 4096 * 1408 * 2)); fi
    rm -rf /tmp/cut-glm45-air
    write_cut qwen3-30b-yarn bench/moe_offload/qwen3-30b-a3b/config.json 4 "$d/tok" \
      '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, "max_position_embeddings": 131072}' || exit 1
    equivalence qwen3-30b-yarn /tmp/cut-qwen3-30b-yarn 151643 || exit 1
    ;;
  nvfp4-shape)
    layers=${LAYERS:-3}
    servedeck-worker make-tiny-model --model-type glm4_moe --out /tmp/tg --tokenizer-dir "$d/tok" > /dev/null || exit 1
    stamp "the dequantiser against the CPU backend's NVFP4 reader, on the tiny model"
    servedeck-worker make-tiny-model --quantize nvfp4 --out /tmp/tq --tokenizer-dir "$d/tok" > /dev/null || exit 1
    python3 scripts/dequantize_checkpoint.py /tmp/tq /tmp/tq-deq || exit 1
    python3 -c "import json,random; r=random.Random(3); json.dump([[r.randrange(4096) for _ in range(n)] for n in (5,40)], open('/tmp/tp.json','w'))"
    servedeck-logits /tmp/tq /tmp/tp.json /tmp/tq.json --top-k 20 | tail -1
    servedeck-logits /tmp/tq-deq /tmp/tp.json /tmp/tq-deq.json --top-k 20 | tail -1
    python3 - <<'PY'
import json
a, b = (json.load(open(p))["prompts"] for p in ("/tmp/tq.json", "/tmp/tq-deq.json"))
d = max(abs(x[1] - y[1]) for pa, pb in zip(a, b) for qa, qb in zip(pa["positions"], pb["positions"])
        for x, y in zip(qa["top"], qb["top"]) if x[0] == y[0])
same = all([x[0] for x in qa["top"]] == [y[0] for y in qb["top"]] for pa, pb in zip(a, b) for qa, qb in zip(pa["positions"], pb["positions"]))
print(f"tiny nvfp4 read by servedeck vs its fp32 dequantisation: same top-20 ids {same}, max |d logit| {d:.3g}")
PY
    write_cut glm45-air bench/moe_offload/glm-4.5-air/config.json "$layers" /tmp/tg '{}' || exit 1
    stamp "servedeck-worker quantize --format nvfp4"
    t0=$(date +%s.%N)
    servedeck-worker quantize --model /tmp/cut-glm45-air --out /tmp/cut-glm45-air-nvfp4 --format nvfp4 || exit 1
    echo "quantize: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
    du -sh /tmp/cut-glm45-air-nvfp4
    rm -rf /tmp/cut-glm45-air
    stamp "the cut's fp32 dequantisation (transformers' reference)"
    python3 scripts/dequantize_checkpoint.py /tmp/cut-glm45-air-nvfp4 /tmp/deq-glm45-air || exit 1
    equivalence glm45-air-nvfp4 /tmp/deq-glm45-air 151329 --tool-parser glm || exit 1
    rm -rf /tmp/deq-glm45-air
    serve_entry glm45-air-nvfp4 /tmp/cut-glm45-air-nvfp4 "$layers" 9732352
    ;;
  *) echo "usage: BIN=DIR run_served_device.sh quant|glm|real-shape|equivalence|nvfp4-shape" >&2; exit 2 ;;
esac
kill %1 2>/dev/null
wait
