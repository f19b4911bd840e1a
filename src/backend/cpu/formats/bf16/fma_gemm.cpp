// bf16-weight GEMM on float32 FMAs (see fma_gemm.h).
#include "backend/cpu/formats/bf16/fma_gemm.h"

// GCC 12's AVX-512 headers build results on _mm512_undefined_*(), which -Wuninitialized reports
// at every inlined use (GCC bug 105593): a false positive, as in common/avx512.h.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/common/transpose_avx512.h"

namespace mla::cpu {

namespace {

constexpr int kRows = 32;    // weight rows per block: two zmm of float32 lanes
constexpr int kTokens = 12;  // most tokens per register block: 24 accumulators

// y[t, 0..31] for T tokens over the packed pairs of K columns; rows past `rows` not stored.
template <int T>
void micro(const uint32_t* p, const float* x, int64_t ldx, int64_t K, int rows, float* y, int64_t ldy) {
  __m512 a0[T], a1[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) a0[t] = a1[t] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(int32_t(0xffff0000u));
  for (int64_t k = 0; k < K; k += 2, p += kRows) {
    const __m512i r0 = _mm512_loadu_si512(p), r1 = _mm512_loadu_si512(p + 16);  // stored weights: any alignment
    // Column k: the low words, widened by a shift; column k + 1: the high words, masked.
    const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(r0, 16)), e1 = _mm512_castsi512_ps(_mm512_slli_epi32(r1, 16));
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512 b = _mm512_set1_ps(x[t * ldx + k]);
      a0[t] = _mm512_fmadd_ps(e0, b, a0[t]);
      a1[t] = _mm512_fmadd_ps(e1, b, a1[t]);
    }
    const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(r0, high)), o1 = _mm512_castsi512_ps(_mm512_and_si512(r1, high));
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512 b = _mm512_set1_ps(x[t * ldx + k + 1]);
      a0[t] = _mm512_fmadd_ps(o0, b, a0[t]);
      a1[t] = _mm512_fmadd_ps(o1, b, a1[t]);
    }
  }
  store_rows32<T>(a0, a1, rows, y, ldy);
}

}  // namespace

void fma_gemm_packed_rows32(const float* x, int64_t M, int64_t K, int64_t ldx, const uint32_t* p, int64_t rows,
                            float* y, int64_t ldy) {
  for_each_token_group<kTokens>(M, [&](auto n, int64_t t0) {
    micro<decltype(n)::value>(p, x + t0 * ldx, ldx, K, int(rows), y + t0 * ldy, ldy);
  });
}

void fma_gemm_rows32(const float* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* W, int64_t ldw,
                     int64_t rows, float* y, int64_t ldy) {
  struct Tag;
  uint32_t* const packed = thread_buffer<Tag, uint32_t>(size_t(K / 2 * kRows));
  pack_column_pairs32(W, ldw, K, packed);
  fma_gemm_packed_rows32(x, M, K, ldx, packed, rows, y, ldy);
}

}  // namespace mla::cpu
