// The decode GEMV of llama.cpp's block formats on int8 activations (Kernel::GemvVnni), as
// llama.cpp computes their dot products: the activations quantized to int8 in the weights' block
// shape (llama.cpp's Q8_K for the K-quants, Q8_0 / Q8_1 for the others), each block's integer dot
// product on VPDPBUSD (the weights' unsigned codes times the signed activation codes), the
// codes' offsets and the K-quants' mins taken off through the activations' per-block sums.
//
// The activations (quantize_x): per block of B columns (256 for the K-quants, 32 otherwise) a
// float32 scale s = m / 127 (m the block's largest magnitude) and codes q = round(x * (127 / m))
// (float32, to nearest even; |q| <= 127); a block of zeros has scale 0 and codes 0. One token's
// layout (XLayout), from a 64-byte aligned start:
//   codes   int8 [K], column order (Q4_K, Q5_K: chunks of 32 in their code vectors' order),
//           then 64 bytes of zeros (the block-32 kernels read a pair of blocks past an odd
//           last one)
//   scales  float [K / B], then zeros to a multiple of 16
//   sums    K-quants: minus the sum of the codes of each 16 columns, int16 [K / 16];
//           block-32: each block's scale times the sum of its codes, float [K / 32], then zeros
//           to a multiple of 16
//
// The weights' codes come out of a block in natural column order, 64 to a zmm (GFNI's
// GF2P8AFFINEQB moves any bits of each byte into place in one instruction, its bit matrix per
// 64-bit lane), and each VPDPBUSD lane sums 4 adjacent columns: one sub-block's lanes share its
// scale. The K-quants (Kquant<Format>): per super-block of 256 columns, per token, the 4 code
// vectors by VPDPBUSD from zero into 16-lane dot products (|dot| <= 4 * 63 * 127 < 2^15), each
// times its lanes' sub-block scales by VPDPWSSD (the dot's low word times the scale in the even
// word, zero in the odd) into one integer sum; Q3_K and Q6_K take the codes' offset (4, 32)
// times the scales times the sums into the same sum, Q2_K, Q4_K and Q5_K their mins times the
// sums into a second; each to float32 times d (dmin) times the token's scale, into 16 float
// lanes summed at the row's end. The block-32 formats (Block32<Format>): 16 blocks at a time,
// their f16 d (and m) gathered into one vector, per pair of blocks a VPDPBUSD from zero (lanes
// 0..7 the first block, 8..15 the second) converted and multiplied by its blocks' d times the
// token's scales (a vpermps of the 16), the offsets (Q4_0 8, Q5_0 16, Q8_0's 128 of its codes
// biased to unsigned) and Q4_1 / Q5_1's m times the sums once per 16 blocks.
// Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/formats/gemv_rows.h"
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
// K4: the codes of each super-block's chunks of 32 columns in the order 0, 2, 1, 3, 4, 6, 5, 7,
// the order of Q4_K's and Q5_K's code vectors (KQ4); the sums stay in column order.
template <int64_t B, bool K4 = false>
void quantize_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) {
  static_assert(!K4 || B == 256);
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
        constexpr int kChunkAt[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        const int64_t at = K4 ? kChunkAt[k / 32] * 32 + k % 32 : k;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * B + at), _mm512_cvtsepi32_epi8(c));
        const int32_t sum = _mm512_reduce_add_epi32(c);
        if constexpr (B == 256) reinterpret_cast<int16_t*>(o + L.sums)[(b * B + k) / 16] = int16_t(-sum);
        block_sum += sum;
      }
      if constexpr (B == 32) reinterpret_cast<float*>(o + L.sums)[b] = s[b] * float(block_sum);
    }
  }
}

