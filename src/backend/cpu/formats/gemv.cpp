// Fused dequantize-and-dot kernels for a few tokens (see gemv.h): a tile of R rows x up to 4
// tokens, each chunk of 32 columns decoded once in registers (decode_avx512.h) and dotted with
// the tokens' activations, permuted once per call into the format's lane layout ("prepared").
// FP8 block scales are folded into the activations per 128-row block (times 2^64, the sum
// times 2^56, keeping the 2^-120 of the decode far from float32's range limits).
//
// In the fast precision (Context::precision == Fast) bf16, FP8 and INT4 weights take a second
// family of kernels: the activations are rounded to bf16 once per call (round to nearest even,
// permuted into the format's word layout), each 64-column step of a row is decoded to bf16 in
// registers (exactly: the weights' values, times 2^-120 for FP8, before the INT4 group scale)
// and dotted by VDPBF16PS, whose products of two bf16 are exact in float32 and summed in
// float32. FP8 block scales and INT4 group scales multiply the float32 partial sums of their
// 128 / 32 columns. F32, F16 and INT8 weights keep the float32 kernels in both precisions (INT8:
// dispatch.cpp's gemv_kernel has the measurements), and so do products of more tokens than
// Context::gemv_bf16_max_tokens (1 by default), except FP8
// products of 2 to 16 tokens where the CPU has AMX: those run on tiles of 16 rows (amx.h), the
// activations rounded to bf16 as above. Where int8 activations are on, INT4 and INT8 repacked at
// load (INT4_WORDS16, INT8_WORDS16) run on VPDPBUSD over int8 activations instead, as the
// prompt's VNNI GEMM does (VnniRows). dispatch.h's gemv_kernel decides, per product.
#include "backend/cpu/formats/gemv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/common/decode_avx512.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"
#include "tensor/dtype.h"

namespace mla::cpu {

namespace {

using namespace avx512;

constexpr bool kPrefetch = true;  // software prefetch ahead in each row of a tile
constexpr int kMaxTT = 4;            // tokens sharing one decode of a chunk
// Below this many weights a product runs on the calling thread alone: a parallel region costs a
// few microseconds of fork and barrier (far more when the cores are shared), which is what
// streaming 256K weights takes.
constexpr int64_t kSerialWork = int64_t(1) << 18;
// Weight bytes per dynamically scheduled work unit: a quarter of a thread's share of the call,
// within these bounds. Each unit starts its row streams cold (nothing prefetched ahead of its
// first rows), so larger units read faster: mla bench decode (2 threads, batch 1) with units up
// to 1 MiB against a fixed 192 KiB: fp8 24.7-25.1 against 22.2-22.8 tokens/s, bf16 17.7 against
// 15.9-16.4, int4 21.2-22.5 against 20.3-20.5 (alternating runs); up to 2 MiB, fp8 24.1-24.3.
constexpr double kMinUnitBytes = 192 * 1024, kMaxUnitBytes = 1024 * 1024;

// The kernels of a job: the float32 GEMV (Rows), the bf16 ones (FastRows: VDPBF16PS, AMX FP8
// tiles), the VNNI GEMV of INT8_WORDS16 (VnniRows).
enum class Family { F32, Bf16, Vnni };

struct Unit {
  Family family;
  size_t job;
  int64_t n0, n1;
};
constexpr float kFp8XScale = 18446744073709551616.0f;  // 2^64
constexpr float kFp8YScale = 72057594037927936.0f;     // 2^56 (2^64 * 2^56 = 2^120)

// ---- the order of the tiles ------------------------------------------------------------------

// The rows of one tile lie at least a page apart. Rows of 2 KiB (FP8 at 2048 columns) or 1 KiB
// (INT4) taken side by side put 2 or 4 of a tile's streams in one 4 KiB page, and the L2
// streamer, which follows one stream per page, then fetches less ahead. bench/matmul --quick
// (2 threads, 1 GB of 1408 x 2048 and 2048 x 1408 experts from DRAM, one token, two runs each):
// FP8 19.1-20.3 GB/s with adjacent rows, 22.8-23.5 a page apart, 20.7-21.2 two pages apart;
// INT4 13.9-15.1, 16.1-17.3 and 13.4-15.7 (kPageBytes: stream_prefetch.h).

// Calls tile(n, gap) for tiles of R rows n, n + gap, ..., n + (R - 1) gap covering [s, e) (gap:
// the fewest rows that span a page), then for adjacent rows, and rest(n) with the first of the
// rows left over (fewer than R).
template <int R, class Tile, class Rest>
inline void for_each_tile(int64_t s, int64_t e, int64_t row_bytes, Tile&& tile, Rest&& rest) {
  const int64_t gap = std::max<int64_t>(1, (kPageBytes + row_bytes - 1) / std::max<int64_t>(1, row_bytes));
  int64_t n = s;
  for (; n + R * gap <= e; n += R * gap)
    for (int64_t j = 0; j < gap; ++j) tile(n + j, gap);
  for (; n + R <= e; n += R) tile(n, int64_t(1));
  if (n < e) rest(n);
}

// Each tile keeps two accumulators per (row, token) — one per half of a chunk — to keep two FMA
// chains in flight; these set them to zero and reduce them to one float each.
template <int R, int TT>
[[gnu::always_inline]] inline void zero_sums(__m512 (&a)[R][TT], __m512 (&b)[R][TT]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) a[r][t] = b[r][t] = _mm512_setzero_ps();
}

template <int R, int TT>
[[gnu::always_inline, gnu::flatten]] inline void reduce_sums(const __m512 (&a)[R][TT], const __m512 (&b)[R][TT],
                                               float (&out)[R][TT]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) out[r][t] = hsum(_mm512_add_ps(a[r][t], b[r][t]));
}

