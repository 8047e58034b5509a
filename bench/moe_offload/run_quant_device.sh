#!/bin/bash
# Runs on the GPU machine (device tool) from the repository root: the quantised-expert GPU tests,
# the decode benchmark per expert format, transformers' reading of a written FP8 checkpoint, and
# a served FP8 model (streamed chat, a timed 256-token request). Binaries built on the dev
# machine (Release, sm_90a) carried as $BIN/bins.tar.xz (test_worker_cuda_quant,
# bench_moe_offload, servedeck-worker, servedeck-logits) with Qwen3's tokenizer files and
# scripts/validate_fp8_transformers.py beside them. Logs under $OUT.
#   bash run_quant_device.sh [LAYERS] [DECODE]     (bench: Qwen3-30B-A3B shape at LAYERS layers)
set -o pipefail
BIN=${BIN:-.dev/quant}
OUT=${OUT:-/tmp}
LAYERS=${1:-4}
DECODE=${2:-64}
B=/tmp/sdq
rm -rf $B && mkdir -p $B && tar -xJf "$BIN/bins.tar.xz" -C $B || exit 1
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${cublas_dir}:${LD_LIBRARY_PATH}
stamp() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader
stamp "test_worker_cuda_quant"
timeout 40 $B/test_worker_cuda_quant > $OUT/quant_test.log 2>&1; echo "rc=$?"
grep -E "test cases|ERROR|MESSAGE|CHECK" $OUT/quant_test.log | head -30
for f in bf16 fp8 nvfp4; do
  stamp "bench_moe_offload --experts $f --layers $LAYERS"
  timeout 30 $B/bench_moe_offload --experts $f --layers $LAYERS --decode $DECODE --prompt 64 --prefill-max 512 \
    --breakdown 0 --long-prompt 0 > $OUT/bench_$f.log 2>&1; echo "rc=$?"
  grep -hE "^(measured ceilings|model:|load |hot |0%|25%|50%|all|prefill|mode|resident|offloaded)" $OUT/bench_$f.log | head -16
done
stamp "make-tiny-model fp8 aligned; servedeck-logits; transformers"
$B/servedeck-worker make-tiny-model --out /tmp/fp8a --tokenizer-dir $B/tok --quantize fp8 --shape aligned || exit 1
python3 -c 'import json,random; r=random.Random(3); json.dump([[r.randrange(151643) for _ in range(n)] for n in (1,24,64)], open("/tmp/prompts.json","w"))'
timeout 30 $B/servedeck-logits /tmp/fp8a /tmp/prompts.json /tmp/ours.json --threads 16 2>&1 | tail -2
PYTHONUNBUFFERED=1 timeout 45 python3 $B/validate_fp8_transformers.py /tmp/fp8a /tmp/ours.json /tmp/prompts.json 2>$OUT/hf_err.log | tee $OUT/hf.json; echo "rc=$?"
tail -5 $OUT/hf_err.log
stamp "serve the FP8 model on the CUDA backend"
$B/servedeck-worker serve --model /tmp/fp8a --backend cuda --port 0 --max-model-len 4096 --kv-cache-bytes 268435456 \
  --hot-fraction 0 > /tmp/serve.log 2>&1 &
spid=$!
for i in $(seq 1 100); do grep -q "listening on" /tmp/serve.log && break; sleep 0.1; done
addr=$(sed -nE 's/.*listening on ([^ ]+).*/\1/p' /tmp/serve.log | head -1)
for i in $(seq 1 200); do curl -s -o /dev/null -w '%{http_code}' http://$addr/health | grep -q 200 && break; sleep 0.1; done
curl -sN http://$addr/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello"}]}' | head -c 600 > $OUT/stream.txt
echo "stream: $(grep -c '^data:' $OUT/stream.txt) data lines"; tail -c 200 $OUT/stream.txt; echo
t0=$(date +%s.%N)
curl -s http://$addr/v1/completions -H 'content-type: application/json' \
  -d '{"model":"m","prompt":"hello","max_tokens":256,"ignore_eos":true,"temperature":0}' > $OUT/timed.json
t1=$(date +%s.%N)
python3 -c "import json,sys; j=json.load(open('$OUT/timed.json')); u=j.get('usage',{}); print('timed 256:', u, 'in', round($t1-$t0,3), 's')"
kill $spid; wait $spid 2>/dev/null
tail -3 /tmp/serve.log
stamp done
