// The HTTP layer's pieces (see http_io.h).
#include "server/http_io.h"

#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>

namespace mla::server {

bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string& ip, int& port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  ip = h;
  port = std::atoi(s);
  return true;
}

// One connection as cpp-httplib's Stream: first the bytes the listener has read (a whole
// request, perhaps the start of the next), then the socket (non-blocking, polled with the
// timeouts).
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

Head examine(std::string& buf, size_t max_header, size_t max_body, bool continue_sent) {
  Head h;
  size_t end = buf.find("\r\n\r\n");
  size_t sep = 4;
  if (const size_t lf = buf.find("\n\n"); lf != std::string::npos && (end == std::string::npos || lf < end))
    end = lf, sep = 2;
  if (end == std::string::npos) {
    if (buf.size() > max_header) {
      h.kind = Head::Reject, h.status = 431;
      h.message = "the request's line and headers exceed " + std::to_string(max_header) + " bytes";
    }
    return h;
  }
  if (end + sep > max_header) {
    h.kind = Head::Reject, h.status = 431;
    h.message = "the request's line and headers exceed " + std::to_string(max_header) + " bytes";
    return h;
  }
  std::string_view head(buf.data(), end);
  const size_t eol = head.find('\n');
  std::string_view line = trim(head.substr(0, eol));
  const size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  std::string_view method = line.substr(0, sp1), target;
  if (sp1 != std::string_view::npos) target = line.substr(sp1 + 1, sp2 == std::string_view::npos ? sp2 : sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  uint64_t length = 0;
  bool have_length = false, expect_continue = false;
  size_t expect_begin = 0, expect_end = 0;
  // Every route takes JSON: a body labelled a form (curl -d's default) is passed on labelled
  // JSON, which cpp-httplib would otherwise parse as form fields and refuse past 8 KiB.
  size_t form_begin = std::string::npos, form_size = 0;
  static constexpr std::string_view kJson = "application/json";
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 1;
  while (pos < head.size()) {
    size_t next = head.find('\n', pos);
    if (next == std::string_view::npos) next = head.size();
    std::string_view l = head.substr(pos, next - pos);
    const size_t colon = l.find(':');
    if (colon != std::string_view::npos) {
      std::string_view name = trim(l.substr(0, colon)), value = trim(l.substr(colon + 1));
      if (iequals(name, "content-length")) {
        uint64_t v = 0;
        bool ok = !value.empty();
        for (char c : value) {
          if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) {
            ok = false;
            break;
          }
          v = v * 10 + uint64_t(c - '0');
        }
        if (!ok || (have_length && v != length)) {
          h.kind = Head::Reject, h.status = 400;
          h.message = "the Content-Length header is not one non-negative integer";
          return h;
        }
        have_length = true;
        length = v;
      } else if (iequals(name, "transfer-encoding")) {
        h.kind = Head::Reject, h.status = 411;
        h.message = "request bodies must come with a Content-Length (Transfer-Encoding is not supported)";
        return h;
      } else if (iequals(name, "content-type") &&
                 iequals(trim(value.substr(0, value.find(';'))), "application/x-www-form-urlencoded")) {
        form_begin = size_t(value.data() - buf.data()), form_size = value.size();
      } else if (iequals(name, "expect") && iequals(value, "100-continue")) {
        expect_continue = true;
        // the line and its end (for the last line, the first half of the blank line's separator)
        expect_begin = pos, expect_end = next < head.size() ? next + 1 : end + sep / 2;
      }
    }
    pos = next + 1;
  }
  if (length > max_body) {
    h.kind = Head::Reject, h.status = 413;
    h.message = "the request body of " + std::to_string(length) + " bytes exceeds the limit of " +
                std::to_string(max_body) + " bytes";
    return h;
  }
  // The edits of the head, the later one first so that the earlier one's offsets still hold;
  // each shortens buf in place, so the views into its request line stay valid.
  auto relabel_form = [&] {
    if (form_begin == std::string::npos) return;
    buf.replace(form_begin, form_size, kJson);
    end -= form_size - kJson.size();
  };
  if (form_begin != std::string::npos && (!expect_continue || form_begin > expect_begin)) relabel_form(), form_begin = std::string::npos;
  if (expect_continue) {  // answered here; cpp-httplib never sees the header
    buf.erase(expect_begin, expect_end - expect_begin);
    end -= expect_end - expect_begin;
    h.send_continue = !continue_sent && length > 0;
  }
  relabel_form();
  if (buf.size() < end + sep + length) return h;
  h.kind = Head::Complete;
  h.method = method;
  h.target = target;
  return h;
}

void write_small_response(int fd, int status, const std::string& body) {
  std::string reason = status == 408   ? "Request Timeout"
                       : status == 411 ? "Length Required"
                       : status == 413 ? "Payload Too Large"
                       : status == 431 ? "Request Header Fields Too Large"
                       : status == 503 ? "Service Unavailable"
                                       : "Bad Request";
  std::string msg = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                    "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + (status == 503 ? "\r\nRetry-After: 1" : "") + "\r\n\r\n" + body;
  (void)!::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
}

}  // namespace mla::server
