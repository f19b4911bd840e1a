// The decode GEMV of llama.cpp's block formats on int8 activations (Kernel::GemvVnni), as
// llama.cpp computes their dot products: the activations quantized to int8 in the weights' block
// shape (llama.cpp's Q8_K for the K-quants, Q8_0 / Q8_1 for the others), each block's integer dot
// product on VPDPBUSD (the weights' unsigned codes times the signed activation codes), the
// codes' offsets and the K-quants' mins taken off through the activations' per-block sums.
// Measurements: docs/backend.md.
//
// The activations (quantize_x): per block of B columns (256 for the K-quants, 32 otherwise) a
// float32 scale s = m / 127 (m the block's largest magnitude) and codes q = round(x * (127 / m))
// (float32, to nearest even; |q| <= 127); a block of zeros has scale 0 and codes 0. One token's
// layout (XLayout), from a 64-byte aligned start:
//   codes   int8 [K], column order (Q2_K, Q4_K, Q5_K: within a super-block in their code
//           vectors' order, Order),
//           then 64 bytes of zeros (the block-32 kernels read a pair of blocks past an odd
//           last one)
//   scales  float [K / B], then zeros to a multiple of 16
//   sums    K-quants: minus the sum of the codes of each 16 columns, int16 [K / 16];
//           block-32: each block's scale times the sum of its codes, float [K / 32], then zeros
//           to a multiple of 16
//
// The weights' codes come out of a block 64 to a zmm, unsigned (GFNI's GF2P8AFFINEQB moves any
// bits of each byte into place in one instruction, its bit matrix per 64-bit lane), and each
// VPDPBUSD lane sums the products of 4 columns of one sub-block. The K-quants (KQ2 .. KQ6): per
// super-block of 256 columns and token, the 4 code vectors' VPDPBUSD products scaled by VPDPWSSD
// (the dot's low word times the sub-block scale in the even word of its lane, zero in the odd),
// once for each group of vectors whose lanes hold the same sub-blocks, their products summed
// first (each lane's sum < 2^15): Q2_K's 4 vectors one group, Q4_K's and Q5_K's two pairs, Q3_K's
// and Q6_K's 4 vectors one each (their 16-column sub-blocks fill a 128-bit lane of one vector).
// Q3_K and Q6_K take the codes' offset (4, 32) times the scales times the sums into the same
// sum, Q2_K, Q4_K and Q5_K their mins times the sums into a second; each to float32 times d
// (dmin) times the token's scale, into 16 float lanes summed at the row's end. The block-32
// formats (BQ4_0 .. BQ8_0): 16 blocks at a time, their f16 d (and m) into one vector (vpermt2b),
// per pair of blocks a VPDPBUSD from zero (lanes 0..7 the first block, 8..15 the second)
// converted and multiplied by its blocks' d times the token's scales (a vpermps of the 16), the
// offsets (Q4_0 8, Q5_0 16, Q8_0's 128 of its codes biased to unsigned) and Q4_1 / Q5_1's m
// times the sums once per 16 blocks.
// Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/ggml/decode.h"
#include "tensor/matrix.h"