namespace {  // internal linkage, as the decoders' (docs/backend.md)

// ---- moving bits with GF2P8AFFINEQB -------------------------------------------------------------

// The bit matrix that moves bits [from, from + count) of each byte to [to, to + count), the others
// zero: result bit i is the parity of byte 7 - i of the matrix AND the source byte.
constexpr uint64_t gf_move(int from, int count, int to) {
  uint64_t a = 0;
  for (int i = 0; i < count; ++i) a |= uint64_t(1u << (from + i)) << (8 * (7 - (to + i)));
  return a;
}
// A zmm of matrices: lo for the first 32 bytes, hi for the last 32.
inline __m512i gf_halves(uint64_t lo, uint64_t hi) {
  return _mm512_set_epi64(int64_t(hi), int64_t(hi), int64_t(hi), int64_t(hi), int64_t(lo), int64_t(lo), int64_t(lo),
                          int64_t(lo));
}
inline __m512i gf(__m512i v, __m512i matrix) { return _mm512_gf2p8affine_epi64_epi8(v, matrix, 0); }
// 32 bytes at p in both halves of a zmm.
inline __m512i bcast32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// The f16 at p (and the next), as float32 in lanes 0 (and 1).
inline __m128 half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(h));
}
inline __m128 halves_at(const uint8_t* p) {
  uint32_t h;
  std::memcpy(&h, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(int(h)));
}

// ---- the K-quants ------------------------------------------------------------------------------

// A decoded super-block: the codes of columns 64k .. 64k + 63 (z[k], unsigned), each VPDPBUSD
// lane's sub-block scale in the even word of its dword (s[k]), d, and the 16 words of either the
// mins (per 16 columns; dmin) or the scales times the codes' offset (Q3_K, Q6_K).
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
// Bytes: byte 4l of vector k selects byte sel(k, l) of each 128-bit lane, bytes 4l + 1 .. zero.
// Q4_K, Q5_K: vector k holds sub-blocks k4_sub(k, 0) (lanes 0..7) and k4_sub(k, 1) (8..15).
constexpr int k4_sub(int k, int h) { return (k / 2) * 4 + k % 2 + 2 * h; }
// The byte of scale (min) j in scales_mins_k4's order.
constexpr int k4_scale_byte(int j) { return j < 4 ? j : j + 4; }
constexpr int k4_min_byte(int j) { return j < 4 ? j + 4 : j + 8; }
template <int Per>  // columns a scale: 16 (Q2_K, byte 4k + l / 4) or 32 (Q4_K, Q5_K)
constexpr SpreadIdx spread_idx_bytes() {
  SpreadIdx x{};
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 16; ++l) {
      x.b[k][4 * l] = int8_t(Per == 16 ? 4 * k + l / 4 : k4_scale_byte(k4_sub(k, l / 8)));
      x.b[k][4 * l + 1] = x.b[k][4 * l + 2] = x.b[k][4 * l + 3] = int8_t(0x80);
    }
  return x;
}
inline constexpr SpreadIdx kSpreadWords16 = spread_idx_words16();
inline constexpr SpreadIdx kSpreadBytes16 = spread_idx_bytes<16>();
inline constexpr SpreadIdx kSpreadBytes32 = spread_idx_bytes<32>();

// The 16 signed scales (words) of a super-block: lane l of vector k takes scale 4k + l / 4.
inline void spread_words16(__m256i sc16, __m512i (&s)[4]) {
  const __m512i w = _mm512_zextsi256_si512(sc16);
  for (int k = 0; k < 4; ++k)
    s[k] = _mm512_maskz_permutexvar_epi16(0x55555555u, _mm512_load_si512(kSpreadWords16.b[k]), w);
}
// Unsigned byte scales (the 16 bytes of v) through an index of spread_idx_bytes.
inline void spread_bytes(__m128i v, const SpreadIdx& idx, __m512i (&s)[4]) {
  const __m512i b = _mm512_broadcast_i32x4(v);
  for (int k = 0; k < 4; ++k) s[k] = _mm512_shuffle_epi8(b, _mm512_load_si512(idx.b[k]));
}

struct KQ2 {
  static constexpr int64_t kBytes = 84;
  static constexpr bool kMins = true;
  static void decode(const uint8_t* blk, SuperBlock& o) {
    // Vector k: bytes 32 (k / 2) .. + 31, crumbs 2 (k % 2) and 2 (k % 2) + 1 (columns 64k ..).
    for (int k = 0; k < 4; ++k)
      o.z[k] = gf(bcast32(blk + 16 + 32 * (k / 2)), gf_halves(gf_move(4 * (k % 2), 2, 0), gf_move(4 * (k % 2) + 2, 2, 0)));
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)), m4 = _mm_set1_epi8(0xF);
    spread_bytes(_mm_and_si128(v, m4), kSpreadBytes16, o.s);
    o.m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4));
    o.dd = halves_at(blk + 80);
  }
};

