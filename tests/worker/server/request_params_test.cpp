// Reading generation fields: defaults from the model's generation_config, OpenAI/vLLM names,
// and errors that name the field, the value read and what was expected.
#include <doctest/doctest.h>

#include "worker/server/request_params.hpp"

using namespace servedeck::worker;
using nlohmann::json;

TEST_CASE("omitted sampling fields take the model's defaults; given ones win") {
  SamplingParams defaults{0.6, 20, 0.95, std::nullopt};
  CommonParams p;
  REQUIRE(!parse_common_params(json::object(), ApiKind::chat, p, defaults));
  CHECK(p.gen.sampling.temperature == 0.6);
  CHECK(p.gen.sampling.top_k == 20);
  CHECK(p.gen.sampling.top_p == 0.95);
  CHECK(!p.max_tokens_given);

  CommonParams q;
  REQUIRE(!parse_common_params(json{{"temperature", 0}, {"top_k", -1}, {"top_p", 1}, {"seed", 5}, {"max_completion_tokens", 7},
                                    {"stop", "END"}, {"logprobs", true}, {"top_logprobs", 3}, {"thinking_token_budget", 100},
                                    {"stream", true}, {"stream_options", {{"include_usage", true}}}},
                               ApiKind::chat, q, defaults));
  CHECK(q.gen.sampling.temperature == 0);
  CHECK(q.gen.sampling.top_k == 0);
  CHECK(q.gen.sampling.top_p == 1);
  CHECK(q.gen.sampling.seed == 5u);
  CHECK(q.gen.max_tokens == 7);
  CHECK(q.gen.stop == std::vector<std::string>{"END"});
  CHECK(q.gen.logprobs == 3);
  CHECK(q.gen.thinking_token_budget == 100u);
  CHECK(q.stream);
  CHECK(q.include_usage);

  CommonParams c;
  REQUIRE(!parse_common_params(json{{"logprobs", 2}, {"prompt_logprobs", 0}}, ApiKind::completions, c));
  CHECK(c.gen.logprobs == 2);
  CHECK(c.gen.prompt_logprobs == 0);
}

TEST_CASE("bad fields are refused naming field, value and expectation") {
  auto err = [](json body, ApiKind kind = ApiKind::chat) {
    CommonParams p;
    return parse_common_params(body, kind, p).value_or("");
  };
  CHECK(err({{"temperature", "hot"}}).find("field 'temperature': expected a number") == 0);
  CHECK(err({{"temperature", "hot"}}).find("got \"hot\"") != std::string::npos);
  CHECK(err({{"max_tokens", 0}}).find("field 'max_tokens'") == 0);
  CHECK(err({{"stop", {1, 2}}}).find("field 'stop'") == 0);
  CHECK(err({{"n", 2}}).find("field 'n'") == 0);
  CHECK(err({{"best_of", 3}}, ApiKind::completions) == "field 'best_of': expected 1 (this engine returns one choice), got 3");
  CHECK(err({{"best_of", 1}, {"n", 1}}, ApiKind::completions).empty());
  CHECK(err({{"top_logprobs", 50}}).find("field 'top_logprobs'") == 0);
  CHECK(err({{"logprobs", true}}, ApiKind::completions).find("field 'logprobs'") == 0);
  CHECK(err({{"stream_options", {{"include_usage", "yes"}}}}).find("field 'stream_options.include_usage': expected true or false") == 0);
  CHECK(err({{"top_p", 0}}).find("field 'top_p'") == 0);
  CHECK(err({{"frequency_penalty", "x"}}).find("field 'frequency_penalty': expected a number in [-2") == 0);
  CHECK(err({{"presence_penalty", json::array({1})}}).find("field 'presence_penalty'") == 0);
  CHECK(err({{"presence_penalty", 3}}).find("field 'presence_penalty'") == 0);
  CHECK(err({{"logit_bias", "x"}}).find("field 'logit_bias': expected an object") == 0);
  CHECK(err({{"user", 5}}).find("field 'user': expected a string, got 5") == 0);
  for (const double tiny : {0.0, 1e-300, -1.0, 0.009})
    CHECK(err({{"repetition_penalty", tiny}}).find("field 'repetition_penalty': expected a number in [0.010000, 100.000000]") == 0);
  CHECK(err({{"repetition_penalty", 0.01}}).empty());
  CHECK(err({{"frequency_penalty", 0.5}, {"presence_penalty", 0}, {"logit_bias", json::object()}, {"user", "u"}}).empty());
}

