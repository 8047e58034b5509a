// The official `openai` npm SDK (v6) reading servedeck's usage through the gateway (G12).
// Usage: node openai_usage_client.mjs BASE_URL REQUEST_JSON_FILE
// Sends the request three ways — create() with stream, the stream() helper, create() without
// stream — and prints one JSON line per way: {"way", "usage", "content"} (usage as the SDK
// handed it over). Exits non-zero, with the error, when the SDK throws.
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, requestFile] = process.argv.slice(2);
if (!baseURL || !requestFile) {
  console.error("usage: node openai_usage_client.mjs BASE_URL REQUEST_JSON_FILE");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });
const request = JSON.parse(fs.readFileSync(requestFile, "utf8"));

try {
  const stream = await client.chat.completions.create({ ...request, stream: true });
  let usage = null, content = "", usageChunks = 0;
  for await (const chunk of stream) {
    if (chunk.usage) { usage = chunk.usage; ++usageChunks; }
    for (const c of chunk.choices) content += c.delta?.content ?? "";
  }
  console.log(JSON.stringify({ way: "create_stream", usage, content, usage_chunks: usageChunks }));

  const helper = client.chat.completions.stream({ ...request, stream: true });
  const final = await helper.finalChatCompletion();
  console.log(JSON.stringify({ way: "stream_helper", usage: final.usage ?? null, content: final.choices[0].message.content }));

  const { stream_options, ...plain } = request;
  const body = await client.chat.completions.create({ ...plain, stream: false });
  console.log(JSON.stringify({ way: "create", usage: body.usage ?? null, content: body.choices[0].message.content }));
} catch (e) {
  console.error("openai SDK threw: " + (e?.stack ?? e));
  process.exit(1);
}
