// SQLite state store. See store.hpp for the contract.
//
// Schema versioning: table schema_version(version INTEGER) holds one row. Migrations are an
// ordered list of SQL scripts; migration i takes the database from version i to i+1 and runs in
// one transaction with the version bump, so a crash mid-migration leaves the old version.
#include "gateway/state/store.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <system_error>

#include "common/json_limits.hpp"

namespace servedeck::state {

namespace {

// note: migrations are append-only. Never edit one that shipped; add the next.
constexpr const char* k_migrations[] = {
    // 0 → 1
    R"sql(
CREATE TABLE launches (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model TEXT NOT NULL,
  argv TEXT NOT NULL,
  env TEXT NOT NULL,
  pid INTEGER NOT NULL DEFAULT 0,
  pid_start_time INTEGER NOT NULL DEFAULT 0,
  preflight TEXT NOT NULL,
  start_ms INTEGER NOT NULL DEFAULT 0,
  ready_ms INTEGER NOT NULL DEFAULT 0,
  stop_ms INTEGER NOT NULL DEFAULT 0,
  exit_status INTEGER,
  state TEXT NOT NULL DEFAULT '',
  why TEXT NOT NULL DEFAULT '',
  log_path TEXT NOT NULL DEFAULT '',
  port INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  time_ms INTEGER NOT NULL,
  kind TEXT NOT NULL,
  model TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE TABLE requests (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  time_ms INTEGER NOT NULL,
  route TEXT NOT NULL,
  model TEXT NOT NULL,
  alias TEXT NOT NULL,
  stream INTEGER NOT NULL,
  status INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  ttft_ms REAL NOT NULL,
  total_ms REAL NOT NULL,
  decode_tok_s REAL NOT NULL,
  error_code TEXT NOT NULL
);
CREATE INDEX requests_route ON requests(route);
CREATE TABLE measured_memory (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model TEXT NOT NULL,
  ctx INTEGER NOT NULL,
  engine_build TEXT NOT NULL,
  peak_vram_gib REAL NOT NULL,
  host_rss_gib REAL NOT NULL,
  load_s REAL NOT NULL,
  time_ms INTEGER NOT NULL
);
CREATE INDEX measured_memory_model ON measured_memory(model, ctx);
CREATE TABLE documents (
  ns TEXT NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  expires_ms INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (ns, key)
);
)sql",
};
static_assert(std::size(k_migrations) == Store::k_schema_version,
              "one migration per schema version");

std::string errmsg(sqlite3* db) { return db ? sqlite3_errmsg(db) : "out of memory"; }

/// A prepared statement, finalized on scope exit. Binding is 1-based like SQLite.
class Stmt {
 public:
  Stmt(sqlite3* db, std::string_view sql, const std::string& path) : db_(db) {
    if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &st_, nullptr) != SQLITE_OK)
      throw StoreError(path + ": preparing '" + std::string(sql.substr(0, 60)) + "': " + errmsg(db));
    path_ = path;
  }
  ~Stmt() { sqlite3_finalize(st_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v) { check(sqlite3_bind_int64(st_, i, v)); return *this; }
  Stmt& bind(int i, int v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, double v) { check(sqlite3_bind_double(st_, i, v)); return *this; }
  Stmt& bind(int i, std::string_view v) {
    check(sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& bind_null(int i) { check(sqlite3_bind_null(st_, i)); return *this; }

  /// Steps once; true when a row is available.
  bool step() {
    int rc = sqlite3_step(st_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw StoreError(path_ + ": " + errmsg(db_));
  }
  int64_t i64(int col) const { return sqlite3_column_int64(st_, col); }
  double dbl(int col) const { return sqlite3_column_double(st_, col); }
  bool is_null(int col) const { return sqlite3_column_type(st_, col) == SQLITE_NULL; }
  std::string text(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st_, col));
    return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(st_, col))) : std::string();
  }
  nlohmann::json json_col(int col) const {
    auto j = parse_untrusted(text(col));
    return j.is_discarded() ? nlohmann::json() : j;
  }

 private:
  void check(int rc) {
    if (rc != SQLITE_OK) throw StoreError(path_ + ": binding: " + errmsg(db_));
  }
  sqlite3* db_;
  sqlite3_stmt* st_ = nullptr;
  std::string path_;
};

void exec(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : errmsg(db);
    sqlite3_free(err);
    throw StoreError(path + ": " + msg);
  }
}

constexpr const char* k_launch_cols =
    "id, model, argv, env, pid, pid_start_time, preflight, start_ms, ready_ms, stop_ms, "
    "exit_status, state, why, log_path, port";

