// Whether the client of an HTTP request is still there, polled on its TCP socket for the
// peer's end (POLLRDHUP / POLLHUP / POLLERR). The server's own listener passes the socket it
// read the request from. Without it (cpp-httplib 0.11 hands a handler no socket, and its
// DataSink::is_writable() only asks select(), which a closed peer passes) the socket is found
// among the process's descriptors by its two addresses (the handler's Request carries them).
// The socket stays open while the handler or its content provider runs, so the descriptor
// cannot be reused under us. A client that only half-closes its side counts as gone, as it
// does for the servers vLLM runs behind.
#pragma once
#include <string>

namespace mla::server {

class ClientConnection {
 public:
  ClientConnection() = default;
  // The socket itself, when the caller has it (the server's listener hands it over).
  explicit ClientConnection(int fd) : fd_(fd) {}
  ClientConnection(const std::string& remote_addr, int remote_port, const std::string& local_addr, int local_port);

  bool found() const { return fd_ >= 0; }
  // The peer has closed the connection (false when the socket was not found).
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace mla::server
