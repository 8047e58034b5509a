// restore_reasoning's ReasoningStore (bounded, expiring, thread-safe, keys) end to end through
// the pipelines, and capture (env gate, permissions, retention).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "policies/capture.hpp"
#include "policies/restore_reasoning.hpp"
#include "policy_test_support.hpp"

using namespace servedeck;
using namespace servedeck::policies;
using namespace servedeck::policies::testing;

namespace {

json assistant_call(const std::string& id, const std::string& args) {
  return {{"role", "assistant"}, {"content", nullptr},
          {"tool_calls", json::array({{{"id", id}, {"type", "function"}, {"function", {{"name", "list_dir"}, {"arguments", args}}}}})}};
}

}  // namespace

TEST_CASE("ReasoningStore keys: tool-call ids, else a hash of normalised content") {
  auto keys = ReasoningStore::keys_of(assistant_call("call_1", "{\"path\": \"/a\"}"));
  REQUIRE(keys.size() == 2);
  CHECK(keys[0] == "id:call_1");
  CHECK(keys[1].rfind("h:", 0) == 0);
  // whitespace differences in content or argument formatting do not change the hash key
  json a = {{"role", "assistant"}, {"content", "Hello   there\n"}};
  json b = {{"role", "assistant"}, {"content", " Hello there"}};
  CHECK(ReasoningStore::keys_of(a) == ReasoningStore::keys_of(b));
  CHECK(ReasoningStore::keys_of(assistant_call("", "{\"path\":\"/a\"}")) ==
        ReasoningStore::keys_of(assistant_call("", "{ \"path\" : \"/a\" }")));
  // an empty turn has no key (every empty turn would collide)
  CHECK(ReasoningStore::keys_of(json{{"role", "assistant"}, {"content", ""}}).empty());
}

TEST_CASE("ReasoningStore keys of arguments nested 100,000 deep: keyed as text, no recursion") {
  const std::string nested = std::string(100000, '[') + std::string(100000, ']');
  auto keys = ReasoningStore::keys_of(assistant_call("call_n", nested));
  REQUIRE(keys.size() == 2);
  CHECK(keys[0] == "id:call_n");
  CHECK(keys[1] != ReasoningStore::keys_of(assistant_call("call_n", "[[]]"))[1]);
}

TEST_CASE("ReasoningStore expires entries and stays bounded") {
  auto t = ReasoningStore::Clock::now();
  ReasoningStore::Options o;
  o.max_entries = 4;
  o.ttl = std::chrono::seconds(60);
  o.now = [&t] { return t; };
  ReasoningStore store(o);
  store.remember(json{{"content", "a"}}, "ra");
  CHECK(store.recall(json{{"content", "a"}}) == std::optional<std::string>("ra"));
  t += std::chrono::seconds(61);
  CHECK_FALSE(store.recall(json{{"content", "a"}}).has_value());
  for (int i = 0; i < 10; ++i) store.remember(json{{"content", "m" + std::to_string(i)}}, "r" + std::to_string(i));
  CHECK(store.size() <= 4);
  CHECK_FALSE(store.recall(json{{"content", "m0"}}).has_value());  // oldest evicted
  CHECK(store.recall(json{{"content", "m9"}}) == std::optional<std::string>("r9"));
}

TEST_CASE("ReasoningStore is safe under concurrent use") {
  ReasoningStore::Options o;
  o.max_entries = 256;
  ReasoningStore store(o);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < 500; ++i) {
        json m = {{"content", "t" + std::to_string(t) + "-" + std::to_string(i)}};
        store.remember(m, "r");
        (void)store.recall(m);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(store.size() <= 256);
}

