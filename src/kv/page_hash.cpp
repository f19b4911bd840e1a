// XXH64 and the prefix cache's key chain (see page_hash.h).
#include "kv/page_hash.h"

#include <cstring>

namespace mla {

namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round(uint64_t acc, uint64_t v) { return rotl(acc + v * P2, 31) * P1; }
inline uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round(0, v)) * P1 + P4; }

}  // namespace

uint64_t hash64(const void* data, size_t n, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* end = p + n;
  uint64_t h;
  if (n >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const uint8_t* limit = end - 32;
    do {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = seed + P5;
  }
  h += uint64_t(n);
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round(0, read64(p)), 27) * P1 + P4;
  if (p + 4 <= end) {
    h = rotl(h ^ (uint64_t(read32(p)) * P1), 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (uint64_t(*p) * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

std::string Hash128::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[size_t(15 - i)] = digits[(hi >> (4 * i)) & 15];
    s[size_t(31 - i)] = digits[(lo >> (4 * i)) & 15];
  }
  return s;
}

std::optional<Hash128> Hash128::from_hex(std::string_view s) {
  if (s.size() != 32) return std::nullopt;
  Hash128 h;
  for (size_t i = 0; i < 32; ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    uint64_t& half = i < 16 ? h.hi : h.lo;
    half = (half << 4) | uint64_t(d);
  }
  return h;
}

Digest& Digest::add(const void* data, size_t bytes) {
  const uint64_t len = bytes;
  h_.hi = hash64(data, bytes, hash64(&len, 8, h_.hi));
  h_.lo = hash64(data, bytes, hash64(&len, 8, h_.lo ^ P3));
  return *this;
}

Hash128 page_key(const Hash128& parent, std::span<const int32_t> tokens) {
  return {hash64(tokens.data(), tokens.size_bytes(), parent.hi ^ rotl(parent.lo * P2, 29)),
          hash64(tokens.data(), tokens.size_bytes(), parent.lo + rotl(parent.hi * P3, 17) + P1)};
}

std::vector<Hash128> page_keys(std::span<const int32_t> tokens, int64_t page_size, int64_t pages) {
  std::vector<Hash128> keys;
  keys.reserve(size_t(pages));
  Hash128 parent;
  for (int64_t i = 0; i < pages && (i + 1) * page_size <= int64_t(tokens.size()); ++i) {
    parent = page_key(parent, tokens.subspan(size_t(i * page_size), size_t(page_size)));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace mla