namespace mla::cpu::ggml {

// ---- the activations ---------------------------------------------------------------------------

// Where one token's quantized activations lie (bytes from its start) for K columns in blocks of B.
struct XLayout {
  int64_t scales, sums, bytes;
};
inline XLayout x_layout(int64_t K, int64_t B) {
  auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
  auto up16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  const int64_t scales = up64(K + 64);
  const int64_t sums = scales + up64(4 * up16(K / B));
  const int64_t bytes = B == 256 ? sums + up64(2 * (K / 16)) : sums + up64(4 * up16(K / 32));
  return {scales, sums, bytes};
}

// x [T, K] (row stride ldx) into T tokens of x_layout(K, B).bytes each at out (64-byte aligned).
// The order of a super-block's codes (the sums stay in column order): natural; Q4_K's and Q5_K's
// (k4_codes: 16-column piece p at 64 (p % 4) + 16 (p / 4)); Q2_K's (KQ2: the 4 columns 4i .. of
// sub-block l at 64 i + 4 l).
enum class Order { Natural, K4, Q2 };
template <int64_t B, Order O = Order::Natural>
void quantize_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) {
  static_assert(O == Order::Natural || B == 256);
  const XLayout L = x_layout(K, B);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* o = out + t * L.bytes;
    std::memset(o, 0, size_t(L.bytes));
    int8_t* q = reinterpret_cast<int8_t*>(o);
    float* s = reinterpret_cast<float*>(o + L.scales);
    const float* xt = x + t * ldx;
    for (int64_t b = 0; b < K / B; ++b) {
      const float* xb = xt + b * B;
      __m512 m = _mm512_setzero_ps();
      for (int64_t k = 0; k < B; k += 16) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(xb + k), sign));
      const float amax = _mm512_reduce_max_ps(m);
      // |x| * 127 / amax rounds to at most 127.
      const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      s[b] = amax / 127.0f;
      int32_t block_sum = 0;
      for (int64_t k = 0; k < B; k += 16) {
        const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + k), inv));
        const __m128i codes = _mm512_cvtsepi32_epi8(c);
        if constexpr (O == Order::Q2) {
          alignas(16) int32_t d[4];
          _mm_store_si128(reinterpret_cast<__m128i*>(d), codes);
          for (int i = 0; i < 4; ++i) std::memcpy(q + b * B + 64 * i + 4 * (k / 16), &d[i], 4);
        } else {
          const int64_t at = O == Order::K4 ? 64 * ((k / 16) % 4) + 16 * (k / 64) : k;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * B + at), codes);
        }
        const int32_t sum = _mm512_reduce_add_epi32(c);
        if constexpr (B == 256) reinterpret_cast<int16_t*>(o + L.sums)[(b * B + k) / 16] = int16_t(-sum);
        block_sum += sum;
      }
      if constexpr (B == 32) reinterpret_cast<float*>(o + L.sums)[b] = s[b] * float(block_sum);
    }
  }
}

using avx512::k4_min_byte;
using avx512::k4_scale_byte;
using avx512::scales_k3;
using avx512::scales_mins_k4;

namespace {  // internal linkage, as the decoders' (docs/backend.md)

// ---- streaming the weights ----------------------------------------------------------------------

// For a row's consecutive pieces of Piece bytes (a super-block, a pair of blocks), called with
// each piece's address: the lines Piece bytes cover, avx512::kPrefetchBytes (16 KiB) on, into
// L2. A row-by-row stream of Q4_K (one thread, 470 MB from DRAM, a loaded 2-core AMD Zen 5, best
// of 8 passes): none 8.0-8.9 GB/s, L1 1-4 KiB ahead 8.4-11.6, L2 8 KiB 12.5-15.7, L2 16 KiB
// 13.5-14.4, against a read loop's 16.1-20.6.
template <int64_t Piece>
[[gnu::always_inline]] inline void stream_ahead(const uint8_t* piece) {
  for (int64_t o = 0; o < Piece; o += 64) avx512::prefetch_at(piece, o);
}

// ---- moving bits with GF2P8AFFINEQB -------------------------------------------------------------

// The bit matrix that moves bits [from, from + count) of each byte to [to, to + count), the others
// zero: result bit i is the parity of byte 7 - i of the matrix AND the source byte.
constexpr uint64_t gf_move(int from, int count, int to) {
  uint64_t a = 0;
  for (int i = 0; i < count; ++i) a |= uint64_t(1u << (from + i)) << (8 * (7 - (to + i)));
  return a;
}
// A zmm of matrices: lo for the first 32 bytes, hi for the last 32.
[[gnu::always_inline]] inline __m512i gf_halves(uint64_t lo, uint64_t hi) {
  return _mm512_set_epi64(int64_t(hi), int64_t(hi), int64_t(hi), int64_t(hi), int64_t(lo), int64_t(lo), int64_t(lo),
                          int64_t(lo));
}
[[gnu::always_inline]] inline __m512i gf(__m512i v, __m512i matrix) { return _mm512_gf2p8affine_epi64_epi8(v, matrix, 0); }
// 32 bytes at p in both halves of a zmm.
[[gnu::always_inline]] inline __m512i bcast32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// The f16 at p (and the next), as float32 in lanes 0 (and 1).
[[gnu::always_inline]] inline __m128 half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(h));
}
[[gnu::always_inline]] inline __m128 halves_at(const uint8_t* p) {
  uint32_t h;
  std::memcpy(&h, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(int(h)));
}

// ---- the K-quants ------------------------------------------------------------------------------

