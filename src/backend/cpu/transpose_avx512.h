// A 16 x 16 transpose of dwords in AVX-512 registers, shared by the GEMM kernels that
// reorder a block of weight rows into column groups (bf16 column pairs: fma_gemm.cpp,
// dpbf16_gemm.cpp; int8 column quads: vnni_gemm.cpp). Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace mla::cpu {

// Transposes 16 rows of 16 dwords: r[j] holds dword j of every row afterwards.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// out[p * 32 + r] = the dword (W[r, 2p], W[r, 2p + 1]) of bf16 rows r < 32 (ldw apart, K % 32 ==
// 0) for the K / 2 column pairs p; out 64-byte aligned.
inline void pack_column_pairs32(const uint16_t* W, int64_t ldw, int64_t K, uint32_t* out) {
  for (int64_t k0 = 0; k0 < K; k0 += 32)
    for (int h = 0; h < 2; ++h) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(W + (h * 16 + i) * ldw + k0);
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_store_si512(out + (k0 / 2 + j) * 32 + h * 16, r[j]);
    }
}

}  // namespace mla::cpu
