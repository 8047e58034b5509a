#!/usr/bin/env bash
# End-to-end: real coding agents, each unmodified (npm packages pinned in package.json), against
# the daemon, which launches the real native worker on the tiny chat model (CPU; a planted reply
# that ends its turn). Nothing beyond loopback: each agent's telemetry, auto-update and
# background installs are switched off with its own documented setting.
#   - Anthropic's TypeScript SDK on /v1/messages (create, stream, countTokens);
#   - Claude Code (`claude -p`) on /v1/messages: exits 0 with the planted reply; the engine never
#     sees its per-request x-anthropic-billing-header block (capture files); then a tool-using
#     turn on the tiny tool model (make-tiny-model --variant tool: a Bash call, then, after the
#     tool result, the reply): Claude Code runs the tool (the file appears) and finishes;
#   - opencode (`opencode run`), Qwen Code (`qwen -p`) and pi (`pi -p`) on /v1/chat/completions,
#     configured with their base URL and model only — no output-token settings: opencode and pi
#     send budgets larger than the tiny model's context, which fit_output_budget lowers;
#   - Codex's Responses shapes engines reject (web_search / custom / namespace tools, a
#     max_output_tokens 1 probe) are answered;
#   - a client pointed at a route the gateway lacks shows up in /metrics.
# Each step prints its wall time. Usage: e2e_agents.sh BUILD_DIR SOURCE_DIR (ctest passes both)
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
servedeck="$build/gateway/servedeck"
worker="$build/worker/servedeck-worker"
nm="$src/node_modules"
for f in "$servedeck" "$worker" "$src/models/tiny-chat/config.json" "$src/models/tiny-tool/config.json" "$nm/@anthropic-ai/sdk/package.json" \
         "$nm/.bin/claude" "$nm/.bin/opencode" "$nm/.bin/qwen" "$nm/.bin/pi"; do
  [ -e "$f" ] || { echo "FAIL: missing $f (scripts/dev.sh test builds it; npm ci installs the agents)"; exit 1; }
done

. "$src/tests/e2e/e2e_lib.sh"
e2e_tmp servedeck-agents
t_start=$(date +%s)
step() { echo "--- $1 ($(( $(date +%s) - t_start )) s since start)"; }
took() { echo "time: $1 took $(( $(date +%s) - $2 )) s"; }

reply="Hello from servedeck's tiny model."
# ctx 16384 (native_entry's default), as the shipped tiny-chat: smaller than the budgets the agents send.
{
  cat <<TOML
[server]
listen = "127.0.0.1:0"
state_dir = "$tmp/state"

TOML
  native_entry tiny-chat "$src/models/tiny-chat" 64
  cat <<TOML

[models.tiny-chat.policies]
capture = true                 # also needs SERVEDECK_CAPTURE=1 (set below): the engine bodies are checked

# The same with a planted tool call: \`touch ran.txt\` through Bash, then the reply after the result.
TOML
  native_entry tiny-tool "$src/models/tiny-tool" 64
} > "$tmp/models.toml"
e2e_serve SERVEDECK_CAPTURE=1
root="http://127.0.0.1:$port"
"$servedeck" --config "$tmp/models.toml" switch tiny-chat > /dev/null || fail "switch tiny-chat"
echo "daemon up on port $port, tiny-chat ready"
repairs() {  # fit_output_budget repairs on tiny-chat so far
  curl -s "$root/metrics" | awk '/^servedeck_policy_repairs_total\{policy="fit_output_budget",model="tiny-chat"\}/ {n = $2} END {print n + 0}'
}
expect_reply() {  # NAME RC FILE
  [ "$2" -eq 0 ] || { tail -20 "$3"; fail "$1 exited $2"; }
  grep -qF "$reply" "$3" || { tail -20 "$3"; fail "$1 did not print the model's reply"; }
  echo "ok: $1 exited 0 with the planted reply"
}

step "Anthropic SDK"
t=$(date +%s)
NODE_PATH="$nm" node "$src/tests/e2e/anthropic_sdk_e2e.mjs" "$root" tiny-chat "$reply" || fail "Anthropic SDK checks"
took "Anthropic SDK" "$t"

