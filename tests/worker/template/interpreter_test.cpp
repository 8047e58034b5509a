// Unit tests of the chat-template interpreter. Expected strings are what Python jinja2 3.1
// renders in transformers' configuration (trim_blocks, lstrip_blocks, sandbox, its tojson).
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/template/chat_template.hpp"
#include "worker/template/template_source.hpp"

using servedeck::worker::ChatTemplate;
using servedeck::worker::RenderLimits;
using servedeck::worker::TemplateError;
using servedeck::worker::TemplateRaised;
using ojson = nlohmann::ordered_json;

namespace {

std::string render(const std::string& src, const std::string& ctx = "{}") {
  return ChatTemplate::parse(src).render(ojson::parse(ctx));
}

// The TemplateError message of parsing or rendering `src`, or "" if it succeeded.
std::string error_of(const std::string& src, const std::string& ctx = "{}") {
  try {
    render(src, ctx);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("whitespace control: trim_blocks, lstrip_blocks and '-'") {
  CHECK(render("  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}\n") == "  x\n  y");
  CHECK(render("a  {% if true %}b{% endif %}") == "a  b");  // lstrip only at line start
  CHECK(render("{% if true %}\n\nx{% endif %}") == "\nx");  // trim_blocks drops one newline
  CHECK(render("{% if true +%}\nx{% endif %}") == "\nx");   // '+' keeps it
  CHECK(render("  {%+ if true %}x{% endif %}") == "  x");   // '+' keeps the indentation
  CHECK(render("  {{- 'a' }}  \n  {{ 'b' -}}  \n  c") == "a  \n  bc");
  CHECK(render("{% for i in range(2) -%}\n  {{ i }}\n{%- endfor %}") == "01");
  CHECK(render("{{ 'a' }}\n{{ 'b' }}\n") == "a\nb");  // one trailing newline dropped
  CHECK(render("a\r\nb\rc") == "a\nb\nc");             // newlines normalised
  CHECK(render("{# comment #}a {#- c -#} b") == "ab");
  CHECK(render("  {# c #}\nx") == "x");
  CHECK(render("{% raw %}{{ not rendered }}{% endraw %}") == "{{ not rendered }}");
  CHECK(render("{% set x = {'k': '}}'} %}{{ x.k }}") == "}}");
}

TEST_CASE("literals and printing follow Python str()") {
  CHECK(render("{{ none }}|{{ True }}|{{ false }}") == "None|True|False");
  CHECK(render("{{ [1, 'a', None, 1.5, {'k': (1, 2)}] }}") == "[1, 'a', None, 1.5, {'k': (1, 2)}]");
  CHECK(render("{{ (1,) }} {{ () }}") == "(1,) ()");
  CHECK(render(R"({{ ["it's", 'say "hi"', 'both \' "'] }})") == R"(["it's", 'say "hi"', 'both \' "'])");
  CHECK(render("{{ 1e16 }} {{ 1.0 }} {{ 0.00001 }} {{ 0.1 + 0.2 }} {{ -0.0 }}") ==
        "1e+16 1.0 1e-05 0.30000000000000004 -0.0");
  CHECK(render("{{ 'a\\qb' }}{{ '\\u00e9\\x41\\n' }}") == "a\\qbéA\n");
  CHECK(render("{{ \"x\" 'y' }}") == "xy");
  CHECK(render("{{ 1_000 }} {{ 1.5e-3 }}") == "1000 0.0015");
  CHECK(render("{{ x }}|{{ x.y is defined }}", R"({"x": {"z": 1}})") == "{'z': 1}|False");
}

TEST_CASE("arithmetic, comparison and logic") {
  CHECK(render("{{ 7 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 10.5 // 3 }}") ==
        "3.5 -4 2 1024 0.5 3.0");
  CHECK(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 1 - 2 - 3 }} {{ 'a' ~ 2 * 3 }}") == "7 9 -4 a6");
  // `~` binds tighter than `+` in jinja2: ('a' ~ 1) + 2 is str + int.
  CHECK(error_of("{{ 'a' ~ 1 + 2 }}").find("'str' and 'int'") != std::string::npos);
  CHECK(render("{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 1 == 1.0 }} {{ '1' == 1 }} {{ [1, 2] < [1, 3] }}") ==
        "True False True False True");
  CHECK(render("{{ 'b' in 'abc' }} {{ 'z' not in 'abc' }} {{ 1 in [1] }} {{ 'a' in {'a': 1} }}") ==
        "True True True True");
  CHECK(render("{{ true and 'x' }} {{ false or 'y' }} {{ [] or 'z' }} {{ 0 and 1 }}") == "x y z 0");
  CHECK(render("{{ not a == 1 }} {{ not not a }}", R"({"a": 1})") == "False True");
  CHECK(render("{{ [1, 2] + [3] }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [0] * 2 }}") == "[1, 2, 3] ababab xxx [0, 0]");
  CHECK(render("{{ 1 if false else 2 if true else 3 }}|{{ 'x' if false }}") == "2|");
  CHECK(render("{{ '%d items, %s' % (3, 'ok') }} {{ '%.2f' % 3.14159 }}") == "3 items, ok 3.14");
  CHECK(error_of("{{ 'a' + 1 }}").find("unsupported operand type(s) for +: 'str' and 'int'") != std::string::npos);
  CHECK(error_of("{{ 1 // 0 }}").find("division or modulo by zero") != std::string::npos);
  CHECK(error_of("{{ 2 ** 63 }}").find("integer overflow") != std::string::npos);
}

