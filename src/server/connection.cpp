// ClientConnection: the request's socket by its addresses, polled for the peer's end.
#include "server/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>

namespace mla::server {

namespace {

// Numeric host and port of a socket address, as cpp-httplib writes them into its Request.
bool host_port(const sockaddr_storage& a, socklen_t len, std::string* host, int* port) {
  if (a.ss_family != AF_INET && a.ss_family != AF_INET6) return false;
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = std::atoi(s);
  return true;
}

}  // namespace

ClientConnection::ClientConnection(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                                   int local_port) {
  if (remote_port <= 0 || local_port <= 0) return;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    char* end = nullptr;
    const std::string name = entry.path().filename().string();
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    sockaddr_storage a{}, b{};
    socklen_t la = sizeof a, lb = sizeof b;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&a), &la) != 0) continue;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&b), &lb) != 0) continue;
    std::string lh, rh;
    int lp = 0, rp = 0;
    if (!host_port(a, la, &lh, &lp) || !host_port(b, lb, &rh, &rp)) continue;
    if (lp == local_port && rp == remote_port && rh == remote_addr && (local_addr.empty() || lh == local_addr)) {
      fd_ = int(fd);
      return;
    }
  }
}

bool ClientConnection::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, short(POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace mla::server