LaunchRecord read_launch(const Stmt& s) {
  LaunchRecord r;
  r.id = s.i64(0);
  r.model = s.text(1);
  r.argv = s.json_col(2);
  r.env = s.json_col(3);
  r.pid = s.i64(4);
  r.pid_start_time = s.i64(5);
  r.preflight = s.json_col(6);
  r.start_ms = s.i64(7);
  r.ready_ms = s.i64(8);
  r.stop_ms = s.i64(9);
  if (!s.is_null(10)) r.exit_status = static_cast<int>(s.i64(10));
  r.state = s.text(11);
  r.why = s.text(12);
  r.log_path = s.text(13);
  r.port = static_cast<int>(s.i64(14));
  return r;
}

/// Binds the 14 non-id launch fields starting at parameter 1.
void bind_launch(Stmt& s, const LaunchRecord& r) {
  s.bind(1, r.model).bind(2, dump_safe(r.argv)).bind(3, dump_safe(r.env)).bind(4, r.pid)
      .bind(5, r.pid_start_time).bind(6, dump_safe(r.preflight)).bind(7, r.start_ms)
      .bind(8, r.ready_ms).bind(9, r.stop_ms);
  if (r.exit_status) s.bind(10, *r.exit_status); else s.bind_null(10);
  s.bind(11, r.state).bind(12, r.why).bind(13, r.log_path).bind(14, r.port);
}

/// Makes `db` and its -wal/-shm 0600: creates a missing database file so (SQLite gives the -wal
/// and -shm it creates the database file's mode) and chmods existing ones by path. A file this
/// process may not chmod (another user's) is left as it is; opening it then fails or succeeds on
/// its own.
/// note: an existing database is never opened here: closing any descriptor of a file drops every
/// POSIX lock this process holds on it, SQLite's included (another Store on the same file).
void restrict_db_files(const std::string& db) {
  int fd = ::open(db.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::fchmod(fd, 0600);  // independent of the umask
    ::close(fd);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string f = db + suffix;
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) ::chmod(f.c_str(), 0600);
  }
}

}  // namespace

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

Store::Store(const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) throw StoreError("state directory '" + state_dir + "': cannot create: " + ec.message());
  path_ = (std::filesystem::path(state_dir) / "state.db").string();
  restrict_db_files(path_);
  if (sqlite3_open_v2(path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = errmsg(db_);
    sqlite3_close(db_);
    db_ = nullptr;
    throw StoreError(path_ + ": cannot open: " + msg);
  }
  try {
    // note: several processes open the store (the daemon, `servedeck status` when the daemon is
    // down); a 5 s busy timeout covers a concurrent writer's short transactions.
    sqlite3_busy_timeout(db_, 5000);
    exec(db_, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; PRAGMA secure_delete=ON;",
         path_);
    restrict_db_files(path_);  // -wal and -shm exist now
    exec(db_, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);", path_);
    int version = 0;
    {
      Stmt s(db_, "SELECT version FROM schema_version LIMIT 1", path_);
      if (s.step()) {
        version = static_cast<int>(s.i64(0));
      } else {
        Stmt ins(db_, "INSERT INTO schema_version(version) VALUES (0)", path_);
        ins.step();
      }
    }
    if (version > k_schema_version)
      throw StoreError(path_ + ": schema_version " + std::to_string(version) +
                       " is newer than this servedeck understands (" + std::to_string(k_schema_version) +
                       "); upgrade servedeck or move the file away");
    for (int v = version; v < k_schema_version; ++v) {
      exec(db_, "BEGIN IMMEDIATE", path_);
      try {
        exec(db_, k_migrations[v], path_);
        Stmt up(db_, "UPDATE schema_version SET version = ?", path_);
        up.bind(1, v + 1).step();
        exec(db_, "COMMIT", path_);
      } catch (...) {
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    }
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

Store::~Store() {
  if (db_) sqlite3_close(db_);
}

int64_t Store::begin_launch(const LaunchRecord& r) {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "INSERT INTO launches(model, argv, env, pid, pid_start_time, preflight, start_ms, ready_ms, "
         "stop_ms, exit_status, state, why, log_path, port) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
         path_);
  bind_launch(s, r);
  s.step();
  return sqlite3_last_insert_rowid(db_);
}

void Store::update_launch(const LaunchRecord& r) {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "UPDATE launches SET model=?, argv=?, env=?, pid=?, pid_start_time=?, preflight=?, start_ms=?, "
         "ready_ms=?, stop_ms=?, exit_status=?, state=?, why=?, log_path=?, port=? WHERE id=?",
         path_);
  bind_launch(s, r);
  s.bind(15, r.id);
  s.step();
  if (sqlite3_changes(db_) != 1)
    throw StoreError(path_ + ": update_launch: no launch with id " + std::to_string(r.id));
}

std::optional<LaunchRecord> Store::launch(int64_t id) const {
  std::lock_guard lk(mu_);
  Stmt s(db_, std::string("SELECT ") + k_launch_cols + " FROM launches WHERE id = ?", path_);
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_launch(s);
}

std::optional<LaunchRecord> Store::latest_launch() const {
  std::lock_guard lk(mu_);
  Stmt s(db_, std::string("SELECT ") + k_launch_cols + " FROM launches ORDER BY id DESC LIMIT 1", path_);
  if (!s.step()) return std::nullopt;
  return read_launch(s);
}

std::vector<LaunchRecord> Store::unfinished_launches() const {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         std::string("SELECT ") + k_launch_cols +
             " FROM launches WHERE state NOT IN ('stopped','failed') ORDER BY id",
         path_);
  std::vector<LaunchRecord> out;
  while (s.step()) out.push_back(read_launch(s));
  return out;
}

