// The HTTP layer's listener (see http_listener.h).
#include "server/http_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>

namespace mla::server {

using Clock = HttpListener::Clock;

namespace {

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

int millis_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return int(std::clamp<int64_t>(ms, 0, 1 << 30));
}

thread_local int current_socket = -1;

}  // namespace

int serving_socket() { return current_socket; }

HttpListener::HttpListener(HttpCore& http, HttpCounters& counters, Limits limits, Hooks hooks)
    : http_(http), counters_(counters), limits_(limits), hooks_(std::move(hooks)) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("server: eventfd failed");
  work_pool_ = std::make_unique<Pool>(limits_.work_threads);
  liveness_pool_ = std::make_unique<Pool>(limits_.liveness_threads);
}

HttpListener::~HttpListener() {
  stop_pools();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void HttpListener::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void HttpListener::stop_pools() {
  work_pool_->shutdown();
  liveness_pool_->shutdown();
}

void HttpListener::close_connection(int fd) {
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  --counters_.open_connections;
}

int HttpListener::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) throw std::runtime_error("server: port " + std::to_string(port) + " is out of range");
  if (listen_fd_ >= 0) return port_;
  addrinfo hints{}, *ai = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &ai) != 0 || !ai)
    throw std::runtime_error("server: cannot resolve the address " + host);
  int fd = -1;
  for (addrinfo* a = ai; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0)
    throw std::runtime_error("server: cannot bind " + host + ":" + std::to_string(port) +
                             " (in use, or not an address of this machine)");
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string ip;
  int bound_port = 0;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !numeric_address(a, len, ip, bound_port)) {
    ::close(fd);
    throw std::runtime_error("server: cannot read the bound port");
  }
  listen_fd_ = fd;
  port_ = bound_port;
  http_.set_listen_socket(fd);
  return bound_port;
}

void HttpListener::serve_connection(int fd, std::string bytes) {
  ConnStream strm(fd, std::move(bytes), limits_.read_timeout, limits_.write_timeout);
  bool closed = false;
  const bool close = hooks_.stopping();
  bool ok = false;
  current_socket = fd;
  try {
    ok = http_.serve(strm, close, closed);
  } catch (...) {
    ok = false;
  }
  current_socket = -1;
  if (ok && !closed && !close && !hooks_.stopping()) {
    {
      std::lock_guard lk(returned_mu_);
      returned_.emplace_back(fd, strm.leftover());
    }
    wake();
  } else {
    close_connection(fd);
  }
}

