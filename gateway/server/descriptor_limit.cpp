#include "gateway/server/descriptor_limit.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace servedeck::gateway {

namespace {

std::uint64_t nr_open() {
  std::ifstream f("/proc/sys/fs/nr_open");
  std::uint64_t n = 0;
  return f >> n && n > 0 ? n : std::uint64_t{1} << 20;  // the kernel's default when unreadable
}

}  // namespace

DescriptorLimit raise_descriptor_limit() {
  DescriptorLimit out;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    out.error = std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno);
    return out;
  }
  out.soft_before = out.soft = rl.rlim_cur;
  out.hard = rl.rlim_max == RLIM_INFINITY ? nr_open() : rl.rlim_max;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= out.hard) return out;
  rlimit raised = rl;
  raised.rlim_cur = out.hard;
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    out.error = "setrlimit(RLIMIT_NOFILE, " + std::to_string(out.hard) + "): " + std::strerror(errno);
    return out;
  }
  out.soft = out.hard;
  return out;
}

std::size_t connections_for_descriptors(std::uint64_t soft, std::size_t wanted) {
  const std::uint64_t left = soft > k_reserved_descriptors ? soft - k_reserved_descriptors : 0;
  const std::uint64_t fit = std::max<std::uint64_t>(left / 2, 4);
  return static_cast<std::size_t>(std::min<std::uint64_t>(wanted, fit));
}

std::string describe(const DescriptorLimit& limit, std::size_t max_connections) {
  std::string s = "descriptors: soft limit " + std::to_string(limit.soft_before);
  if (limit.soft != limit.soft_before) s += " raised to " + std::to_string(limit.soft);
  s += " (hard " + std::to_string(limit.hard) + ")";
  if (!limit.error.empty()) s += ", not raised: " + limit.error;
  s += "; max_connections " + std::to_string(max_connections) + " (" + std::to_string(k_reserved_descriptors) +
       " kept for the daemon, two per proxied connection)";
  return s;
}

}  // namespace servedeck::gateway