struct KQ3 {
  static constexpr int64_t kBytes = 110;
  static constexpr bool kMins = false;
  static constexpr int kOffsetShift = 2;  // codes 0..7 stand for -4..3
  static void decode(const uint8_t* blk, SuperBlock& o) {
    const __m512i h = bcast32(blk);
    for (int k = 0; k < 4; ++k) {
      // Crumbs s, s + 1 (s = 2 (k % 2)) of bytes 32 (k / 2) .., high bits 4 (k / 2) + s, + 1.
      const int n = k / 2, s = 2 * (k % 2);
      const __m512i lo = gf(bcast32(blk + 32 + 32 * n), gf_halves(gf_move(2 * s, 2, 0), gf_move(2 * s + 2, 2, 0)));
      o.z[k] = _mm512_or_si512(lo, gf(h, gf_halves(gf_move(4 * n + s, 1, 2), gf_move(4 * n + s + 1, 1, 2))));
    }
    uint32_t a[3];
    std::memcpy(a, blk + 96, 12);
    constexpr uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const __m128i sc = _mm_sub_epi8(_mm_set_epi32(int(((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)),
                                                  int(((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4)),
                                                  int((a[1] & m4) | (((a[2] >> 2) & m2) << 4)),
                                                  int((a[0] & m4) | ((a[2] & m2) << 4))),
                                    _mm_set1_epi8(32));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
    spread_words16(sc16, o.s);
    o.m = _mm256_slli_epi16(sc16, kOffsetShift);
    o.dd = half_at(blk + 108);
  }
};

// The 8 6-bit scales and mins of a Q4_K / Q5_K super-block (12 bytes at p, read as 16) as the
// bytes sc0..3, m0..3, sc4..7, m4..7. Dwords d0, d1, d2 of p: sc0..3 = d0 & 63, m0..3 = d1 & 63,
// sc4..7 = (d2 & 15) | (d0 >> 6) << 4, m4..7 = (d2 >> 4 & 15) | (d1 >> 6) << 4, byte by byte.
inline __m128i scales_mins_k4(const uint8_t* p) {
  const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_srlv_epi32(_mm_shuffle_epi32(d, _MM_SHUFFLE(2, 2, 1, 0)), _mm_setr_epi32(0, 0, 0, 4));
  const __m128i hi = _mm_srli_epi32(_mm_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 1, 0)), 2);
  const __m128i m_lo = _mm_setr_epi32(0x3f3f3f3f, 0x3f3f3f3f, 0x0f0f0f0f, 0x0f0f0f0f);
  const __m128i m_hi = _mm_setr_epi32(0, 0, 0x30303030, 0x30303030);
  return _mm_or_si128(_mm_and_si128(lo, m_lo), _mm_and_si128(hi, m_hi));
}
// Their scales spread over the code vectors (lanes 0..7 of vector k: sub-block k4_sub(k, 0),
// 8..15: k4_sub(k, 1)) and mins per 16 columns.
inline void spread_k4(__m128i sm, SuperBlock& o) {
  spread_bytes(sm, kSpreadBytes32, o.s);
  o.m = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
      sm, _mm_setr_epi8(k4_min_byte(0), k4_min_byte(0), k4_min_byte(1), k4_min_byte(1), k4_min_byte(2), k4_min_byte(2),
                        k4_min_byte(3), k4_min_byte(3), k4_min_byte(4), k4_min_byte(4), k4_min_byte(5), k4_min_byte(5),
                        k4_min_byte(6), k4_min_byte(6), k4_min_byte(7), k4_min_byte(7))));
}

