// The HTTP layer's pieces, which know no API: a fixed pool of threads, one connection as
// cpp-httplib's stream (the bytes the listener read, then the socket, with the timeouts),
// cpp-httplib's request processing without its accept loop, the listener's look at a request's
// head (its size and body limits, Expect: 100-continue) and the short responses it writes
// itself. The listener loop that uses them is http_listener.h.
#pragma once
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace mla::server {

// A fixed set of threads over a queue of jobs.
class Pool {
 public:
  explicit Pool(size_t n) {
    for (size_t i = 0; i < std::max<size_t>(n, 1); ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() { shutdown(); }
  void post(std::function<void()> job) {
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  void shutdown() {  // runs the jobs already posted, then joins
    {
      std::lock_guard lk(mu_);
      if (done_) return;
      done_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return done_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool done_ = false;
};

// The numeric host and port of a socket address; false when it has none.
bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string& ip, int& port);

class ConnStream : public httplib::Stream {
 public:
  ConnStream(int fd, std::string buffered, double read_timeout, double write_timeout)
      : fd_(fd),
        buf_(std::move(buffered)),
        read_ms_(int(read_timeout * 1000)),
        write_ms_(int(write_timeout * 1000)) {}

  bool is_readable() const override { return pos_ < buf_.size() || wait(POLLIN, read_ms_); }
  bool is_writable() const override { return wait(POLLOUT, write_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < buf_.size()) {
      const size_t n = std::min(size, buf_.size() - pos_);
      std::memcpy(ptr, buf_.data() + pos_, n);
      pos_ += n;
      return ssize_t(n);
    }
    while (true) {
      if (!wait(POLLIN, read_ms_)) return -1;
      const ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n >= 0 || (errno != EAGAIN && errno != EINTR)) return n;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    while (true) {
      if (!wait(POLLOUT, write_ms_)) return -1;
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0 || (errno != EAGAIN && errno != EINTR)) return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) numeric_address(a, len, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) numeric_address(a, len, ip, port);
  }
  socket_t socket() const override { return fd_; }
  std::string leftover() const { return buf_.substr(pos_); }

 private:
  bool wait(short events, int ms) const {
    pollfd p{fd_, events, 0};
    while (true) {
      const int r = ::poll(&p, 1, ms);
      if (r < 0 && errno == EINTR) continue;
      return r > 0 && (p.revents & events);
    }
  }
  int fd_;
  std::string buf_;
  size_t pos_ = 0;
  int read_ms_, write_ms_;
};

// cpp-httplib's server without its accept loop: we hand it whole requests on our stream.
class HttpCore : public httplib::Server {
 public:
  bool serve(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    return process_request(strm, close_connection, connection_closed, nullptr);
  }
  // Its streaming stops once this socket is invalid ("shutting down"): ours while we serve.
  void set_listen_socket(int fd) { svr_sock_ = fd; }
};

// What the listener made of the bytes of a connection so far.
struct Head {
  enum Kind { NeedMore, Complete, Reject } kind = NeedMore;
  int status = 0;  // Reject
  std::string message;
  std::string method, target;  // Complete: the request line's method and path (no query)
  bool send_continue = false;
};

// Looks at the head (and body length) of the request at the start of buf. An Expect:
// 100-continue line is taken out of buf (the listener answers it itself).
Head examine(std::string& buf, size_t max_header, size_t max_body, bool continue_sent);

// A short response with a JSON body written by the listener itself (the socket is
// non-blocking: best effort).
void write_small_response(int fd, int status, const std::string& body);

}  // namespace mla::server
