// The log follower of GET /admin/logs?follow=1 against a real file and a recording responder:
// bounded reads, and a failure that ends the client's stream with an error line instead of
// escaping its detached thread (which would terminate the daemon).
#include <doctest/doctest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gateway/admin/log_follower.hpp"

using namespace servedeck;

namespace {

std::string temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "sd-follow-XXXXXX").string();
  return mkdtemp(t.data()) ? t : "";
}

/// Polls `pred` every 10 ms until true or `timeout_ms`.
bool wait_for(const std::function<bool()>& pred, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// Records the stream; `throw_on_write` > 0 makes that write (1-based) throw.
struct RecordingResponder : http::Responder {
  mutable std::mutex mu;
  std::vector<std::string> writes;
  int status = 0;
  std::string body;
  std::atomic<bool> gone{false};
  std::atomic<bool> ended{false};
  int throw_on_write = 0;

  void send(int s, std::string, std::string b, http::Headers) override {
    std::lock_guard lk(mu);
    status = s;
    body = std::move(b);
  }
  bool start_stream(int s, std::string, http::Headers) override {
    std::lock_guard lk(mu);
    status = s;
    return true;
  }
  bool write(std::string_view bytes) override {
    std::lock_guard lk(mu);
    writes.emplace_back(bytes);
    if (static_cast<int>(writes.size()) == throw_on_write) throw std::runtime_error("the socket caught fire");
    return true;
  }
  void end() override { ended = true; }
  bool client_gone() const override { return gone; }
  void on_disconnect(std::function<void()>) override {}

  std::string all() const {
    std::lock_guard lk(mu);
    std::string out;
    for (const auto& w : writes) out += w;
    return out;
  }
  std::size_t largest_write() const {
    std::lock_guard lk(mu);
    std::size_t n = 0;
    for (const auto& w : writes) n = std::max(n, w.size());
    return n;
  }
};

void append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::app) << text;
}

}  // namespace

TEST_CASE("a log that grew by more than a read's bound is sent in bounded reads, every byte in order") {
  // Regression: the whole growth since the last poll was read in one allocation.
  const std::string dir = temp_dir();
  const std::string path = dir + "/m-1.log";
  append(path, "line one\nline two\n");
  auto res = std::make_shared<RecordingResponder>();
  admin::FollowOptions opt;
  opt.poll_ms = 10;
  opt.max_read_bytes = 64 * 1024;
  std::string error = "not returned";
  std::thread follower([&] { error = admin::follow_log(path, 1, res, opt); });
  REQUIRE(wait_for([&] { return res->all() == "line two\n"; }, 5000));
  std::string grown;
  for (int i = 0; grown.size() < 3 * opt.max_read_bytes + 17; ++i) grown += "engine line " + std::to_string(i) + "\n";
  append(path, grown);
  CHECK(wait_for([&] { return res->all().size() == 9 + grown.size(); }, 10000));
  res->gone = true;
  follower.join();
  CHECK(res->all() == "line two\n" + grown);
  CHECK(res->largest_write() <= opt.max_read_bytes);
  CHECK(error.empty());
  CHECK(res->ended);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a failure while following ends the stream with an error line and is returned, never thrown") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/m-1.log";
  append(path, "old\n");
  auto res = std::make_shared<RecordingResponder>();
  res->throw_on_write = 2;  // the first write is the tail; the second, the growth, throws
  admin::FollowOptions opt;
  opt.poll_ms = 10;
  std::string error = "not returned";
  std::thread follower([&] {
    try {
      error = admin::follow_log(path, 5, res, opt);
    } catch (...) {
      error = "thrown";
    }
  });
  REQUIRE(wait_for([&] { return res->all() == "old\n"; }, 5000));
  append(path, "new\n");
  follower.join();  // it ends by itself
  CHECK(error == "following " + path + " stopped: the socket caught fire");
  const std::string all = res->all();
  CHECK(all.size() >= error.size());
  CHECK(all.substr(all.size() - error.size() - 1) == error + "\n");
  CHECK(all.find("\nservedeck: following ") != std::string::npos);
  CHECK(res->ended);
  std::filesystem::remove_all(dir);
}