// One step of a tile: both halves of the step's x for every token, then per row the decoded
// weight halves multiplied into the two accumulators of every token. Madd says what a step is:
// 32 float32 columns with FMA (F32Madd) or 64 bf16 columns with VDPBF16PS (Bf16Madd).
struct F32Madd {
  using X = float;
  using V = __m512;
  static constexpr int64_t kHalf = kChunk / 2;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 madd(__m512 acc, V w, V x) { return _mm512_fmadd_ps(w, x, acc); }
};
struct Bf16Madd {
  using X = uint16_t;
  using V = __m512i;
  static constexpr int64_t kHalf = kStep / 2;
  static V load(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static __m512 madd(__m512 acc, V w, V x) { return _mm512_dpbf16_ps(acc, as_bh(w), as_bh(x)); }
};

template <class Madd, int TT, int R, class Dec>
[[gnu::always_inline, gnu::flatten]] inline void tile_step(const Dec* dec, const typename Madd::X* xp, int64_t ldxp,
                                             int64_t s, __m512 (&acc)[R][TT], __m512 (&acc2)[R][TT]) {
  constexpr int64_t kWidth = 2 * Madd::kHalf;
  typename Madd::V xa[TT], xb[TT];
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t) {
    xa[t] = Madd::load(xp + t * ldxp + s * kWidth);
    xb[t] = Madd::load(xp + t * ldxp + s * kWidth + Madd::kHalf);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    typename Madd::V a, b;
    if constexpr (kPrefetch) dec[r].prefetch(s);
    dec[r].decode(s, a, b);
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      acc[r][t] = Madd::madd(acc[r][t], a, xa[t]);
      acc2[r][t] = Madd::madd(acc2[r][t], b, xb[t]);
    }
  }
}

// ---- the tile kernel: R rows x TT tokens over Kc chunks ---------------------------------------

template <int TT, int R, class Dec>
[[gnu::flatten]] inline void tile(const Dec* dec, const float* xp, int64_t ldxp, int64_t Kc, float (&out)[R][TT]) {
  __m512 acc[R][TT], acc2[R][TT];
  zero_sums(acc, acc2);
  for (int64_t c = 0; c < Kc; ++c) tile_step<F32Madd, TT, R>(dec, xp, ldxp, c, acc, acc2);
  reduce_sums(acc, acc2, out);
}

// Per-thread scratch, reused across calls (no allocation once warm).
struct Scratch {
  std::vector<float> xs;      // FP8: the prepared activations times a row block's scales
  std::vector<float> scales;  // INT4, INT8: per-chunk float32 scales of the rows of a tile
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The walk both BF16_PAIRS32 GEMVs share (Rows::pairs32, FastRows::pairs32): the rows [n0, n1)
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

// The walk both INT4_WORDS16 GEMVs share (Rows::words16, FastRows::words16): the rows [n0, n1)
// of W in whole blocks of 16, tokens in groups of up to 4. For each chunk c of 32 columns,
// chunk(tn, part, t0, p, d) adds the products of tokens t0 .. t0 + tn - 1 (tn a
// std::integral_constant: the sums stay in registers) with the block's 4 words of it (p: 16 rows'
// words d = 4c .. 4c + 3, 8 columns each) into part[t][0..3]; their sum times the rows' group
// scales goes into the token's total, stored to y at the end of the block.
template <int TN, class Chunk>
void words16_tokens(const MatrixView& W, const uint32_t* block, const uint16_t* sc, int64_t t0, float* y, int64_t ldy,
                    Chunk& chunk) {
  const int64_t Kc = W.cols / kChunk, per = W.group_size / kChunk;
  __m512 total[TN];
  for (int t = 0; t < TN; ++t) total[t] = _mm512_setzero_ps();
  int64_t in_group = 0;  // chunks of the current group done (sc: its scales)
  for (int64_t c = 0; c < Kc; ++c) {
    const uint32_t* p = block + c * 64;
    if constexpr (kPrefetch)
      for (int l = 0; l < 4; ++l) prefetch_at(p, l * 64);
    __m512 part[TN][4];
    for (auto& a : part)
      for (auto& v : a) v = _mm512_setzero_ps();
    chunk(std::integral_constant<int, TN>{}, part, t0, p, 4 * c);
    const __m512 s = words16_scales(sc);
    for (int t = 0; t < TN; ++t)
      total[t] = _mm512_fmadd_ps(
          _mm512_add_ps(_mm512_add_ps(part[t][0], part[t][1]), _mm512_add_ps(part[t][2], part[t][3])), s, total[t]);
    if (++in_group == per) in_group = 0, sc += 16;
  }
  for (int t = 0; t < TN; ++t) _mm512_storeu_ps(y + (t0 + t) * ldy, total[t]);
}

template <class Chunk>
void words16_blocks(const MatrixView& W, int64_t n0, int64_t n1, int64_t T, float* y, int64_t ldy, Chunk&& chunk) {
  const int64_t words = W.cols / 8;
  for (int64_t b = n0; b < n1; b += 16) {
    const uint32_t* block = static_cast<const uint32_t*>(W.data) + b * words;
    const uint16_t* sc = static_cast<const uint16_t*>(W.scales) + words16_scale(W.row0 + b, 0, W.scale_cols);
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
      switch (std::min<int64_t>(4, T - t0)) {
        case 1: words16_tokens<1>(W, block, sc, t0, y + b, ldy, chunk); break;
        case 2: words16_tokens<2>(W, block, sc, t0, y + b, ldy, chunk); break;
        case 3: words16_tokens<3>(W, block, sc, t0, y + b, ldy, chunk); break;
        default: words16_tokens<4>(W, block, sc, t0, y + b, ldy, chunk); break;
      }
    }
  }
}

// The rows [n0, n1) of one thread.
struct Rows {
  const MatrixView& W;
  const float* x;
  int64_t ldx;
  const float* xp;  // prepared, [T, Kc * 32]
  int64_t T, Kc;
  float* y;
  int64_t ldy;

  template <class Dec>
  Dec make(int slot, int64_t n, float* sbuf) const {
    const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
    if constexpr (std::is_same_v<Dec, DecF32>) return {reinterpret_cast<const float*>(row)};
    else if constexpr (std::is_same_v<Dec, DecF16> || std::is_same_v<Dec, DecBF16>) return {reinterpret_cast<const uint16_t*>(row)};
    else if constexpr (std::is_same_v<Dec, DecFP8>) return {row};
    else {
      float* s = sbuf + slot * Kc;
      group_chunk_scales(W, n, Kc, s);
      return {row, s};
    }
  }

