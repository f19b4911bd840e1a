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
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/common/transpose_avx512.h"

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
void micro_pairs(const uint32_t* p, const uint32_t* x, int64_t K, const char* pf, int64_t pf_lines, int rows, float* y,
                 int64_t ldy) {
  __m512 a0[T], a1[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) a0[t] = a1[t] = _mm512_setzero_ps();
  // pf_lines cache lines from pf, spread evenly over the K / 2 column pairs.
  int64_t line = 0, due = 0;
  for (int64_t k = 0; k < K; k += 2, p += 32, x += T) {
    for (; line < pf_lines && due <= k / 2 * pf_lines; ++line, due += K / 2)
      _mm_prefetch(pf + line * 64, _MM_HINT_T1);
    const __m512i r0 = _mm512_loadu_si512(p), r1 = _mm512_loadu_si512(p + 16);  // stored weights: any alignment
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512bh b = as_bh(_mm512_set1_epi32(int32_t(x[t])));
      a0[t] = _mm512_dpbf16_ps(a0[t], as_bh(r0), b);
      a1[t] = _mm512_dpbf16_ps(a1[t], as_bh(r1), b);
    }
  }
  store_rows32<T>(a0, a1, rows, y, ldy);
}

}  // namespace

void pack_activation_pair_group(const uint16_t* x, int64_t n, int64_t K, int64_t ldx, uint32_t* out) {
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = x + t * ldx;
    for (int64_t j = 0; j < K / 2; ++j) std::memcpy(out + j * n + t, row + 2 * j, 4);
  }
}

void pack_activation_pair_group(const float* x, int64_t n, int64_t K, int64_t ldx, uint32_t* out) {
  const __mmask16 keep = __mmask16((1u << n) - 1);
  for (int64_t c = 0; c < K / 32; ++c) {
    __m512i r[16];  // r[t]: token t's 16 pairs of this chunk, then (transposed) r[j]: pair j of every token
    for (int t = 0; t < 16; ++t) {
      const float* src = x + t * ldx + c * 32;
      r[t] = t < n ? reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src)))
                   : _mm512_setzero_si512();
    }
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_mask_storeu_epi32(out + (c * 16 + j) * n, keep, r[j]);
  }
}

void pack_activation_pairs(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, uint32_t* out) {
  for (int64_t g = 0, groups = token_group_count(M, kDpbf16PairsTokens); g < groups; ++g) {
    const TokenGroup tg = token_group(M, kDpbf16PairsTokens, g);
    pack_activation_pair_group(x + tg.t0 * ldx, tg.n, K, ldx, out + tg.t0 * (K / 2));
  }
}

void dpbf16_gemm_packed_rows32(const uint32_t* xp, int64_t M, int64_t K, const uint32_t* p, const void* next,
                               int64_t rows, float* y, int64_t ldy) {
  // The next block comes in while the token groups run, each fetching its tokens' share of the
  // lines (a prefetch never faults).
  const int64_t lines = next != nullptr ? 32 * K * 2 / 64 : 0;
  const char* pf = static_cast<const char*>(next);
  for_each_token_group<kDpbf16PairsTokens>(M, [&](auto n, int64_t t0) {  // 24 accumulators
    const int64_t l0 = lines * t0 / M, l1 = lines * (t0 + n) / M;
    micro_pairs<decltype(n)::value>(p, xp + t0 * (K / 2), K, pf + l0 * 64, l1 - l0, int(rows), y + t0 * ldy, ldy);
  });
}

void dpbf16_gemm_pairs_rows32(const uint32_t* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows,
                              bool prefetch, float* y, int64_t ldy) {
  struct Tag;
  uint32_t* const packed = thread_buffer<Tag, uint32_t>(size_t(K / 2 * 32));
  pack_column_pairs32(W, ldw, K, packed);
  // The caller's next block of 32 rows follows where ldw == K.
  dpbf16_gemm_packed_rows32(xp, M, K, packed, prefetch && ldw == K ? W + 32 * ldw : nullptr, rows, y, ldy);
}

void dpbf16_gemm_rows32(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* W, int64_t ldw,
                        int64_t rows, bool prefetch, float* y, int64_t ldy) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const uint16_t* w = W + r0 * ldw;
    // The next 4 rows (past the last: the caller's next block of 32, as a thread takes its
    // blocks in order; a prefetch never faults) come in while the first token group runs.
    const uint16_t* next = prefetch ? W + (r0 + kRows < rows ? r0 + kRows : 32) * ldw : nullptr;
    for_each_token_group<kTokens>(M, [&](auto n, int64_t t0) {
      micro<decltype(n)::value>(w, ldw, x + t0 * ldx, ldx, K, t0 == 0 ? next : nullptr, int(rows - r0), y + t0 * ldy + r0,
                                ldy);
    });
  }
}

}  // namespace mla::cpu
