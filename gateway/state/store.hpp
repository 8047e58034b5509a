// The daemon's state store: one SQLite database (WAL mode, versioned schema) in the state
// directory. It outlives the daemon: `servedeck status` reads it when the daemon is down, and a
// restarted daemon adopts the engine it finds recorded here.
//
// The database and its -wal/-shm files are 0600 (created so; an existing file is chmod'ed at
// open) and deleted rows are overwritten (secure_delete), so what prune() removes is gone from
// the file too. Lifetimes: prune() (run by the daemon's Janitor, gateway/state/janitor.hpp).
//
// Thread-safety: every public method may be called from any thread; calls are serialised on
// one connection by an internal mutex. Methods throw StoreError on SQLite failure (disk full,
// corrupt file); callers on the gateway's request path catch it and log, they never fail a
// client request because the log could not be written.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

struct sqlite3;

namespace servedeck::state {

struct StoreError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One engine launch. Times are Unix epoch milliseconds; 0 = not reached.
struct LaunchRecord {
  int64_t id = 0;
  std::string model;                    // registry table key
  nlohmann::json argv = nlohmann::json::array();
  nlohmann::json env = nlohmann::json::object();  // only the variables the registry set
  int64_t pid = 0;                      // process-group leader (pgid == sid == pid)
  int64_t pid_start_time = 0;           // /proc/PID/stat field 22 (clock ticks since boot): adoption check
  nlohmann::json preflight = nlohmann::json::array();  // the preflight table at launch
  int64_t start_ms = 0;
  int64_t ready_ms = 0;
  int64_t stop_ms = 0;
  std::optional<int> exit_status;       // wait status decoded: exit code, or 128+signal
  std::string state;                    // last slot state for this launch ("starting", "ready", ...)
  std::string why;                      // why it ended, or the failure
  std::string log_path;
  int port = 0;
};

/// One proxied request (never bodies).
struct RequestRecord {
  int64_t time_ms = 0;
  std::string route;                    // "/v1/chat/completions", "/v1/responses", ...
  std::string model;                    // base model (registry key)
  std::string alias;                    // the id the client sent
  bool stream = false;
  int status = 0;                       // HTTP status sent to the client
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double ttft_ms = 0;
  double total_ms = 0;
  double decode_tok_s = 0;
  std::string error_code;               // empty when ok
};

/// What Store::prune() removes. docs/operations.md "Security" lists the defaults.
struct Retention {
  /// Stored /v1/responses turns (documents ns "responses"): no expiry later than now + this, ms
  /// (0: every stored turn goes now). nullopt leaves the expiries they were written with.
  std::optional<int64_t> responses_max_ms;
  int64_t history_max_age_ms = 0;  // requests and events rows older than this go; 0 = no age bound
  int64_t history_max_rows = 0;    // requests and events: rows beyond the newest N go; 0 = no bound
};

/// Rows Store::prune() deleted.
struct PruneCounts {
  int64_t documents = 0;
  int64_t requests = 0;
  int64_t events = 0;
  int64_t total() const { return documents + requests + events; }
};

/// Memory measured after a launch reached ready.
struct MeasuredMemory {
  std::string model;
  int64_t ctx = 0;
  std::string engine_build;             // program path + mtime, or a version string
  double peak_vram_gib = 0;
  double host_rss_gib = 0;
  double load_s = 0;
  int64_t time_ms = 0;
};

class Store {
 public:
  /// Opens (creating if needed) `<state_dir>/state.db`, sets WAL, and migrates the schema to
  /// k_schema_version. Throws StoreError naming the path on failure.
  explicit Store(const std::string& state_dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  static constexpr int k_schema_version = 1;

  /// Inserts a launch; returns its id.
  int64_t begin_launch(const LaunchRecord& r);
  /// Overwrites every field of launch `r.id`.
  void update_launch(const LaunchRecord& r);
  std::optional<LaunchRecord> launch(int64_t id) const;
  /// The newest launch of any model (for `status` and adoption).
  std::optional<LaunchRecord> latest_launch() const;
  /// Launches with state not in {"stopped","failed"}: candidates for adoption at daemon start.
  std::vector<LaunchRecord> unfinished_launches() const;
  std::vector<LaunchRecord> recent_launches(int limit) const;

  /// Appends an event (kind: "switch", "preflight", "reap", "adopt", "error", ...).
  void add_event(std::string_view kind, std::string_view model, const nlohmann::json& detail);
  /// Newest first.
  std::vector<nlohmann::json> recent_events(int limit) const;

  void add_request(const RequestRecord& r);
  std::vector<RequestRecord> recent_requests(int limit) const;
  /// Counts rows in the request log with `route` (tests).
  int64_t count_requests(std::string_view route) const;

  void add_measured_memory(const MeasuredMemory& m);
  /// The newest measurement for (model, ctx), any build.
  std::optional<MeasuredMemory> last_measured_memory(std::string_view model, int64_t ctx) const;

  /// Key/value store for small JSON documents (stored Responses for previous_response_id,
  /// reasoning keyed by tool-call id). `expires_ms` = 0 keeps it until overwritten.
  void put_document(std::string_view ns, std::string_view key, const nlohmann::json& value,
                    int64_t expires_ms = 0);
  std::optional<nlohmann::json> get_document(std::string_view ns, std::string_view key) const;

  /// Deletes every expired document (any namespace), clamps stored responses to `r`, and
  /// bounds the requests and events tables by age and rows, in one transaction; then truncates
  /// the WAL when anything went. Throws StoreError.
  PruneCounts prune(const Retention& r, int64_t now_ms);
  /// Rows in the events table (tests).
  int64_t count_events() const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
  mutable std::mutex mu_;
};

/// Unix epoch milliseconds, now.
int64_t now_ms();

}  // namespace servedeck::state