  // Rows n, n + gap, ... (R of them).
  template <class Dec, int TT, int R>
  void do_tile(int64_t n, int64_t gap, int64_t t0, const float* xseg, float post, float* sbuf) const {
    Dec dec[R];
    for (int r = 0; r < R; ++r) dec[r] = make<Dec>(r, n + r * gap, sbuf);
    float out[R][TT];
    tile<TT, R>(dec, xseg + t0 * Kc * kChunk, Kc * kChunk, Kc, out);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) {
        const int64_t row = n + r * gap;
        float v = out[r][t] * post;
        for (int64_t k = Kc * kChunk; k < W.cols; ++k) v += element(W, row, k) * x[(t0 + t) * ldx + k];
        y[(t0 + t) * ldy + row] = v;
      }
  }

  template <class Dec, int TT>
  void rows_tt(int64_t s, int64_t e, int64_t t0, const float* xseg, float post, float* sbuf) const {
    constexpr int R = TT <= 2 ? 4 : 2;
    for_each_tile<R>(
        s, e, int64_t(W.row_bytes()), [&](int64_t n, int64_t gap) { do_tile<Dec, TT, R>(n, gap, t0, xseg, post, sbuf); },
        [&](int64_t n) {
          for (; n < e; ++n) do_tile<Dec, TT, 1>(n, 1, t0, xseg, post, sbuf);
        });
  }

  template <class Dec>
  void segment(int64_t s, int64_t e, const float* xseg, float post) const {
    Scratch& sc = scratch();
    float* sbuf = nullptr;
    if constexpr (std::is_same_v<Dec, DecInt4> || std::is_same_v<Dec, DecInt8>) {
      if (sc.scales.size() < size_t(4 * Kc)) sc.scales.resize(size_t(4 * Kc));
      sbuf = sc.scales.data();
    }
    for (int64_t t0 = 0; t0 < T; t0 += kMaxTT) {
      switch (std::min<int64_t>(kMaxTT, T - t0)) {
        case 1: rows_tt<Dec, 1>(s, e, t0, xseg, post, sbuf); break;
        case 2: rows_tt<Dec, 2>(s, e, t0, xseg, post, sbuf); break;
        case 3: rows_tt<Dec, 3>(s, e, t0, xseg, post, sbuf); break;
        default: rows_tt<Dec, 4>(s, e, t0, xseg, post, sbuf); break;
      }
    }
  }

  // BF16_PAIRS32 rows [n0, n1) (pairs32_blocks): per column pair the block's two zmm widened to
  // float32, the low words by a shift, the high by a mask, against the token's two values
  // broadcast (at 2 to 4 tokens this ran 1408 x 2048 experts from DRAM at 1.3-1.5x the
  // row-major float32 GEMV's GB/s, 2 threads, AMD Zen 5; at one token the fast precision takes
  // FastRows::pairs32).
  void pairs32(int64_t n0, int64_t n1) const {
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

  // INT4_WORDS16 rows [n0, n1) (words16_blocks): nibble i of each word, shifted down, picks its
  // code's float32 q - 8 from vpermps's table; one FMA a token against column 8d + i, broadcast
  // from the unpermuted activations.
  void words16(int64_t n0, int64_t n1) const {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    words16_blocks(W, n0, n1, T, y, ldy, [&](auto tn, auto& part, int64_t t0, const uint32_t* p, int64_t d0) {
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m512i w = _mm512_loadu_si512(p + v * 16);
        const float* xc = x + t0 * ldx + (d0 + v) * 8;
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          const __m512 q = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * i), table);
#pragma GCC unroll 4
          for (int t = 0; t < decltype(tn)::value; ++t)
            part[t][i & 3] = _mm512_fmadd_ps(q, _mm512_set1_ps(xc[t * ldx + i]), part[t][i & 3]);
        }
      }
    });
  }

  void run(int64_t n0, int64_t n1) const {
    if (n0 >= n1) return;
    switch (W.format) {
      case WeightFormat::BF16_PAIRS32: pairs32(n0, n1); break;
      case WeightFormat::INT4_WORDS16: words16(n0, n1); break;
      case WeightFormat::INT8_WORDS16: break;  // VnniRows, or the reference (gemv_kernel)
      case WeightFormat::F32: segment<DecF32>(n0, n1, xp, 1.0f); break;
      case WeightFormat::F16: segment<DecF16>(n0, n1, xp, 1.0f); break;
      case WeightFormat::BF16: segment<DecBF16>(n0, n1, xp, 1.0f); break;
      case WeightFormat::INT4_GROUP: segment<DecInt4>(n0, n1, xp, 1.0f); break;
      case WeightFormat::INT8_GROUP: segment<DecInt8>(n0, n1, xp, 1.0f); break;
      case WeightFormat::FP8_BLOCK128: {
        // Rows of one 128-row block share their scales: fold them into the activations.
        Scratch& sc = scratch();
        const int64_t width = Kc * kChunk;
        if (sc.xs.size() < size_t(T * width)) sc.xs.resize(size_t(T * width));
        const float* bs = static_cast<const float*>(W.scales);
        for (int64_t s = n0; s < n1;) {
          const int64_t blk = (W.row0 + s) / 128;
          const int64_t e = std::min(n1, (blk + 1) * 128 - W.row0);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < Kc; ++c) {
              const __m512 f = _mm512_set1_ps(bs[blk * W.scale_cols + (c * kChunk) / 128] * kFp8XScale);
              const float* src = xp + t * width + c * kChunk;
              float* dst = sc.xs.data() + t * width + c * kChunk;
              _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_loadu_ps(src), f));
              _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_loadu_ps(src + 16), f));
            }
          segment<DecFP8>(s, e, sc.xs.data(), kFp8YScale);
          s = e;
        }
        break;
      }
    }
  }
};

// ---- the fast precision: bf16 x bf16 products (VDPBF16PS) ------------------------------------

constexpr float kFp8FastXScale = 18446744073709551616.0f;  // 2^64: activations, before rounding
constexpr float kFp8FastPost = 72057594037927936.0f;       // 2^56: the sums (2^64 * 2^56 = 2^120)
constexpr float kFp8FastFix = 1.0f / 18446744073709551616.0f;  // 2^-64: the subnormals' sums

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// The same on 16 lanes, with the instruction prepare_bf16 rounds the other columns with.
inline __m512 round_bf16(__m512 f) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(f)), 16));
}