// A decoded super-block: its 4 code vectors (z, unsigned; which columns each holds is the
// format's, the activations in the same order), the sub-block scales of their lanes in the even
// word of each dword (s: one vector per group of code vectors, the format's dot), d and dmin,
// and the 16 words of either the mins (per 16 columns; dmin) or the scales times the codes'
// offset (Q3_K, Q6_K).
struct SuperBlock {
  __m512i z[4], s[4];
  __m256i m;
  __m128 dd;  // d, dmin in lanes 0, 1
};

// Index vectors that spread a super-block's scales over its 4 code vectors, one per vector.
struct SpreadIdx {
  alignas(64) int8_t b[4][64];
};
// Words: word 2l of vector k selects word 4k + l / 4 (16 columns a scale), odd words zero (mask).
constexpr SpreadIdx spread_idx_words16() {
  SpreadIdx x{};
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 16; ++l) x.b[k][4 * l] = int8_t(4 * k + l / 4);
  return x;
}
inline constexpr SpreadIdx kSpreadWords16 = spread_idx_words16();

// The 16 signed scales (words) of a super-block: lane l of vector k takes scale 4k + l / 4.
[[gnu::always_inline]] inline void spread_words16(__m256i sc16, __m512i (&s)[4]) {
  const __m512i w = _mm512_zextsi256_si512(sc16);
  for (int k = 0; k < 4; ++k)
    s[k] = _mm512_maskz_permutexvar_epi16(0x55555555u, _mm512_load_si512(kSpreadWords16.b[k]), w);
}
// The scaled integer dot product of a super-block's code vectors with the activation codes x: per
// code vector, VPDPBUSD from zero, then VPDPWSSD by its lanes' scales (every format whose code
// vectors each have their own lanes' sub-blocks).
[[gnu::always_inline]] inline __m512i dot4(const SuperBlock& o, const __m512i (&x)[4]) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i acc = zero;
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) acc = _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(zero, o.z[k], x[k]), o.s[k]);
  return acc;
}

// Q2_K in one lane pattern: lane l of every code vector is sub-block l (16 columns: 8n + 2s + h
// for crumb s of qs[32n + 16h ..]), vector k its columns 4k .. 4k + 3: qword j (lanes 2j, 2j + 1:
// n = j / 4, s = j % 4, h = 0, 1) the dwords 8n + k and 8n + 4 + k of qs (vpermd) through crumb
// s (GF2P8AFFINEQB). The 4 VPDPBUSD then sum into one vector (|sum| <= 16 * 3 * 127 < 2^15)
// scaled once, lane l by scale l. The activations in that order (Order::Q2).
struct KQ2 {
  static constexpr int64_t kBytes = 84;
  static constexpr bool kMins = true;
  [[gnu::always_inline]] static void decode(const uint8_t* blk, SuperBlock& o) {
    const __m512i q = _mm512_loadu_si512(blk + 16);
    const __m512i crumbs = _mm512_set_epi64(int64_t(gf_move(6, 2, 0)), int64_t(gf_move(4, 2, 0)), int64_t(gf_move(2, 2, 0)),
                                            int64_t(gf_move(0, 2, 0)), int64_t(gf_move(6, 2, 0)), int64_t(gf_move(4, 2, 0)),
                                            int64_t(gf_move(2, 2, 0)), int64_t(gf_move(0, 2, 0)));
    for (int k = 0; k < 4; ++k) {
      const __m512i idx = _mm512_setr_epi32(k, 4 + k, k, 4 + k, k, 4 + k, k, 4 + k, 8 + k, 12 + k, 8 + k, 12 + k, 8 + k,
                                            12 + k, 8 + k, 12 + k);
      o.z[k] = gf(_mm512_permutexvar_epi32(idx, q), crumbs);
    }
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)), m4 = _mm_set1_epi8(0xF);
    o.s[0] = _mm512_cvtepu8_epi32(_mm_and_si128(v, m4));
    o.m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4));
    o.dd = halves_at(blk + 80);
  }
  [[gnu::always_inline]] static __m512i dot(const SuperBlock& o, const __m512i (&x)[4]) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, o.z[0], x[0]), o.z[1], x[1]);
    const __m512i b = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, o.z[2], x[2]), o.z[3], x[3]);
    return _mm512_dpwssd_epi32(zero, _mm512_add_epi32(a, b), o.s[0]);
  }
};

