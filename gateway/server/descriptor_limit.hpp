// The daemon's file-descriptor budget: RLIMIT_NOFILE against the HTTP server's max_connections.
//
// Every client connection is a descriptor, and a proxied request holds a second one to its
// engine; the daemon itself keeps some (the state store's database, WAL and shared memory, the
// lock, launch logs, the engine's pidfd and pipes, epoll and event descriptors, NVML's device
// files, /proc scans). With the usual soft limit of 1024 and max_connections 4096 the process ran
// out of descriptors long before the server's 503 "too many connections" could answer: accept()
// failed with EMFILE and clients waited in the backlog. So at start the soft limit is raised to
// the hard one, and max_connections is clamped to what is left.
//
// Thread-safety: call once at start, before any thread is started.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace servedeck::gateway {

/// Descriptors kept for the daemon's own files. note: a daemon with a ready (fake) engine held 35
/// with 22 idle client connections, so ~13 of its own (/proc/PID/fd: store, logs, epoll,
/// eventfds, pidfd, pipes); NVML opens about ten per GPU, vLLM's engine is reached over more
/// connections; 256 leaves room for those and transient ones (a capture file, a holder scan, a
/// log rotation).
inline constexpr std::uint64_t k_reserved_descriptors = 256;

/// What raise_descriptor_limit() found and did.
struct DescriptorLimit {
  std::uint64_t soft_before = 0;  // the soft limit the process started with
  std::uint64_t soft = 0;         // the soft limit now
  std::uint64_t hard = 0;         // the hard limit (nr_open when it is unlimited)
  std::string error;              // why raising failed ("" when it did not)
};

/// Raises RLIMIT_NOFILE's soft limit to its hard limit (to /proc/sys/fs/nr_open when the hard
/// limit is unlimited: the kernel refuses more). Never throws; a failure is reported in `error`
/// and leaves the limit as it was.
DescriptorLimit raise_descriptor_limit();

/// The connections that fit in `soft` descriptors: min(wanted, (soft − k_reserved_descriptors) / 2)
/// — half, because each proxied client connection holds one more to its engine — and at least 4.
std::size_t connections_for_descriptors(std::uint64_t soft, std::size_t wanted);

/// "descriptors: soft limit 1024 raised to 524288 (hard 524288); max_connections 4096": the
/// start-up log line for `limit` and the chosen `max_connections`.
std::string describe(const DescriptorLimit& limit, std::size_t max_connections);

}  // namespace servedeck::gateway