// The products of the FP8 subnormal codes among the step's 64 bytes (mask: exponent field 0),
// which VDPBF16PS reads as zero: fix[t] += code * scale * x, x as the kernel holds it (times
// 2^64). Rare in trained weights (values under 2^-6 of the format's 448).
template <int TT>
[[gnu::noinline, gnu::cold]] void fp8_subnormals(const uint8_t* bytes, uint64_t mask, const uint16_t* xs, int64_t ldxp,
                                                 float scale, float* fix) {
  BfDecFP8::subnormals(bytes, mask, scale, [&](int w, float v) {
    for (int t = 0; t < TT; ++t) fix[t] += v * bf16_to_f32(xs[t * ldxp + w]);
  });
}

template <int TT, int R, class D>
inline void tile_bf16(const D* dec, const uint16_t* xp, int64_t ldxp, int64_t S, float (&out)[R][TT],
                      float (&fix)[R][TT]) {
  __m512 acc[R][TT], acc2[R][TT];
  zero_sums(acc, acc2);
  if constexpr (D::kStepsPerScale == 0) {
    for (int64_t s = 0; s < S; ++s) tile_step<Bf16Madd, TT, R>(dec, xp, ldxp, s, acc, acc2);
  } else {
    // Partial sums over the columns of one scale (a step pair for FP8, a step for INT4), then
    // times the scale into the accumulator.
    constexpr int64_t G = D::kStepsPerScale;
    for (int64_t g = 0; g < S; g += G) {
      const int64_t ge = std::min(S, g + G);
      // FP8 sums a and b apart (chains of 2 VDPBF16PS per 128 columns, 2 FMAs), INT4 together.
      constexpr bool two = G > 1;
      __m512 part[R][TT], part2[R][TT];
      zero_sums(part, part2);
      for (int64_t s = g; s < ge; ++s) {
        __m512i xa[TT], xb[TT];
#pragma GCC unroll 8
        for (int t = 0; t < TT; ++t) {
          xa[t] = _mm512_loadu_si512(xp + t * ldxp + s * kStep);
          xb[t] = _mm512_loadu_si512(xp + t * ldxp + s * kStep + 32);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512i a, b;
          if constexpr (kPrefetch) dec[r].prefetch(s);
          const uint64_t special = dec[r].decode(s, a, b);
          if constexpr (std::is_same_v<D, BfDecFP8>) {
            if (special) [[unlikely]]
              fp8_subnormals<TT>(dec[r].row + s * kStep, special, xp + s * kStep, ldxp, dec[r].scales[s / G], fix[r]);
          }
#pragma GCC unroll 8
          for (int t = 0; t < TT; ++t) {
            part[r][t] = _mm512_dpbf16_ps(part[r][t], as_bh(a), as_bh(xa[t]));
            if constexpr (two) part2[r][t] = _mm512_dpbf16_ps(part2[r][t], as_bh(b), as_bh(xb[t]));
            else part[r][t] = _mm512_dpbf16_ps(part[r][t], as_bh(b), as_bh(xb[t]));
          }
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 sc = dec[r].scale(g);
#pragma GCC unroll 8
        for (int t = 0; t < TT; ++t) {
          acc[r][t] = _mm512_fmadd_ps(part[r][t], sc, acc[r][t]);
          if constexpr (two) acc2[r][t] = _mm512_fmadd_ps(part2[r][t], sc, acc2[r][t]);
        }
      }
    }
  }
  reduce_sums(acc, acc2, out);
}

// The rows [n0, n1) of one thread, fast precision.
struct FastRows {
  const MatrixView* W;
  const float* x;
  int64_t ldx;
  const uint16_t* xp;  // prepared bf16, [T, S * 64] (on AMX: B tiles, amx.h)
  int64_t T, S, Kc;    // steps of 64 columns, chunks of 32
  float* y;
  int64_t ldy;
  bool amx = false;  // FP8 on AMX tiles (amx_gemv_fp8_rows16), xp in its B tiles' layout

  template <class D>
  D make(int slot, int64_t n, float* sbuf, const float* bs) const {
    const uint8_t* row = static_cast<const uint8_t*>(W->data) + size_t(n) * W->row_bytes();
    if constexpr (std::is_same_v<D, BfDecBF16>) return {reinterpret_cast<const uint16_t*>(row)};
    else if constexpr (std::is_same_v<D, BfDecFP8>) return {row, bs};
    else {
      float* s = sbuf + slot * (Kc + 16);
      group_chunk_scales(*W, n, Kc, s);
      return {row, s};
    }
  }

  // v plus row `row` times token t over the columns past the last step of 64, on bf16 activations.
  // A matrix narrower than 64 columns (the W_UK^T of a model with qk_nope_head_dim 32) is all
  // tail: 16 lanes at a time for the float formats, element by element for the others.
  float add_tail(float v, int64_t row, int64_t t) const {
    const int64_t k0 = S * kStep, cols = W->cols;
    if (k0 >= cols) return v;
    const float* xr = x + t * ldx;
    const uint8_t* p = static_cast<const uint8_t*>(W->data) + size_t(row) * W->row_bytes();
    if (W->format == WeightFormat::BF16 || W->format == WeightFormat::F32 || W->format == WeightFormat::F16) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = k0; k < cols; k += 16) {
        const __mmask16 m = cols - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - k)) - 1);
        __m512 w;
        if (W->format == WeightFormat::BF16)
          w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p + 2 * k)), 16));
        else if (W->format == WeightFormat::F16)
          w = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * k));
        else
          w = _mm512_maskz_loadu_ps(m, p + 4 * k);
        acc = _mm512_fmadd_ps(w, round_bf16(_mm512_maskz_loadu_ps(m, xr + k)), acc);
      }
      return v + _mm512_reduce_add_ps(acc);
    }
    for (int64_t k = k0; k < cols; ++k) v += element(*W, row, k) * round_bf16(xr[k]);
    return v;
  }

  // Rows n, n + gap, ... (R of them).
  template <class D, int TT, int R>
  void do_tile(int64_t n, int64_t gap, int64_t t0, const float* bs, float post, float* sbuf) const {
    D dec[R];
    for (int r = 0; r < R; ++r) dec[r] = make<D>(r, n + r * gap, sbuf, bs);
    float out[R][TT], fix[R][TT] = {};
    tile_bf16<TT, R>(dec, xp + t0 * S * kStep, S * kStep, S, out, fix);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) {
        const int64_t row = n + r * gap;
        float v = out[r][t] * post;
        if constexpr (std::is_same_v<D, BfDecFP8>) v += fix[r][t] * kFp8FastFix;
        y[(t0 + t) * ldy + row] = add_tail(v, row, t0 + t);
      }
  }

  template <class D, int TT>
  void rows_tt(int64_t s, int64_t e, int64_t t0, const float* bs, float post, float* sbuf) const {
    constexpr int R = TT <= 2 ? 4 : 2;
    for_each_tile<R>(
        s, e, int64_t(W->row_bytes()), [&](int64_t n, int64_t gap) { do_tile<D, TT, R>(n, gap, t0, bs, post, sbuf); },
        [&](int64_t n) {
          for (; n < e; ++n) do_tile<D, TT, 1>(n, 1, t0, bs, post, sbuf);
        });
  }

  template <class D>
  void segment(int64_t s, int64_t e, const float* bs, float post) const {
    float* sbuf = nullptr;
    if constexpr (std::is_same_v<D, BfDecInt4>) {
      Scratch& sc = scratch();
      if (sc.scales.size() < size_t(4 * (Kc + 16))) sc.scales.resize(size_t(4 * (Kc + 16)));
      sbuf = sc.scales.data();
    }
    for (int64_t t0 = 0; t0 < T; t0 += kMaxTT) {
      switch (std::min<int64_t>(kMaxTT, T - t0)) {
        case 1: rows_tt<D, 1>(s, e, t0, bs, post, sbuf); break;
        case 2: rows_tt<D, 2>(s, e, t0, bs, post, sbuf); break;
        case 3: rows_tt<D, 3>(s, e, t0, bs, post, sbuf); break;
        default: rows_tt<D, 4>(s, e, t0, bs, post, sbuf); break;
      }
    }
  }

  // The FP8 rows [n0, n1) on AMX, in tiles of up to 16 rows within one 128-row block.
  void run_amx(int64_t n0, int64_t n1) const {
    const uint8_t* base = static_cast<const uint8_t*>(W->data);
    const int64_t rb = W->row_bytes();
    alignas(64) float c[kAmxGemvRows * kAmxGemvTokens], fix[kAmxGemvRows * kAmxGemvTokens];
    const float* scales = nullptr;
    // nr rows n, n + gap, ... of one 128-row block.
    auto tile = [&](int64_t n, int64_t gap, int64_t nr) {
      std::fill_n(fix, nr * T, 0.0f);
      amx_gemv_fp8_rows16(base + n * rb, gap * rb, nr, S, T, xp, scales, kAmxGemvRows * gap * rb, c, fix);
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = n + r * gap;
          y[t * ldy + row] = add_tail(c[r * T + t] * kFp8FastPost + fix[r * T + t] * kFp8FastFix, row, t);
        }
    };
    amx_gemv_begin(T);
    for (int64_t s = n0; s < n1;) {
      const int64_t blk = (W->row0 + s) / 128;
      const int64_t e = std::min(n1, (blk + 1) * 128 - W->row0);
      scales = static_cast<const float*>(W->scales) + blk * W->scale_cols;
      for_each_tile<kAmxGemvRows>(
          s, e, rb, [&](int64_t n, int64_t gap) { tile(n, gap, kAmxGemvRows); },
          [&](int64_t n) { tile(n, 1, e - n); });
      s = e;
    }
    amx_gemv_end();
  }

  // BF16_PAIRS32 rows [n0, n1) (pairs32_blocks), columns a multiple of 64 (bf16_kernel): as
  // Rows::pairs32 on VDPBF16PS, each token's bf16 pair broadcast against the block's two zmm of
  // a column pair. A float32 FMA a column costs about three instructions per 64 bytes of
  // weights against one here: at one token, 1408 x 2048 experts from DRAM on 2 threads (AMD Zen
  // 5, batches of 8 as an MoE decode step) streamed at 33-35 GB/s on the FMAs and 36-40 on the
  // row-major bf16 GEMV in one run, 40.0-40.1 here against 37.7-37.9 for that GEMV in another.
  void pairs32(int64_t n0, int64_t n1) const {
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

  // INT4_WORDS16 rows [n0, n1) (words16_blocks): a 16-bit shift by 4j brings nibbles j and j + 4
  // of each row's word d to the bottom of its two halves, vpermw makes them bf16 codes
  // (kInt4Bf16), and VDPBF16PS multiplies them by the token's pair of columns 8d + j and
  // 8d + j + 4 (Layout64::Words16), broadcast; a last chunk past the prepared steps of 64 columns
  // rounds its pairs here, as prepare_bf16 does (to nearest even).
  void words16(int64_t n0, int64_t n1) const {
    const __m512i table = _mm512_load_si512(kInt4Bf16);
    const int64_t ld = S * kStep, prepared = S * 8;  // words d of the prepared steps
    words16_blocks(*W, n0, n1, T, y, ldy, [&](auto tn, auto& part, int64_t t0, const uint32_t* p, int64_t d0) {
      uint32_t tail[4][4][4];  // [token][v][j]: the pairs of a chunk past the prepared steps
      const bool in_tail = d0 >= prepared;
      if (in_tail) [[unlikely]]
        for (int t = 0; t < decltype(tn)::value; ++t)
          for (int v = 0; v < 4; ++v)
            for (int j = 0; j < 4; ++j) {
              const float* xt = x + (t0 + t) * ldx + (d0 + v) * 8 + j;
              tail[t][v][j] = uint32_t(f32_to_bf16(xt[0])) | uint32_t(f32_to_bf16(xt[4])) << 16;
            }
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m512i w = _mm512_loadu_si512(p + v * 16);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512i q = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4 * j), table);
#pragma GCC unroll 4
          for (int t = 0; t < decltype(tn)::value; ++t) {
            const void* pair = in_tail ? static_cast<const void*>(&tail[t][v][j]) : xp + (t0 + t) * ld + (d0 + v) * 8 + 2 * j;
            // The pair as the instruction's broadcast memory operand (a load, not a shuffle
            // beside vpermw's; GCC 12 emits the intrinsic with a separate VPBROADCASTD).
            asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(part[t][v]) : "v"(q), "m"(*static_cast<const int32_t*>(pair)));
          }
        }
      }
    });
  }

  void run(int64_t n0, int64_t n1) const {
    if (n0 >= n1) return;
    if (amx) {
      run_amx(n0, n1);
      return;
    }
    switch (W->format) {
      case WeightFormat::BF16_PAIRS32: pairs32(n0, n1); break;
      case WeightFormat::INT4_WORDS16: words16(n0, n1); break;
      case WeightFormat::BF16: segment<BfDecBF16>(n0, n1, nullptr, 1.0f); break;
      case WeightFormat::INT4_GROUP: segment<BfDecInt4>(n0, n1, nullptr, 1.0f); break;
      case WeightFormat::FP8_BLOCK128: {
        const float* scales = static_cast<const float*>(W->scales);
        for (int64_t s = n0; s < n1;) {  // the rows of one 128-row block share their scales
          const int64_t blk = (W->row0 + s) / 128;
          const int64_t e = std::min(n1, (blk + 1) * 128 - W->row0);
          segment<BfDecFP8>(s, e, scales + blk * W->scale_cols, kFp8FastPost);
          s = e;
        }
        break;
      }
      default: break;
    }
  }
};

