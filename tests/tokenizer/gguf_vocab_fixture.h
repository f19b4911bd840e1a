// The DeepSeek-V3 vocabulary as a llama.cpp GGUF file holds it (tests/fixtures/gguf/, written by
// make_vocab_gguf.py with gguf-py and stored gzip-compressed), for the GGUF tokenizer tests: the
// file's bytes, and its metadata read by a small reader of the GGUF key-value section so that the
// tests do not depend on GgufFile (test_gguf_vocab_file.cpp opens the same file through it).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "format/gguf.h"

namespace mla::test {

inline std::string deepseek_v3_vocab_gguf_gz() {
  return std::string(MLA_SOURCE_DIR) + "/tests/fixtures/gguf/deepseek-v3-vocab.gguf.gz";
}

// The uncompressed bytes of a .gz file.
inline std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  const bool ok = n == 0;
  gzclose(f);
  if (!ok) throw std::runtime_error(path + ": bad gzip data");
  return out;
}

// The metadata of GGUF bytes (versions 2 and 3, little-endian), as GgufFile::metadata() gives it.
inline std::map<std::string, GgufValue> read_gguf_metadata(const std::string& bytes) {
  size_t at = 0;
  auto take = [&](size_t n) {
    if (bytes.size() - at < n) throw std::runtime_error("GGUF: truncated at byte " + std::to_string(at));
    const char* p = bytes.data() + at;
    at += n;
    return p;
  };
  auto u32 = [&] { uint32_t v; std::memcpy(&v, take(4), 4); return v; };
  auto u64 = [&] { uint64_t v; std::memcpy(&v, take(8), 8); return v; };
  auto str = [&] { uint64_t n = u64(); return std::string(take(n), n); };
  using Kind = GgufValue::Kind;
  // One scalar of GGUF type `type` into v (kind, and i / f / b / s).
  auto scalar = [&](uint32_t type, GgufValue& v) {
    auto integer = [&](size_t n, bool is_signed) {
      uint64_t raw = 0;
      std::memcpy(&raw, take(n), n);
      if (is_signed && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);
      v.kind = Kind::Int;
      v.i = static_cast<int64_t>(raw);
    };
    switch (type) {
      case 0: return integer(1, false);
      case 1: return integer(1, true);
      case 2: return integer(2, false);
      case 3: return integer(2, true);
      case 4: return integer(4, false);
      case 5: return integer(4, true);
      case 10: return integer(8, false);
      case 11: return integer(8, true);
      case 6: { float f; std::memcpy(&f, take(4), 4); v.kind = Kind::Float; v.f = f; return; }
      case 12: { std::memcpy(&v.f, take(8), 8); v.kind = Kind::Float; return; }
      case 7: v.kind = Kind::Bool; v.b = *take(1) != 0; return;
      case 8: v.kind = Kind::String; v.s = str(); return;
      default: throw std::runtime_error("GGUF: value type " + std::to_string(type));
    }
  };
  if (std::string(take(4), 4) != "GGUF") throw std::runtime_error("GGUF: bad magic");
  if (uint32_t version = u32(); version != 2 && version != 3) throw std::runtime_error("GGUF: version " + std::to_string(version));
  u64();  // tensor count
  const uint64_t n_kv = u64();
  std::map<std::string, GgufValue> metadata;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = str();
    GgufValue v;
    uint32_t type = u32();
    if (type == 9) {
      const uint32_t elem = u32();
      const uint64_t count = u64();
      v.kind = Kind::Array;
      for (uint64_t e = 0; e < count; ++e) {
        GgufValue x;
        scalar(elem, x);
        v.elem = x.kind;
        if (x.kind == Kind::String) v.strings.push_back(std::move(x.s));
        else if (x.kind == Kind::Float) v.floats.push_back(x.f);
        else v.ints.push_back(x.kind == Kind::Bool ? x.b : x.i);
      }
      if (count == 0) v.elem = elem == 8 ? Kind::String : elem == 6 || elem == 12 ? Kind::Float : Kind::Int;
    } else {
      scalar(type, v);
    }
    metadata.emplace(std::move(key), std::move(v));
  }
  return metadata;
}

}  // namespace mla::test
