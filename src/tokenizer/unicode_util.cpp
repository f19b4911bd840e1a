// UTF-8 validation, encoding and the GPT-2 byte-level alphabet (see unicode_util.h).
#include "tokenizer/unicode_util.h"

namespace mla::utf8 {

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t sequence_length(std::string_view s, size_t i, size_t* bad_len) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *bad_len = 1;
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      *bad_len = k;
      return 0;
    }
    uint8_t b = byte(i + k);
    uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *bad_len = k;
      return 0;
    }
  }
  return need;
}

uint32_t decode_at(std::string_view s, size_t i, size_t len) {
  const auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  switch (len) {
    case 1: return byte(i);
    case 2: return ((byte(i) & 0x1F) << 6) | (byte(i + 1) & 0x3F);
    case 3: return ((byte(i) & 0x0F) << 12) | ((byte(i + 1) & 0x3F) << 6) | (byte(i + 2) & 0x3F);
    default:
      return ((byte(i) & 0x07) << 18) | ((byte(i + 1) & 0x3F) << 12) | ((byte(i + 2) & 0x3F) << 6) |
             (byte(i + 3) & 0x3F);
  }
}

size_t complete_prefix_length(std::string_view s) {
  // Look at the last up-to-3 bytes for the start of a sequence that is valid so far but short.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t i = n - back;
    uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) return n;           // ASCII: everything before is complete
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    size_t bad = 0;
    size_t len = sequence_length(s, i, &bad);
    if (len != 0) return n;                    // a complete character ends the string
    if (i + bad == n) return i;                // valid so far, cut short by the end: hold back
    return n;                                  // ill-formed regardless of what follows
  }
  return n;
}

bool is_valid(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    size_t len = sequence_length(s, i, &bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

const std::array<uint32_t, 256>& byte_to_char() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

int char_to_byte(uint32_t cp) {
  static const std::array<int16_t, 512> inverse = [] {
    std::array<int16_t, 512> inv{};
    inv.fill(-1);
    const auto& fwd = byte_to_char();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

bool byte_level_decode(std::string_view text, std::string* bytes) {
  bytes->clear();
  size_t i = 0, bad = 0;
  while (i < text.size()) {
    size_t len = sequence_length(text, i, &bad);
    int b = len ? char_to_byte(decode_at(text, i, len)) : -1;
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

}  // namespace mla::utf8
