// Anthropic's official TypeScript SDK (npm @anthropic-ai/sdk) against the daemon and the real
// worker on the tiny chat model (planted reply, ends its turn): messages.create, messages.stream
// with thinking enabled, and countTokens, which must be the engine's exact count (not flagged).
// Usage: node anthropic_sdk_e2e.mjs BASE_URL MODEL REPLY
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, reply] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120000 });
const fail = (what, got) => {
  console.error(`FAIL: ${what}: ${JSON.stringify(got)}`);
  process.exit(1);
};
const messages = [{ role: "user", content: "Say hello in three words." }];
const plain = await client.messages.create({ model, max_tokens: 64, messages });
if (plain.content.map((b) => b.text ?? "").join("") !== reply || plain.stop_reason !== "end_turn") fail("create", plain);
let text = "";
const stream = client.messages.stream({ model, max_tokens: 64, thinking: { type: "enabled", budget_tokens: 32 }, messages });
stream.on("text", (d) => { text += d; });
const final = await stream.finalMessage();
if (text !== reply || final.stop_reason !== "end_turn" || !(final.usage.input_tokens > 0)) fail("stream", { text, final });
const count = await client.messages.countTokens({ model, messages });
if (!(count.input_tokens > 0) || count.servedeck_estimated) fail("countTokens", count);
console.log(`ok: @anthropic-ai/sdk create, stream and countTokens (${count.input_tokens} tokens) on ${model}`);
