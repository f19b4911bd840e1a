// AVX-512 decoders of the weight formats, shared by the GEMV kernels (gemv.cpp) and the bf16
// GEMM path (gemm.cpp). A step covers 32 columns ("a chunk") of a weight row, decoded into two
// vectors of 16 floats (a, b). Which columns land in which lane depends on the format, chosen so
// the decode is a couple of integer ops; activations are permuted into the same layout.
//   bf16: a = even columns (word << 16), b = odd columns (word & 0xffff0000)
//   int4: a = even columns, b = odd: each byte's low / high nibble, zero-extended to a lane,
//         indexes a 16-entry table of (q - 8) * scale (vpermps)
//   fp8:  sign-extended byte << 20, masked: the e4m3 bits as a float32, 2^-120 times the value
//         (block scales are applied by the caller)
//   f16, f32: natural order
// Internal to src/backend/cpu.
#pragma once
// GCC 12's AVX-512 headers build results on _mm512_undefined_ps(), which -Wuninitialized
// reports at every inlined use (GCC bug 105593): a false positive, silenced for these files.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

constexpr int64_t kChunk = 32;

enum class Layout { Natural, EvenOdd };

// The column (0..31 within the chunk) held by lane 0..15 of a, or 16..31 of b.
inline int layout_col(Layout l, int lane) {
  const int j = lane & 15, b = lane >> 4;
  switch (l) {
    case Layout::Natural: return lane;
    case Layout::EvenOdd: return 2 * j + b;
  }
  return lane;
}

inline Layout layout_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16:
    case WeightFormat::INT4_GROUP: return Layout::EvenOdd;
    default: return Layout::Natural;
  }
}

inline bool fast_supported(const MatrixView& W) {
  return W.format != WeightFormat::INT4_GROUP || (W.group_size > 0 && W.group_size % kChunk == 0);
}

// One weight, as MatrixView::dequant_row computes it (for the columns past the last full chunk).
inline float element(const MatrixView& W, int64_t r, int64_t k) {
  const uint8_t* p = static_cast<const uint8_t*>(W.data) + size_t(r) * W.row_bytes();
  switch (W.format) {
    case WeightFormat::F32: { float f; std::memcpy(&f, p + 4 * k, 4); return f; }
    case WeightFormat::BF16: { uint16_t h; std::memcpy(&h, p + 2 * k, 2); return bf16_to_f32(h); }
    case WeightFormat::F16: { uint16_t h; std::memcpy(&h, p + 2 * k, 2); return f16_to_f32(h); }
    case WeightFormat::FP8_BLOCK128:
      return fp8e4m3_to_f32(p[k]) * static_cast<const float*>(W.scales)[((W.row0 + r) / 128) * W.scale_cols + k / 128];
    case WeightFormat::INT4_GROUP: {
      uint32_t w;
      std::memcpy(&w, p + 4 * (k / 8), 4);
      int q = int((w >> (4 * (k % 8))) & 0xF) - 8;
      return float(q) * bf16_to_f32(static_cast<const uint16_t*>(W.scales)[(W.row0 + r) * W.scale_cols + k / W.group_size]);
    }
  }
  return 0;
}

// Sum of the 16 lanes (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its header).
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// ---- decoders: decode(c, a, b) writes chunk c of the row -------------------------------------

// prefetch(c): the cache line kPrefetchBytes ahead of chunk c of the row (the next rows follow
// in memory, so near a row's end this fetches the start of the next tile's rows).
constexpr int64_t kPrefetchBytes = 1024;
inline void prefetch_at(const void* p, int64_t offset) {
  _mm_prefetch(static_cast<const char*>(p) + offset + kPrefetchBytes, _MM_HINT_T0);
}

struct DecF32 {
  const float* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 4), prefetch_at(row, c * kChunk * 4 + 64); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = _mm512_loadu_ps(row + c * kChunk);
    b = _mm512_loadu_ps(row + c * kChunk + 16);
  }
};

struct DecF16 {
  const uint16_t* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 2); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kChunk)));
    b = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kChunk + 16)));
  }
};

struct DecBF16 {
  const uint16_t* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 2); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    __m512i v = _mm512_loadu_si512(row + c * kChunk);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
};

inline __m512 fp8_bits(__m512i sx) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(sx, 20), _mm512_set1_epi32(int(0x87f00000u))));
}

struct DecFP8 {
  const uint8_t* row;
  void prefetch(int64_t c) const {
    if ((c & 1) == 0) prefetch_at(row, c * kChunk);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = fp8_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * kChunk))));
    b = fp8_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * kChunk + 16))));
  }
};

struct DecInt4 {
  const uint8_t* row;
  const float* scale;  // per chunk, float32
  void prefetch(int64_t c) const {
    if ((c & 3) == 0) prefetch_at(row, c * 16);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    // Byte i holds columns 2i (low nibble) and 2i+1 (high nibble). vpermps reads the low 4 bits
    // of each index: byte i zero-extended gives the low nibble; the 16-bit shift by 4 (a 128-bit
    // op, which leaves the 512-bit ports to the rest) brings each byte's high nibble down.
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * 16));
    const __m512 t = _mm512_mul_ps(table, _mm512_set1_ps(scale[c]));
    a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), t);
    b = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4)), t);
  }
};

}  // namespace mla::cpu::avx512
