#include "registry/toml_reader.hpp"

#include "common/json_limits.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

namespace servedeck::registry::detail {

void DiagnosticSink::error(int line, std::string key, std::string message) {
  diagnostics.push_back(Diagnostic{"error", SourceLocation{file, line, 0}, std::move(key), std::move(message)});
}
void DiagnosticSink::warning(int line, std::string key, std::string message) {
  diagnostics.push_back(Diagnostic{"warning", SourceLocation{file, line, 0}, std::move(key), std::move(message)});
}
bool DiagnosticSink::has_errors() const {
  return std::any_of(diagnostics.begin(), diagnostics.end(), [](const Diagnostic& d) { return d.severity == "error"; });
}

int line_of(const toml::node& n) { return static_cast<int>(n.source().begin.line); }

std::string format_number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string show(const toml::node& n) {
  if (auto s = n.as_string()) return dump_safe(nlohmann::json(s->get()));
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto f = n.as_floating_point()) return format_number(f->get());
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  if (n.is_array()) return "[...]";
  if (n.is_table()) return "{...}";
  return "(date/time)";
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(std::string_view key, const std::vector<std::string>& valid) {
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const auto& v : valid) {
    std::size_t d = edit_distance(key, v);
    // A key that contains the typo (or vice versa) is a likely match too: "offload" → "cpu_offload_gib".
    if (d < best_d) {
      best_d = d;
      best = v;
    }
  }
  std::size_t limit = std::max<std::size_t>(2, key.size() / 3);
  if (best_d <= limit) return best;
  for (const auto& v : valid)
    if (key.size() >= 3 && (v.find(key) != std::string::npos || key.find(v) != std::string::npos)) return v;
  return "";
}

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}
}  // namespace

TableReader::TableReader(const toml::table& t, std::string prefix, DiagnosticSink& sink,
                         std::vector<std::string> known)
    : table_(t), prefix_(std::move(prefix)), sink_(sink) {
  for (auto&& [k, v] : t) {
    std::string key(k.str());
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string hint = closest_key(key, known);
    std::string msg = "unknown key " + key_path(key) + " = " + show(v) + "; ";
    msg += hint.empty() ? "valid keys: " + join(known) : "did you mean '" + hint + "'?";
    sink_.error(static_cast<int>(k.source().begin.line ? k.source().begin.line : v.source().begin.line),
                key_path(key), msg);
  }
}