TEST_CASE("attribute and item access, slicing") {
  const std::string msgs = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  CHECK(render("{{ messages[0].content }} {{ messages|length }} {{ messages[-1]['role'] }}", msgs) == "hi 2 assistant");
  CHECK(render("{% for m in messages[::-1] %}{{ m.role }} {% endfor %}", msgs) == "assistant user ");
  CHECK(render("{{ messages[1:]|length }}", msgs) == "1");
  CHECK(render("{% set a = [1, 2, 3, 4, 5] %}{{ a[4:0:-2] }} {{ a[-2:] }} {{ a[:-10] }} {{ a[::2] }} {{ a[10:] }}") ==
        "[5, 3] [4, 5] [] [1, 3, 5] []");
  CHECK(render("{{ 'héllo'[1:3] }} {{ 'abc'[::-1] }} {{ 'abc'[-1] }} {{ 'abc'.0 }}") == "él cba c a");
  CHECK(render("{{ [1, 2, 3][5] }}|{{ d['items'] }}|{{ d.get('z', 5) }}", R"({"d": {"items": 3}})") == "|3|5");
  CHECK(render("{{ m.reasoning_content is defined }}", R"({"m": {"content": "a"}})") == "False");
  // Like jinja2's default Undefined: an attribute of an undefined value is an error.
  CHECK(error_of("{{ foo.bar }}").find("'foo' is undefined") != std::string::npos);
  CHECK(render("{% set x = none %}{{ x.y is defined }}") == "False");
}

TEST_CASE("for loops: loop variables, filtering, unpacking, else, break/continue, scoping") {
  CHECK(render("{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {{ loop.first }} "
               "{{ loop.last }} {{ loop.revindex }} {{ loop.revindex0 }} {{ loop.previtem }} {{ loop.nextitem }} "
               "{{ loop.cycle('a', 'b') }};{% endfor %}") ==
        "1/2:2 True False 2 1  3 a;2/2:3 False True 1 0 2  b;");
  CHECK(render("{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}{{ v }}{% endfor %}") == "x1y2");
  CHECK(render("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}") == "ba");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
               "{{ i }}{% endfor %}") == "02");
  // A set inside a loop body is local to the iteration (jinja2 scoping) ...
  CHECK(render("{% set c = 0 %}{% for i in range(3) %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}") == "1110");
  // ... which is why templates carry state out through namespace().
  CHECK(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") ==
        "6");
  CHECK(render("{% for i in [1] %}{% for j in [2, 3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}") == "121");
  CHECK(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").find("too many values to unpack") != std::string::npos);
}

TEST_CASE("set, block set, macros, call blocks, filter blocks") {
  CHECK(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}") == "12");
  CHECK(render("{% set x %}hello {{ 1 }}{% endset %}[{{ x }}]") == "[hello 1]");
  CHECK(render("{% set x | upper %}hello{% endset %}[{{ x }}]") == "[HELLO]");
  CHECK(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 5) }}{{ m(b=7, a=0) }}") == "121507");
  CHECK(render("{% macro m(a) %}{{ a }}{{ kwargs }}{{ varargs }}{% endmacro %}{{ m(1, 2, c=3) }}") == "1{'c': 3}(2,)");
  CHECK(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, c=3) }}").find("takes no keyword argument 'c'") !=
        std::string::npos);
  CHECK(render("{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}") == "321");
  CHECK(render("{% macro f(x) %}[{{ caller(x + 1) }}]{% endmacro %}{% call(y) f(1) %}got {{ y }}{% endcall %}") ==
        "[got 2]");
  CHECK(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}") == "ABCD");
  CHECK(error_of("{% set d = {'a': 1} %}{% set d.a = 2 %}").find("non-namespace") != std::string::npos);
}

