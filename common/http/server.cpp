// Implementation of common/http/server.hpp: Request::header, Server (listen, the accept loop,
// stop, post_blocking) and send_error. One connection is a Session (server_session.cpp) and
// the Responder a handler gets is ResponderImpl (server_responder.cpp); both are declared,
// with the design notes, in server_internal.hpp.
#include "common/http/server.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/http/server_internal.hpp"
#include "common/json_limits.hpp"
#include "common/openai_error.hpp"

namespace servedeck::http {

std::string Request::header(std::string_view name) const {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
  auto it = headers.find(key);
  return it == headers.end() ? std::string() : it->second;
}

// note: the core is shared with every Session, so a Responder kept by a producer thread past
// the Server's lifetime still refers to live memory (its writes are then dropped).
struct Server::Impl {
  std::shared_ptr<ServerCore> core = std::make_shared<ServerCore>();
};

void ServerCore::do_accept(const std::shared_ptr<ServerCore>& self) {
  acceptor->async_accept(asio::make_strand(ioc), [this, self](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (ec) {
      // Out of descriptors (or memory) the connection stays in the backlog and the next accept
      // fails at once: accepting again at once spun an I/O thread at full speed for as long as
      // the descriptors stayed taken. Wait, then try again; say so once per run of failures.
      if (!accept_failing)
        std::fprintf(stderr, "servedeck: http: accept on port %d failed (%s); retrying every %d ms\n", port,
                     ec.message().c_str(), k_accept_retry_ms);
      accept_failing = true;
      accept_retry->expires_after(std::chrono::milliseconds(k_accept_retry_ms));
      accept_retry->async_wait([this, self](error_code wait_ec) {
        if (wait_ec || stopped.load() || !acceptor->is_open()) return;
        do_accept(self);
      });
      return;
    }
    accept_failing = false;
    auto n = connections.fetch_add(1) + 1;
    auto s = std::make_shared<Session>(std::move(socket), self);
    if (n > opt.max_connections) {
      asio::dispatch(s->executor(), [s] { s->reject_busy(); });
    } else {
      s->start();
    }
    do_accept(self);
  });
}

Server::Server(ServerOptions options, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->core->opt = std::move(options);
  impl_->core->handler = std::move(handler);
}

Server::~Server() { stop(); }

void Server::start() {
  auto& im = *impl_->core;
  if (im.started) return;
  error_code ec;
  auto addr = asio::ip::make_address(im.opt.host, ec);
  if (ec) throw ServerError("cannot listen on " + im.opt.host + ":" + std::to_string(im.opt.port) +
                            ": not an IP address (" + ec.message() + ")");
  tcp::endpoint ep(addr, static_cast<unsigned short>(im.opt.port));
  im.acceptor.emplace(im.ioc);
  im.accept_retry.emplace(im.ioc);
  auto check = [&](const char* what) {
    if (ec) throw ServerError("cannot listen on " + im.opt.host + ":" + std::to_string(im.opt.port) + ": " + what +
                              ": " + ec.message());
  };
  im.acceptor->open(ep.protocol(), ec);
  check("open");
  im.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  check("SO_REUSEADDR");
  im.acceptor->bind(ep, ec);
  check("bind");
  im.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  check("listen");
  im.port = im.acceptor->local_endpoint().port();
  im.pool = std::make_unique<detail::BlockingPool>(im.opt.blocking_threads, 1024);
  im.work.emplace(im.ioc.get_executor());
  im.do_accept(impl_->core);
  for (int i = 0; i < std::max(1, im.opt.threads); ++i)
    im.threads.emplace_back([&im] {
      // A completion handler that throws ends its own connection's work only; the I/O thread
      // logs it and runs on (an exception leaving a std::thread is std::terminate).
      for (;;) {
        try {
          im.ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "servedeck: http I/O thread: a handler failed (the thread continues): %s\n", e.what());
        } catch (...) {
          std::fprintf(stderr, "servedeck: http I/O thread: a handler failed (the thread continues)\n");
        }
      }
    });
  im.started = true;
}

int Server::port() const { return impl_->core->port; }

void Server::stop() {
  auto& im = *impl_->core;
  if (!im.started || im.stopped.exchange(true)) return;
  // No Responder posts from here on; wait for posts already in progress.
  while (im.posting.load() != 0) std::this_thread::yield();
  asio::post(im.ioc, [&im] {
    error_code ignored;
    if (im.acceptor) im.acceptor->close(ignored);
  });
  // Pin the live sessions under the lock, close them outside it: a pinned session may lose its
  // other references meanwhile, and its destructor takes sessions_mu (dropping the last
  // reference while holding the lock deadlocked Server::stop).
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lk(im.sessions_mu);
    live.reserve(im.sessions.size());
    for (auto* s : im.sessions) {
      // The session may be in its destructor on another thread; weak_from_this is null then.
      if (auto sp = s->weak_from_this().lock()) live.push_back(std::move(sp));
    }
  }
  for (auto& sp : live) asio::post(sp->executor(), [sp] { sp->close_now(); });
  live.clear();
  im.work.reset();
  // With the listener and every socket closed, every pending operation completes (aborted)
  // and run() returns on its own.
  for (auto& t : im.threads)
    if (t.joinable()) t.join();
  im.threads.clear();
  // Handlers made ready by the last completions (none should remain; this breaks any cycle
  // session → core → io_context → handler → session).
  im.ioc.restart();
  im.ioc.poll();
  if (im.pool) im.pool->stop();
}

bool Server::post_blocking(std::function<void()> fn) {
  auto& im = *impl_->core;
  if (!im.pool) return false;
  return im.pool->post(std::move(fn));
}

void send_error(Responder& res, int status, std::string_view message, std::string_view type,
                std::string_view code, bool from_engine, Headers extra_headers) {
  res.send(status, "application/json",
           dump_safe(make_error(message, type, code, from_engine ? ErrorSource::engine : ErrorSource::servedeck)),
           std::move(extra_headers));
}

}  // namespace servedeck::http
