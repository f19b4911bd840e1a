// What INT4 and INT8 groups share (tensor/matrix.h): one bf16 scale per group of a row's
// columns (a multiple of 32 for the fused kernels, registry.h), row-major [rows, cols / group], or
// in blocks of 16 rows as the WORDS16 formats keep them (words16_scale).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// The scale of weight (r, k) as float32: row-major groups, and the WORDS16 formats' blocks.
inline float group_scale(const MatrixView& W, int64_t r, int64_t k) {
  return bf16_to_f32(static_cast<const uint16_t*>(W.scales)[(W.row0 + r) * W.scale_cols + k / W.group_size]);
}
inline float words16_group_scale(const MatrixView& W, int64_t r, int64_t k) {
  return bf16_to_f32(static_cast<const uint16_t*>(W.scales)[words16_scale(W.row0 + r, k / W.group_size, W.scale_cols)]);
}

// The group scales (INT4, INT8) of row n as float32, one per chunk of 32 columns.
inline void group_chunk_scales(const MatrixView& W, int64_t n, int64_t Kc, float* s) {
  if (is_words16(W.format)) {
    const uint16_t* src = static_cast<const uint16_t*>(W.scales);
    for (int64_t c = 0; c < Kc; ++c)
      s[c] = bf16_to_f32(src[words16_scale(W.row0 + n, c * kChunk / W.group_size, W.scale_cols)]);
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(W.scales) + (W.row0 + n) * W.scale_cols;
  if (W.group_size == kChunk) {
    int64_t c = 0;
    for (; c + 16 <= Kc; c += 16) {
      __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c)));
      _mm512_storeu_ps(s + c, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    for (; c < Kc; ++c) s[c] = bf16_to_f32(src[c]);
  } else {
    const int64_t per = W.group_size / kChunk;
    for (int64_t c = 0; c < Kc; ++c) s[c] = bf16_to_f32(src[c / per]);
  }
}

// The bf16 scales of one group of a WORDS16 block (its 16 rows, s[0..15]) as float32.
inline __m512 words16_scales(const uint16_t* s) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Lanes 0..7: the scale of chunk 2s, lanes 8..15: chunk 2s + 1 (INT4 and INT8 steps).
inline __m512 chunk_pair_scale(const float* scales, int64_t s) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(scales + 2 * s));
}

}  // namespace mla::cpu::avx512