// Q3_K, natural order: vector k the columns 64k .. 64k + 63, 4 sub-blocks of 16.
struct KQ3 {
  static constexpr int64_t kBytes = 110;
  static constexpr bool kMins = false;
  static constexpr int kOffsetShift = 2;  // codes 0..7 stand for -4..3
  [[gnu::always_inline]] static __m512i dot(const SuperBlock& o, const __m512i (&x)[4]) { return dot4(o, x); }
  [[gnu::always_inline]] static void decode(const uint8_t* blk, SuperBlock& o) {
    const __m512i h = bcast32(blk);
    for (int k = 0; k < 4; ++k) {
      // Crumbs s, s + 1 (s = 2 (k % 2)) of bytes 32 (k / 2) .., high bits 4 (k / 2) + s, + 1.
      const int n = k / 2, s = 2 * (k % 2);
      const __m512i lo = gf(bcast32(blk + 32 + 32 * n), gf_halves(gf_move(2 * s, 2, 0), gf_move(2 * s + 2, 2, 0)));
      o.z[k] = _mm512_or_si512(lo, gf(h, gf_halves(gf_move(4 * n + s, 1, 2), gf_move(4 * n + s + 1, 1, 2))));
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(scales_k3(blk + 96));
    spread_words16(sc16, o.s);
    o.m = _mm256_slli_epi16(sc16, kOffsetShift);
    o.dd = half_at(blk + 108);
  }
};

// Q4_K, Q5_K in two lane patterns: the 128 bytes of nibbles as 16-byte pieces A = qs 0..15,
// 32..47, 64..79, 96..111 and B = 16..31, 48..63, 80..95, 112..127, so that lane group L (a
// 128-bit lane) of A's and B's low nibbles is sub-block 2L (its columns 0..15 and 16..31), of
// their high nibbles 2L + 1: z = low A, low B, high A, high B, each pair's VPDPBUSD summed
// before one VPDPWSSD (|sum| <= 8 * 31 * 127 < 2^15) by s[0] (sub-block 2L's scale in lane
// group L) and s[1] (2L + 1). The activations' 16-column pieces in that order (quantize_x).
[[gnu::always_inline]] inline void k4_codes(const uint8_t* qs, __m512i (&z)[4]) {
  const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
  const __m512i a = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512i b = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(3, 1, 3, 1));
  const __m512i m4 = _mm512_set1_epi8(0xF), hi = _mm512_set1_epi64(int64_t(gf_move(4, 4, 0)));
  z[0] = _mm512_and_si512(a, m4);
  z[1] = _mm512_and_si512(b, m4);
  z[2] = gf(a, hi);
  z[3] = gf(b, hi);
}
[[gnu::always_inline]] inline void k4_scales(const uint8_t* p, SuperBlock& o) {
  const __m128i sm = scales_mins_k4(p);
  const __m512i b = _mm512_broadcast_i32x4(sm);
  // Lane group L of s[h]: scale 2L + h, in the low byte of each dword.
  alignas(64) static constexpr int8_t kIdx[2][64] = {
#define MLA_K4(h, L) k4_scale_byte(2 * L + h), -128, -128, -128
#define MLA_K4x4(h, L) MLA_K4(h, L), MLA_K4(h, L), MLA_K4(h, L), MLA_K4(h, L)
      {MLA_K4x4(0, 0), MLA_K4x4(0, 1), MLA_K4x4(0, 2), MLA_K4x4(0, 3)},
      {MLA_K4x4(1, 0), MLA_K4x4(1, 1), MLA_K4x4(1, 2), MLA_K4x4(1, 3)}};
#undef MLA_K4x4
#undef MLA_K4
  o.s[0] = _mm512_shuffle_epi8(b, _mm512_load_si512(kIdx[0]));
  o.s[1] = _mm512_shuffle_epi8(b, _mm512_load_si512(kIdx[1]));
  o.m = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
      sm, _mm_setr_epi8(k4_min_byte(0), k4_min_byte(0), k4_min_byte(1), k4_min_byte(1), k4_min_byte(2), k4_min_byte(2),
                        k4_min_byte(3), k4_min_byte(3), k4_min_byte(4), k4_min_byte(4), k4_min_byte(5), k4_min_byte(5),
                        k4_min_byte(6), k4_min_byte(6), k4_min_byte(7), k4_min_byte(7))));
}

[[gnu::always_inline]] inline __m512i k4_dot(const SuperBlock& o, const __m512i (&x)[4]) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i even = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, o.z[0], x[0]), o.z[1], x[1]);
  const __m512i odd = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, o.z[2], x[2]), o.z[3], x[3]);
  return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero, even, o.s[0]), odd, o.s[1]);
}

