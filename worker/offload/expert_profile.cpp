#include "worker/offload/expert_profile.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
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
  // One descriptor, opened without blocking (a FIFO put in its place cannot hang the load) and
  // checked with fstat, so what is checked is what is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw bad(path, std::string("cannot open: ") + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw bad(path, std::string("fstat failed: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw bad(path, "not a regular file");
  if (static_cast<std::size_t>(st.st_size) > k_max_profile_bytes)
    throw bad(path, std::to_string(st.st_size) + " bytes, more than the " + std::to_string(k_max_profile_bytes) + " a profile may hold");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw bad(path, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) break;  // the file shrank while read: parse what is there
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
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
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw bad(path, "cannot create " + dir.string() + ": " + ec.message());
  // A unique sibling (mkstemp), written, fsync'd and closed with every error checked, renamed
  // over the path, then the directory fsync'd: after a crash the path holds the old profile or
  // the new one, whole.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw bad(path, "cannot create a temporary file beside it: " + std::string(std::strerror(errno)));
  const std::string text = dump_safe(nlohmann::json{{"layout", p.layout}, {"counts", p.counts}}) + "\n";
  std::string why;
  for (std::size_t done = 0; why.empty() && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) why = std::string("write to ") + tmp + " failed: " + std::strerror(errno);
    else done += static_cast<std::size_t>(n);
  }
  if (why.empty() && ::fsync(fd) != 0) why = std::string("fsync of ") + tmp + " failed: " + std::strerror(errno);
  if (::close(fd) != 0 && why.empty()) why = std::string("close of ") + tmp + " failed: " + std::strerror(errno);
  if (why.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) why = "rename from " + tmp + " failed: " + std::strerror(errno);
  if (!why.empty()) {
    std::filesystem::remove(tmp, ec);
    throw bad(path, why);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: the rename is done either way
    ::close(dfd);
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
