// `servedeck`: the daemon (`serve`) and its thin command-line client. See docs/supervisor.md.
#include <iostream>
#include <map>

#include "gateway/cli/cli_common.hpp"

namespace {

constexpr const char* k_usage = R"(usage: servedeck [--config models.toml] [--state-dir DIR] VERB [args]

verbs:
  serve [--port N]          run the daemon (gateway + admin API + slot supervisor)
  switch MODEL              bring MODEL up (drain, stop, reap /dev/shm, preflight, start); prints each step
  stop                      stop the running engine
  status [--json]           slot, model, state, pid, uptime, ctx, VRAM, host RAM, last error,
                            last switch refused by preflight (while recorded)
                            (daemon down: what the state store last recorded; exit status 3)
  models [--json]           the registry's models
  logs [MODEL] [--lines N] [-f]   the engine's launch log (current launch, or MODEL's newest)
  lint                      check models.toml; exit 1 on errors
  preflight MODEL [--json]  run the preflight checks here, without a daemon; exit 1 on a refusal
  soak [--model ID] [--turns N] [--tools N] [--max-tokens N] [--time-limit S] [--url HOST:PORT] [--cold-prefix] [--json]
                            agent-loop reproducer through the gateway; stops at the first failed turn (exit 1);
                            per turn TTFT, prompt and cached tokens (--cold-prefix: no prefix can be reused)
  probe amnesia [--url HOST:PORT] [--model ID] [--conversation FILE] [--continuation TEXT] [--json]
                            greeting mass with reasoning dropped vs restored (engine's /tokenize + logprobs)
  compare --baseline HOST:PORT --candidate HOST:PORT [--model ID] [--prompts FILE] [--json]
                            prompt-logprob KL and top-1 agreement vs the baseline's own drift (exit 1 outside)

--config defaults to ./models.toml, else /etc/servedeck/models.toml. --state-dir (where the daemon
keeps its state, and daemon.json and admin.token tell the CLI its address and admin credential)
defaults to $SERVEDECK_STATE_DIR, else the config's server.state_dir, for serve and every verb. With no --config, no ./models.toml and no /etc/servedeck/models.toml, the CLI
cannot know which daemon to ask: it says so and exits 2 (pass --config FILE or --state-dir DIR).

exit status:
  0  done
  1  the verb failed: a switch or stop failed, lint found errors, preflight refused, a soak
     turn failed, compare fell outside the baseline's drift, or an unexpected error
  2  usage error (unknown verb, flag or model); no models.toml found, or serve/preflight cannot
     load it; no daemon to talk to (switch, stop, soak, probe)
  3  status: the daemon is down (what the state store last recorded is shown)
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace servedeck::cli;
  Args a;
  try {
    a = parse_args(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "servedeck: " << e.what() << "\n" << k_usage;
    return 2;
  }
  if (a.verb.empty() || a.has("--help") || a.verb == "help") {
    std::cout << k_usage;
    return a.verb.empty() && !a.has("--help") ? 2 : 0;
  }
  static const std::map<std::string, int (*)(const Args&)> verbs = {
      {"serve", cmd_serve}, {"switch", cmd_switch}, {"stop", cmd_stop},   {"status", cmd_status},
      {"models", cmd_models}, {"logs", cmd_logs},   {"lint", cmd_lint},   {"preflight", cmd_preflight},
      {"soak", cmd_soak},     {"probe", cmd_probe}, {"compare", cmd_compare}};
  auto it = verbs.find(a.verb);
  if (it == verbs.end()) {
    std::cerr << "servedeck: unknown verb '" << a.verb << "'\n" << k_usage;
    return 2;
  }
  try {
    return it->second(a);
  } catch (const std::exception& e) {
    std::cerr << "servedeck: " << a.verb << ": " << e.what() << "\n";
    return 1;
  }
}