// ---- the WORDS16 formats on int8 activations (VPDPBUSD) ------------------------------------

// The VNNI GEMV's blocks are one sequential stream (16 rows' 4 or 8 columns a 64-byte vector),
// which it prefetches a page at a time (touch_page_ahead, stream_prefetch.h). Its scales, a
// second stream of 32 bytes a chunk, it prefetches a line every other chunk, this many bytes of
// codes ahead of the chunk it computes; a work unit fetches its first this many bytes of codes
// into L1 as it starts. The distances were measured when the codes too were prefetched a line at
// a time (batches of 12 experts from DRAM as a decode step's, 2 threads, one token, GB/s relative
// to 2 KiB: INT4 8 KiB 1.09-1.21, INT8 8 KiB 0.94-0.97).
template <class Block>
constexpr int64_t kVnniPrefetchBytes = std::is_same_v<Block, Int8Words16Block> ? 2048 : 8192;

// Rows b .. b + 15 (blk: vnni_gemm.h's Words16Block or Int8Words16Block) for tokens
// t0 .. t0 + TN - 1: per chunk of 32 columns, each token's integer sum starts at its correction
// qc, takes the block's 8 code vectors by VPDPBUSD against the token's 4 activation codes
// broadcast, and adds into the float32 total as the VNNI GEMM's micro kernel does (the same
// block reader, the same operations in the same order: equal results).
template <int TN, class Block>
[[gnu::always_inline]] inline void vnni_words16_block(const Block blk, int64_t Kc, const int8_t* q, int64_t ldq,
                                                      const float* qs, const int32_t* qc, int64_t lds, float* y,
                                                      int64_t ldy) {
  constexpr int64_t kAhead = kVnniPrefetchBytes<Block> / Block::kChunkBytes;  // chunks
  const char* p = reinterpret_cast<const char*>(blk.p);
  __m512 f[TN];
  for (int t = 0; t < TN; ++t) f[t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < Kc; ++c, p += Block::kChunkBytes) {
    touch_page_ahead<Block::kChunkBytes>(p);
    // The scales' stream, 32 bytes a group of 16 rows: a line every other chunk.
    if ((c & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(blk.s + (c + kAhead) / blk.per * 16), _MM_HINT_T0);
    __m512i acc[TN];
    for (int t = 0; t < TN; ++t) acc[t] = _mm512_set1_epi32(qc[t * lds + c]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w = blk.code(c, j);
      for (int t = 0; t < TN; ++t) {
        // The activations' 4 codes as the instruction's broadcast memory operand (vnni_gemm.cpp).
        const void* a = q + t * ldq + c * kChunk + 4 * j;
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc[t]) : "v"(w), "m"(*static_cast<const int32_t*>(a)));
      }
    }
    const __m512 s = blk.scale(c);
    for (int t = 0; t < TN; ++t)
      f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(s, _mm512_set1_ps(qs[t * lds + c])), f[t]);
  }
  for (int t = 0; t < TN; ++t) _mm512_storeu_ps(y + t * ldy, f[t]);
}

