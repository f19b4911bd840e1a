// The activations converted once per call into the column order a weight format's decoders
// leave a row in (see activations.h).
#include "backend/cpu/formats/activations.h"

#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"
#include "tensor/dtype.h"

namespace mla::cpu {

namespace {

using namespace avx512;

// The 32 source columns of a chunk in lane order, as permutex2var indices (bit 4 picks the
// second vector of 16).
struct ChunkPerm {
  __m512i a, b;
};
ChunkPerm chunk_perm(Layout l) {
  alignas(64) int32_t ia[16], ib[16];
  for (int j = 0; j < 16; ++j) {
    ia[j] = layout_col(l, j);
    ib[j] = layout_col(l, 16 + j);
  }
  return {_mm512_load_si512(ia), _mm512_load_si512(ib)};
}

// Calls chunk(t, c, a, b) for every token t < T and chunk c of 32 columns of x, a and b the
// chunk's 32 values in layout l's column order (layout_col).
template <class Chunk>
void for_each_chunk(const float* x, int64_t T, int64_t ldx, int64_t K, Layout l, Chunk&& chunk) {
  const ChunkPerm p = chunk_perm(l);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < K / kChunk; ++c) {
      const float* src = x + t * ldx + c * kChunk;
      const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
      chunk(t, c, _mm512_permutex2var_ps(lo, p.a, hi), _mm512_permutex2var_ps(lo, p.b, hi));
    }
}

}  // namespace

void activations_bf16(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, bool permute,
                      uint16_t* dst, int64_t ld) {
  for_each_chunk(x, T, ldx, K, permute ? format_kernels(format).layout : Layout::Natural,
                 [&](int64_t t, int64_t c, __m512 a, __m512 b) { store_bf16x32(dst + t * ld + c * kChunk, a, b); });
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = K / kChunk * kChunk; k < K; ++k) dst[t * ld + k] = f32_to_bf16(x[t * ldx + k]);
}

void activations_f32_permuted(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, float* dst,
                              int64_t ld) {
  for_each_chunk(x, T, ldx, K, format_kernels(format).layout, [&](int64_t t, int64_t c, __m512 a, __m512 b) {
    _mm512_storeu_ps(dst + t * ld + c * kChunk, a);
    _mm512_storeu_ps(dst + t * ld + c * kChunk + 16, b);
  });
  for (int64_t t = 0; t < T; ++t)
    std::copy(x + t * ldx + K / kChunk * kChunk, x + t * ldx + K, dst + t * ld + K / kChunk * kChunk);
}

void activations_int8(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, int bias, int8_t* q,
                      int64_t ldq, float* qs, int32_t* qc, int64_t lds) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for_each_chunk(x, T, ldx, K, format_kernels(format).layout, [&](int64_t t, int64_t c, __m512 a, __m512 b) {
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, sign), _mm512_and_ps(b, sign)));
    // A chunk of zeros gets codes 0 and scale 0; otherwise |x| * 127 / m rounds to at most 127.
    const float inv = m > 0 ? 127.0f / m : 0.0f;
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    int8_t* dst = q + t * ldq + c * kChunk;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtsepi32_epi8(qb));
    qs[t * lds + c] = m / 127.0f;
    qc[t * lds + c] = -bias * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  });
}

}  // namespace mla::cpu
