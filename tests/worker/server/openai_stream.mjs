// Streams one chat completion from a worker with the official `openai` npm SDK and prints what
// it received as JSON: {"chunks": N, "content": "...", "finish_reason": "...", "usage": {...}}.
//   node openai_stream.mjs BASE_URL MODEL
import { join } from "node:path";
import { createRequire } from "node:module";

const [baseURL, model] = process.argv.slice(2);
const root = process.env.SERVEDECK_SOURCE_DIR;
const require = createRequire(join(root, "package.json"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL, apiKey: "unused" });
const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Say hello." }],
  max_tokens: 4,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
let chunks = 0, content = "", finish_reason = null, usage = null;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices ?? []) {
    content += c.delta?.content ?? "";
    content += c.delta?.reasoning_content ?? "";
    if (c.finish_reason) finish_reason = c.finish_reason;
  }
}
console.log(JSON.stringify({ chunks, content, finish_reason, usage }));