TEST_CASE("filters") {
  CHECK(render("{{ {'b': 1, 'a': 'é'}|tojson }}") == R"({"b": 1, "a": "é"})");
  CHECK(render("{{ {'b': 1, 'a': []}|tojson(indent=2) }}") == "{\n  \"b\": 1,\n  \"a\": []\n}");
  CHECK(render("{{ v|tojson }}", R"({"v": {"z": 1, "a": [1.5, 2.0, "x\n\"q\""], "m": {}}})") ==
        R"({"z": 1, "a": [1.5, 2.0, "x\n\"q\""], "m": {}})");
  CHECK(render("{{ ['é😀']|tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}") ==
        R"(["\u00e9\ud83d\ude00"] {"a": 2, "b": 1})");
  CHECK(render("{{ {'a': [1, 2]}|tojson(separators=(',', ':')) }}") == R"({"a":[1,2]})");
  CHECK(render("{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }}") ==
        "[1, 2, 3] ['A', 'b', 'c'] [{'a': 1}, {'a': 2}]");
  CHECK(render("{{ [1, 2, 3]|sum }} {{ [1, 2, 3]|max }} {{ [1, 2, 3]|min }} {{ [1, 1, 2]|unique|list }} "
               "{{ [1, 2]|reverse|list }} {{ 'abc'|reverse }}") == "6 3 1 [1, 2] [2, 1] cba");
  CHECK(render("{{ ['a', 'b']|join(', ') }} {{ ts|map(attribute='function')|map(attribute='name')|join('|') }}",
               R"({"ts": [{"function": {"name": "x"}}, {"function": {"name": "y"}}]})") == "a, b x|y");
  CHECK(render("{{ ms|selectattr('role', 'equalto', 'user')|list|length }} {{ ms|rejectattr('role')|list }}",
               R"({"ms": [{"role": "user"}, {"role": ""}]})") == "1 [{'role': ''}]");
  CHECK(render("{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|reject('>', 1)|list }}") == "[1, 3] [1]");
  CHECK(render("{{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1}|items|list }}") == "[('a', 2), ('b', 1)] [('b', 1)]");
  CHECK(render("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|d('d', true) }} {{ none|default('z') }}") ==
        "d  d None");
  CHECK(render("{{ 'a<b>&\"\\''|e }} {{ '  hi  '|trim }} {{ 'xxhixx'|trim('x') }} {{ 'x'|safe }}") ==
        "a&lt;b&gt;&amp;&#34;&#39; hi hi x");
  CHECK(render("{{ 'hELLO wORLD'|capitalize }} {{ 'hello world'|title }} {{ 'Hi'|lower }}{{ 'Hi'|upper }}") ==
        "Hello world Hello World hiHI");
  CHECK(render("{{ '3.7'|int }} {{ ' 42 '|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '1e3'|float }} {{ true|int }}") ==
        "3 42 0 7 1000.0 1");
  CHECK(render("{{ 2.5|round }} {{ 2.675|round(2) }} {{ 3.1|round(0, 'ceil') }} {{ -3|abs }}") == "2.0 2.67 4.0 3");
  CHECK(render("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ [1, 2, 3]|batch(2, 0)|list }}|{{ 'ab'|length }}{{ [1]|count }}") ==
        "a\n  b\n\n  c|[[1, 2], [3, 0]]|21");
  CHECK(render("{{ 'aXbX'|replace('X', '-') }} {{ \"%s-%s\"|format('a', 1) }}") == "a-b- a-1");
  CHECK(error_of("{{ 'abc' | wordwrap }}") == "chat template 1:12: unsupported filter 'wordwrap'");
}

TEST_CASE("tests") {
  CHECK(render("{{ x is defined }}{{ x is none }}{{ none is none }}{{ 1 is number }}{{ true is number }}"
               "{{ true is integer }}") == "FalseFalseTrueTrueTrueFalse");
  CHECK(render("{{ 's' is string }}{{ {} is mapping }}{{ [] is sequence }}{{ 1 is iterable }}{{ 'a' is iterable }}"
               "{{ true is boolean }}{{ 1 is boolean }}") == "TrueTrueTrueFalseTrueTrueFalse");
  CHECK(render("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 1 is equalto 1 }}"
               "{{ 2 is eq 3 }}{{ none is not none }}{{ true is true }}{{ 0 is false }}") ==
        "TrueTrueTrueFalseTrueFalseFalseTrueFalse");
  CHECK(render("{{ enable_thinking is defined and enable_thinking is false }}", R"({"enable_thinking": false})") ==
        "True");
  CHECK(render("{{ 1 is in [1, 2] }}{{ 2 is gt 1 }}{{ 'a' is lower }}") == "TrueTrueTrue");
  CHECK(error_of("{{ 1 is prime }}") == "chat template 1:9: unsupported test 'prime'");
}

