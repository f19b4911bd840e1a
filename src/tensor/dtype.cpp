#include "tensor/dtype.h"

#include <cmath>

namespace mla {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::F8_E4M3: case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F64: return "F64";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  static const struct { const char* n; DType t; } names[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F8_E4M3", DType::F8_E4M3},
      {"I64", DType::I64}, {"I32", DType::I32}, {"I16", DType::I16},   {"I8", DType::I8},
      {"U8", DType::U8},   {"BOOL", DType::BOOL}, {"F64", DType::F64}};
  for (auto& n : names)
    if (s == n.n) { *out = n.t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static constexpr float fp8_value(int b) {
  int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return __builtin_nanf("");
  float scale = 1.0f / 64.0f;  // 2^-6, the subnormal exponent
  for (int i = 1; i < e; ++i) scale *= 2.0f;
  float v = (e == 0 ? m / 8.0f : 1.0f + m / 8.0f) * scale;
  return s ? -v : v;
}

struct Fp8Table {
  float v[256];
};
static constexpr Fp8Table make_fp8_table() {
  Fp8Table t{};
  for (int b = 0; b < 256; ++b) t.v[b] = fp8_value(b);
  return t;
}
static constexpr Fp8Table fp8_table = make_fp8_table();
const float (&kFp8E4M3Table)[256] = fp8_table.v;

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Nearest of the 127 finite non-negative codes, ties to even code.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // first code with value >= a
    int mid = (lo + hi) / 2;
    if (fp8_value(mid) < a) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return sign;
  float up = fp8_value(lo), down = fp8_value(lo - 1);
  int code = (up - a < a - down) ? lo : (up - a > a - down) ? lo - 1 : ((lo & 1) ? lo - 1 : lo);
  return sign | uint8_t(code);
}

}  // namespace mla