std::string TableReader::key_path(std::string_view key) const {
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

int TableReader::line(std::string_view key) const {
  if (auto n = table_.get(key)) return line_of(*n);
  return line_of(table_);
}

void TableReader::type_error(std::string_view key, std::string_view expected) {
  const toml::node* n = table_.get(key);
  sink_.error(line(key), key_path(key),
              key_path(key) + " = " + (n ? show(*n) : std::string("?")) + " has the wrong type; expected " +
                  std::string(expected));
}

std::optional<std::string> TableReader::string(std::string_view key) {
  const toml::node* n = table_.get(key);
  if (!n) return std::nullopt;
  if (auto s = n->as_string()) return s->get();
  type_error(key, "a string");
  return std::nullopt;
}

std::optional<bool> TableReader::boolean(std::string_view key) {
  const toml::node* n = table_.get(key);
  if (!n) return std::nullopt;
  if (auto b = n->as_boolean()) return b->get();
  type_error(key, "true or false");
  return std::nullopt;
}

std::optional<int64_t> TableReader::integer(std::string_view key, int64_t min, int64_t max, std::string_view what) {
  const toml::node* n = table_.get(key);
  if (!n) return std::nullopt;
  auto i = n->as_integer();
  if (!i) {
    type_error(key, "an integer (" + std::string(what) + ")");
    return std::nullopt;
  }
  int64_t v = i->get();
  if (v < min || v > max) {
    sink_.error(line(key), key_path(key),
                key_path(key) + " = " + std::to_string(v) + " is out of range; valid: " + std::to_string(min) +
                    " to " + std::to_string(max) + " (" + std::string(what) + ")");
    return std::nullopt;
  }
  return v;
}

std::optional<double> TableReader::number(std::string_view key, double min, double max, bool min_exclusive,
                                          std::string_view what) {
  const toml::node* n = table_.get(key);
  if (!n) return std::nullopt;
  double v = 0;
  if (auto i = n->as_integer()) v = static_cast<double>(i->get());
  else if (auto f = n->as_floating_point()) v = f->get();
  else {
    type_error(key, "a number (" + std::string(what) + ")");
    return std::nullopt;
  }
  bool low_ok = min_exclusive ? v > min : v >= min;
  if (!std::isfinite(v) || !low_ok || v > max) {
    sink_.error(line(key), key_path(key),
                key_path(key) + " = " + format_number(v) + " is out of range; valid: " + format_number(min) +
                    (min_exclusive ? " < " : " <= ") + std::string(key) + " <= " + format_number(max) + " (" +
                    std::string(what) + ")");
    return std::nullopt;
  }
  return v;
}

std::optional<std::vector<std::string>> TableReader::string_array(std::string_view key) {
  const toml::node* n = table_.get(key);
  if (!n) return std::nullopt;
  auto a = n->as_array();
  if (!a) {
    type_error(key, "an array of strings");
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool ok = true;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const toml::node& e = *a->get(i);
    if (auto s = e.as_string()) {
      out.push_back(s->get());
    } else {
      sink_.error(line_of(e) ? line_of(e) : line(key), key_path(key) + "[" + std::to_string(i) + "]",
                  key_path(key) + "[" + std::to_string(i) + "] = " + show(e) +
                      " has the wrong type; expected a string (quote numbers: \"8192\")");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<std::map<std::string, std::string>> TableReader::string_table(std::string_view key) {
  const toml::node* n = table_.get(key);
  if (!n) return std::nullopt;
  auto t = n->as_table();
  if (!t) {
    type_error(key, "a table of strings");
    return std::nullopt;
  }
  std::map<std::string, std::string> out;
  bool ok = true;
  for (auto&& [k, v] : *t) {
    std::string name(k.str());
    if (auto s = v.as_string()) {
      out[name] = s->get();
    } else {
      sink_.error(line_of(v), key_path(key) + "." + name,
                  key_path(key) + "." + name + " = " + show(v) +
                      " has the wrong type; expected a string (environment values are text: write \"" +
                      (v.is_number() ? show(v) : std::string("...")) + "\")");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

const toml::table* TableReader::subtable(std::string_view key) {
  const toml::node* n = table_.get(key);
  if (!n) return nullptr;
  if (auto t = n->as_table()) return t;
  type_error(key, "a table");
  return nullptr;
}

const toml::array* TableReader::array(std::string_view key) {
  const toml::node* n = table_.get(key);
  if (!n) return nullptr;
  if (auto a = n->as_array()) return a;
  type_error(key, "an array");
  return nullptr;
}

nlohmann::json to_json(const toml::node& n, std::map<std::string, int>* lines, const std::string& pointer) {
  if (lines) (*lines)[pointer] = line_of(n);
  if (auto s = n.as_string()) return s->get();
  if (auto i = n.as_integer()) return i->get();
  if (auto f = n.as_floating_point()) return f->get();
  if (auto b = n.as_boolean()) return b->get();
  if (auto a = n.as_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < a->size(); ++i)
      out.push_back(to_json(*a->get(i), lines, pointer + "/" + std::to_string(i)));
    return out;
  }
  if (auto t = n.as_table()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto&& [k, v] : *t) {
      std::string name(k.str());
      // JSON pointer escaping: ~ → ~0, / → ~1.
      std::string esc;
      for (char c : name) esc += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
      out[name] = to_json(v, lines, pointer + "/" + esc);
    }
    return out;
  }
  return "(date/time)";  // models.toml has no date or time keys
}

}  // namespace servedeck::registry::detail
