#include "gateway/cli/serve_state.hpp"

#include "gateway/admin/admin_token.hpp"
#include "gateway/state/state_dir.hpp"
#include "policies/capture.hpp"

namespace servedeck::cli {

std::string prepare_state_dir(const std::string& dir, const std::string& config_path, const LogLine& log) {
  if (auto mismatch = state::systemd_state_dir_mismatch(dir, config_path)) return *mismatch;
  if (std::string changed = state::secure_state_dir(dir); !changed.empty() && log) log(changed);
  return "";
}

state::Retention retention_of(const registry::ServerConfig& server) {
  state::Retention r;
  r.responses_max_ms = server.responses_retention_s * 1000;
  r.history_max_age_ms = server.history_retention_s * 1000;
  r.history_max_rows = server.history_max_rows;
  return r;
}

std::unique_ptr<state::Janitor> start_janitor(state::Store& store, const registry::ServerConfig& server,
                                              const LogLine& log) {
  auto capture = [log] {
    if (std::size_t n = policies::apply_capture_retention(); n > 0 && log)
      log("retention: deleted " + std::to_string(n) + " capture file(s)");
  };
  return std::make_unique<state::Janitor>(store, retention_of(server), k_janitor_interval, log, capture);
}

std::string issue_admin_token(const std::string& dir) {
  std::string token = admin::new_admin_token();
  admin::write_admin_token(dir, token);
  return token;
}

}  // namespace servedeck::cli
