// The ways the parser tests cut a streamed text: at every byte boundary into two pieces, one
// byte at a time, and random pieces; and the check that a delta holds whole UTF-8 characters.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace mla::test {

// Well-formed UTF-8 (no overlong lead bytes, no cut sequence at the end).
inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
    if (n == 9 || i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n + 1;
  }
  return true;
}

// check(pieces, how) for: each of the text.size() + 1 cuts into two pieces, the text one byte at
// a time, then `random_trials` cuts into pieces of 0 to max_piece bytes (an RNG seeded `seed`).
template <class Check>
void for_each_split(const std::string& text, Check&& check, int random_trials = 0, size_t max_piece = 7,
                    uint32_t seed = 7) {
  for (size_t k = 0; k <= text.size(); ++k)
    check(std::vector<std::string>{text.substr(0, k), text.substr(k)}, "split at byte " + std::to_string(k));
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  check(bytes, std::string("one byte at a time"));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < random_trials; ++trial) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      size_t n = std::uniform_int_distribution<size_t>(0, max_piece)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    check(pieces, "random pieces, trial " + std::to_string(trial));
  }
}

}  // namespace mla::test
