// Anthropic's official TypeScript SDK (npm @anthropic-ai/sdk, pinned in package.json) against
// servedeck's /v1/messages. Run by gateway_messages_test.cpp, whose fake engine answers, in order:
//   1. a chat completion "Sunny."                        (messages.create, not streamed)
//   2. a stream: reasoning "Let me think." then "Hello."  (messages.stream with thinking)
//   3. a stream: a get_weather tool call {city: Paris}    (messages.stream with tools)
//   4. a chat completion "It is sunny in Paris."          (messages.create with the tool_result)
//   5. /tokenize {"count": 42}                            (messages.countTokens)
// An unknown model must raise the SDK's NotFoundError. Every check that fails exits 1 naming
// what the SDK returned; success prints "sdk: all checks passed".
// Usage: node anthropic_sdk_client.mjs BASE_URL MODEL
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });
const fail = (what, got) => {
  console.error(`FAIL: ${what}: ${JSON.stringify(got)}`);
  process.exit(1);
};
const user = (text) => ({ role: "user", content: text });
const tools = [{ name: "get_weather", description: "weather for a city",
                 input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];

// 1. Not streamed.
const plain = await client.messages.create({ model, max_tokens: 64, system: "Be brief.", messages: [user("weather?")] });
if (plain.type !== "message" || plain.content[0]?.type !== "text" || plain.content[0].text !== "Sunny.") fail("create", plain);
if (plain.stop_reason !== "end_turn" || !(plain.usage.input_tokens > 0) || !(plain.usage.output_tokens > 0)) fail("create usage", plain);
if (!plain._request_id?.startsWith("req_")) fail("request id", plain._request_id);

// 2. Streamed with thinking: thinking_delta events reach the SDK's `thinking` listener.
let thinkingSeen = "", textSeen = "";
const thinking = client.messages.stream({ model, max_tokens: 1024, thinking: { type: "enabled", budget_tokens: 512 },
                                          messages: [user("hi")] });
thinking.on("thinking", (delta) => { thinkingSeen += delta; });
thinking.on("text", (delta) => { textSeen += delta; });
const t = await thinking.finalMessage();
if (thinkingSeen !== "Let me think." || textSeen !== "Hello.") fail("stream deltas", { thinkingSeen, textSeen });
if (t.content.length !== 2 || t.content[0].type !== "thinking" || t.content[0].thinking !== "Let me think." ||
    !t.content[0].signature || t.content[1].type !== "text" || t.content[1].text !== "Hello.") fail("thinking message", t);
if (t.stop_reason !== "end_turn" || t.usage.output_tokens !== 5) fail("thinking stop/usage", t);

// 3. Streamed tool use: the input arrives as input_json_delta and parses into an object.
const toolStream = client.messages.stream({ model, max_tokens: 256, tools, tool_choice: { type: "auto" },
                                            messages: [user("weather in Paris?")] });
const call = await toolStream.finalMessage();
const use = call.content.find((b) => b.type === "tool_use");
if (!use || use.name !== "get_weather" || use.input?.city !== "Paris" || call.stop_reason !== "tool_use") fail("tool use", call);

// 4. The tool result goes back (with the signed thinking of turn 2 as history), not streamed.
const answer = await client.messages.create({
  model, max_tokens: 256, tools,
  messages: [user("hi"), { role: "assistant", content: t.content }, user("weather in Paris?"),
             { role: "assistant", content: call.content },
             { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny, 24 C" }] }],
});
if (answer.content[0]?.text !== "It is sunny in Paris.") fail("tool result answer", answer);

// 5. count_tokens, and an unknown model.
const count = await client.messages.countTokens({ model, messages: [user("hi")] });
if (count.input_tokens !== 42) fail("countTokens", count);
try {
  await client.messages.create({ model: "claude-nonexistent", max_tokens: 8, messages: [user("hi")] });
  fail("unknown model", "no error");
} catch (e) {
  if (!(e instanceof Anthropic.NotFoundError) || e.error?.error?.type !== "not_found_error") fail("unknown model error", String(e));
}
console.log("sdk: all checks passed");
