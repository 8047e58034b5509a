#!/usr/bin/env bash
# Fails when the CUDA backend, its benchmark or its tests read an environment variable that is not
# on the list below: the decode and prefill kernels have one path each, chosen by the device and
# the shapes, and nothing selects kernel variants at run time (docs/cuda-backend.md, "Switches").
# Also fails when bench/moe_offload/tried/ (rejected patches) exists again.
# Usage: scripts/check_cuda_switches.sh [repository root]   (run by ctest: worker_cuda_switches)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
# NAME:file — the variables that may be read, each where it is read (docs/cuda-backend.md says why).
allowed=(
  "SERVEDECK_CUDA_SMEM_PER_BLOCK:worker/cuda/device_limits.cu"
  "SERVEDECK_PREFILL_PROFILE:worker/cuda/prefill_profile.cu"
  "OUT:bench/moe_offload/bench_moe_offload.cpp"
)
status=0
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  text=${rest#*:}
  name=$(sed -nE 's/.*getenv *\( *"([A-Za-z0-9_]+)".*/\1/p' <<<"$text")
  if [[ -z $name ]]; then
    echo "$file:$line: getenv without a literal name: $text" >&2
    status=1
    continue
  fi
  ok=0
  for a in "${allowed[@]}"; do [[ "$name:$file" == "$a" ]] && ok=1; done
  if ((!ok)); then
    echo "$file:$line: reads $name, which is not an allowed switch (scripts/check_cuda_switches.sh)" >&2
    status=1
  fi
done < <(grep -rnE '\bgetenv *\(' worker/cuda worker/offload bench/moe_offload tests/worker/cuda \
           --include='*.cu' --include='*.cuh' --include='*.cpp' --include='*.hpp' --include='*.h' || true)
if [[ -e bench/moe_offload/tried ]]; then
  echo "bench/moe_offload/tried exists: rejected patches live in git history, not in the tree" >&2
  status=1
fi
((status == 0)) && echo "CUDA backend: no kernel-variant switches (allowed: ${allowed[*]%%:*})"
exit $status
