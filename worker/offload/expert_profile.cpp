#include "worker/offload/expert_profile.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "common/json_limits.hpp"

namespace servedeck::worker::offload {

namespace {

std::runtime_error bad(const std::string& path, const std::string& what) {
  return std::runtime_error("hot-expert profile " + path + ": " + what);
}

std::string describe(const nlohmann::json& v) {
  std::string s = dump_safe(v);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

}  // namespace

std::string expert_profile_layout(int moe_layers, int experts) {
  return "layers=" + std::to_string(moe_layers) + " experts=" + std::to_string(experts) + " offloaded=all";
}

std::optional<ExpertProfile> read_expert_profile(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw bad(path, std::string("stat failed: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw bad(path, "not a regular file");
  if (static_cast<std::size_t>(st.st_size) > k_max_profile_bytes)
    throw bad(path, std::to_string(st.st_size) + " bytes, more than the " + std::to_string(k_max_profile_bytes) + " a profile may hold");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad(path, "cannot open");
  std::string text;
  text.resize(static_cast<std::size_t>(st.st_size));
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  JsonError err;
  JsonLimits limits;
  limits.max_bytes = k_max_profile_bytes;
  limits.max_depth = 4;
  const nlohmann::json j = parse_untrusted(text, &err, limits);
  if (j.is_discarded()) throw bad(path, err.message);
  const char* shape = "expected {\"layout\": string, \"counts\": [[non-negative integer, ...], ...]}";
  if (!j.is_object()) throw bad(path, std::string("read ") + j.type_name() + ", " + shape);
  const auto counts = j.find("counts");
  if (counts == j.end() || !counts->is_array()) throw bad(path, std::string("no \"counts\" array; ") + shape);
  ExpertProfile p;
  if (const auto layout = j.find("layout"); layout != j.end()) {
    if (!layout->is_string()) throw bad(path, "\"layout\" is " + describe(*layout) + ", expected a string");
    p.layout = layout->get<std::string>();
  }
  if (counts->size() > k_max_profile_layers)
    throw bad(path, std::to_string(counts->size()) + " rows, more than " + std::to_string(k_max_profile_layers) + " layers");
  for (std::size_t l = 0; l < counts->size(); ++l) {
    const nlohmann::json& row = (*counts)[l];
    const std::string where = "counts[" + std::to_string(l) + "]";
    if (!row.is_array()) throw bad(path, where + " is " + describe(row) + ", expected an array of counts");
    if (row.size() > k_max_profile_experts)
      throw bad(path, where + " holds " + std::to_string(row.size()) + " counts, more than " + std::to_string(k_max_profile_experts));
    std::vector<uint64_t> r;
    r.reserve(row.size());
    for (std::size_t e = 0; e < row.size(); ++e) {
      if (!row[e].is_number_unsigned())
        throw bad(path, where + "[" + std::to_string(e) + "] is " + describe(row[e]) + ", expected a non-negative integer");
      r.push_back(row[e].get<uint64_t>());
    }
    p.counts.push_back(std::move(r));
  }
  return p;
}

void write_expert_profile(const ExpertProfile& p, const std::string& path) {
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) throw bad(path, "cannot create " + target.parent_path().string() + ": " + ec.message());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw bad(path, "cannot write " + tmp + ": " + std::strerror(errno));
    out << dump_safe(nlohmann::json{{"layout", p.layout}, {"counts", p.counts}}) << "\n";
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      throw bad(path, "writing " + tmp + " failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::filesystem::remove(tmp, ec);
    throw bad(path, "rename from " + tmp + " failed: " + why);
  }
}

ExpertProfile accumulate_expert_profile(const ExpertProfile& before, const ExpertProfile& run) {
  if (before.layout != run.layout || before.counts.size() != run.counts.size()) return run;
  for (std::size_t l = 0; l < run.counts.size(); ++l)
    if (before.counts[l].size() != run.counts[l].size()) return run;
  ExpertProfile out = run;
  constexpr uint64_t top = std::numeric_limits<uint64_t>::max();
  for (std::size_t l = 0; l < out.counts.size(); ++l)
    for (std::size_t e = 0; e < out.counts[l].size(); ++e) {
      const uint64_t a = before.counts[l][e];
      out.counts[l][e] = out.counts[l][e] > top - a ? top : out.counts[l][e] + a;
    }
  return out;
}

}  // namespace servedeck::worker::offload