// Accepts, reads every connection's next request without blocking, hands whole requests to a
// pool, until Hooks::done.
void HttpListener::run() {
  struct Pending {
    int fd;
    std::string buf;
    Clock::time_point deadline;
    bool continue_sent = false;
    bool lingering = false;  // answered with an error: reading what is left until EOF, then closed
  };
  std::vector<Pending> pending;
  const size_t read_cap = limits_.max_header_bytes + limits_.max_body_bytes + 1;
  auto reject = [&](Pending& c, int status, const std::string& message) {
    write_small_response(c.fd, status, hooks_.error_body(status, message));
    ::shutdown(c.fd, SHUT_WR);
    c.lingering = true;
    c.buf.clear();
    c.deadline = Clock::now() + std::chrono::seconds(1);
  };
  // Out of file descriptors (accept4 failing with EMFILE or ENFILE), a connection would stay in
  // the backlog and poll would report the listening socket readable at once, every time: the
  // listener would spin on a core until a descriptor came free. A descriptor held in reserve is
  // let go instead, the waiting connection accepted, answered 503 and closed, and the reserve
  // taken back, so each connection past the limit is told to retry at once. Where the reserve
  // cannot be had back, accepting pauses for 100 ms at a time.
  int spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  Clock::time_point accept_paused_until{};
  auto out_of_descriptors = [&] {
    ++counters_.rejected_descriptors;
    if (spare_fd >= 0) {
      ::close(spare_fd);
      if (const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC); fd >= 0) {
        const char* message = "the server has no file descriptor left for this connection; retry later";
        write_small_response(fd, 503, hooks_.error_body(503, message));
        ::close(fd);
      }
      spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (spare_fd < 0) accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
  };
  // Complete -> handed to a pool (false: stays pending or lingering).
  auto advance = [&](Pending& c) -> bool {
    if (c.lingering) return false;
    Head h = examine(c.buf, limits_.max_header_bytes, limits_.max_body_bytes, c.continue_sent);
    if (h.send_continue) {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)!::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL);
      c.continue_sent = true;
    }
    if (h.kind == Head::Reject) {
      ++counters_.errors;
      reject(c, h.status, h.message);
      return false;
    }
    if (h.kind != Head::Complete) return false;
    Pool& pool = hooks_.liveness(h) ? *liveness_pool_ : *work_pool_;
    pool.post([this, fd = c.fd, bytes = std::move(c.buf)]() mutable { serve_connection(fd, std::move(bytes)); });
    return true;
  };

  while (true) {
    const auto now = Clock::now();
    if (hooks_.done(now)) break;
    {
      std::vector<std::pair<int, std::string>> back;
      {
        std::lock_guard lk(returned_mu_);
        back.swap(returned_);
      }
      for (auto& [fd, rest] : back) {
        if (hooks_.stopping()) {
          close_connection(fd);
          continue;
        }
        pending.push_back({fd, std::move(rest), now + seconds(limits_.read_timeout)});
        if (!pending.back().buf.empty() && advance(pending.back())) pending.pop_back();
      }
    }
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, short(now < accept_paused_until ? 0 : POLLIN), 0});
    for (const Pending& c : pending) fds.push_back({c.fd, POLLIN, 0});
    Clock::time_point next = now + std::chrono::milliseconds(100);
    if (now < accept_paused_until) next = std::min(next, accept_paused_until);
    for (const Pending& c : pending) next = std::min(next, c.deadline);
    const int r = ::poll(fds.data(), nfds_t(fds.size()), std::max(1, millis_until(next)));
    if (r < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof v);
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) out_of_descriptors();
          break;
        }
        ++counters_.open_connections;
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Pending c{fd, {}, Clock::now() + seconds(limits_.read_timeout)};
        if (counters_.open_connections > limits_.max_connections) {
          ++counters_.rejected_connections;
          reject(c, 503, "the server has its limit of " + std::to_string(limits_.max_connections) +
                             " connections open; retry later");
        }
        pending.push_back(std::move(c));
      }
    }
    // Read what came; hand on whole requests. (New connections have no revents yet.)
    std::vector<Pending> still;
    still.reserve(pending.size());
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& c = pending[i];
      const short rev = i + 2 < fds.size() && fds[i + 2].fd == c.fd ? fds[i + 2].revents : 0;
      bool gone = false;
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        char chunk[16384];
        while (true) {
          const ssize_t n = ::recv(c.fd, chunk, sizeof chunk, 0);
          if (n > 0) {
            if (!c.lingering) c.buf.append(chunk, size_t(n));
            if (c.buf.size() > read_cap) break;
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) gone = true;
          if (n < 0 && errno == EINTR) continue;
          break;
        }
        if (!gone && advance(c)) continue;  // handed on
      }
      if (gone) {
        close_connection(c.fd);
        continue;
      }
      if (Clock::now() >= c.deadline) {
        if (c.lingering || c.buf.empty()) {
          close_connection(c.fd);  // done lingering, or idle: closed quietly
          continue;
        }
        ++counters_.read_timeouts;
        ++counters_.errors;
        reject(c, 408,
               "the request did not arrive within " + std::to_string(int64_t(limits_.read_timeout)) +
                   " s (the server's read timeout)");
      }
      still.push_back(std::move(c));
    }
    pending.swap(still);
  }
  for (Pending& c : pending) close_connection(c.fd);
  if (spare_fd >= 0) ::close(spare_fd);
  ::close(listen_fd_);
  listen_fd_ = -1;
  // The threads end once their requests are answered (cut ones included).
  stop_pools();
  std::vector<std::pair<int, std::string>> back;
  {
    std::lock_guard lk(returned_mu_);
    back.swap(returned_);
  }
  for (auto& [fd, rest] : back) close_connection(fd);
  http_.set_listen_socket(-1);
}

}  // namespace mla::server