struct KQ4 {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kMins = true;
  [[gnu::always_inline]] static __m512i dot(const SuperBlock& o, const __m512i (&x)[4]) { return k4_dot(o, x); }
  [[gnu::always_inline]] static void decode(const uint8_t* blk, SuperBlock& o) {
    k4_codes(blk + 16, o.z);
    k4_scales(blk + 4, o);
    o.dd = halves_at(blk);
  }
};

struct KQ5 {
  static constexpr int64_t kBytes = 176;
  static constexpr bool kMins = true;
  [[gnu::always_inline]] static __m512i dot(const SuperBlock& o, const __m512i (&x)[4]) { return k4_dot(o, x); }
  [[gnu::always_inline]] static void decode(const uint8_t* blk, SuperBlock& o) {
    // As Q4_K's, each sub-block j's fifth bits bit j of qh's 32 bytes: for A, qh 0..15, for B
    // 16..31, in every lane group; bit 2L (low nibbles) or 2L + 1 (high) of lane group L.
    k4_codes(blk + 48, o.z);
    const __m512i h0 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
    const __m512i h1 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32)));
    auto bits = [](int h) {
      return _mm512_set_epi64(int64_t(gf_move(6 + h, 1, 4)), int64_t(gf_move(6 + h, 1, 4)), int64_t(gf_move(4 + h, 1, 4)),
                              int64_t(gf_move(4 + h, 1, 4)), int64_t(gf_move(2 + h, 1, 4)), int64_t(gf_move(2 + h, 1, 4)),
                              int64_t(gf_move(h, 1, 4)), int64_t(gf_move(h, 1, 4)));
    };
    o.z[0] = _mm512_or_si512(o.z[0], gf(h0, bits(0)));
    o.z[1] = _mm512_or_si512(o.z[1], gf(h1, bits(0)));
    o.z[2] = _mm512_or_si512(o.z[2], gf(h0, bits(1)));
    o.z[3] = _mm512_or_si512(o.z[3], gf(h1, bits(1)));
    k4_scales(blk + 4, o);
    o.dd = halves_at(blk);
  }
};

