// The HTTP layer's listener, which knows no API. One thread accepts every connection and reads
// each request (head and body) without blocking, under limits: the head's size (431), the
// body's size (413, from its Content-Length, before it is read), a deadline for the whole
// request (slow senders get 408, idle keep-alive connections are closed), a number of open
// connections (503), file descriptors running out (503). Only a complete request is handed to
// a thread of one of two pools, where HttpCore (http_io.h) parses, routes and writes the
// response; a connection kept alive then comes back for its next request. What the listener
// cannot know (which pool a request goes to, whether the server is stopping and when its drain
// is over, the body of the errors it writes itself) it asks the server through Hooks.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/http_io.h"

namespace mla::server {

// What the listener counts (the server's /metrics reads them; its routes count errors too).
struct HttpCounters {
  std::atomic<int64_t> open_connections{0};
  std::atomic<int64_t> errors{0};  // responses with an error status
  std::atomic<int64_t> rejected_connections{0}, rejected_descriptors{0};
  std::atomic<int64_t> read_timeouts{0};
};

// The socket of the request this thread serves (-1: none), for a handler's ClientConnection.
int serving_socket();

class HttpListener {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    double read_timeout = 10;   // seconds for a whole request to arrive (and keep-alive idling)
    double write_timeout = 10;  // seconds a client may leave one write unread
    size_t max_header_bytes = 0, max_body_bytes = 0;
    int max_connections = 0;
    size_t work_threads = 1, liveness_threads = 1;  // the two pools
  };

  struct Hooks {
    // The server is stopping: a connection back from its request is closed, not kept.
    std::function<bool()> stopping;
    // Asked once per turn of the loop: true ends it (a drain over, or given up).
    std::function<bool(Clock::time_point now)> done;
    // A complete request (its method and path) goes to the liveness pool, not the work pool.
    std::function<bool(const Head& head)> liveness;
    // The JSON body of an error response the listener writes itself.
    std::function<std::string(int status, const std::string& message)> error_body;
  };

  // http serves the requests (its routes set by the caller); counters count. Both must outlive
  // the listener. Throws std::runtime_error when it cannot make its wake-up descriptor.
  HttpListener(HttpCore& http, HttpCounters& counters, Limits limits, Hooks hooks);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds host:port (port 0: a free one); returns the port. Again: the bound port. Throws
  // std::runtime_error when it cannot.
  int bind(const std::string& host, int port);
  bool bound() const { return listen_fd_ >= 0; }
  int port() const { return port_; }
  // Serves until Hooks::done; then closes the listening socket and the connections waiting,
  // and returns once the pools have answered every request handed to them.
  void run();
  // Makes run() look at once (a request's end, a stop). Thread-safe.
  void wake();
  // Ends the pools once the jobs posted are done.
  void stop_pools();

 private:
  // Runs one whole request (already read) on a pool thread, then gives the connection back to
  // the listener or closes it.
  void serve_connection(int fd, std::string bytes);
  void close_connection(int fd);

  HttpCore& http_;
  HttpCounters& counters_;
  const Limits limits_;
  const Hooks hooks_;
  int listen_fd_ = -1, wake_fd_ = -1, port_ = -1;
  std::unique_ptr<Pool> work_pool_, liveness_pool_;
  // Connections back from a pool after a response, waiting for their next request.
  std::mutex returned_mu_;
  std::vector<std::pair<int, std::string>> returned_;
};

}  // namespace mla::server