TEST_CASE("string, dict and list methods") {
  CHECK(render("{{ '\\n\\nx\\n'.strip('\\n') }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ 'xyx'.strip('x') }}") ==
        "x|x  |  x|y");
  CHECK(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a b c'.rsplit(' ', 1) }}") ==
        "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a b', 'c']");
  CHECK(render("{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.find('c') }} "
               "{{ 'aXbX'.replace('X', '-', 1) }}") == "True True 2 a-bX");
  CHECK(render("{{ '{} and {name}'.format(1, name='n') }} {{ ', '.join(['a', 'b']) }} {{ \"they're\".title() }}") ==
        "1 and n a, b They'Re");
  CHECK(render("{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('z') }}",
               R"({"d": {"a": 1, "b": [2]}})") == "['a', 'b'] [1, [2]] [('a', 1), ('b', [2])] None");
  CHECK(render("{% set ns = namespace(items=[]) %}{% for i in range(3) %}{{ ns.items.append(i * 2) or '' }}"
               "{% endfor %}{{ ns.items }} {{ ns.items.index(4) }}") == "[0, 2, 4] 2");
  // Qwen3's reasoning split.
  CHECK(render("{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n')"
               ".split('<think>')[-1].lstrip('\\n') }}",
               R"({"c": "<think>\n r \n</think>\n\nans"})") == "ans| r ");
}

TEST_CASE("globals: raise_exception, range, namespace, strftime_now; context shadows them") {
  CHECK_THROWS_WITH_AS(render("{{ raise_exception('roles must alternate') }}"), "roles must alternate", TemplateRaised);
  CHECK(render("{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}") ==
        "[0, 1, 2] [1, 4, 7] [5, 3, 1]");
  CHECK(error_of("{{ range(1000000)|length }}").find("range too big") != std::string::npos);
  CHECK(render("{{ namespace(a=1) }} {% set ns = namespace({'a': 1}) %}{{ ns.a }}") == "<Namespace {'a': 1}> 1");
  CHECK(render("{{ strftime_now('%Y')|length }}") == "4");
  CHECK(render("{{ range }}", R"({"range": "mine"})") == "mine");
}

TEST_CASE("errors name line and column") {
  CHECK(error_of("line one\n{{ foo( }}") == "chat template 2:1: unterminated '{{' (missing '}}')");
  CHECK(error_of("line one\n{{ foo) }}") == "chat template 2:7: expected '}}', got ')'");
  CHECK(error_of("{% for %}") == "chat template 1:8: expected a name, got '%}'");
  CHECK(error_of("{% if true %}unclosed") == "chat template 1:22: unexpected end of template, expected '{% endif %}'");
  CHECK(error_of("{{ 'unterminated }}") == "chat template 1:4: unterminated string literal");
  CHECK(error_of("\n\n  {% include 'x' %}") == "chat template 3:6: unsupported statement 'include'");
  CHECK(error_of("{% endfor %}") == "chat template 1:4: unexpected '{% endfor %}'");
  CHECK(error_of("{{ 1 }}\n  {{ x.y }}") == "chat template 2:8: 'x' is undefined");
  CHECK(error_of("{# never closed") == "chat template 1:1: unterminated comment '{#'");
  CHECK(error_of("{{ a | b }}").find("1:8: unsupported filter 'b'") != std::string::npos);
  try {
    render("{{ 1 }}\n{{ 1 | nope }}");
    FAIL("expected a TemplateError");
  } catch (const TemplateError& e) {
    CHECK(e.line == 2);
    CHECK(e.column == 8);
  }
}

