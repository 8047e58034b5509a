#!/bin/bash
# Runs on the GPU machine (device tool) from the repository root: the daemon launches models.toml's
# qwen3-30b-synthetic entry verbatim (Qwen3-30B-A3B shape, synthesised weights, 25% hot) through
# `servedeck switch`, then `servedeck soak` sends the agent loop through the gateway: one
# conversation with 50 tools regrown and re-sent each turn, streamed; per turn it prints prompt and
# cached tokens and TTFT. Output under $OUT.
#   BIN=DIR bash bench/agent_loop/run_soak_device.sh [TURNS]
# DIR holds servedeck, servedeck-worker, lib/ (libtomlplusplus.so.3 and the other libraries the
# device lacks) and tok/ (Qwen3's tokenizer.json and tokenizer_config.json), built on the dev
# machine (Release, sm_90a).
set -o pipefail
d=$(cd "${BIN:?BIN: the carried binaries}" && pwd)
OUT=${OUT:-/tmp}
TURNS=${1:-24}
export LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$d:$PATH
cp "$d"/tok/tokenizer*.json bench/moe_offload/qwen3-30b-a3b/
python3 - <<'PY'
import os
s = open('models.toml').read()
i = s.index('[models.qwen3-30b-synthetic]'); j = s.index('# ----', i)
entry = s[i:j].replace('"bench/moe_offload', '"' + os.getcwd() + '/bench/moe_offload')
open('/tmp/soak.toml', 'w').write('[server]\nlisten = "127.0.0.1:0"\nstate_dir = "/tmp/sd/state"\n\n' + entry)
PY
servedeck --config /tmp/soak.toml serve --port 0 > /tmp/sd-daemon.log 2>&1 &
for i in $(seq 1 50); do [ -s /tmp/sd/state/daemon.json ] && break; sleep 0.2; done
servedeck --config /tmp/soak.toml switch qwen3-30b-synthetic || exit 1
timeout 300 servedeck --config /tmp/soak.toml soak --model qwen3-30b-synthetic --turns "$TURNS" --max-tokens 16 --time-limit 290 2>&1 |
  tee "$OUT/soak.log"
servedeck --config /tmp/soak.toml stop
kill %1
wait