// Q6_K, natural order as Q3_K.
struct KQ6 {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kMins = false;
  static constexpr int kOffsetShift = 5;  // codes 0..63 stand for -32..31
  [[gnu::always_inline]] static __m512i dot(const SuperBlock& o, const __m512i (&x)[4]) { return dot4(o, x); }
  [[gnu::always_inline]] static void decode(const uint8_t* blk, SuperBlock& o) {
    // Half n (128 columns): 64 bytes of ql (low nibbles: columns 128n .. + 63, high: + 64 ..)
    // and 32 of qh (crumbs 0, 1 for the first 32 columns of each 64, 2, 3 for the next).
    const __m512i lo = _mm512_set1_epi64(int64_t(gf_move(0, 4, 0))), hi = _mm512_set1_epi64(int64_t(gf_move(4, 4, 0)));
    const __m512i h01 = gf_halves(gf_move(0, 2, 4), gf_move(2, 2, 4)), h23 = gf_halves(gf_move(4, 2, 4), gf_move(6, 2, 4));
    for (int n = 0; n < 2; ++n) {
      const __m512i l = _mm512_loadu_si512(blk + 64 * n), h = bcast32(blk + 128 + 32 * n);
      o.z[2 * n] = _mm512_or_si512(gf(l, lo), gf(h, h01));
      o.z[2 * n + 1] = _mm512_or_si512(gf(l, hi), gf(h, h23));
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    spread_words16(sc16, o.s);
    o.m = _mm256_slli_epi16(sc16, kOffsetShift);
    o.dd = half_at(blk + 208);
  }
};

// R rows, row r at row0 + r * gap bytes (K / 256 super-blocks each), times TN tokens (a token's
// activations every xstride bytes from x, laid out as L) into y[t * ldy + r * ygap].
template <class F, int TN, int R>
[[gnu::always_inline]] inline void kquant_tile(const uint8_t* row0, size_t gap, int64_t K, const uint8_t* x,
                                               int64_t xstride, const XLayout& L, float* y, int64_t ldy, int64_t ygap) {
  __m512 f[R][TN];
  __m256 g[R][TN];  // the mins' products (Q2_K, Q4_K, Q5_K)
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TN; ++t) f[r][t] = _mm512_setzero_ps(), g[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < K / 256; ++b) {
    SuperBlock o[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = row0 + r * gap + b * F::kBytes;
      stream_ahead<F::kBytes>(blk);
      F::decode(blk, o[r]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < TN; ++t) {
      const uint8_t* xt = x + t * xstride;
      const int8_t* q = reinterpret_cast<const int8_t*>(xt) + b * 256;
      __m512i xq[4];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) xq[k] = _mm512_loadu_si512(q + 64 * k);
      // Minus the codes' sums per 16 columns, and the token's scale.
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + L.sums + 32 * b));
      const float xs = reinterpret_cast<const float*>(xt + L.scales)[b];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        __m512i acc = F::dot(o[r], xq);
        if constexpr (!F::kMins) acc = _mm512_dpwssd_epi32(acc, _mm512_zextsi256_si512(sums), _mm512_zextsi256_si512(o[r].m));
        const __m128 c = _mm_mul_ps(o[r].dd, _mm_set1_ps(xs));  // d, dmin times the token's scale
        f[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_broadcastss_ps(c), f[r][t]);
        if constexpr (F::kMins) {
          const __m256i mins = _mm256_dpwssd_epi32(_mm256_setzero_si256(), sums, o[r].m);
          g[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_broadcastss_ps(_mm_movehdup_ps(c)), g[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TN; ++t) {
      if constexpr (F::kMins) f[r][t] = _mm512_add_ps(f[r][t], _mm512_zextps256_ps512(g[r][t]));
      y[t * ldy + r * ygap] = avx512::hsum(f[r][t]);
    }
}

// ---- the block-32 formats ------------------------------------------------------------------------

// Byte indices for vpermb: the 16 bytes at 0 twice, then the 16 at Second twice.
template <int Second>
struct PairIdx {
  alignas(64) int8_t b[64];
  constexpr PairIdx() : b{} {
    for (int i = 0; i < 64; ++i) b[i] = int8_t((i < 32 ? 0 : Second) + i % 16);
  }
};
// The 16 bytes of nibbles at qs and at qs + Bytes (the next block's, where `two`; else zeros)
// as 64 codes: the first block's low nibbles (its columns 0..15), its high ones (16..31), then
// the second's. One masked load (no fault past the matrix's end), vpermb, GF2P8AFFINEQB.
template <int Bytes>
[[gnu::always_inline]] inline __m512i nibble_pair(const uint8_t* qs, bool two) {
  static constexpr PairIdx<Bytes> kIdx{};
  const __mmask64 live = two ? (__mmask64(1) << (Bytes + 16)) - 1 : 0xFFFF;
  const __m512i v = _mm512_permutexvar_epi8(_mm512_load_si512(kIdx.b), _mm512_maskz_loadu_epi8(live, qs));
  constexpr int64_t lo = int64_t(gf_move(0, 4, 0)), hi = int64_t(gf_move(4, 4, 0));
  return gf(v, _mm512_set_epi64(hi, hi, lo, lo, hi, hi, lo, lo));
}

// Per format: block bytes; the codes of blocks p and p + 1 (the second when `two`) as one zmm,
// unsigned, in column order; the codes' offset (subtracted through the sums); whether the block
// adds m (its second f16) times the sum of its activations.
struct BQ4_0 {
  static constexpr int64_t kBytes = 18;
  static constexpr float kOffset = 8;
  static constexpr bool kM = false;
  [[gnu::always_inline]] static __m512i pair(const uint8_t* p, bool two) {
    // qs of each block in two 128-bit lanes: its low nibbles (columns 0..15), its high (16..31).
    return nibble_pair<kBytes>(p + 2, two);
  }
};

struct BQ4_1 {
  static constexpr int64_t kBytes = 20;
  static constexpr float kOffset = 0;
  static constexpr bool kM = true;
  [[gnu::always_inline]] static __m512i pair(const uint8_t* p, bool two) {
    return nibble_pair<kBytes>(p + 4, two);
  }
};

// Q5_0 / Q5_1: the nibbles as Q4_0's (qs at p + Qs) plus bit 4 from each block's 32 bits of qh
// (at p + Qh), whose bit v belongs to column v: the two blocks' words are the byte mask.
template <int Qh, int Qs, int64_t Bytes>
[[gnu::always_inline]] inline __m512i q5_pair(const uint8_t* p, bool two) {
  uint32_t h0, h1 = 0;
  std::memcpy(&h0, p + Qh, 4);
  if (two) std::memcpy(&h1, p + Bytes + Qh, 4);
  const __m512i z = nibble_pair<Bytes>(p + Qs, two);
  return _mm512_mask_add_epi8(z, __mmask64(h0) | __mmask64(h1) << 32, z, _mm512_set1_epi8(0x10));
}

struct BQ5_0 {
  static constexpr int64_t kBytes = 22;
  static constexpr float kOffset = 16;
  static constexpr bool kM = false;
  [[gnu::always_inline]] static __m512i pair(const uint8_t* p, bool two) { return q5_pair<2, 6, kBytes>(p, two); }
};

struct BQ5_1 {
  static constexpr int64_t kBytes = 24;
  static constexpr float kOffset = 0;
  static constexpr bool kM = true;
  [[gnu::always_inline]] static __m512i pair(const uint8_t* p, bool two) { return q5_pair<4, 8, kBytes>(p, two); }
};

struct BQ8_0 {
  static constexpr int64_t kBytes = 34;
  static constexpr float kOffset = 128;
  static constexpr bool kM = false;
  [[gnu::always_inline]] static __m512i pair(const uint8_t* p, bool two) {
    // The int8 codes biased to unsigned (q + 128: the sign bit flipped).
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    const __m256i b = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBytes + 2)) : _mm256_setzero_si256();
    return _mm512_maskz_xor_epi32(two ? 0xFFFF : 0x00FF, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1),
                                  _mm512_set1_epi8(char(0x80)));
  }
};