TEST_CASE("limits: recursion, steps, output size, nesting") {
  CHECK(error_of("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}").find("nested deeper than 100") != std::string::npos);
  CHECK(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").find("nesting deeper") !=
        std::string::npos);
  RenderLimits small;
  small.max_steps = 10000;
  small.max_string_bytes = 1000;
  const auto loop = ChatTemplate::parse("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  CHECK_THROWS_WITH_AS(loop.render(ojson::object(), small), doctest::Contains("evaluation steps"), TemplateError);
  const auto big = ChatTemplate::parse("{{ 'x' * 5000 }}");
  CHECK_THROWS_WITH_AS(big.render(ojson::object(), small), doctest::Contains("exceeds the limit"), TemplateError);
  const auto out = ChatTemplate::parse("{% for i in range(2000) %}x{% endfor %}");
  CHECK_THROWS_WITH_AS(out.render(ojson::object(), small), doctest::Contains("output exceeds"), TemplateError);
  // A list appended into itself: printing it fails cleanly, and nothing leaks (LSan in CI).
  CHECK(error_of("{% set ns = namespace(l=[]) %}{{ ns.l.append(ns.l) or '' }}{{ ns.l }}").find("nested deeper") !=
        std::string::npos);
  std::string deep;
  for (int i = 0; i < 1000; ++i) deep += "[";
  for (int i = 0; i < 1000; ++i) deep += "]";
  CHECK(error_of("{{ x }}", R"({"x": )" + deep + "}") == "chat template 0:0: render context: context nested deeper than 256 levels");
  CHECK(error_of("{{ '{99999999999}'.format(1) }}").find("out of range") != std::string::npos);
  CHECK(render("{% set ns = namespace() %}{% set ns.self = ns %}{% macro m() %}{% endmacro %}{% set ns.m = m %}ok") == "ok");
}

TEST_CASE("context key order is kept (ordered_json); nlohmann::json input still renders") {
  const auto t = ChatTemplate::parse("{{ d|tojson }}");
  CHECK(t.render(ojson::parse(R"({"d": {"z": 1, "a": 2}})")) == R"({"z": 1, "a": 2})");
  CHECK(t.render(nlohmann::json::parse(R"({"d": {"z": 1, "a": 2}})")) == R"({"a": 2, "z": 1})");
}

TEST_CASE("template source: tokenizer_config.json string or named list, chat_template.jinja first") {
  using servedeck::worker::chat_template_from_config;
  using servedeck::worker::load_chat_template_source;
  using servedeck::worker::special_token;
  CHECK(chat_template_from_config(nlohmann::json::parse(R"({"chat_template": "A"})")) == "A");
  const auto listed = nlohmann::json::parse(
      R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  CHECK(chat_template_from_config(listed) == "D");
  CHECK(chat_template_from_config(listed, "tool_use") == "T");
  CHECK_THROWS_WITH(chat_template_from_config(listed, "rag"), doctest::Contains("have: default, tool_use"));
  CHECK_THROWS_WITH(chat_template_from_config(nlohmann::json::object()), doctest::Contains("no \"chat_template\""));
  const auto cfg = nlohmann::json::parse(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                                             "pad_token": null})");
  CHECK(special_token(cfg, "bos_token") == "<s>");
  CHECK(special_token(cfg, "eos_token") == "</s>");
  CHECK_FALSE(special_token(cfg, "pad_token").has_value());

  char dir[] = "/tmp/servedeck_template_source_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string d = dir;
  CHECK_THROWS_WITH(load_chat_template_source(d), doctest::Contains("expected chat_template.jinja or tokenizer_config.json"));
  { std::ofstream(d + "/tokenizer_config.json") << R"({"chat_template": "from config"})"; }
  CHECK(load_chat_template_source(d) == "from config");
  { std::ofstream(d + "/chat_template.jinja") << "from jinja"; }
  CHECK(load_chat_template_source(d) == "from jinja");
  std::filesystem::remove_all(d);
}

TEST_CASE("a macro defined inside a loop outlives the iteration that defined it") {
  // (Which loop variables such a macro sees is a jinja2 quirk - it renders them as
  // "missing" - so this checks only that calling it after the loop is safe.)
  CHECK(render("{% set ns = namespace(m=none) %}{% for i in range(2) %}{% macro m(x) %}<{{ x }}>{% endmacro %}"
               "{% set ns.m = m %}{% endfor %}{{ ns.m(5) }}") == "<5>");
}

TEST_CASE("one parsed template renders concurrently") {
  const auto t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}[{{ m.role }}:{{ m.content|trim }}]"
      "{% endfor %}{{ ns.n }}{{ tools|tojson }}");
  const auto ctx = ojson::parse(
      R"({"messages": [{"role": "user", "content": " a "}, {"role": "assistant", "content": "b"}],
          "tools": [{"name": "f", "z": 1, "a": 2}]})");
  const std::string expected = R"([user:a][assistant:b]2[{"name": "f", "z": 1, "a": 2}])";
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (t.render(ctx) != expected) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}