// The INT4_WORDS16 or INT8_WORDS16 rows [n0, n1) (whole blocks of 16) of one thread, the
// activations' codes, scales and corrections prepared once per call (activations_int8, gemm.h).
struct VnniRows {
  const MatrixView* W;
  const int8_t* q;
  const float* qs;
  const int32_t* qc;
  int64_t T;
  float* y;
  int64_t ldy;

  template <class Block>
  void blocks(int64_t n0, int64_t n1) const {
    const int64_t K = W->cols, Kc = K / kChunk;
    // A unit starts its stream cold: its first kVnniPrefetchBytes into L1 at once (the kernel's
    // page touches run two pages ahead of it; touching the unit's second page here too measured
    // alike).
    constexpr int64_t kAheadBytes = kVnniPrefetchBytes<Block>;
    const char* start = reinterpret_cast<const char*>(words16_block<Block>(*W, n0).p);
    const int64_t bytes = (n1 - n0) * int64_t(W->row_bytes());
    for (int64_t o = 0; o < std::min(kAheadBytes, bytes); o += 64) _mm_prefetch(start + o, _MM_HINT_T0);
    for (int64_t b = n0; b < n1; b += 16) {
      const Block blk = words16_block<Block>(*W, b);
      for (int64_t t0 = 0; t0 < T; t0 += 4) {
        const int8_t* qt = q + t0 * K;
        const float* st = qs + t0 * Kc;
        const int32_t* ct = qc + t0 * Kc;
        float* yt = y + t0 * ldy + b;
        switch (std::min<int64_t>(4, T - t0)) {
          case 1: vnni_words16_block<1>(blk, Kc, qt, K, st, ct, Kc, yt, ldy); break;
          case 2: vnni_words16_block<2>(blk, Kc, qt, K, st, ct, Kc, yt, ldy); break;
          case 3: vnni_words16_block<3>(blk, Kc, qt, K, st, ct, Kc, yt, ldy); break;
          default: vnni_words16_block<4>(blk, Kc, qt, K, st, ct, Kc, yt, ldy); break;
        }
      }
    }
  }

