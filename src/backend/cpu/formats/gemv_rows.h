// The tile walk of the decode GEMVs (formats/gemv.h), shared by every format: a tile of R rows x
// up to 4 tokens, each chunk of 32 columns (float32 kernels) or step of 64 (bf16 kernels) decoded
// once in registers by the format's decoder (formats/<format>/decode.h) and dotted with the
// tokens' activations, permuted once per call into the decoder's lane layout ("prepared").
// A product's rows are one of three jobs, by the activations' kind: GemvRows (float32),
// GemvFastRows (bf16, VDPBF16PS or AMX tiles), GemvVnniRows (int8, VPDPBUSD). Each holds the
// format's rows kernel from the registry (formats/registry.h); the kernels of the row-major
// formats are GemvRows::segment and GemvFastRows::segment over their decoder, those of the
// blocked formats walk their blocks (formats/bf16/kernels.cpp, formats/int4/kernels.cpp,
// formats/int_group/vnni_gemv.h). formats/gemv.cpp prepares the jobs and splits their rows
// across the threads. Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/formats/int_group/scales.h"
#include "backend/cpu/formats/registry.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

constexpr bool kPrefetch = true;  // software prefetch ahead in each row of a tile
constexpr int kMaxTT = 4;            // tokens sharing one decode of a chunk

// Calls run(n, t0) for the tokens [0, T) in tiles of kMaxTT from t0 = 0, n the tile's token count
// as a std::integral_constant (the last tile may be short): the sums of a tile stay in registers.
template <class Run>
inline void for_each_token_tile(int64_t T, Run&& run) {
  static_assert(kMaxTT == 4);
  for (int64_t t0 = 0; t0 < T; t0 += kMaxTT) {
    switch (std::min<int64_t>(kMaxTT, T - t0)) {
      case 1: run(std::integral_constant<int, 1>{}, t0); break;
      case 2: run(std::integral_constant<int, 2>{}, t0); break;
      case 3: run(std::integral_constant<int, 3>{}, t0); break;
      default: run(std::integral_constant<int, 4>{}, t0); break;
    }
  }
}

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
[[gnu::flatten]] inline void tile_f32(const Dec* dec, const float* xp, int64_t ldxp, int64_t Kc, float (&out)[R][TT]) {
  __m512 acc[R][TT], acc2[R][TT];
  zero_sums(acc, acc2);
  for (int64_t c = 0; c < Kc; ++c) tile_step<F32Madd, TT, R>(dec, xp, ldxp, c, acc, acc2);
  reduce_sums(acc, acc2, out);
}

// Per-thread scratch, reused across calls (no allocation once warm).
struct GemvScratch {
  std::vector<float> xs;      // FP8: the prepared activations times a row block's scales
  std::vector<float> scales;  // INT4, INT8: per-chunk float32 scales of the rows of a tile
};
inline GemvScratch& gemv_scratch() {
  thread_local GemvScratch s;
  return s;
}

// The rows [n0, n1) of one thread, float32 activations.
struct GemvRows {
  const MatrixView& W;
  const float* x;
  int64_t ldx;
  const float* xp;  // prepared, [T, Kc * 32]
  int64_t T, Kc;
  float* y;
  int64_t ldy;
  void (*kernel)(const GemvRows&, int64_t n0, int64_t n1);  // the format's (FormatKernels::gemv_f32)

  template <class Dec>
  Dec make(int slot, int64_t n, float* sbuf) const {
    const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
    if constexpr (!Dec::kGroupScales) return {reinterpret_cast<decltype(Dec::row)>(row)};
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
    tile_f32<TT, R>(dec, xseg + t0 * Kc * kChunk, Kc * kChunk, Kc, out);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) {
        const int64_t row = n + r * gap;
        float v = out[r][t] * post;
        for (int64_t k = Kc * kChunk; k < W.cols; ++k) v += Dec::element(W, row, k) * x[(t0 + t) * ldx + k];
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
    GemvScratch& sc = gemv_scratch();
    float* sbuf = nullptr;
    if constexpr (Dec::kGroupScales) {
      if (sc.scales.size() < size_t(4 * Kc)) sc.scales.resize(size_t(4 * Kc));
      sbuf = sc.scales.data();
    }
    for_each_token_tile(T, [&](auto tt, int64_t t0) { rows_tt<Dec, decltype(tt)::value>(s, e, t0, xseg, post, sbuf); });
  }
};

