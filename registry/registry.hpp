// Loading, validating and linting models.toml (toml++), and rendering an entry's launch.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "registry/model_entry.hpp"

namespace servedeck::registry {

/// One problem found in models.toml: `models.toml:41 models.glm53.ctx = 400000 exceeds
/// validated_ctx = 327680`. Severity "error" makes the file unusable; "warning" does not.
struct Diagnostic {
  std::string severity;  // "error" | "warning"
  SourceLocation location;
  std::string key;       // dotted path, e.g. "models.glm53.ctx"
  std::string message;   // starts with the key and the value read, then what is valid:
                         // "models.glm53.ctx = 400000 exceeds validated_ctx = 327680"
  std::string to_string() const;  // "file:line: severity: message" (no line when 0)
};

/// Thrown by load_registry when any error-severity diagnostic exists; carries all of them.
struct RegistryError : std::runtime_error {
  explicit RegistryError(std::vector<Diagnostic> diagnostics);
  std::vector<Diagnostic> diagnostics;
};

/// Parses and validates `path`; fills defaults; discovers model_max_ctx from
/// `<checkpoint>/config.json` (max_position_embeddings, through text_config when nested) when
/// not declared. Throws RegistryError with every problem found (not only the first).
Registry load_registry(const std::string& path);

/// The text of `path`, read with the registry's size bound (4 MiB; a device such as /dev/zero is
/// refused once past it). nullopt with `error` naming the path and the cause otherwise.
std::optional<std::string> read_registry_file(const std::string& path, std::string& error);

/// Same, from text (tests). `path` names the text in diagnostics; relative paths in the text
/// resolve against the directory of `path`.
Registry parse_registry(std::string_view text, const std::string& path);

/// Non-throwing form: fills `diagnostics` with every error and warning (parse, validation,
/// discovery; not the [[rules]]) and returns what could be read. Use only when no diagnostic has
/// severity "error" for anything beyond display.
Registry parse_registry(std::string_view text, const std::string& path, std::vector<Diagnostic>& diagnostics);

/// Every diagnostic for `path`: parse/validation errors, then the [[rules]] evaluated against
/// every entry (preflight/rules), then warnings. Never throws for content problems.
std::vector<Diagnostic> lint_registry(const std::string& path);

/// True for a usable [models.NAME] key: 1 to 64 of [A-Za-z0-9._-], the first a letter or digit
/// (so that `{state_dir}/.../{name}.json` stays inside state_dir). parse_registry reports others.
bool valid_model_name(std::string_view name);

/// A launch with placeholders filled in. Placeholders: {port} {host} {ctx} {model} (checkpoint)
/// {served_name} {gpu} {kv_cache_bytes} {util} {cpu_offload_gib} {name} {state_dir}.
/// An unknown placeholder is an error at load time, not here.
struct LaunchSpec {
  std::string program;
  std::vector<std::string> argv;             // argv[0] == program
  std::map<std::string, std::string> env;    // only the registry's variables (+ CUDA_VISIBLE_DEVICES)
  std::string host;
  int port = 0;
};

/// Renders `m`'s launch for `port` (the actual port when m.port == 0 was resolved by the caller).
/// Paths in the entry are already absolute (resolved at load); `program` stays a bare name when
/// written as one (the launcher searches $PATH; see resolve_program in registry/discovery.hpp).
LaunchSpec render_launch(const ModelEntry& m, int port, const ServerConfig& server);

/// The placeholder names render_launch fills (without braces).
const std::vector<std::string>& placeholder_names();
/// Every `{name}` in `text` (name: lowercase letters, digits, '_'); JSON such as
/// `{"moe_backend":"marlin"}` contains none.
std::vector<std::string> placeholders_in(std::string_view text);
/// The values render_launch uses for `m` at `port`; a placeholder whose source is unset is absent.
std::map<std::string, std::string> placeholder_values(const ModelEntry& m, int port, const ServerConfig& server);

}  // namespace servedeck::registry