TEST_CASE("restore_reasoning: a streamed tool-call turn's reasoning goes back on the echoed turn") {
  auto model = glm_entry();
  model.policies.restore_reasoning = true;
  ReasoningStore store;
  Counter counter;
  json request = fixture("list_dir_request.json");
  ResponseContext rctx{&model, "glm53-flash-high", request, counter.fn(), &store};
  auto out = run_stream(rctx, sse_chunks("list_dir_leak.sse"));
  auto a = assemble(out);
  REQUIRE(a.calls.count(0) == 1);

  // the client echoes the turn without reasoning (as Copilot and Codex do)
  json next = request;
  next["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                              {"tool_calls", json::array({{{"id", a.calls[0]["id"]}, {"type", "function"},
                                  {"function", {{"name", "list_dir"}, {"arguments", a.calls[0]["arguments"]}}}}})}});
  next["messages"].push_back({{"role", "tool"}, {"tool_call_id", a.calls[0]["id"]}, {"content", "src"}});
  RequestContext ctx;
  ctx.model = &model;
  ctx.requested_id = "glm53-flash-high";
  ctx.count_repair = counter.fn();
  ctx.reasoning_store = &store;
  ctx.prompt_tokens = 1000;
  RequestPipeline p(ctx);
  REQUIRE_FALSE(p.apply(next).has_value());
  const json& turn = next["messages"][2];
  CHECK(turn["reasoning_content"] == "The user wants the project directory listed. I'll call list_dir on the project root.");
  CHECK(turn["content"].is_null());  // never into content
  CHECK(counter["restore_reasoning"] == 1);
}

TEST_CASE("restore_reasoning: a non-streamed plain answer is found by its content hash") {
  auto model = glm_entry();
  model.policies.restore_reasoning = true;
  ReasoningStore store;
  Counter counter;
  json body = {{"choices", json::array({{{"index", 0}, {"finish_reason", "stop"},
      {"message", {{"role", "assistant"}, {"content", "Done: 3 files changed."}, {"reasoning_content", "I edited a, b and c."}}}}})}};
  ResponseContext rctx{&model, "glm53-flash", json::object(), counter.fn(), &store};
  ResponsePipeline rp(rctx);
  REQUIRE_FALSE(rp.apply_body(body).has_value());

  json next = {{"messages", json::array({{{"role", "user"}, {"content", "go"}},
                                         {{"role", "assistant"}, {"content", "Done:  3 files changed.\n"}},
                                         {{"role", "user"}, {"content", "thanks"}}})}};
  RequestContext ctx;
  ctx.model = &model;
  ctx.count_repair = counter.fn();
  ctx.reasoning_store = &store;
  RequestPipeline p(ctx);
  REQUIRE_FALSE(p.apply(next).has_value());
  CHECK(next["messages"][1]["reasoning_content"] == "I edited a, b and c.");
  CHECK(next["messages"][1]["content"] == "Done:  3 files changed.\n");

  // off (as shipped for GLM): nothing restored
  model.policies.restore_reasoning = false;
  json again = {{"messages", json::array({{{"role", "assistant"}, {"content", "Done: 3 files changed."}}})}};
  RequestPipeline p2(ctx);
  REQUIRE_FALSE(p2.apply(again).has_value());
  CHECK_FALSE(again["messages"][0].contains("reasoning_content"));
}

TEST_CASE("capture writes only with policy AND SERVEDECK_CAPTURE=1; 0700 dir, 0600 files, retention") {
  char tmpl[] = "/tmp/servedeck-capture-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string root = tmpl;
  CaptureOptions o;
  o.dir = root + "/capture";
  o.max_files = 3;
  auto model = glm_entry();
  json req = {{"messages", json::array({{{"role", "user"}, {"content", "secret"}}})}};
  json resp = {{"choices", json::array()}};

  ::unsetenv("SERVEDECK_CAPTURE");
  model.policies.capture = true;
  auto r = capture_exchange(model, req, resp, o);
  CHECK_FALSE(r.path.has_value());
  CHECK_FALSE(std::filesystem::exists(o.dir));

  ::setenv("SERVEDECK_CAPTURE", "1", 1);
  model.policies.capture = false;
  CHECK_FALSE(capture_exchange(model, req, resp, o).path.has_value());

  model.policies.capture = true;
  for (int i = 0; i < 5; ++i) {
    r = capture_exchange(model, req, resp, o);
    REQUIRE(r.path.has_value());
    CHECK_FALSE(r.error.has_value());
  }
  struct stat st {};
  REQUIRE(::stat(o.dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat(r.path->c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.dir)) {
    (void)e;
    ++n;
  }
  CHECK(n == 3);  // retention by count
  json doc = json::parse(std::ifstream(*r.path));
  CHECK(doc["request"]["messages"][0]["content"] == "secret");
  CHECK(doc["model"] == "glm53");

  // retention by age: a zero max_age removes everything older than now, including older files
  o.max_age = std::chrono::seconds(0);
  std::filesystem::last_write_time(*r.path, std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
  r = capture_exchange(model, req, resp, o);
  n = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.dir)) {
    (void)e;
    ++n;
  }
  CHECK(n <= 1);
  ::unsetenv("SERVEDECK_CAPTURE");
  std::filesystem::remove_all(root);
}