TEST_CASE("penalties and logit_bias are read into the request's logits changes") {
  CommonParams p;
  REQUIRE(!parse_common_params(json{{"presence_penalty", -0.5}, {"frequency_penalty", 1.5}, {"repetition_penalty", 1.1},
                                    {"logit_bias", {{"42", -100}, {"7", 2.5}, {"0", 100}}}},
                               ApiKind::completions, p));
  const LogitsAdjust& a = p.gen.adjust;
  CHECK(a.presence_penalty == -0.5f);
  CHECK(a.frequency_penalty == 1.5f);
  CHECK(a.repetition_penalty == doctest::Approx(1.1));
  using Bias = std::vector<std::pair<int32_t, float>>;
  CHECK(a.bias == Bias{{0, 100.0f}, {42, -100.0f}, {7, 2.5f}});  // nlohmann's object order: keys sorted as strings
  CHECK(a.active());
  CommonParams none;
  REQUIRE(!parse_common_params(json{{"presence_penalty", nullptr}, {"logit_bias", nullptr}}, ApiKind::chat, none));
  CHECK_FALSE(none.gen.adjust.active());
}

TEST_CASE("response_format: text is accepted; JSON modes are refused by name, not ignored") {
  auto err = [](json body) {
    CommonParams p;
    return parse_common_params(body, ApiKind::chat, p).value_or("");
  };
  CHECK(err({{"response_format", {{"type", "text"}}}}).empty());
  CHECK(err({{"response_format", nullptr}}).empty());
  CHECK(err({{"response_format", {{"type", "json_object"}}}}) ==
        "field 'response_format': type \"json_object\" is not supported by this engine (no constrained decoding); expected "
        "\"text\" or no response_format");
  CHECK(err({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", json::object()}}}}}})
            .find("type \"json_schema\" is not supported") != std::string::npos);
  CHECK(err({{"response_format", {{"type", "yaml"}}}}) ==
        "field 'response_format.type': expected \"text\", \"json_object\" or \"json_schema\", got \"yaml\"");
  CHECK(err({{"response_format", "json"}}) == "field 'response_format': expected an object with a string \"type\", got \"json\"");
  CHECK(err({{"response_format", {{"type", 3}}}}).find("field 'response_format': expected an object") == 0);
}

TEST_CASE("logit_bias keys must be token ids and values within [-100, 100], in a bounded count") {
  auto err = [](json body) {
    CommonParams p;
    return parse_common_params(body, ApiKind::chat, p).value_or("");
  };
  for (const char* key : {"abc", "-1", "1e3", " 5", "", "2147483648", "99999999999", "12a", "007", "00"}) {
    CAPTURE(key);
    CHECK(err({{"logit_bias", {{key, 1}}}}) ==
          "field 'logit_bias': expected keys that are token ids (decimal integers), got " + json(key).dump());
  }
  CHECK(err({{"logit_bias", {{"2147483647", 1}, {"0", 1}, {"10", 1}}}}).empty());  // the largest id; Engine::check knows the vocabulary
  CHECK(err({{"logit_bias", {{"5", 100.5}}}}) == "field 'logit_bias[\"5\"]': expected a number in [-100, 100], got 100.5");
  CHECK(err({{"logit_bias", {{"5", "high"}}}}) == "field 'logit_bias[\"5\"]': expected a number in [-100, 100], got \"high\"");
  CHECK(err({{"logit_bias", {{"5", nullptr}}}}).find("field 'logit_bias[\"5\"]'") == 0);
  json many = json::object();
  for (std::size_t i = 0; i <= k_max_logit_bias; ++i) many[std::to_string(i)] = 1;
  CHECK(err({{"logit_bias", many}}) == "field 'logit_bias': expected at most 4096 token ids, got 4097");
  many.erase("0");
  CHECK(err({{"logit_bias", many}}).empty());
}

TEST_CASE("an integer that would wrap is refused: above LLONG_MAX, or a top_k above INT_MAX") {
  CommonParams p;
  const auto e = parse_common_params(json{{"top_k", 18446744073709551615ULL}}, ApiKind::chat, p);
  REQUIRE(e);
  CHECK(*e == "field 'top_k': expected an integer in [-1, 2147483647], got 18446744073709551615");
  CommonParams k;  // 2^31 would be INT_MIN as the sampler's int
  CHECK(parse_common_params(json{{"top_k", 2147483648LL}}, ApiKind::chat, k));
  CommonParams q;
  CHECK(parse_common_params(json{{"max_tokens", 9223372036854775808ULL}}, ApiKind::completions, q));
}

TEST_CASE("stop_token_ids outside int32 are refused, not truncated to another token") {
  auto err = [](json ids) {
    CommonParams p;
    return parse_common_params(json{{"stop_token_ids", std::move(ids)}}, ApiKind::chat, p).value_or("");
  };
  CHECK(err({4294967296LL}) == "field 'stop_token_ids': expected an array of token ids (integers in [0, 2147483647]), got [4294967296]");
  CHECK(err({-1}).find("field 'stop_token_ids'") == 0);
  CHECK(err({18446744073709551615ULL}).find("field 'stop_token_ids'") == 0);
  CommonParams ok;
  REQUIRE(!parse_common_params(json{{"stop_token_ids", {0, 2147483647}}}, ApiKind::chat, ok));
  CHECK(ok.gen.stop_token_ids == std::vector<int32_t>{0, 2147483647});
}

TEST_CASE("stop strings and stop_token_ids are bounded in count and length, each generated token being matched against them") {
  auto err = [](json body) {
    CommonParams p;
    return parse_common_params(body, ApiKind::chat, p).value_or("");
  };
  CHECK(err({{"stop", json(std::vector<std::string>(k_max_stop_strings + 1, "x"))}}) ==
        "field 'stop': expected at most 64 strings, got 65");
  CHECK(err({{"stop", std::string(k_max_stop_bytes + 1, 'x')}}) ==
        "field 'stop': expected strings of at most 4096 bytes, got 4097 bytes in stop[0]");
  CHECK(err({{"stop", {"a", std::string(k_max_stop_bytes + 1, 'x')}}}).find("in stop[1]") != std::string::npos);
  CHECK(err({{"stop_token_ids", json(std::vector<int>(k_max_stop_token_ids + 1, 7))}}) ==
        "field 'stop_token_ids': expected at most 1024 ids, got 1025");
  CommonParams ok;
  REQUIRE(!parse_common_params(json{{"stop", json(std::vector<std::string>(k_max_stop_strings, std::string(k_max_stop_bytes, 'x')))},
                                    {"stop_token_ids", json(std::vector<int>(k_max_stop_token_ids, 7))}},
                               ApiKind::chat, ok));
  CHECK(ok.gen.stop.size() == k_max_stop_strings);
  CHECK(ok.gen.stop_token_ids.size() == k_max_stop_token_ids);
}

TEST_CASE("chat reads max_tokens and max_completion_tokens both: either one wrong is a 400, max_completion_tokens wins") {
  CommonParams p;
  CHECK(parse_common_params(json{{"max_tokens", 5}, {"max_completion_tokens", -3}}, ApiKind::chat, p).value_or("").find(
            "field 'max_completion_tokens'") == 0);
  CHECK(parse_common_params(json{{"max_tokens", "5"}, {"max_completion_tokens", 3}}, ApiKind::chat, p).value_or("").find(
            "field 'max_tokens'") == 0);
  CommonParams both;
  REQUIRE(!parse_common_params(json{{"max_tokens", 5}, {"max_completion_tokens", 3}}, ApiKind::chat, both));
  CHECK(both.gen.max_tokens == 3);
  CommonParams only;
  REQUIRE(!parse_common_params(json{{"max_tokens", 5}}, ApiKind::chat, only));
  CHECK(only.gen.max_tokens == 5);
}

TEST_CASE("prompt_logprobs with stream is refused: a streamed answer has no place for them") {
  CommonParams p;
  CHECK(parse_common_params(json{{"stream", true}, {"prompt_logprobs", 1}}, ApiKind::completions, p).value_or("") ==
        "field 'prompt_logprobs': returned only in a non-streamed answer; expected \"stream\": false with it");
  CHECK(parse_common_params(json{{"stream", true}, {"prompt_logprobs", 0}}, ApiKind::chat, p).has_value());
  CommonParams ok;
  CHECK_FALSE(parse_common_params(json{{"stream", false}, {"prompt_logprobs", 1}}, ApiKind::chat, ok).has_value());
  CHECK_FALSE(parse_common_params(json{{"stream", true}, {"prompt_logprobs", nullptr}}, ApiKind::chat, ok).has_value());
}