std::vector<LaunchRecord> Store::recent_launches(int limit) const {
  std::lock_guard lk(mu_);
  Stmt s(db_, std::string("SELECT ") + k_launch_cols + " FROM launches ORDER BY id DESC LIMIT ?", path_);
  s.bind(1, limit);
  std::vector<LaunchRecord> out;
  while (s.step()) out.push_back(read_launch(s));
  return out;
}

void Store::add_event(std::string_view kind, std::string_view model, const nlohmann::json& detail) {
  std::lock_guard lk(mu_);
  Stmt s(db_, "INSERT INTO events(time_ms, kind, model, detail) VALUES (?,?,?,?)", path_);
  s.bind(1, now_ms()).bind(2, kind).bind(3, model).bind(4, dump_safe(detail));
  s.step();
}

std::vector<nlohmann::json> Store::recent_events(int limit) const {
  std::lock_guard lk(mu_);
  Stmt s(db_, "SELECT id, time_ms, kind, model, detail FROM events ORDER BY id DESC LIMIT ?", path_);
  s.bind(1, limit);
  std::vector<nlohmann::json> out;
  while (s.step())
    out.push_back({{"id", s.i64(0)}, {"time_ms", s.i64(1)}, {"kind", s.text(2)}, {"model", s.text(3)},
                   {"detail", s.json_col(4)}});
  return out;
}

void Store::add_request(const RequestRecord& r) {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "INSERT INTO requests(time_ms, route, model, alias, stream, status, prompt_tokens, "
         "completion_tokens, ttft_ms, total_ms, decode_tok_s, error_code) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
         path_);
  s.bind(1, r.time_ms ? r.time_ms : now_ms()).bind(2, r.route).bind(3, r.model).bind(4, r.alias)
      .bind(5, r.stream ? 1 : 0).bind(6, r.status).bind(7, r.prompt_tokens).bind(8, r.completion_tokens)
      .bind(9, r.ttft_ms).bind(10, r.total_ms).bind(11, r.decode_tok_s).bind(12, r.error_code);
  s.step();
}

std::vector<RequestRecord> Store::recent_requests(int limit) const {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "SELECT time_ms, route, model, alias, stream, status, prompt_tokens, completion_tokens, ttft_ms, "
         "total_ms, decode_tok_s, error_code FROM requests ORDER BY id DESC LIMIT ?",
         path_);
  s.bind(1, limit);
  std::vector<RequestRecord> out;
  while (s.step()) {
    RequestRecord r;
    r.time_ms = s.i64(0);
    r.route = s.text(1);
    r.model = s.text(2);
    r.alias = s.text(3);
    r.stream = s.i64(4) != 0;
    r.status = static_cast<int>(s.i64(5));
    r.prompt_tokens = s.i64(6);
    r.completion_tokens = s.i64(7);
    r.ttft_ms = s.dbl(8);
    r.total_ms = s.dbl(9);
    r.decode_tok_s = s.dbl(10);
    r.error_code = s.text(11);
    out.push_back(std::move(r));
  }
  return out;
}

int64_t Store::count_requests(std::string_view route) const {
  std::lock_guard lk(mu_);
  Stmt s(db_, "SELECT COUNT(*) FROM requests WHERE route = ?", path_);
  s.bind(1, route);
  return s.step() ? s.i64(0) : 0;
}