TEST_CASE("capture retention deletes only capture's own files, and runs without a write (daemon start)") {
  char tmpl[] = "/tmp/servedeck-capture-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string root = tmpl;
  namespace fs = std::filesystem;
  CaptureOptions o;
  o.dir = root + "/capture";
  o.max_files = 2;
  o.max_age = std::chrono::hours(24);
  fs::create_directories(o.dir);
  auto old = fs::file_time_type::clock::now() - std::chrono::hours(48);
  auto put = [&](const std::string& name, bool aged) {
    std::ofstream(o.dir + "/" + name) << "{}";
    if (aged) fs::last_write_time(o.dir + "/" + name, old);
  };
  // Files an earlier daemon's capture wrote: two aged, three fresh.
  put("1700000000000-41-0-glm53.json", true);
  put("1700000000001-41-1-glm53.json", true);
  put("1800000000000-42-0-glm53.json", false);
  put("1800000000001-42-1-tiny-chat.json", false);
  put("1800000000002-42-2-tiny.json", false);
  // Not capture's: an operator's notes, a look-alike without the numeric fields, and a link
  // named like a capture that points outside the directory.
  put("notes.json", true);
  put("glm53-export.json", true);
  std::ofstream(root + "/precious.json") << "keep me";
  fs::create_symlink(root + "/precious.json", o.dir + "/1600000000000-1-0-link.json");
  fs::last_write_time(root + "/precious.json", old);

  CHECK(is_capture_file_name("1800000000000-42-0-glm53.json"));
  CHECK_FALSE(is_capture_file_name("notes.json"));
  CHECK_FALSE(is_capture_file_name("glm53-export.json"));
  CHECK_FALSE(is_capture_file_name("1-2-3-.json"));
  CHECK_FALSE(is_capture_file_name("1-2-3-a b.json"));

  // No capture_exchange call and SERVEDECK_CAPTURE unset: retention still applies (at start).
  ::unsetenv("SERVEDECK_CAPTURE");
  CHECK(apply_capture_retention(o) == 3);  // the two aged ones, then the oldest fresh one (max_files 2)
  CHECK_FALSE(fs::exists(o.dir + "/1700000000000-41-0-glm53.json"));
  CHECK_FALSE(fs::exists(o.dir + "/1800000000000-42-0-glm53.json"));
  CHECK(fs::exists(o.dir + "/1800000000001-42-1-tiny-chat.json"));
  CHECK(fs::exists(o.dir + "/1800000000002-42-2-tiny.json"));
  CHECK(fs::exists(o.dir + "/notes.json"));
  CHECK(fs::exists(o.dir + "/glm53-export.json"));
  CHECK(fs::is_symlink(o.dir + "/1600000000000-1-0-link.json"));
  CHECK(fs::exists(root + "/precious.json"));
  CHECK(apply_capture_retention(o) == 0);
  CaptureOptions missing = o;
  missing.dir = root + "/nope";
  CHECK(apply_capture_retention(missing) == 0);
  fs::remove_all(root);
}
