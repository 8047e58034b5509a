// End-to-end client checks with the official `openai` npm SDK against a running servedeck
// gateway. Usage: node openai_sdk.mjs BASE_URL MODEL [REPLY]
// REPLY: the exact text the model answers to any chat turn (the tiny "chat" model's planted
// reply); then every answer must be that text and end with finish "stop" / status "completed".
// Exits non-zero with a message on the first failed expectation.
import OpenAI from "openai";

const [baseURL, model, reply] = process.argv.slice(2);
const budget = reply ? 32 : 8;  // room for the whole reply when one is expected
if (!baseURL || !model) {
  console.error("usage: node openai_sdk.mjs BASE_URL MODEL");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: process.env.SERVEDECK_API_KEY || "unused", maxRetries: 0, timeout: 120000 });

function expect(cond, what) {
  if (!cond) {
    console.error("FAIL: " + what);
    process.exit(1);
  }
  console.log("ok: " + what);
}

// 1. Chat completion, streaming: tokens arrive as separate events, the stream ends properly.
{
  const stream = await client.chat.completions.create({
    model, stream: true, max_tokens: budget + 4, temperature: 0,
    messages: [{ role: "user", content: "Say hello in three words." }],
  });
  let events = 0, text = "", finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta?.content) { text += choice.delta.content; events++; }
    if (choice.delta?.reasoning_content) { text += choice.delta.reasoning_content; events++; }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  expect(events >= 2, `chat stream delivered ${events} token events`);
  expect(text.length > 0, `chat stream delivered text (${JSON.stringify(text.slice(0, 40))})`);
  expect(finish === "length" || finish === "stop", `chat stream finished with ${finish}`);
  if (reply) {
    expect(text === reply, `chat stream text is the planted reply (${JSON.stringify(text)})`);
    expect(finish === "stop", "chat stream ends its turn with finish stop");
  }
}

// 2. Chat completion, not streaming.
{
  const r = await client.chat.completions.create({
    model, max_tokens: budget, temperature: 0, messages: [{ role: "user", content: "Hi" }],
  });
  const m = r.choices[0].message;
  expect(r.object === "chat.completion", "non-streaming chat completion object");
  expect((m.content || m.reasoning_content || "").length > 0, "non-streaming chat has content");
  expect(r.usage && r.usage.completion_tokens > 0, `usage counted ${r.usage?.completion_tokens} completion tokens`);
  expect(r.model === model, `response echoes the requested model id (${r.model})`);
  if (reply) expect(m.content === reply && r.choices[0].finish_reason === "stop", "non-streaming chat: the reply, finish stop");
}

// 3. Responses API, not streaming.
{
  const r = await client.responses.create({ model, input: "Write one word.", max_output_tokens: budget });
  expect(r.object === "response", "responses.create returns a response object");
  expect(r.status === "completed" || r.status === "incomplete", `response status ${r.status}`);
  expect(Array.isArray(r.output) && r.output.length > 0, `response has ${r.output.length} output items`);
  if (reply) {
    expect(r.status === "completed", "responses.create: completed");
    expect(r.output_text === reply, `responses.create output_text is the reply (${JSON.stringify(r.output_text)})`);
  }
}

// 4. Responses API, streaming: the stream ends with response.completed/incomplete.
{
  const stream = await client.responses.create({ model, input: "Count to three.", max_output_tokens: budget, stream: true });
  const types = [];
  let deltas = "";
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") deltas += ev.delta;
  }
  expect(types[0] === "response.created", "responses stream starts with response.created");
  const last = types[types.length - 1];
  expect(last === "response.completed" || last === "response.incomplete", `responses stream ends with ${last}`);
  expect(types.some((t) => t === "response.output_text.delta" || t === "response.reasoning_text.delta"),
         "responses stream carried text deltas");
  if (reply) {
    expect(last === "response.completed", "responses stream: completed");
    expect(deltas === reply, `responses stream deltas spell the reply (${JSON.stringify(deltas)})`);
  }
}

// 5. /v1/models lists the model with its context length.
{
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  expect(ids.includes(model), `/v1/models lists ${model}`);
}
console.log("openai SDK end-to-end: all checks passed");
