// Small text helpers shared by the streaming tool-call and reasoning parsers: markers that may be
// cut across fragments, and UTF-8 characters that may be.
#pragma once
#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

namespace mla::chat::parser_text {

// The length of the longest suffix of s that is a proper prefix of one of the markers: bytes
// that must wait, since the next fragment may complete a marker with them.
inline size_t marker_prefix_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    if (m.empty()) continue;
    for (size_t k = std::min(s.size(), m.size() - 1); k > best; --k)
      if (s.substr(s.size() - k) == m.substr(0, k)) {
        best = k;
        break;
      }
  }
  return best;
}

struct Found {
  size_t pos = std::string_view::npos;
  size_t marker = 0;  // index into the list
  size_t size = 0;    // the marker's length
};

// The earliest occurrence at or after `from` of any of the (non-empty) markers.
inline Found find_first(std::string_view s, size_t from, std::initializer_list<std::string_view> markers) {
  Found f;
  size_t i = 0;
  for (std::string_view m : markers) {
    if (!m.empty()) {
      size_t p = s.find(m, from);
      if (p != std::string_view::npos && p < f.pos) f = {p, i, m.size()};
    }
    ++i;
  }
  return f;
}

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

inline bool all_space(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The length of s without an incomplete UTF-8 sequence at its end (a lead byte followed by
// fewer continuation bytes than it announces). Ill-formed bytes are not held: only a sequence
// that the next bytes could still complete waits.
inline size_t utf8_complete_prefix(std::string_view s) {
  size_t n = s.size();
  // Step back over at most three continuation bytes to the lead byte of the last sequence.
  size_t i = n, cont = 0;
  while (i > 0 && cont < 3 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++cont;
  if (i == 0) return n;
  unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t need = lead >= 0xF0 && lead <= 0xF4 ? 3 : lead >= 0xE0 && lead <= 0xEF ? 2 : lead >= 0xC2 && lead <= 0xDF ? 1 : 0;
  if (need > cont) return i - 1;  // the sequence is still open: hold it from its lead byte
  return n;
}

// Text to be emitted as deltas of one kind, holding back an incomplete trailing UTF-8 sequence.
class Utf8Holder {
 public:
  // Appends text; returns what may be emitted now (whole characters).
  std::string take(std::string_view text) {
    pending_.append(text);
    size_t k = utf8_complete_prefix(pending_);
    std::string out = pending_.substr(0, k);
    pending_.erase(0, k);
    return out;
  }
  // Everything still held, complete or not.
  std::string flush() {
    std::string out;
    out.swap(pending_);
    return out;
  }
  bool empty() const { return pending_.empty(); }

 private:
  std::string pending_;
};

}  // namespace mla::chat::parser_text
