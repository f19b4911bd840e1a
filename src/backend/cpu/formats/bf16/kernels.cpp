// The kernels of BF16 and BF16_PAIRS32 weights (decode.h has their layouts) and their registry
// entries: the row-major GEMVs over the tile walk (gemv_rows.h), the PAIRS32 GEMVs over its
// blocks, and a row as bf16 for the prompt GEMMs. The prompt's bf16 GEMMs themselves, which every
// format feeds, are dpbf16_gemm.h and fma_gemm.h here and amx.h (formats/gemm.h drives them);
// the load-time rewrite into column pairs is repack.cpp.
#include <cstring>

#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/formats/bf16/decode.h"
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"
#include "backend/cpu/repack.h"

namespace mla::cpu {

namespace avx512 {
namespace {

// The walk both BF16_PAIRS32 GEMVs share (pairs32_rows_f32, pairs32_rows_bf16): the rows [n0, n1)
// of W in whole blocks of 32, tokens in groups of up to 4, each block read as two streams, its
// first and second halves of columns side by side. For every column pair k of the first half
// pair(acc, t0, tn, p, q, k) adds the products of tokens t0 .. t0 + tn - 1 with pair k (p, the
// block's two zmm of it) and pair k + half (q) into acc[t]: [0] and [1] rows 0-15 and 16-31 of
// the even columns, [2] and [3] of the odd ones, summed into y at the end.
template <class Pair>
void pairs32_blocks(const MatrixView& W, int64_t n0, int64_t n1, int64_t T, float* y, int64_t ldy, Pair&& pair) {
  const int64_t half = W.cols / 2;
  for (int64_t b = n0; b < n1; b += 32) {
    const uint32_t* block = static_cast<const uint32_t*>(W.data) + b * half;
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
      const int tn = int(std::min<int64_t>(4, T - t0));
      __m512 acc[4][4];
      for (auto& a : acc)
        for (auto& v : a) v = _mm512_setzero_ps();
      const uint32_t* p = block;
      for (int64_t k = 0; k < half; k += 2, p += 32) {
        touch_page_ahead<128>(p);  // stream_prefetch.h: both streams a page at a time
        touch_page_ahead<128>(p + half * 16);
        pair(acc, t0, tn, p, p + half * 16, k);
      }
      for (int t = 0; t < tn; ++t) {
        float* yt = y + (t0 + t) * ldy + b;
        _mm512_storeu_ps(yt, _mm512_add_ps(acc[t][0], acc[t][2]));
        _mm512_storeu_ps(yt + 16, _mm512_add_ps(acc[t][1], acc[t][3]));
      }
    }
  }
}

// BF16_PAIRS32 rows [n0, n1) (pairs32_blocks): per column pair the block's two zmm widened to
// float32, the low words by a shift, the high by a mask, against the token's two values
// broadcast (at 2 to 4 tokens this ran 1408 x 2048 experts from DRAM at 1.3-1.5x the
// row-major float32 GEMV's GB/s, 2 threads, AMD Zen 5; at one token the fast precision takes
// pairs32_rows_bf16).
void pairs32_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) {
  const MatrixView& W = job.W;
  const int64_t T = job.T, Kc = job.Kc, ldy = job.ldy;
  const float* xp = job.xp;
  float* y = job.y;
  const int64_t half = W.cols / 2, ld = Kc * kChunk;
  const __m512i high = _mm512_set1_epi32(int32_t(0xffff0000u));
  pairs32_blocks(W, n0, n1, T, y, ldy, [&](__m512 (&acc)[4][4], int64_t t0, int tn, const uint32_t* p, const uint32_t* q,
                                            int64_t k) {
    const __m512i r0 = _mm512_loadu_si512(p), r1 = _mm512_loadu_si512(p + 16);
    const __m512i s0 = _mm512_loadu_si512(q), s1 = _mm512_loadu_si512(q + 16);
    const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(r0, 16)), e1 = _mm512_castsi512_ps(_mm512_slli_epi32(r1, 16));
    const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(r0, high)), o1 = _mm512_castsi512_ps(_mm512_and_si512(r1, high));
    const __m512 f0 = _mm512_castsi512_ps(_mm512_slli_epi32(s0, 16)), f1 = _mm512_castsi512_ps(_mm512_slli_epi32(s1, 16));
    const __m512 g0 = _mm512_castsi512_ps(_mm512_and_si512(s0, high)), g1 = _mm512_castsi512_ps(_mm512_and_si512(s1, high));
    for (int t = 0; t < tn; ++t) {
      const float* xt = xp + (t0 + t) * ld + k;
      const __m512 xe = _mm512_set1_ps(xt[0]), xo = _mm512_set1_ps(xt[1]);
      const __m512 ye = _mm512_set1_ps(xt[half]), yo = _mm512_set1_ps(xt[half + 1]);
      acc[t][0] = _mm512_fmadd_ps(f0, ye, _mm512_fmadd_ps(e0, xe, acc[t][0]));
      acc[t][1] = _mm512_fmadd_ps(f1, ye, _mm512_fmadd_ps(e1, xe, acc[t][1]));
      acc[t][2] = _mm512_fmadd_ps(g0, yo, _mm512_fmadd_ps(o0, xo, acc[t][2]));
      acc[t][3] = _mm512_fmadd_ps(g1, yo, _mm512_fmadd_ps(o1, xo, acc[t][3]));
    }
  });
}