void Store::add_measured_memory(const MeasuredMemory& m) {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "INSERT INTO measured_memory(model, ctx, engine_build, peak_vram_gib, host_rss_gib, load_s, time_ms) "
         "VALUES (?,?,?,?,?,?,?)",
         path_);
  s.bind(1, m.model).bind(2, m.ctx).bind(3, m.engine_build).bind(4, m.peak_vram_gib).bind(5, m.host_rss_gib)
      .bind(6, m.load_s).bind(7, m.time_ms ? m.time_ms : now_ms());
  s.step();
}

std::optional<MeasuredMemory> Store::last_measured_memory(std::string_view model, int64_t ctx) const {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "SELECT model, ctx, engine_build, peak_vram_gib, host_rss_gib, load_s, time_ms FROM measured_memory "
         "WHERE model = ? AND ctx = ? ORDER BY id DESC LIMIT 1",
         path_);
  s.bind(1, model).bind(2, ctx);
  if (!s.step()) return std::nullopt;
  MeasuredMemory m;
  m.model = s.text(0);
  m.ctx = s.i64(1);
  m.engine_build = s.text(2);
  m.peak_vram_gib = s.dbl(3);
  m.host_rss_gib = s.dbl(4);
  m.load_s = s.dbl(5);
  m.time_ms = s.i64(6);
  return m;
}

void Store::put_document(std::string_view ns, std::string_view key, const nlohmann::json& value,
                         int64_t expires_ms) {
  std::lock_guard lk(mu_);
  Stmt s(db_,
         "INSERT INTO documents(ns, key, value, expires_ms) VALUES (?,?,?,?) "
         "ON CONFLICT(ns, key) DO UPDATE SET value = excluded.value, expires_ms = excluded.expires_ms",
         path_);
  s.bind(1, ns).bind(2, key).bind(3, dump_safe(value)).bind(4, expires_ms);
  s.step();
}

std::optional<nlohmann::json> Store::get_document(std::string_view ns, std::string_view key) const {
  std::lock_guard lk(mu_);
  Stmt s(db_, "SELECT value, expires_ms FROM documents WHERE ns = ? AND key = ?", path_);
  s.bind(1, ns).bind(2, key);
  if (!s.step()) return std::nullopt;
  int64_t expires = s.i64(1);
  if (expires != 0 && expires <= now_ms()) return std::nullopt;
  return s.json_col(0);
}

PruneCounts Store::prune(const Retention& r, int64_t now) {
  std::lock_guard lk(mu_);
  PruneCounts n;
  exec(db_, "BEGIN IMMEDIATE", path_);
  try {
    if (r.responses_max_ms) {
      Stmt clamp(db_,
                 "UPDATE documents SET expires_ms = ? WHERE ns = 'responses' AND (expires_ms = 0 OR expires_ms > ?)",
                 path_);
      clamp.bind(1, now + *r.responses_max_ms).bind(2, now + *r.responses_max_ms).step();
    }
    Stmt docs(db_, "DELETE FROM documents WHERE expires_ms != 0 AND expires_ms <= ?", path_);
    docs.bind(1, now).step();
    n.documents = sqlite3_changes(db_);
    for (const char* table : {"requests", "events"}) {
      int64_t& count = std::string_view(table) == "requests" ? n.requests : n.events;
      if (r.history_max_age_ms > 0) {
        Stmt old(db_, std::string("DELETE FROM ") + table + " WHERE time_ms < ?", path_);
        old.bind(1, now - r.history_max_age_ms).step();
        count += sqlite3_changes(db_);
      }
      if (r.history_max_rows > 0) {
        Stmt extra(db_,
                   std::string("DELETE FROM ") + table + " WHERE id <= (SELECT id FROM " + table +
                       " ORDER BY id DESC LIMIT 1 OFFSET ?)",
                   path_);
        extra.bind(1, r.history_max_rows).step();
        count += sqlite3_changes(db_);
      }
    }
    exec(db_, "COMMIT", path_);
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  // The deleted pages are zeroed (secure_delete); a truncating checkpoint also drops the WAL
  // frames that still held them. A reader holding the WAL open makes this a no-op until later.
  if (n.total() > 0) sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
  return n;
}

int64_t Store::count_events() const {
  std::lock_guard lk(mu_);
  Stmt s(db_, "SELECT COUNT(*) FROM events", path_);
  return s.step() ? s.i64(0) : 0;
}

}  // namespace servedeck::state