// ---- the fast precision: bf16 x bf16 products (VDPBF16PS) ------------------------------------

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// The same on 16 lanes, with the instruction prepare_bf16 rounds the other columns with.
inline __m512 round_bf16(__m512 f) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(f)), 16));
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
          if constexpr (D::kSubnormals) {
            if (special) [[unlikely]]
              D::template subnormal_products<TT>(dec[r].row + s * kStep, special, xp + s * kStep, ldxp, dec[r].scales[s / G], fix[r]);
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
struct GemvFastRows {
  const MatrixView* W;
  const float* x;
  int64_t ldx;
  const uint16_t* xp;  // prepared bf16, [T, S * 64] (on AMX: B tiles, amx.h)
  int64_t T, S, Kc;    // steps of 64 columns, chunks of 32
  float* y;
  int64_t ldy;
  // The format's rows kernel: FormatKernels::gemv_bf16, or gemv_amx (FP8 on AMX tiles,
  // amx_gemv_fp8_rows16; xp then in its B tiles' layout).
  void (*kernel)(const GemvFastRows&, int64_t n0, int64_t n1);

  template <class D>
  D make(int slot, int64_t n, float* sbuf, const float* bs) const {
    const uint8_t* row = static_cast<const uint8_t*>(W->data) + size_t(n) * W->row_bytes();
    if constexpr (!D::kGroupScales && D::kStepsPerScale == 0) return {reinterpret_cast<decltype(D::row)>(row)};
    else if constexpr (!D::kGroupScales) return {row, bs};
    else {
      float* s = sbuf + slot * (Kc + 16);
      group_chunk_scales(*W, n, Kc, s);
      return {row, s};
    }
  }

  // v plus row `row` times token t over the columns past the last step of 64, on bf16 activations.
  // A matrix narrower than 64 columns (the W_UK^T of a model with qk_nope_head_dim 32) is all
  // tail: 16 lanes at a time for the float formats, element by element (D::element) for the others.
  template <class D>
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
    for (int64_t k = k0; k < cols; ++k) v += D::element(*W, row, k) * round_bf16(xr[k]);
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
        if constexpr (D::kSubnormals) v += fix[r][t] * D::kFixScale;
        y[(t0 + t) * ldy + row] = add_tail<D>(v, row, t0 + t);
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
    if constexpr (D::kGroupScales) {
      GemvScratch& sc = gemv_scratch();
      if (sc.scales.size() < size_t(4 * (Kc + 16))) sc.scales.resize(size_t(4 * (Kc + 16)));
      sbuf = sc.scales.data();
    }
    for_each_token_tile(T, [&](auto tt, int64_t t0) { rows_tt<D, decltype(tt)::value>(s, e, t0, bs, post, sbuf); });
  }

};


// The INT4_WORDS16 or INT8_WORDS16 rows [n0, n1) (whole blocks of 16) of one thread, the
// activations' codes, scales and corrections prepared once per call (activations_int8, gemm.h);
// or the rows of a format that quantizes its activations itself (FormatKernels::vnni_x: the
// ggml formats), those at xb, a token every xstride bytes.
struct GemvVnniRows {
  const MatrixView* W;
  const int8_t* q;
  const float* qs;
  const int32_t* qc;
  int64_t T;
  float* y;
  int64_t ldy;
  void (*kernel)(const GemvVnniRows&, int64_t n0, int64_t n1);  // the format's (FormatKernels::gemv_vnni)
  const uint8_t* xb = nullptr;
  int64_t xstride = 0;
};

}  // namespace mla::cpu::avx512
