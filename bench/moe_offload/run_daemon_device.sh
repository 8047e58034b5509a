#!/bin/bash
# Runs on the GPU machine from the repository root (BIN: the carried binaries): the daemon launches the qwen3-30b-synthetic
# entry of models.toml (Qwen3-30B-A3B shape, synthesised weights, experts in pinned host RAM,
# 25% hot) through `servedeck switch`; a streamed chat goes through the gateway; then a timed
# 256-token non-streaming request for decode tok/s through the whole stack.
set -u
d=$(cd "${BIN:-.dev/gpurun2}" && pwd)  # servedeck, servedeck-worker, lib/libtomlplusplus.so.3, tok/tokenizer*.json
export LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64
export PATH=$d:$PATH
chmod +x $d/servedeck $d/servedeck-worker
cp $d/tok/tokenizer*.json bench/moe_offload/qwen3-30b-a3b/
python3 - <<'PY'
s = open('models.toml').read()
i = s.index('[models.qwen3-30b-synthetic]'); j = s.index('# ----', i)
open('gpu-run.toml', 'w').write('[server]\nlisten = "127.0.0.1:0"\nstate_dir = "/tmp/sd/state"\n\n' + s[i:j])
PY
echo "--- gpu-run.toml = [server] + the qwen3-30b-synthetic entry of models.toml, verbatim"
servedeck --config gpu-run.toml lint
servedeck --config gpu-run.toml serve --port 0 > /tmp/sd-daemon.log 2>&1 &
for i in $(seq 1 50); do [ -s /tmp/sd/state/daemon.json ] && break; sleep 0.2; done
port=$(python3 -c 'import json;print(json.load(open("/tmp/sd/state/daemon.json"))["port"])')
t0=$(date +%s.%N)
servedeck --config gpu-run.toml switch qwen3-30b-synthetic
echo "switch took $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
servedeck --config gpu-run.toml status
free -g | head -2
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
echo "--- streamed chat through the gateway on port $port"
curl -sN http://127.0.0.1:$port/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"qwen3-30b-synthetic","stream":true,"max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"hi"}]}' | head -c 4000
echo; echo "--- 256 tokens, not streamed, through the gateway (wall time includes prefill of the prompt)"
for run in 1 2; do
python3 - "$port" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
body = {"model": "qwen3-30b-synthetic", "max_tokens": 256, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper. " * 8}]}
t = time.time()
r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
    data=json.dumps(body).encode(), headers={"content-type": "application/json"}), timeout=300))
dt = time.time() - t
u = r["usage"]
print(f"prompt {u['prompt_tokens']} tokens, completion {u['completion_tokens']} tokens, {dt:.2f} s wall, "
      f"{u['completion_tokens']/dt:.2f} tok/s end to end, finish {r['choices'][0]['finish_reason']}")
PY
done
curl -s http://127.0.0.1:$port/metrics | grep -E "^servedeck_(ttft|decode|requests)" | head -12
echo "--- engine log"; tail -12 /tmp/sd/state/logs/*.log
servedeck --config gpu-run.toml stop
kill %1; sleep 2; tail -5 /tmp/sd-daemon.log
