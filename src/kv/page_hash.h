// The hashes of the prefix cache's tiers (kv/prefix_cache.h). A page's key is a 128-bit hash
// of its parent page's key and its own tokens: a hash chain, so one key names the whole prefix
// up to and including its page, and a system prompt or tool list that many sessions share is
// one chain of keys for all of them. hash64 is XXH64 (Yann Collet's public algorithm, written
// from its specification): the checksum of a page's bytes on disk, fast enough (about 10 GB/s
// a core) that verifying a page costs less than reading it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mla {

struct Hash128 {
  uint64_t hi = 0, lo = 0;
  bool operator==(const Hash128&) const = default;
  bool empty() const { return hi == 0 && lo == 0; }
  std::string hex() const;                                   // 32 lowercase hex digits
  static std::optional<Hash128> from_hex(std::string_view s);  // the same form, else nullopt
};

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return size_t(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

uint64_t hash64(const void* data, size_t bytes, uint64_t seed = 0);

// Builds a 128-bit digest from pieces (each fed as its length and its bytes).
class Digest {
 public:
  Digest& add(const void* data, size_t bytes);
  Digest& add(std::string_view s) { return add(s.data(), s.size()); }
  template <class T>
  Digest& add_value(const T& v) { return add(&v, sizeof v); }
  Hash128 finish() const { return h_; }

 private:
  Hash128 h_{0x6D6C612D70616765ull, 0x6B762D6361636865ull};
};

// The key of a page holding `tokens` (page_size of them) after the page keyed `parent` (the
// first page's parent is the empty key).
Hash128 page_key(const Hash128& parent, std::span<const int32_t> tokens);
// The keys of the first `pages` full pages of tokens.
std::vector<Hash128> page_keys(std::span<const int32_t> tokens, int64_t page_size, int64_t pages);

}  // namespace mla