// The f16 at byte Off of each of gn <= 16 blocks of Bytes bytes from blk, as 16 floats (zeros
// past gn): per 128 bytes of blocks one vpermt2b of two (masked) loads, into the next words.
// (vpgatherdd took 21 cycles a gather here: a third of a group of 16 Q4_0 blocks.)
template <int Bytes, int Off>
struct HalvesIdx {
  static constexpr int kPer = (128 - Off - 2) / Bytes + 1;  // blocks per 128 bytes
  static constexpr int kLoads = (16 + kPer - 1) / kPer;
  alignas(64) int8_t idx[kLoads][64];
  constexpr HalvesIdx() : idx{} {
    for (int c = 0; c < kLoads; ++c)
      for (int w = 0; w < 32; ++w) {
        const int j = w - c * kPer;  // block j of this load's 128 bytes writes word w
        const int from = j >= 0 && j < kPer ? j * Bytes + Off : 0;
        idx[c][2 * w] = int8_t(from);
        idx[c][2 * w + 1] = int8_t(from + 1);
      }
  }
};
template <int Bytes, int Off>
[[gnu::always_inline]] inline __m512 block_halves(const uint8_t* blk, int64_t gn) {
  static constexpr HalvesIdx<Bytes, Off> kIdx{};
  constexpr int kPer = HalvesIdx<Bytes, Off>::kPer;
  const int64_t avail = gn * Bytes;
  __m512i words = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int c = 0; c < HalvesIdx<Bytes, Off>::kLoads; ++c) {
    const int64_t at = int64_t(c) * kPer * Bytes;
    if (at >= avail) break;
    auto mask = [&](int64_t from) {
      const int64_t n = std::clamp<int64_t>(avail - from, 0, 64);
      return n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
    };
    const __m512i a = _mm512_maskz_loadu_epi8(mask(at), blk + at);
    const __m512i b = _mm512_maskz_loadu_epi8(mask(at + 64), blk + at + 64);
    // Words c * kPer .. c * kPer + kPer - 1 from this load.
    const __mmask32 mine = __mmask32(((uint64_t(1) << kPer) - 1) << (c * kPer));
    words = _mm512_mask_mov_epi16(words, mine, _mm512_permutex2var_epi8(a, _mm512_load_si512(kIdx.idx[c]), b));
  }
  const __m512 f = _mm512_cvtph_ps(_mm512_castsi512_si256(words));
  return _mm512_maskz_mov_ps(__mmask16((1u << gn) - 1), f);
}

