// Who holds a TCP port: the processes with a listening socket on it, from the kernel's socket
// tables (/proc/net/tcp, /proc/net/tcp6: local port, state 0A = LISTEN, socket inode) matched
// against every process's open descriptors (/proc/PID/fd -> "socket:[INODE]"). A start that
// would fail on "Address already in use" names them instead of leaving the engine's own error.
//
// Only processes whose /proc/PID/fd the daemon may read are found (all of them as root; the
// daemon user's own otherwise); a socket whose holder cannot be read is reported as
// "held by a process this daemon cannot inspect".
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace servedeck::supervisor {

struct Holder {
  int64_t pid = 0;
  std::string command;  // /proc/PID/cmdline, arguments joined by spaces (at most 200 bytes), else comm
  /// "pid 123 (python3 -m vllm.entrypoints.openai.api_server --port 8101)"
  std::string describe() const;
};

/// The command line of `pid` as Holder::command spells it; "" when the process is gone.
std::string process_command(int64_t pid, const std::string& proc_root = "/proc");

/// Inodes of the sockets listening on TCP `port` (IPv4 and IPv6, any local address).
std::vector<uint64_t> listening_socket_inodes(int port, const std::string& proc_root = "/proc");

/// The processes holding a socket that listens on TCP `port`; empty when the port is free.
std::vector<Holder> tcp_port_holders(int port, const std::string& proc_root = "/proc");

/// What holds `port`, as one sentence for an error ("port 8101 is held by pid 123 (...)"), or ""
/// when nothing listens on it.
std::string describe_port_holders(int port, const std::string& proc_root = "/proc");

}  // namespace servedeck::supervisor