  void run(int64_t n0, int64_t n1) const {
    if (W->format == WeightFormat::INT8_WORDS16) blocks<Int8Words16Block>(n0, n1);
    else blocks<Words16Block>(n0, n1);
  }
};

// x [T, cols] (row stride ldx) times mul, rounded to bf16 and permuted into the layout of each
// step of 64 columns: out [T, S * 64].
void prepare_bf16(const float* x, int64_t T, int64_t ldx, int64_t S, Layout64 layout, float mul, uint16_t* out) {
  // Each quarter (16 words) of a step draws on one half (32 columns) of the step's activations.
  alignas(64) int32_t idx[4][16];
  bool upper[4];
  for (int q = 0; q < 4; ++q) {
    upper[q] = layout64_col(layout, 16 * q) >= 32;
    for (int l = 0; l < 16; ++l) idx[q][l] = layout64_col(layout, 16 * q + l) - (upper[q] ? 32 : 0);
  }
  __m512i iv[4];
  for (int q = 0; q < 4; ++q) iv[q] = _mm512_load_si512(idx[q]);
  const __m512 f = _mm512_set1_ps(mul);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      const float* src = x + t * ldx + s * kStep;
      const __m512 h[4] = {_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16), _mm512_loadu_ps(src + 32),
                           _mm512_loadu_ps(src + 48)};
      __m512 q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = _mm512_mul_ps(_mm512_permutex2var_ps(h[upper[k] ? 2 : 0], iv[k], h[upper[k] ? 3 : 1]), f);
      uint16_t* dst = out + t * S * kStep + s * kStep;
      _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(q[1], q[0]));
      _mm512_storeu_si512(dst + 32, (__m512i)_mm512_cvtne2ps_pbh(q[3], q[2]));
    }
}

// prepare_bf16's values as amx_gemv_fp8_rows16's B tiles: out[s * 64T + p * 2T + 2t + i] holds
// word 2p + i of step s for token t (pair p of the step's 32; pairs 0-15 make the first tile).
// tmp: scratch of T * S * 64 values (unused for one token, whose layouts coincide).
void prepare_amx(const float* x, int64_t T, int64_t ldx, int64_t S, Layout64 layout, float mul, uint16_t* tmp,
                 uint16_t* out) {
  if (T == 1) {
    prepare_bf16(x, T, ldx, S, layout, mul, out);
    return;
  }
  prepare_bf16(x, T, ldx, S, layout, mul, tmp);
  const int64_t pairs = S * kStep / 2;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(tmp);
  uint32_t* dst = reinterpret_cast<uint32_t*>(out);
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t t = 0; t < T; ++t) dst[p * T + t] = src[t * pairs + p];
}

}  // namespace

void gemv_reference(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      float s = 0;
      for (int64_t k = 0; k < W.cols; ++k) s += row[size_t(k)] * x[t * ldx + k];
      y[t * ldy + n] = s;
    }
  }
}

