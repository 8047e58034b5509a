// The hot-expert profile: how often each routed expert of each MoE layer was picked, captured by
// one run of the worker (--capture-profile) and read by the next (--hot-profile) to fill the
// VRAM hot-expert cache with each layer's most routed experts (ExpertStore::fill_hot_cache).
//
// File format: one JSON object {"layout": "layers=L experts=E offloaded=all", "counts": [[c, ...],
// ...]}, a row of E non-negative integers per MoE layer. CPU-only code: CI tests it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace servedeck::worker::offload {

/// Per-layer routing counts: counts[layer][expert], and the layout they were captured at.
struct ExpertProfile {
  std::vector<std::vector<uint64_t>> counts;
  std::string layout;  // e.g. "layers=48 experts=128 offloaded=all" (expert_profile_layout)
};

/// Largest profile file read, bytes (a 128-layer, 1024-expert profile of 20-digit counts is ~2.7 MB).
inline constexpr std::size_t k_max_profile_bytes = 16u * 1024 * 1024;
/// Most rows (MoE layers) and most counts per row (experts) a profile may hold.
inline constexpr std::size_t k_max_profile_layers = 1024;
inline constexpr std::size_t k_max_profile_experts = 65536;

/// The layout string of a launch whose `moe_layers` MoE layers of `experts` routed experts are
/// all offloaded: "layers=<moe_layers> experts=<experts> offloaded=all".
std::string expert_profile_layout(int moe_layers, int experts);

/// Reads the profile at `path`; nullopt when nothing exists there (ENOENT: the file or a
/// directory on the way is missing; a dangling symlink too). Throws std::runtime_error naming
/// the path, what was read and what was expected when it cannot be opened or read, is not a
/// regular file, is larger than k_max_profile_bytes, is not JSON, or is not {"layout": string,
/// "counts": [[non-negative integer ...] ...]} within the limits above.
std::optional<ExpertProfile> read_expert_profile(const std::string& path);

/// Writes `p` to `path`: the parent directory is created if missing, the bytes go to a unique
/// sibling temporary file (mkstemp), fsync'd, renamed over `path` (a symlink there is replaced,
/// its target left alone), then the directory is fsync'd: a reader, or the next start after a
/// crash, sees the old file or the new one, whole. Throws std::runtime_error naming the path and
/// the failing call; the temporary file is removed.
void write_expert_profile(const ExpertProfile& p, const std::string& path);

/// The profile a run leaves when it loaded `before` and routed `run`: the element-wise sum
/// (saturating at 2^64 − 1) when both have the same layout and row lengths, so a short run adds
/// to the history instead of replacing it; otherwise `run` alone (the launch's shape changed).
ExpertProfile accumulate_expert_profile(const ExpertProfile& before, const ExpertProfile& run);

}  // namespace servedeck::worker::offload
