// bf16 GEMM on VDPBF16PS (see dpbf16_gemm.h). Register blocking: 4 weight rows x up to 6 tokens
// of float32 accumulators (24 of the 32 zmm registers); per step of 32 columns, 4 weight loads
// and 6 token loads feed 24 VDPBF16PS. A group of 4 rows (16 KiB at K = 2048) stays in L1 while
// every token group of the call passes over it, the tokens come from L2 (the caller bounds a
// pass to about 1 MiB of them). The tokens are split into groups of nearly equal size, at most 6
// (52 tokens: seven groups of 6 and two of 5), so no group is left with one or two tokens and
// too few independent chains to keep the VDPBF16PS ports busy.
//
// The layout before this one broadcast one weight pair to 16 tokens of an activation block
// packed for AMX: a token count off a multiple of 16 padded its last block, which cost an
// expert with 33 tokens a third of its time (0.66 of the VDPBF16PS peak at 33 tokens, 0.99 at
// 48, one thread, 2816 x 2048). This one ran 0.95-0.97 of the peak at 33, 37, 41, 48 and 52.
#include "backend/cpu/dpbf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/decode_avx512.h"
#include "backend/cpu/transpose_avx512.h"

namespace mla::cpu {

namespace {

using avx512::as_bh;

constexpr int kRows = 4;       // weight rows per register block
constexpr int kTokens = 6;     // most tokens per register block
constexpr int64_t kStep = 32;  // columns per VDPBF16PS

// The sums of four accumulators' lanes: {sum a, sum b, sum c, sum d}.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const auto fold = [](__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  };
  const __m256 ab = _mm256_hadd_ps(fold(a), fold(b));  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(fold(c), fold(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a b c d (lower half's lanes) | a b c d (upper's)
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// y[t, r] for 4 rows of w and T tokens of x over all K columns; rows past `rows` are computed
// but not stored. `pf`: 4 rows fetched towards L2 step by step alongside (nullptr: none).
template <int T>
void micro(const uint16_t* w, int64_t ldw, const uint16_t* x, int64_t ldx, int64_t K, const uint16_t* pf,
           int rows, float* y, int64_t ldy) {
  __m512 acc[kRows][T];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 6
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += kStep) {
    if (pf != nullptr) {
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * ldw + k), _MM_HINT_T1);
    }
    __m512i wv[kRows];
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) wv[r] = _mm512_loadu_si512(w + r * ldw + k);
#pragma GCC unroll 6
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_loadu_si512(x + t * ldx + k);
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(wv[r]), as_bh(xv));
    }
  }
  const __mmask8 keep = __mmask8((1u << std::min(rows, kRows)) - 1);
#pragma GCC unroll 6
  for (int t = 0; t < T; ++t) _mm_mask_storeu_ps(y + t * ldy, keep, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
}

// y[t, 0..31] for T tokens over a block of 32 rows packed as column pairs (pack_column_pairs32):
// per pair the 32 rows' two weights in two zmm, each token's two activations (one dword)
// broadcast to both. Rows past `rows` not stored.
template <int T>
void micro_pairs(const uint32_t* p, const uint16_t* x, int64_t ldx, int64_t K, int rows, float* y, int64_t ldy) {
  __m512 a0[T], a1[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) a0[t] = a1[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2, p += 32) {
    const __m512i r0 = _mm512_load_si512(p), r1 = _mm512_load_si512(p + 16);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      uint32_t pair;
      std::memcpy(&pair, x + t * ldx + k, 4);
      const __m512bh b = as_bh(_mm512_set1_epi32(int32_t(pair)));
      a0[t] = _mm512_dpbf16_ps(a0[t], as_bh(r0), b);
      a1[t] = _mm512_dpbf16_ps(a1[t], as_bh(r1), b);
    }
  }
  const __mmask16 m0 = __mmask16((1u << std::min(rows, 16)) - 1);
  const __mmask16 m1 = rows > 16 ? __mmask16((1u << std::min(rows - 16, 16)) - 1) : __mmask16(0);
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(y + t * ldy, m0, a0[t]);
    _mm512_mask_storeu_ps(y + t * ldy + 16, m1, a1[t]);
  }
}

}  // namespace

void dpbf16_gemm_pairs_rows32(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* W, int64_t ldw,
                              int64_t rows, float* y, int64_t ldy) {
  thread_local std::vector<uint32_t> buf;  // each thread's, kept between calls
  if (buf.size() < size_t(K / 2 * 32 + 16)) buf.resize(size_t(K / 2 * 32 + 16));
  uint32_t* const packed = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  pack_column_pairs32(W, ldw, K, packed);
  constexpr int64_t kPairTokens = 12;  // 24 accumulators
  const int64_t groups = (M + kPairTokens - 1) / kPairTokens;
  const int nr = int(rows);
  int64_t t0 = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t left = groups - g, tn = (M - t0 + left - 1) / left;
    const uint16_t* xo = x + t0 * ldx;
    float* yo = y + t0 * ldy;
    switch (tn) {
      case 1: micro_pairs<1>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 2: micro_pairs<2>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 3: micro_pairs<3>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 4: micro_pairs<4>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 5: micro_pairs<5>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 6: micro_pairs<6>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 7: micro_pairs<7>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 8: micro_pairs<8>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 9: micro_pairs<9>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 10: micro_pairs<10>(packed, xo, ldx, K, nr, yo, ldy); break;
      case 11: micro_pairs<11>(packed, xo, ldx, K, nr, yo, ldy); break;
      default: micro_pairs<12>(packed, xo, ldx, K, nr, yo, ldy); break;
    }
    t0 += tn;
  }
}

void dpbf16_gemm_rows32(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* W, int64_t ldw,
                        int64_t rows, bool prefetch, float* y, int64_t ldy) {
  const int64_t groups = (M + kTokens - 1) / kTokens;
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const uint16_t* w = W + r0 * ldw;
    // The next 4 rows (past the last: the caller's next block of 32, as a thread takes its
    // blocks in order; a prefetch never faults) come in while the first token group runs.
    const uint16_t* next = prefetch ? W + (r0 + kRows < rows ? r0 + kRows : 32) * ldw : nullptr;
    int64_t t0 = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t left = groups - g, tn = (M - t0 + left - 1) / left;
      const uint16_t* pf = g == 0 ? next : nullptr;
      const int nr = int(rows - r0);
      float* yo = y + t0 * ldy + r0;
      const uint16_t* xo = x + t0 * ldx;
      switch (tn) {
        case 1: micro<1>(w, ldw, xo, ldx, K, pf, nr, yo, ldy); break;
        case 2: micro<2>(w, ldw, xo, ldx, K, pf, nr, yo, ldy); break;
        case 3: micro<3>(w, ldw, xo, ldx, K, pf, nr, yo, ldy); break;
        case 4: micro<4>(w, ldw, xo, ldx, K, pf, nr, yo, ldy); break;
        case 5: micro<5>(w, ldw, xo, ldx, K, pf, nr, yo, ldy); break;
        default: micro<6>(w, ldw, xo, ldx, K, pf, nr, yo, ldy); break;
      }
      t0 += tn;
    }
  }
}

}  // namespace mla::cpu
