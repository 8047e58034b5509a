#!/usr/bin/env bash
# Compiles the worker's CUDA backend, its tests and its benchmark for the three architectures it
# supports, in one build: sm_90a (H100/H200), sm_89 (RTX 4090) and sm_120 (RTX 5090, RTX PRO 6000
# Blackwell). Compile only (no GPU needed). docs/cuda-backend.md, "Builds and devices".
#   scripts/cuda_archs.sh [build dir, default build/cuda-archs]
# Environment: SERVEDECK_JOBS (parallelism, default nproc), CUDA_ARCHS (default "90a;89;120").
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/cuda-archs}
archs=${CUDA_ARCHS:-90a;89;120}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
start=$(date +%s)
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSERVEDECK_BUILD_DAEMON=OFF -DSERVEDECK_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$archs" "${launcher[@]}" >/dev/null
targets=$(ninja -C "$dir" -t targets all | sed -nE 's/^((test_worker_cuda_[a-z_]+|bench_moe_offload|greedy_digest|servedeck_worker_cuda)): .*/\1/p' | sort -u)
# shellcheck disable=SC2086
ninja -C "$dir" -j "${SERVEDECK_JOBS:-$(nproc)}" $targets
echo "cuda_archs: compiled for $archs in $(( $(date +%s) - start )) s ($dir)"
