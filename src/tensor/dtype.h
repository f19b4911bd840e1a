// Element types of checkpoints and caches, and their scalar conversions to float32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace mla {

enum class DType { F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL, F64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F8_E4M3", ...); false if unknown.
bool parse_dtype(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);

// float8 e4m3fn (no infinities; 0x7f / 0xff are NaN; max 448).
extern const float (&kFp8E4M3Table)[256];
inline float fp8e4m3_to_f32(uint8_t b) { return kFp8E4M3Table[b]; }
// Round to nearest even, saturating at +-448.
uint8_t f32_to_fp8e4m3(float f);

}  // namespace mla