step "Claude Code"
# note: --tools Bash and --system-prompt keep Claude Code's prompt at ~900 tokens; with its
# default 24 tools and system prompt it is ~18,700 tokens, which fits neither the tiny model's
# 16,384-token context nor a CI run's time on the CPU engine (5 min on 2 cores, Debug build).
mkdir -p "$tmp/claude-home" "$tmp/work"
t=$(date +%s)
rc=0
( cd "$tmp/work" && HOME="$tmp/claude-home" ANTHROPIC_BASE_URL="$root" ANTHROPIC_AUTH_TOKEN=unused \
    ANTHROPIC_MODEL=tiny-chat ANTHROPIC_SMALL_FAST_MODEL=tiny-chat ANTHROPIC_DEFAULT_HAIKU_MODEL=tiny-chat \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
    timeout 300 "$nm/.bin/claude" -p --tools Bash --system-prompt "You are a coding agent." "Say hi." \
    > "$tmp/claude.out" 2>&1 ) || rc=$?
took "Claude Code" "$t"
expect_reply "claude -p" "$rc" "$tmp/claude.out"
# Claude Code sent its billing header (every request does); the engine never got it.
cap="$tmp/state/capture"
grep -rlq '"max_tokens":' "$cap" || fail "no capture files of engine requests"
if grep -rlq "x-anthropic-billing-header" "$cap"; then fail "the billing header reached the engine"; fi
n=$(sqlite3 "$tmp/state/state.db" "SELECT COUNT(*) FROM requests WHERE route = '/v1/messages' AND status = 200;")
[ "$n" -ge 3 ] || fail "expected the SDK's and Claude Code's /v1/messages turns in the request log, found $n"
echo "ok: $n /v1/messages turns logged; no x-anthropic-billing-header in the engine requests"

step "Claude Code, a tool-using turn"
"$servedeck" --config "$tmp/models.toml" switch tiny-tool > /dev/null || fail "switch tiny-tool"
mkdir -p "$tmp/tool-work"
t=$(date +%s)
rc=0
# --allowedTools Bash: -p mode has nobody to ask for the permission to run it.
( cd "$tmp/tool-work" && HOME="$tmp/claude-home" ANTHROPIC_BASE_URL="$root" ANTHROPIC_AUTH_TOKEN=unused \
    ANTHROPIC_MODEL=tiny-tool ANTHROPIC_SMALL_FAST_MODEL=tiny-tool ANTHROPIC_DEFAULT_HAIKU_MODEL=tiny-tool \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
    timeout 300 "$nm/.bin/claude" -p --tools Bash --allowedTools Bash --system-prompt "You are a coding agent." \
    "Create the file ran.txt." > "$tmp/claude-tool.out" 2>&1 ) || rc=$?
took "Claude Code tool turn" "$t"
expect_reply "claude -p (tool turn)" "$rc" "$tmp/claude-tool.out"
[ -f "$tmp/tool-work/ran.txt" ] || { cat "$tmp/claude-tool.out"; fail "Claude Code did not run the model's Bash call (no ran.txt)"; }
n=$(sqlite3 "$tmp/state/state.db" "SELECT COUNT(*) FROM requests WHERE route = '/v1/messages' AND model = 'tiny-tool' AND status = 200;")
[ "$n" -ge 2 ] || fail "expected the tool call turn and the answer turn in the request log, found $n"
echo "ok: Claude Code ran the tool call (ran.txt exists) and finished on the answer ($n turns)"
"$servedeck" --config "$tmp/models.toml" switch tiny-chat > /dev/null || fail "switch back to tiny-chat"

step "opencode"
before=$(repairs)
mkdir -p "$tmp/opencode-home" "$tmp/opencode-work"
cat > "$tmp/opencode-work/opencode.json" <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "model": "servedeck/tiny-chat",
  "provider": {
    "servedeck": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "servedeck",
      "options": { "baseURL": "$root/v1" },
      "models": { "tiny-chat": { "name": "tiny-chat" } }
    }
  }
}
JSON
t=$(date +%s)
rc=0
# npm_config_offline: opencode installs @opencode-ai/plugin from npm at every start otherwise.
( cd "$tmp/opencode-work" && HOME="$tmp/opencode-home" OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 \
    npm_config_offline=true timeout 400 "$nm/.bin/opencode" run "Say hi." > "$tmp/opencode.out" 2>&1 ) || rc=$?
took "opencode" "$t"
expect_reply "opencode run" "$rc" "$tmp/opencode.out"
after=$(repairs)
[ "$after" -gt "$before" ] || fail "opencode's max_tokens 32000 was not fitted (fit_output_budget $before -> $after)"
echo "ok: fit_output_budget lowered opencode's budget (counter $before -> $after)"

