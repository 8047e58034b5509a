// What a /dev/shm glob may be. The reaper unlinks files that match a model's shm_globs, so a glob
// must name only that engine's buffers: a file directly in /dev/shm whose name starts with at
// least k_min_shm_glob_prefix literal characters ("/dev/shm/flashnext-kv-*"). "/dev/shm/*",
// "/dev/shm/*-kv" or "/dev/shm/?x*" would match other programs' files (browsers, PulseAudio,
// other engines) and are refused. Header-only: the registry refuses such a glob at load and lint
// time, the reaper refuses it again at run time (a registry built in code skips the parser).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace servedeck::registry {

/// Literal characters a glob's file name must start with before its first wildcard.
inline constexpr std::size_t k_min_shm_glob_prefix = 3;

/// nullopt when `glob` is acceptable, else what is wrong with it (for "<key> = \"<glob>\" " + it).
inline std::optional<std::string> shm_glob_problem(std::string_view glob) {
  constexpr std::string_view dir = "/dev/shm/";
  if (glob.substr(0, dir.size()) != dir) return "must start with /dev/shm/ (the reaper unlinks only there)";
  std::string_view name = glob.substr(dir.size());
  if (name.find('/') != std::string_view::npos || name == "." || name == "..")
    return "must name files directly in /dev/shm/ (no '/' or '..' after it)";
  std::size_t literal = name.find_first_of("*?[\\");
  if (literal == std::string_view::npos) literal = name.size();
  if (literal < k_min_shm_glob_prefix)
    return "is too broad: the file name must start with at least " + std::to_string(k_min_shm_glob_prefix) +
           " literal characters before any wildcard (e.g. \"/dev/shm/flashnext-kv-*\"), or the reaper would "
           "unlink other programs' buffers";
  return std::nullopt;
}

}  // namespace servedeck::registry
