#!/bin/bash
# Runs on the GPU machine (device tool), from the repository root: the GPU-labelled tests, then
# the benchmark, then the transformers reference; everything is tee'd under $OUT. Binaries are built on the dev machine
# (Release, build/cuda-rel) and carried in $BIN.
#   bash bench/moe_offload/run_device.sh [bench args...]
set -o pipefail
BIN=${BIN:-.dev/cudabin2}
OUT=${OUT:-/tmp}
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${cublas_dir}:${LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv 2>&1 | tee "$OUT/gpu.txt"
for t in fused kernels backend flash; do
  timeout 180 "$BIN/test_worker_cuda_$t" 2>&1 | tee "$OUT/test_$t.log"
  echo "test_worker_cuda_$t rc=$?"
done
timeout 420 "$BIN/bench_moe_offload" "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench rc=$?"
# The reference rows: the same shape in transformers, resident (decode and prefill).
timeout 240 python3 bench/moe_offload/transformers_decode.py --new 32 --prefill 512,4096,16384 2>&1 | tee "$OUT/transformers.txt"
echo "transformers rc=$?"
