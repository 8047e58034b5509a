#!/bin/bash
# Runs on the GPU machine (device tool) from the repository root; everything is tee'd under $OUT.
# Binaries are built on the dev machine (Release, sm_90a) and carried as $BIN/bins.tar.xz holding
# new/ (this tree: the GPU test binaries, bench_moe_offload, greedy_digest) and, for a same-run
# A/B, old/ (the previous main's bench_moe_offload and greedy_digest).
#   bash bench/moe_offload/run_device.sh tests     the GPU tests, as built and with the 99 KB shared-memory limit
#   bash bench/moe_offload/run_device.sh stress    the handshake stress test alone, both configurations
#   bash bench/moe_offload/run_device.sh digest    greedy_digest of old/ and new/ (bit-for-bit comparison)
#   bash bench/moe_offload/run_device.sh ab ORDER  bench_moe_offload --decode 256 --prefill-max 0 of each build in ORDER
#                                                  (e.g. "old new"), one process each
set -o pipefail
BIN=${BIN:-.dev/cuda}
OUT=${OUT:-/tmp}
B=/tmp/sd-bins
rm -rf $B && mkdir -p $B && tar -xJf "$BIN/bins.tar.xz" -C $B || exit 1
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${cublas_dir}:${LD_LIBRARY_PATH}
stamp() { echo "[$(date +%T)] $*"; }
case "${1:-}" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv 2>&1 | tee -a "$OUT/tests.log"
    for smem in "" 101376; do
      for t in launch_checks kernels fused flash backend handshake_stress; do
        [[ -n $smem && ( $t == launch_checks || $t == kernels ) ]] && continue  # no shared-memory-dependent path
        stamp "test_worker_cuda_$t ${smem:+SERVEDECK_CUDA_SMEM_PER_BLOCK=$smem}" | tee -a "$OUT/tests.log"
        SERVEDECK_CUDA_SMEM_PER_BLOCK=$smem timeout 240 "$B/new/test_worker_cuda_$t" > /tmp/sd-test.log 2>&1
        rc=$?
        cat /tmp/sd-test.log >> "$OUT/tests.log"
        grep -E "test cases|ERROR|FAILED|MESSAGE: CUDA vs CPU" /tmp/sd-test.log | head -8
        stamp "rc=$rc" | tee -a "$OUT/tests.log"
      done
    done
    ;;
  stress)
    # The handshake stress test in both shared-memory configurations, then (when present) a
    # binary built with H2's wait removed from the folded router, which must fail.
    for smem in "" 101376; do
      stamp "test_worker_cuda_handshake_stress ${smem:+SERVEDECK_CUDA_SMEM_PER_BLOCK=$smem}" | tee -a "$OUT/tests.log"
      SERVEDECK_CUDA_SMEM_PER_BLOCK=$smem timeout 240 "$B/new/test_worker_cuda_handshake_stress" > /tmp/sd-test.log 2>&1
      rc=$?
      cat /tmp/sd-test.log >> "$OUT/tests.log"
      grep -E "test cases|ERROR|FAILED" /tmp/sd-test.log | head -6
      stamp "rc=$rc" | tee -a "$OUT/tests.log"
    done
    if [[ -x $B/new/test_mutant_no_h2_wait ]]; then
      stamp "mutant: H2's wait removed (must fail)" | tee -a "$OUT/tests.log"
      timeout 240 "$B/new/test_mutant_no_h2_wait" > /tmp/sd-test.log 2>&1
      rc=$?
      cat /tmp/sd-test.log >> "$OUT/tests.log"
      grep -E "test cases|differ" /tmp/sd-test.log | head -6
      stamp "rc=$rc" | tee -a "$OUT/tests.log"
    fi
    ;;
  digest)
    for b in old new; do
      stamp "greedy_digest $b"
      timeout 120 "$B/$b/greedy_digest" 2>&1 | tee -a "$OUT/digest.log"
    done
    ;;
  ab)
    for b in ${2:-old new}; do
      stamp "bench_moe_offload $b --decode 256 --prefill-max 0"
      timeout 200 "$B/$b/bench_moe_offload" --decode 256 --prefill-max 0 > /tmp/sd-ab.log 2>&1
      rc=$?
      { stamp "bench_moe_offload $b --decode 256 --prefill-max 0: rc=$rc"; cat /tmp/sd-ab.log; } >> "$OUT/ab.log"
      grep -hE "^(measured ceilings|hot |0%|25%|50%|all)" /tmp/sd-ab.log
      stamp "rc=$rc"
    done
    ;;
  *) echo "usage: run_device.sh tests|stress|digest|ab ORDER" >&2; exit 2 ;;
esac
