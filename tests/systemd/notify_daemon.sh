#!/usr/bin/env bash
# The daemon under a stand-in for systemd's Type=notify protocol (systemd-run is not available
# in CI containers, where systemd is not PID 1): a datagram socket plays $NOTIFY_SOCKET, the real
# `servedeck serve` runs with it, and the test checks READY=1 arrives once the gateway listens,
# STATUS lines follow the default model's start, and STOPPING=1 comes on SIGTERM, after which
# the daemon exits 0 and leaves no engine behind.
# Usage: notify_daemon.sh BUILD_DIR SOURCE_DIR ; exit 77 (skipped) without python3.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
command -v python3 >/dev/null || { echo "python3 not installed: skipped"; exit 77; }
[ -f "$src/models/tiny/config.json" ] || { echo "FAIL: models/tiny missing (scripts/dev.sh writes it)"; exit 1; }
tmp=$(mktemp -d /tmp/servedeck-notify-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
cat > "$tmp/models.toml" <<TOML
[server]
listen = "127.0.0.1:0"
state_dir = "$tmp/state"
default_model = "tiny"
[models.tiny]
engine = "native"
served_name = "tiny"
checkpoint = "$src/models/tiny"
program = "$build/worker/servedeck-worker"
args = ["serve", "--model", "{model}", "--host", "{host}", "--port", "{port}", "--max-model-len", "{ctx}"]
ctx = 2048
validated_ctx = 2048
kv_cache_bytes_per_token = 512
requires_gpu = false
TOML
python3 - "$tmp/notify.sock" "$tmp/messages" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(0.5)
end = time.time() + 120
with open(sys.argv[2], "a", buffering=1) as out:
    while time.time() < end:
        try:
            out.write(s.recv(4096).decode().replace("\n", " | ") + "\n")
        except socket.timeout:
            pass
PY
for _ in $(seq 1 50); do [ -S "$tmp/notify.sock" ] && break; sleep 0.1; done
NOTIFY_SOCKET="$tmp/notify.sock" "$build/gateway/servedeck" --config "$tmp/models.toml" serve --port 0 > "$tmp/daemon.log" 2>&1 &
daemon=$!
wait_for() {  # wait_for PATTERN SECONDS
  for _ in $(seq 1 $(( $2 * 10 ))); do grep -q "$1" "$tmp/messages" 2>/dev/null && return 0; sleep 0.1; done
  echo "FAIL: no '$1' from the daemon within $2 s; got:"; cat "$tmp/messages" 2>/dev/null; tail -20 "$tmp/daemon.log"; exit 1
}
wait_for "READY=1" 30
grep -q "READY=1 | STATUS=listening on port" "$tmp/messages" || { echo "FAIL: READY without the listening STATUS"; cat "$tmp/messages"; exit 1; }
wait_for "STATUS=tiny ready" 120
engine=$("$build/gateway/servedeck" --config "$tmp/models.toml" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
kill -TERM "$daemon"
rc=0; wait "$daemon" || rc=$?
wait_for "STOPPING=1" 5
[ "$rc" -eq 0 ] || { echo "FAIL: daemon exited $rc on SIGTERM"; tail -20 "$tmp/daemon.log"; exit 1; }
if kill -0 "$engine" 2>/dev/null; then echo "FAIL: engine pid $engine survived the daemon's stop"; exit 1; fi
echo "notify protocol: $(tr '\n' ';' < "$tmp/messages")"
echo "ok: READY after listening, STATUS while starting, STOPPING on SIGTERM, engine $engine stopped with the daemon"
