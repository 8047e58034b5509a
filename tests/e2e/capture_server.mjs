// A loopback stand-in for an API server that records what a client sends, for fixtures of real
// agents' requests (tests/gateway/anthropic/fixtures/claude_code_2.1.197_first_request.json came
// from it). Every request is written to DIR/req-N.json ({method, url, headers, body}); Messages
// and chat-completions requests get a short canned answer ("Hello there."), streamed when asked,
// so the client finishes its turn; count_tokens answers 10.
// Usage: node capture_server.mjs DIR PORT, then point the agent's base URL at 127.0.0.1:PORT.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";

const [dir, port] = process.argv.slice(2);
if (!dir || !port) {
  console.error("usage: node capture_server.mjs DIR PORT");
  process.exit(2);
}
fs.mkdirSync(dir, { recursive: true });
let n = 0;
const text = "Hello there.";
const sse = (res, event, data) => res.write((event ? `event: ${event}\n` : "") + `data: ${JSON.stringify(data)}\n\n`);

http.createServer((req, res) => {
  let raw = "";
  req.on("data", (d) => { raw += d; });
  req.on("end", () => {
    let body = raw;
    try { body = JSON.parse(raw); } catch {}
    fs.writeFileSync(path.join(dir, `req-${++n}.json`), JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body }, null, 1));
    const model = body?.model ?? "unknown";
    if (req.url.includes("/messages/count_tokens")) {
      res.writeHead(200, { "content-type": "application/json" });
      return res.end(JSON.stringify({ input_tokens: 10 }));
    }
    if (req.url.includes("/messages")) {
      const usage = { input_tokens: 10, output_tokens: 3 };
      if (!body?.stream) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ id: "msg_1", type: "message", role: "assistant", model, content: [{ type: "text", text }],
                                        stop_reason: "end_turn", stop_sequence: null, usage }));
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      sse(res, "message_start", { type: "message_start", message: { id: "msg_1", type: "message", role: "assistant", content: [], model,
                                                                    stop_reason: null, stop_sequence: null, usage } });
      sse(res, "content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } });
      sse(res, "content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text } });
      sse(res, "content_block_stop", { type: "content_block_stop", index: 0 });
      sse(res, "message_delta", { type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: 3 } });
      sse(res, "message_stop", { type: "message_stop" });
      return res.end();
    }
    if (req.url.includes("/chat/completions")) {
      const base = { id: "c1", created: 1, model };
      const usage = { prompt_tokens: 10, completion_tokens: 3, total_tokens: 13 };
      if (!body?.stream) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ ...base, object: "chat.completion", usage,
                                        choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }] }));
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      const chunk = (choices, extra = {}) => sse(res, "", { ...base, object: "chat.completion.chunk", choices, ...extra });
      chunk([{ index: 0, delta: { role: "assistant", content: text }, finish_reason: null }]);
      chunk([{ index: 0, delta: {}, finish_reason: "stop" }]);
      chunk([], { usage });
      return res.end("data: [DONE]\n\n");
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { message: `no route ${req.method} ${req.url}` } }));
  });
}).listen(Number(port), "127.0.0.1");