void gemv_batch(const Context& ctx, std::span<const GemvJob> jobs) {
  // Jobs without a fast kernel run on the reference; the rest are prepared (activations permuted
  // into the format's lane layout, on this thread; in the fast precision rounded to bf16 for the
  // formats with a bf16 kernel, quantized to int8 for the VNNI GEMV) and split across the
  // threads by weight bytes.
  thread_local std::vector<float> prepared;
  thread_local std::vector<uint16_t> prepared16;
  thread_local std::vector<uint16_t> amx_tmp;
  thread_local std::vector<int8_t> codes;     // the VNNI GEMV's activations: int8 codes,
  thread_local std::vector<float> code_scales;  // a scale per token and chunk,
  thread_local std::vector<int32_t> code_fix;   // and the bias's correction
  thread_local std::vector<Rows> rows;
  thread_local std::vector<FastRows> frows;
  thread_local std::vector<VnniRows> vrows;
  thread_local std::vector<double> cum;  // weight bytes before each fast job
  thread_local std::vector<std::pair<Family, size_t>> order;  // (kernel family, index) of each job in cum
  thread_local std::vector<Unit> units;
  const CpuFeatures feats = features(ctx);
  auto kernel_of = [&](const GemvJob& j) { return gemv_kernel(ctx, j.T, j.W, feats); };
  size_t need = 0, need16 = 0, need8 = 0, need_chunks = 0;
  for (const auto& j : jobs) {
    if (j.T <= 0 || j.W.rows <= 0) continue;
    const Kernel k = kernel_of(j);
    if (k == Kernel::GemvReference) continue;
    const size_t words = size_t(j.T * (j.W.cols / kStep) * kStep);
    if (k == Kernel::GemvAmxFp8 || k == Kernel::GemvBf16) need16 += words;
    else if (k == Kernel::GemvVnni) need8 += size_t(j.T * j.W.cols), need_chunks += size_t(j.T * (j.W.cols / kChunk));
    else need += size_t(j.T * (j.W.cols / kChunk) * kChunk);
  }
  if (prepared.size() < need) prepared.resize(need);
  if (prepared16.size() < need16) prepared16.resize(need16);
  if (codes.size() < need8) codes.resize(need8);
  if (code_scales.size() < need_chunks) code_scales.resize(need_chunks), code_fix.resize(need_chunks);
  rows.clear();
  frows.clear();
  vrows.clear();
  cum.clear();
  order.clear();
  double total = 0;
  int64_t weights = 0;
  size_t off = 0, off16 = 0, off8 = 0, off_chunks = 0;
  for (const auto& j : jobs) {
    if (j.T <= 0 || j.W.rows <= 0) continue;
    const Kernel k = kernel_of(j);
    if (k == Kernel::GemvReference) {
      gemv_reference(j.x, j.T, j.ldx, j.W, j.y, j.ldy);
      continue;
    }
    if (k == Kernel::GemvVnni) {
      const int64_t K = j.W.cols, Kc = K / kChunk;
      int8_t* q = codes.data() + off8;
      float* qs = code_scales.data() + off_chunks;
      int32_t* qc = code_fix.data() + off_chunks;
      off8 += size_t(j.T * K);
      off_chunks += size_t(j.T * Kc);
      activations_int8(j.x, j.T, j.ldx, K, j.W.format, vnni_weight_bias(j.W.format), q, K, qs, qc, Kc);
      order.push_back({Family::Vnni, vrows.size()});
      vrows.push_back(VnniRows{&j.W, q, qs, qc, j.T, j.y, j.ldy});
    } else if (k == Kernel::GemvAmxFp8) {
      const int64_t S = j.W.cols / kStep, n = j.T * S * kStep;
      uint16_t* xp = prepared16.data() + off16;
      off16 += size_t(n);
      if (amx_tmp.size() < size_t(n)) amx_tmp.resize(size_t(n));
      prepare_amx(j.x, j.T, j.ldx, S, Layout64::Fp8Unpack, kFp8FastXScale, amx_tmp.data(), xp);
      order.push_back({Family::Bf16, frows.size()});
      frows.push_back(FastRows{&j.W, j.x, j.ldx, xp, j.T, S, j.W.cols / kChunk, j.y, j.ldy, true});
    } else if (k == Kernel::GemvBf16) {
      const int64_t S = j.W.cols / kStep;
      uint16_t* xp = prepared16.data() + off16;
      off16 += size_t(j.T * S * kStep);
      const float mul = j.W.format == WeightFormat::FP8_BLOCK128 ? kFp8FastXScale : 1.0f;
      prepare_bf16(j.x, j.T, j.ldx, S, layout64_of(j.W.format), mul, xp);
      order.push_back({Family::Bf16, frows.size()});
      frows.push_back(FastRows{&j.W, j.x, j.ldx, xp, j.T, S, j.W.cols / kChunk, j.y, j.ldy});
    } else {
      const int64_t Kc = j.W.cols / kChunk, width = Kc * kChunk;
      float* xp = prepared.data() + off;
      off += size_t(j.T * width);
      const Layout layout = layout_of(j.W.format);
      alignas(64) int32_t ia[16], ib[16];
      for (int l = 0; l < 16; ++l) {
        ia[l] = layout_col(layout, l);
        ib[l] = layout_col(layout, 16 + l);
      }
      const __m512i pa = _mm512_load_si512(ia), pb = _mm512_load_si512(ib);
      for (int64_t t = 0; t < j.T; ++t)
        for (int64_t c = 0; c < Kc; ++c) {
          const float* src = j.x + t * j.ldx + c * kChunk;
          const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
          _mm512_storeu_ps(xp + t * width + c * kChunk, _mm512_permutex2var_ps(lo, pa, hi));
          _mm512_storeu_ps(xp + t * width + c * kChunk + 16, _mm512_permutex2var_ps(lo, pb, hi));
        }
      order.push_back({Family::F32, rows.size()});
      rows.push_back(Rows{j.W, j.x, j.ldx, xp, j.T, Kc, j.y, j.ldy});
    }
    cum.push_back(total);
    total += double(j.W.rows) * double(j.W.row_bytes() + (j.W.scale_bytes() + j.W.rows - 1) / j.W.rows);
    weights += j.W.rows * j.W.cols;
  }
  if (order.empty()) return;
  cum.push_back(total);
  // The workers read this thread's lists (thread_local names would be their own).
  const std::vector<Rows>& all = rows;
  const std::vector<FastRows>& fall = frows;
  const std::vector<VnniRows>& vall = vrows;
  auto run = [&](Family f, size_t k, int64_t n0, int64_t n1) {
    switch (f) {
      case Family::F32: all[k].run(n0, n1); break;
      case Family::Bf16: fall[k].run(n0, n1); break;
      case Family::Vnni: vall[k].run(n0, n1); break;
    }
  };
  auto weight_of = [&](Family f, size_t k) -> const MatrixView& {
    return f == Family::F32 ? all[k].W : f == Family::Bf16 ? *fall[k].W : *vall[k].W;
  };
  const int threads = ctx.num_threads();
  const bool serial = weights < kSerialWork || omp_in_parallel() || threads == 1;
  if (serial) {
    for (const auto& [f, k] : order) run(f, k, 0, weight_of(f, k).rows);
    return;
  }
  // Work units of about unit_bytes of weights (whole multiples of 16 rows: AMX tiles and the
  // WORDS16 formats' blocks; of 32 for BF16_PAIRS32's blocks), handed out
  // dynamically: a thread that is descheduled for a while (shared cores) holds up one unit, not
  // half of the product.
  units.clear();
  const double unit_bytes = std::clamp(total / (4.0 * threads), kMinUnitBytes, kMaxUnitBytes);
  for (size_t i = 0; i < order.size(); ++i) {
    const auto [f, k] = order[i];
    const MatrixView& W = weight_of(f, k);
    const int64_t N = W.rows;
    const double row_bytes = (cum[i + 1] - cum[i]) / double(N);
    const int64_t align = W.format == WeightFormat::BF16_PAIRS32 ? 32 : 16;
    const int64_t step = std::max<int64_t>(align, int64_t(unit_bytes / std::max(1.0, row_bytes)) / align * align);
    for (int64_t n = 0; n < N; n += step) units.push_back({f, k, n, std::min(N, n + step)});
  }
  const std::vector<Unit>& work = units;
  const int64_t nunits = int64_t(work.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t u = 0; u < nunits; ++u) {
    const Unit& w = work[size_t(u)];
    run(w.family, w.job, w.n0, w.n1);
  }
}

void gemv(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  const GemvJob job{x, T, ldx, W, y, ldy};
  gemv_batch(ctx, std::span<const GemvJob>(&job, 1));
}

}  // namespace mla::cpu