step "Qwen Code"
mkdir -p "$tmp/qwen-home/.qwen" "$tmp/qwen-work"
cat > "$tmp/qwen-home/.qwen/settings.json" <<JSON
{"privacy": {"usageStatisticsEnabled": false}, "general": {"enableAutoUpdate": false},
 "telemetry": {"enabled": false}, "memory": {"enableManagedAutoMemory": false}}
JSON
t=$(date +%s)
rc=0
# note: --core-tools and --system-prompt keep the prompt at ~4,400 tokens (the defaults are
# ~14,600, 143 s of prefill on 2 cores in a Debug build, several times that under ASan); the
# memory-extraction subagent (a second ~6,900-token request after every turn) is off in settings.
( cd "$tmp/qwen-work" && HOME="$tmp/qwen-home" OPENAI_BASE_URL="$root/v1" OPENAI_API_KEY=unused OPENAI_MODEL=tiny-chat \
    timeout 300 "$nm/.bin/qwen" -p --core-tools run_shell_command --system-prompt "You are a coding agent." "Say hi." \
    > "$tmp/qwen.out" 2>&1 ) || rc=$?
took "Qwen Code" "$t"
expect_reply "qwen -p" "$rc" "$tmp/qwen.out"

step "pi"
before=$(repairs)
mkdir -p "$tmp/pi-home/.pi/agent" "$tmp/pi-work"
cat > "$tmp/pi-home/.pi/agent/models.json" <<JSON
{"providers": {"servedeck": {"baseUrl": "$root/v1", "api": "openai-completions", "apiKey": "unused",
                             "models": [{"id": "tiny-chat"}]}}}
JSON
t=$(date +%s)
rc=0
( cd "$tmp/pi-work" && HOME="$tmp/pi-home" timeout 300 "$nm/.bin/pi" -p --provider servedeck --model tiny-chat "Say hi." \
    > "$tmp/pi.out" 2>&1 ) || rc=$?
took "pi" "$t"
expect_reply "pi -p" "$rc" "$tmp/pi.out"
after=$(repairs)
[ "$after" -gt "$before" ] || fail "pi's max_completion_tokens 16384 was not fitted"
echo "ok: fit_output_budget lowered pi's max_completion_tokens (counter $before -> $after)"

step "Codex's Responses shapes"
node - "$root/v1" <<'JS' || fail "Codex request shapes"
const [base] = process.argv.slice(2);
const post = async (body) => {
  const r = await fetch(base + "/responses", {method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(body)});
  return [r.status, await r.json()];
};
// Tools engines cannot run (Codex sends them to every provider): dropped with a note, the turn answered.
const tools = [{type: "web_search"}, {type: "custom", name: "apply_patch", description: "patch", format: {type: "grammar"}},
               {type: "namespace", name: "mcp_fs", tools: [{type: "function", name: "read", parameters: {type: "object", properties: {}}}]},
               {type: "function", name: "shell", parameters: {type: "object", properties: {cmd: {type: "string"}}}}];
let [s, j] = await post({model: "tiny-chat", input: "Say hi.", tools});
if (s !== 200 || j.status !== "completed") { console.error("FAIL: tools of other types:", s, JSON.stringify(j).slice(0, 300)); process.exit(1); }
// Codex's connectivity probe: max_output_tokens 1.
[s, j] = await post({model: "tiny-chat", input: "hi", max_output_tokens: 1});
if (s !== 200 || j.status !== "incomplete" || j.incomplete_details?.reason !== "max_output_tokens") {
  console.error("FAIL: max_output_tokens 1 probe:", s, JSON.stringify(j).slice(0, 300)); process.exit(1);
}
console.log("ok: web_search / custom / namespace tools and a max_output_tokens 1 probe answered");
JS
grep -q "dropped tool of type 'web_search'" "$tmp/daemon.log" || fail "the dropped web_search tool was not noted in the daemon log"

step "unserved routes"
curl -s -o /dev/null "$root/api/tags"
curl -s "$root/metrics" | grep -q 'servedeck_unserved_requests_total{path="/api/tags"} 1' || fail "/api/tags not counted in /metrics"
echo "ok: a request to /api/tags is counted by path in /metrics"
echo "e2e agents: all checks passed in $(( $(date +%s) - t_start )) s"
