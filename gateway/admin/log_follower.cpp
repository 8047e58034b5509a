#include "gateway/admin/log_follower.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <thread>

#include "gateway/supervisor/launch_log.hpp"

namespace servedeck::admin {

namespace {

int64_t size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : int64_t{0};
}

void follow(const std::string& path, int lines, http::Responder& res, const FollowOptions& opt, bool& started) {
  std::string first = supervisor::tail_lines(path, lines);
  if (!res.start_stream(200, "text/plain; charset=utf-8")) return;
  started = true;
  if (!first.empty() && !res.write(first + "\n")) return;
  int64_t offset = size_of(path);
  bool caught_up = true;
  while (!res.client_gone()) {
    if (caught_up || res.queued_bytes() > opt.max_queued_bytes)
      std::this_thread::sleep_for(std::chrono::milliseconds(opt.poll_ms));
    if (res.queued_bytes() > opt.max_queued_bytes) continue;
    const int64_t size = size_of(path);
    if (size < offset) offset = 0;  // copy-truncated: start over at the new beginning
    caught_up = size == offset;
    if (caught_up) continue;
    const auto want = std::min<int64_t>(size - offset, static_cast<int64_t>(opt.max_read_bytes));
    std::ifstream f(path, std::ios::binary);
    f.seekg(offset);
    std::string chunk(static_cast<std::size_t>(want), '\0');
    f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    chunk.resize(static_cast<std::size_t>(std::max<std::streamsize>(f.gcount(), 0)));
    if (chunk.empty()) {  // replaced or shrunk between the stat and the read: look again later
      caught_up = true;
      continue;
    }
    offset += static_cast<int64_t>(chunk.size());
    caught_up = offset >= size;
    if (!res.write(chunk)) return;
  }
}

}  // namespace

std::string follow_log(const std::string& path, int lines, const std::shared_ptr<http::Responder>& res,
                       const FollowOptions& options) {
  bool started = false;
  std::string error;
  try {
    follow(path, lines, *res, options, started);
  } catch (const std::exception& e) {
    error = "following " + path + " stopped: " + e.what();
  } catch (...) {
    error = "following " + path + " stopped: unknown exception";
  }
  try {
    if (!error.empty()) {
      if (started) res->write("\nservedeck: " + error + "\n");
      else http::send_error(*res, 500, error, "servedeck_admin_error", "log_follow_failed");
    }
    res->end();
  } catch (const std::exception&) {
    // The client's connection failed too: nothing more can be said to it.
  }
  return error;
}

}  // namespace servedeck::admin