// BF16_PAIRS32 rows [n0, n1) (pairs32_blocks), columns a multiple of 64 (bf16_kernel): as
// pairs32_rows_f32 on VDPBF16PS, each token's bf16 pair broadcast against the block's two zmm of
// a column pair. A float32 FMA a column costs about three instructions per 64 bytes of
// weights against one here: at one token, 1408 x 2048 experts from DRAM on 2 threads (AMD Zen
// 5, batches of 8 as an MoE decode step) streamed at 33-35 GB/s on the FMAs and 36-40 on the
// row-major bf16 GEMV in one run, 40.0-40.1 here against 37.7-37.9 for that GEMV in another.
void pairs32_rows_bf16(const GemvFastRows& job, int64_t n0, int64_t n1) {
  const MatrixView* W = job.W;
  const int64_t T = job.T, S = job.S, ldy = job.ldy;
  const uint16_t* xp = job.xp;
  float* y = job.y;
  const int64_t half = W->cols / 2, ld = S * kStep;
  pairs32_blocks(*W, n0, n1, T, y, ldy, [&](__m512 (&acc)[4][4], int64_t t0, int tn, const uint32_t* p, const uint32_t* q,
                                             int64_t k) {
    const __m512i r0 = _mm512_loadu_si512(p), r1 = _mm512_loadu_si512(p + 16);
    const __m512i s0 = _mm512_loadu_si512(q), s1 = _mm512_loadu_si512(q + 16);
    for (int t = 0; t < tn; ++t) {
      const uint16_t* xt = xp + (t0 + t) * ld + k;
      int32_t lo, hi;
      std::memcpy(&lo, xt, 4);
      std::memcpy(&hi, xt + half, 4);
      const __m512bh bx = as_bh(_mm512_set1_epi32(lo)), by = as_bh(_mm512_set1_epi32(hi));
      acc[t][0] = _mm512_dpbf16_ps(acc[t][0], as_bh(r0), bx);
      acc[t][1] = _mm512_dpbf16_ps(acc[t][1], as_bh(r1), bx);
      acc[t][2] = _mm512_dpbf16_ps(acc[t][2], as_bh(s0), by);
      acc[t][3] = _mm512_dpbf16_ps(acc[t][3], as_bh(s1), by);
    }
  });
}

void bf16_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { job.segment<DecBF16>(n0, n1, job.xp, 1.0f); }
void bf16_rows_bf16(const GemvFastRows& job, int64_t n0, int64_t n1) { job.segment<BfDecBF16>(n0, n1, nullptr, 1.0f); }

void bf16_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float*) {
  decoded_row_bf16(DecBF16{reinterpret_cast<const uint16_t*>(row_bytes_of(W, n))}, W.cols / kChunk, out);
}

// The AMX GEMM's and oneDNN's way in (the GEMMs without AMX read the blocks in place): row n's
// column pairs gathered from its block.
void pairs32_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float*) {
  const int64_t K = W.cols;
  const uint32_t* block = static_cast<const uint32_t*>(W.data) + (n / 32) * 16 * K;
  for (int64_t p = 0; p < K / 2; ++p) std::memcpy(out + 2 * p, block + p * 32 + n % 32, 4);
}

}  // namespace
}  // namespace avx512

using namespace avx512;

// The registry's entries (formats/registry.cpp).
extern const FormatKernels kBf16Format{.format = WeightFormat::BF16, .name = "bf16", .layout = Layout::EvenOdd,
    .layout64 = Layout64::Natural, .element = bf16_element, .gemv_f32 = bf16_rows_f32, .gemv_bf16 = bf16_rows_bf16,
    .fast_gemv_tokens = 4, .row_bf16 = bf16_row_bf16, .bf16_weights = Bf16Weights::InPlace,
    .repacked = WeightFormat::BF16_PAIRS32, .repack_eligible = pairs32_eligible, .repack = repack_pairs32};
extern const FormatKernels kBf16Pairs32Format{.format = WeightFormat::BF16_PAIRS32, .name = "bf16-pairs32",
    .row_block = 32, .element = pairs32_element, .gemv_f32 = pairs32_rows_f32, .gemv_bf16 = pairs32_rows_bf16,
    .gemv_bf16_cols = 64, .fast_gemv_tokens = 4, .row_bf16 = pairs32_row_bf16, .bf16_weights = Bf16Weights::Pairs32};

}  // namespace mla::cpu