struct KQ4 {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kMins = true;
  static void decode(const uint8_t* blk, SuperBlock& o) {
    // 64 bytes of nibbles at a time: low nibbles (sub-blocks 4i, 4i + 2), then high (4i + 1, 4i + 3).
    const __m512i m4 = _mm512_set1_epi8(0xF), hi = _mm512_set1_epi64(int64_t(gf_move(4, 4, 0)));
    for (int i = 0; i < 2; ++i) {
      const __m512i q = _mm512_loadu_si512(blk + 16 + 64 * i);
      o.z[2 * i] = _mm512_and_si512(q, m4);
      o.z[2 * i + 1] = gf(q, hi);
    }
    spread_k4(scales_mins_k4(blk + 4), o);
    o.dd = halves_at(blk);
  }
};

struct KQ5 {
  static constexpr int64_t kBytes = 176;
  static constexpr bool kMins = true;
  static void decode(const uint8_t* blk, SuperBlock& o) {
    // As Q4_K's, each sub-block j's fifth bits bit j of qh's 32 bytes.
    const __m512i m4 = _mm512_set1_epi8(0xF), hi = _mm512_set1_epi64(int64_t(gf_move(4, 4, 0))), h = bcast32(blk + 16);
    for (int i = 0; i < 2; ++i) {
      const __m512i q = _mm512_loadu_si512(blk + 48 + 64 * i);
      o.z[2 * i] = _mm512_or_si512(_mm512_and_si512(q, m4), gf(h, gf_halves(gf_move(4 * i, 1, 4), gf_move(4 * i + 2, 1, 4))));
      o.z[2 * i + 1] = _mm512_or_si512(gf(q, hi), gf(h, gf_halves(gf_move(4 * i + 1, 1, 4), gf_move(4 * i + 3, 1, 4))));
    }
    spread_k4(scales_mins_k4(blk + 4), o);
    o.dd = halves_at(blk);
  }
};

struct KQ6 {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kMins = false;
  static constexpr int kOffsetShift = 5;  // codes 0..63 stand for -32..31
  static void decode(const uint8_t* blk, SuperBlock& o) {
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
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = 0; b < K / 256; ++b) {
    SuperBlock o[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = row0 + r * gap + b * F::kBytes;
      touch_page_ahead<F::kBytes>(blk);
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
        __m512i acc = zero;
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) acc = _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(zero, o[r].z[k], xq[k]), o[r].s[k]);
        if constexpr (!F::kMins) acc = _mm512_dpwssd_epi32(acc, _mm512_zextsi256_si512(sums), _mm512_zextsi256_si512(o[r].m));
        const __m512 d = _mm512_broadcastss_ps(o[r].dd);
        f[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, _mm512_set1_ps(xs)), f[r][t]);
        if constexpr (F::kMins) {
          const __m256 dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(o[r].dd));
          const __m256i mins = _mm256_dpwssd_epi32(_mm256_setzero_si256(), sums, o[r].m);
          g[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, _mm256_set1_ps(xs)), g[r][t]);
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

// The 16 bytes of nibbles at a (and at b, or zeros) as 64 codes: a's low nibbles (columns 0..15
// of its block), its high ones (16..31), then b's.
inline __m512i nibble_pair(const uint8_t* a, const uint8_t* b) {
  const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i vb = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)) : _mm_setzero_si128();
  const __m512i v = _mm512_inserti64x4(_mm512_broadcast_i32x4(va), _mm256_broadcastsi128_si256(vb), 1);
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
  static __m512i pair(const uint8_t* p, bool two) {
    // qs of each block in two 128-bit lanes: its low nibbles (columns 0..15), its high (16..31).
    return nibble_pair(p + 2, two ? p + kBytes + 2 : nullptr);
  }
};

struct BQ4_1 {
  static constexpr int64_t kBytes = 20;
  static constexpr float kOffset = 0;
  static constexpr bool kM = true;
  static __m512i pair(const uint8_t* p, bool two) {
    return nibble_pair(p + 4, two ? p + kBytes + 4 : nullptr);
  }
};