// R rows, row r at row0 + r * gap bytes (K / 32 blocks each), times TN tokens into
// y[t * ldy + r * ygap].
template <class F, int TN, int R>
[[gnu::always_inline]] inline void block32_tile(const uint8_t* row0, size_t gap, int64_t K, const uint8_t* x,
                                                int64_t xstride, const XLayout& L, float* y, int64_t ldy, int64_t ygap) {
  __m512 f[R][TN];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TN; ++t) f[r][t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  const __m512i pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const int64_t nb = K / 32;
  for (int64_t g = 0; g < nb; g += 16) {
    const int64_t gn = std::min<int64_t>(16, nb - g);
    // Per row, each block's d (and Q4_1 / Q5_1's m) times each token's scales: c[r][t].
    __m512 c[R][TN];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = row0 + r * gap + g * F::kBytes;
      const __m512 d = block_halves<F::kBytes, 0>(blk, gn);
      __m512 m = _mm512_setzero_ps();
      if constexpr (F::kM) m = block_halves<F::kBytes, 2>(blk, gn);
#pragma GCC unroll 4
      for (int t = 0; t < TN; ++t) {
        const uint8_t* xt = x + t * xstride;
        c[r][t] = _mm512_mul_ps(d, _mm512_loadu_ps(reinterpret_cast<const float*>(xt + L.scales) + g));
        const __m512 sums = _mm512_loadu_ps(reinterpret_cast<const float*>(xt + L.sums) + g);
        if constexpr (F::kOffset != 0)
          f[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(-F::kOffset)), sums, f[r][t]);
        if constexpr (F::kM) f[r][t] = _mm512_fmadd_ps(m, sums, f[r][t]);
      }
    }
    // Blocks p, p + 1 (the second where `two`): lanes 0..7 of their dot products the first's,
    // 8..15 the second's, times their coefficients.
    auto pair = [&](int64_t p, bool two) {
      __m512i z[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint8_t* pb = row0 + r * gap + (g + p) * F::kBytes;
        stream_ahead<2 * F::kBytes>(pb);
        z[r] = F::pair(pb, two);
      }
      const __m512i lanes = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(int(p)));
#pragma GCC unroll 4
      for (int t = 0; t < TN; ++t) {
        const __m512i xq = _mm512_loadu_si512(reinterpret_cast<const int8_t*>(x + t * xstride) + (g + p) * 32);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512i dot = _mm512_dpbusd_epi32(zero, z[r], xq);
          f[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, c[r][t]), f[r][t]);
        }
      }
    };
    if (gn == 16) {  // unrolled: the pairs' lanes constants
#pragma GCC unroll 8
      for (int p = 0; p < 16; p += 2) pair(p, true);
    } else {
      for (int64_t p = 0; p < gn; p += 2) pair(p, p + 1 < gn);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TN; ++t) y[t * ldy + r * ygap] = avx512::hsum(f[r][t]);
}

// ---- the rows kernel ----------------------------------------------------------------------------

// Rows [n0, n1) of a GEMV job, for each tile of up to 4 tokens, in tiles of kRows rows a page
// apart (gemv_rows.h's for_each_tile): tile(tn, R, first row's bytes, the rows' gap in bytes, x
// of the tile's first token, y of its first token and row, the rows' gap). One row a tile: two
// ran slower in L2 (Q4_K 21.7 against 18.8 cycles a super-block, Q8_0 9.6 against 7.6 a pair of
// blocks, one token, AMD Zen 5), their registers spilling.
constexpr int kRows = 1;

template <class Tile>
void vnni_rows(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1, Tile&& tile) {
  const MatrixView& W = *job.W;
  const size_t rb = W.row_bytes();
  const uint8_t* data = static_cast<const uint8_t*>(W.data);
  // A unit starts its stream cold: its first bytes, up to where stream_ahead starts, into L2.
  const int64_t bytes = (n1 - n0) * int64_t(rb);
  for (int64_t o = 0; o < std::min<int64_t>(avx512::kPrefetchBytes, bytes); o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(data + size_t(n0) * rb + size_t(o)), _MM_HINT_T1);
  avx512::for_each_token_tile(job.T, [&](auto tn, int64_t t0) {
    constexpr int R = kRows;
    const uint8_t* x = job.xb + t0 * job.xstride;
    float* y = job.y + t0 * job.ldy;
    avx512::for_each_tile<R>(
        n0, n1, int64_t(rb),
        [&](int64_t n, int64_t gap) {
          tile(tn, std::integral_constant<int, R>{}, data + size_t(n) * rb, size_t(gap) * rb, x, y + n, gap);
        },
        [&](int64_t n) {
          for (; n < n1; ++n) tile(tn, std::integral_constant<int, 1>{}, data + size_t(n) * rb, rb, x, y + n, 1);
        });
  });
}

}  // namespace

}  // namespace mla::cpu::ggml
