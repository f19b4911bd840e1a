#include "backend/cpu/attention/small_gemm.h"

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on _mm512_undefined_ps() (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

namespace mla::cpu {

namespace {

// C = alpha x + beta C for one value (beta == 0: C not read).
inline float finish(float x, float alpha, float beta, const float* c) {
  return beta == 0.0f ? alpha * x : alpha * x + beta * *c;
}

// ---- A B^T ------------------------------------------------------------------------------------

// Rows of A per chunk: 8 rows of up to 576 floats (18 KiB) stay in L1 beside the tile's rows of B.
constexpr int64_t kNtRowChunk = 8;

// The 16 sums of v[0..16): lane i of the result is the sum of v[i]'s lanes.
inline __m512 reduce16(__m512 v[16]) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (v2i, v2i+1, v2i, v2i+1) partial sums
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: v4i .. v4i+3
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]))));
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: v8i..+3 (two halves), v8i+4..+7 (two halves)
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88), _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
}

// Rows [0, MR) of A against rows [0, NR) of B, MR, NR <= 4; accumulator r * 4 + c is (r, c).
template <int MR, int NR>
void nt_tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float alpha, float beta, float* C,
             int64_t ldc) {
  __m512 acc[16];
  for (auto& v : acc) v = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 b[NR];
    for (int c = 0; c < NR; ++c) b[c] = _mm512_loadu_ps(B + c * ldb + k);
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_loadu_ps(A + r * lda + k);
      for (int c = 0; c < NR; ++c) acc[r * 4 + c] = _mm512_fmadd_ps(a, b[c], acc[r * 4 + c]);
    }
  }
  if (k < K) {
    const __mmask16 m = __mmask16((1u << (K - k)) - 1);
    __m512 b[NR];
    for (int c = 0; c < NR; ++c) b[c] = _mm512_maskz_loadu_ps(m, B + c * ldb + k);
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_maskz_loadu_ps(m, A + r * lda + k);
      for (int c = 0; c < NR; ++c) acc[r * 4 + c] = _mm512_fmadd_ps(a, b[c], acc[r * 4 + c]);
    }
  }
  alignas(64) float s[16];
  _mm512_store_ps(s, reduce16(acc));
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) C[r * ldc + c] = finish(s[r * 4 + c], alpha, beta, C + r * ldc + c);
}

using NtTile = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float, float, float*, int64_t);
// The tile kernel for MR rows x NR columns (1..4 each), looked up by the counts a product cuts into.
constexpr NtTile kNtTiles[4][4] = {
    {nt_tile<1, 1>, nt_tile<1, 2>, nt_tile<1, 3>, nt_tile<1, 4>},
    {nt_tile<2, 1>, nt_tile<2, 2>, nt_tile<2, 3>, nt_tile<2, 4>},
    {nt_tile<3, 1>, nt_tile<3, 2>, nt_tile<3, 3>, nt_tile<3, 4>},
    {nt_tile<4, 1>, nt_tile<4, 2>, nt_tile<4, 3>, nt_tile<4, 4>}};
NtTile nt_tile_of(int mr, int nr) { return kNtTiles[std::min(mr, 4) - 1][std::min(nr, 4) - 1]; }

// ---- A B --------------------------------------------------------------------------------------

constexpr int kNnRows = 6, kNnVecs = 4;  // tile: 6 rows x 64 columns
constexpr int64_t kNnKChunk = 64;        // B's slice [64, 64] (16 KiB) stays in L1 across the row tiles

// Rows [0, MR) of C, columns [0, 16 (NV - 1) + popcount(last)); k in [0, K).
template <int MR, int NV>
void nn_tile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, __mmask16 last, float alpha,
             float beta, float* C, int64_t ldc) {
  __m512 acc[MR][NV];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
    for (int v = 0; v < NV - 1; ++v) b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);
    b[NV - 1] = _mm512_maskz_loadu_ps(last, B + k * ldb + 16 * (NV - 1));
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  // Unrolled, so that the accumulators stay in registers (GCC keeps a stack copy of an array it
  // indexes in a loop, and updates it on every k).
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      float* c = C + r * ldc + 16 * v;
      __m512 x = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, c), x);
      _mm512_mask_storeu_ps(c, m, x);
    }
}

using NnTile = void (*)(int64_t, const float*, int64_t, const float*, int64_t, __mmask16, float, float, float*, int64_t);
// The tile kernel for MR rows (1..6) x NV vectors of 16 columns (1..4).
constexpr NnTile kNnTiles[6][4] = {
    {nn_tile<1, 1>, nn_tile<1, 2>, nn_tile<1, 3>, nn_tile<1, 4>},
    {nn_tile<2, 1>, nn_tile<2, 2>, nn_tile<2, 3>, nn_tile<2, 4>},
    {nn_tile<3, 1>, nn_tile<3, 2>, nn_tile<3, 3>, nn_tile<3, 4>},
    {nn_tile<4, 1>, nn_tile<4, 2>, nn_tile<4, 3>, nn_tile<4, 4>},
    {nn_tile<5, 1>, nn_tile<5, 2>, nn_tile<5, 3>, nn_tile<5, 4>},
    {nn_tile<6, 1>, nn_tile<6, 2>, nn_tile<6, 3>, nn_tile<6, 4>}};
NnTile nn_tile_of(int mr, int nv) { return kNnTiles[std::min(mr, 6) - 1][std::min(nv, 4) - 1]; }

// K == 0: C = beta C (0 where beta == 0).
void scale_only(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

}  // namespace

void gemm_nt_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_only(M, N, beta, C, ldc);
  for (int64_t i0 = 0; i0 < M; i0 += kNtRowChunk) {
    const int64_t i1 = std::min(M, i0 + kNtRowChunk);
    for (int64_t j = 0; j < N; j += 4) {
      const int nr = int(std::min<int64_t>(4, N - j));
      for (int64_t i = i0; i < i1; i += 4) {
        const int mr = int(std::min<int64_t>(4, i1 - i));
        nt_tile_of(mr, nr)(K, A + i * lda, lda, B + j * ldb, ldb, alpha, beta, C + i * ldc + j, ldc);
      }
    }
  }
}

void gemm_nn_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_only(M, N, beta, C, ldc);
  for (int64_t k0 = 0; k0 < K; k0 += kNnKChunk) {
    const int64_t kc = std::min(kNnKChunk, K - k0);
    // Later chunks add to what the earlier ones wrote.
    const float b = k0 == 0 ? beta : 1.0f, al = alpha;
    for (int64_t j = 0; j < N; j += 16 * kNnVecs) {
      const int64_t cols = std::min<int64_t>(16 * kNnVecs, N - j);
      const int nv = int((cols + 15) / 16);
      const int tail = int(cols - 16 * (nv - 1));
      const __mmask16 last = __mmask16(tail == 16 ? 0xFFFF : (1u << tail) - 1);
      for (int64_t i = 0; i < M; i += kNnRows) {
        const int mr = int(std::min<int64_t>(kNnRows, M - i));
        nn_tile_of(mr, nv)(kc, A + i * lda + k0, lda, B + k0 * ldb + j, ldb, last, al, b, C + i * ldc + j, ldc);
      }
    }
  }
}

}  // namespace mla::cpu