// Q5_0 / Q5_1: the nibbles as Q4_0's (qs at p + Qs) plus bit 4 from each block's 32 bits of qh
// (at p + Qh), whose bit v belongs to column v: the two blocks' words are the byte mask.
template <int Qh, int Qs, int64_t Bytes>
inline __m512i q5_pair(const uint8_t* p, bool two) {
  uint32_t h0, h1 = 0;
  std::memcpy(&h0, p + Qh, 4);
  if (two) std::memcpy(&h1, p + Bytes + Qh, 4);
  const __m512i z = nibble_pair(p + Qs, two ? p + Bytes + Qs : nullptr);
  return _mm512_mask_add_epi8(z, __mmask64(h0) | __mmask64(h1) << 32, z, _mm512_set1_epi8(0x10));
}

struct BQ5_0 {
  static constexpr int64_t kBytes = 22;
  static constexpr float kOffset = 16;
  static constexpr bool kM = false;
  static __m512i pair(const uint8_t* p, bool two) { return q5_pair<2, 6, kBytes>(p, two); }
};

struct BQ5_1 {
  static constexpr int64_t kBytes = 24;
  static constexpr float kOffset = 0;
  static constexpr bool kM = true;
  static __m512i pair(const uint8_t* p, bool two) { return q5_pair<4, 8, kBytes>(p, two); }
};

struct BQ8_0 {
  static constexpr int64_t kBytes = 34;
  static constexpr float kOffset = 128;
  static constexpr bool kM = false;
  static __m512i pair(const uint8_t* p, bool two) {
    // The int8 codes biased to unsigned (q + 128: the sign bit flipped).
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    const __m256i b = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBytes + 2)) : _mm256_setzero_si256();
    return _mm512_maskz_xor_epi32(two ? 0xFFFF : 0x00FF, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1),
                                  _mm512_set1_epi8(char(0x80)));
  }
};

// R rows, row r at row0 + r * gap bytes (K / 32 blocks each), times TN tokens into
// y[t * ldy + r * ygap].
template <class F, int TN, int R>
[[gnu::always_inline]] inline void block32_tile(const uint8_t* row0, size_t gap, int64_t K, const uint8_t* x,
                                                int64_t xstride, const XLayout& L, float* y, int64_t ldy, int64_t ygap) {
  __m512 f[R][TN];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TN; ++t) f[r][t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(int(F::kBytes)));
  const __m512i pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const int64_t nb = K / 32;
  for (int64_t g = 0; g < nb; g += 16) {
    const int64_t gn = std::min<int64_t>(16, nb - g);
    const __mmask16 live = __mmask16((1u << gn) - 1);
    // Per row, each block's d (and Q4_1 / Q5_1's m) times each token's scales: c[r][t].
    __m512 c[R][TN];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = row0 + r * gap + g * F::kBytes;
      // Each block's first 32 bits: d, then Q4_1 / Q5_1's m.
      const __m512i w = _mm512_mask_i32gather_epi32(zero, live, offsets, blk, 1);
      const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
#pragma GCC unroll 4
      for (int t = 0; t < TN; ++t) {
        const uint8_t* xt = x + t * xstride;
        c[r][t] = _mm512_mul_ps(d, _mm512_loadu_ps(reinterpret_cast<const float*>(xt + L.scales) + g));
        const __m512 sums = _mm512_loadu_ps(reinterpret_cast<const float*>(xt + L.sums) + g);
        if constexpr (F::kOffset != 0)
          f[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(-F::kOffset)), sums, f[r][t]);
        if constexpr (F::kM)
          f[r][t] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16))), sums, f[r][t]);
      }
    }
    for (int64_t p = 0; p < gn; p += 2) {
      __m512i z[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint8_t* pb = row0 + r * gap + (g + p) * F::kBytes;
        touch_page_ahead<2 * F::kBytes>(pb);
        z[r] = F::pair(pb, p + 1 < gn);
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
  // A unit starts its streams cold: their first 8 KiB into L1 at once (touch_page_ahead runs two
  // pages ahead from there).
  const int64_t bytes = (n1 - n0) * int64_t(rb);
  for (int64_t o = 0; o < std::min<int64_t>(8192, bytes); o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(data + size_t(n0) * rb + size_t(o)), _MM_HINT_T0);
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
