# The parts every end-to-end script shares, sourced after `build`, `src` and `worker` are set:
#   e2e_tmp PREFIX          a scratch directory ($tmp), removed at exit (kept with E2E_KEEP=1),
#                           and the daemon started by e2e_serve stopped (TERM, then KILL after 10 s);
#   fail MESSAGE            prints it with the daemon's and the engines' log tails, exits 1;
#   native_entry NAME CHECKPOINT MAX_TOKENS [CTX [KV_BYTES_PER_TOKEN [EXTRA_ARGS]]]
#                           a [models.NAME] table for the native worker on CPU (ctx 16384 and
#                           512 bytes a token unless given; EXTRA_ARGS: more worker arguments,
#                           TOML-quoted and comma-separated, e.g. '"--tool-parser", "glm"');
#   e2e_serve [ENV=VALUE...] lints $tmp/models.toml, starts the daemon on port 0 with those
#                           variables, waits for daemon.json and sets $daemon_pid and $port.

e2e_tmp() {
  tmp=$(mktemp -d "/tmp/$1-XXXXXX")
  daemon_pid=""
  trap e2e_cleanup EXIT
}

e2e_cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    for _ in $(seq 1 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2>/dev/null || true
  fi
  if [ "${E2E_KEEP:-0}" != 1 ]; then rm -rf "$tmp"; fi
}

fail() {
  echo "FAIL: $*"
  echo "--- daemon log"; tail -40 "$tmp/daemon.log" || true
  echo "--- engine logs"; tail -20 "$tmp"/state/logs/* 2>/dev/null || true
  exit 1
}

native_entry() {
  local extra=${6:+", $6"}
  cat <<TOML
[models.$1]
engine = "native"
served_name = "$1"
checkpoint = "$2"
program = "$worker"
args = ["serve", "--model", "{model}", "--host", "{host}", "--port", "{port}", "--served-model-name", "{served_name}",
        "--max-model-len", "{ctx}", "--kv-cache-bytes", "{kv_cache_bytes}", "--default-max-tokens", "$3"$extra]
port = 0
ctx = ${4:-16384}
validated_ctx = ${4:-16384}
kv_cache_bytes_per_token = ${5:-512}
requires_gpu = false
start_timeout_s = 120
TOML
}

e2e_serve() {
  "$servedeck" --config "$tmp/models.toml" lint || fail "lint of the test registry"
  env "$@" "$servedeck" --config "$tmp/models.toml" serve --port 0 > "$tmp/daemon.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 300); do [ -s "$tmp/state/daemon.json" ] && break; sleep 0.1; done
  [ -s "$tmp/state/daemon.json" ] || fail "daemon did not write daemon.json"
  port=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).port)' "$tmp/state/daemon.json")
}
