#!/bin/bash
# Runs on the GPU machine (device tool), from the repository root: Nsight Compute on the first
# graph launch of each fused decode kernel in bench_moe_offload's per-kernel breakdown (speed of
# light, occupancy, launch statistics, warp stall reasons). Clocks left alone (METHOD.md).
#   BIN=.dev/cudabinN OUT=$OUT bash bench/moe_offload/ncu_decode.sh
BIN=${BIN:-.dev/cudabin2}
OUT=${OUT:-/tmp}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH}
for k in norm_gemv_kernel attention_fused_kernel gemv_pdl_kernel router_fused_kernel moe_gate_up_fused_kernel moe_down_fused_kernel; do
  timeout 120 "$NCU" --clock-control none --launch-skip 2 --launch-count 1 -k "regex:$k" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    "$BIN/bench_moe_offload" --breakdown-only 1 >> "$OUT/ncu.txt" 2>&1
  echo "ncu $k rc=$?"
done
