// llama.cpp's block formats (tensor/ggml_blocks.h; ggml-common.h's block_q4_0 .. block_q6_K) as a
// GGUF file stores them: row r of W is W.cols / 32 blocks (Q4_0 .. Q8_0) or W.cols / 256
// super-blocks (the K-quants), each with its own scales (f16 d, dmin). Value v of a block:
//   Q4_0 (18 bytes): d @0, qs[16] @2; q = qs[v % 16] low nibble (v < 16) or high; d (q - 8)
//   Q4_1 (20): d @0, m @2, qs[16] @4; d q + m
//   Q5_0 (22): d @0, qh (32 bits) @2, qs[16] @6; q = Q4_0's nibble | bit v of qh << 4; d (q - 16)
//   Q5_1 (24): d @0, m @2, qh @4, qs[16] @8; d q + m
//   Q8_0 (34): d @0, int8 q[32] @2; d q
//   Q2_K (84): scales[16] @0 (per 16 values: scale low nibble, min high), qs[64] @16, d @80,
//     dmin @82; v = 128n + 32s + l (l < 32): q = (qs[32n + l] >> 2s) & 3, i = v / 16;
//     d sc_i q - dmin m_i
//   Q3_K (110): hmask[32] @0, qs[64] @32, scales (12 bytes) @96, d @108; v = 128n + 32s + l:
//     q = ((qs[32n + l] >> 2s) & 3) + 4 ((hmask[l] >> (4n + s)) & 1) - 4; scale i = v / 16
//     (6 bits, minus 32): low 4 bits from byte i (i < 8) or i - 8 (high nibble), high 2 bits
//     (byte 8 + i % 4) >> 2 (i / 4); d (scale_i - 32) q
//   Q4_K (144): d @0, dmin @2, scales (12 bytes: 6-bit sc_j and m_j of 8 sub-blocks of 32) @4,
//     qs[128] @16; v = 64i + l: qs[32i + l] low nibble (sub-block 2i), v = 64i + 32 + l: high
//     (2i + 1); d sc_j q - dmin m_j
//   Q5_K (176): Q4_K's d, dmin, scales, then qh[32] @16, qs[128] @48; q = nibble + 16 bit j of
//     qh[l] (sub-block j)
//   Q6_K (210): ql[128] @0, qh[64] @128, int8 scales[16] @192, d @208; v = 128n + 32m + l:
//     q = ql[64n + 32(m & 1) + l] nibble (low for m < 2) | ((qh[32n + l] >> 2m) & 3) << 4;
//     d sc_{v / 16} (q - 32)
// Float32 decoders (Dec*, one per format): a chunk of 32 columns is a block (Q4_0 .. Q8_0) or
// sub-block c % 8 of super-block c / 8, in natural order (Layout::Natural: a = columns 0..15,
// b = 16..31), which is how a block's codes lie, and each K-quant scale covers a half (16 values)
// or the chunk. Their weights equal the reference's bit for bit: the same float32 operations
// in the same order, a product and a sum never fused (rows.cpp is built with -ffp-contract=off,
// as tensor/ggml_blocks.cpp). The VNNI GEMV's decoders are in vnni.h.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/element.h"
#include "tensor/ggml_blocks.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// One weight, as MatrixView::dequant_row computes it: the reference dequantizer over its block.
inline float ggml_element(const MatrixView& W, int64_t r, int64_t k) {
  const GgmlBlock b = ggml_block(W.format);
  float vals[256];
  ggml_dequantize(W.format, row_bytes_of(W, r) + size_t(k / b.values) * b.bytes, b.values, vals);
  return vals[k % b.values];
}

// The f16 at p, as float32 (exact).
inline float ggml_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

namespace {  // internal linkage, as every format's decoders (docs/backend.md)

inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m512 u8_floats(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }

// The byte of scale (min) j in scales_mins_k4's order.
constexpr int k4_scale_byte(int j) { return j < 4 ? j : j + 4; }
constexpr int k4_min_byte(int j) { return j < 4 ? j + 4 : j + 8; }

// The 8 6-bit scales and mins of a Q4_K / Q5_K super-block (12 bytes at p) as the bytes sc0..3,
// m0..3, sc4..7, m4..7: with dwords a0, a1, a2 of p, byte by byte, sc0..3 = a0 & 63, m0..3 = a1 &
// 63, sc4..7 = (a2 & 15) | (a0 >> 6) << 4, m4..7 = (a2 >> 4 & 15) | (a1 >> 6) << 4. On the scalar
// units (64 bits at a time), which the vector ones' work leaves idle: the same in vector
// instructions ran slower (Q3_K 23.6-24.4 cycles a super-block against 22.7).
[[gnu::always_inline]] inline __m128i scales_mins_k4(const uint8_t* p) {
  uint64_t a01;
  uint32_t a2;
  std::memcpy(&a01, p, 8);
  std::memcpy(&a2, p + 8, 4);
  const uint64_t lo = a01 & 0x3f3f3f3f3f3f3f3full;
  const uint64_t hi = ((uint64_t(a2) | uint64_t(a2) << 28) & 0x0f0f0f0f0f0f0f0full) | ((a01 >> 2) & 0x3030303030303030ull);
  return _mm_set_epi64x(int64_t(hi), int64_t(lo));
}

// The 16 6-bit scales of a Q3_K super-block (12 bytes at p), minus 32, as signed bytes: with
// dwords a0, a1, a2 of p, scales 0..3 = (a0 & 15) | (a2 & 3) << 4, byte by byte, 4..7 = (a1 &
// 15) | (a2 >> 2 & 3) << 4, 8..11 = (a0 >> 4 & 15) | (a2 >> 4 & 3) << 4, 12..15 = (a1 >> 4 & 15) |
// (a2 >> 6 & 3) << 4. On the scalar units, as scales_mins_k4.
[[gnu::always_inline]] inline __m128i scales_k3(const uint8_t* p) {
  uint64_t a01;
  uint32_t a2;
  std::memcpy(&a01, p, 8);
  std::memcpy(&a2, p + 8, 4);
  const uint64_t h = uint64_t(a2) | uint64_t(a2) << 30;  // a2 in the low half, a2 >> 2 in the high
  constexpr uint64_t m4 = 0x0f0f0f0f0f0f0f0full, m2 = 0x0303030303030303ull;
  const uint64_t lo = (a01 & m4) | (h & m2) << 4, hi = ((a01 >> 4) & m4) | ((h >> 4) & m2) << 4;
  return _mm_sub_epi8(_mm_set_epi64x(int64_t(hi), int64_t(lo)), _mm_set1_epi8(32));
}

// What every ggml decoder shares: the row, the stored block's bytes and values, a prefetch of
// the line each chunk starts in (once per line), the reference for the columns past the last
// chunk (none: a row is whole blocks).
template <int64_t BlockBytes, int64_t BlockChunks>
struct GgmlDec {
  static constexpr bool kGroupScales = false;
  static constexpr int64_t kBlockBytes = BlockBytes;
  const uint8_t* row;
  // The block chunk c of the row lies in.
  const uint8_t* block(int64_t c) const { return row + (c / BlockChunks) * BlockBytes; }
  void prefetch(int64_t c) const {
    const int64_t off = c * BlockBytes / BlockChunks;
    if ((off & 63) < (BlockBytes + BlockChunks - 1) / BlockChunks) prefetch_at(row, off);
  }
  static float element(const MatrixView& W, int64_t r, int64_t k) { return ggml_element(W, r, k); }
};

// What the K-quant decoders share: their super-block's scales as float32 (d times each
// sub-block's scale, dmin times its min), computed by Scales::of once for the 8 chunks of a
// super-block (the tile walk and decoded_row_bf16 decode a row's chunks in order).
template <int64_t BlockBytes, class Scales>
struct KDec : GgmlDec<BlockBytes, 8> {
  mutable int64_t at = -1;  // the super-block whose scales these are
  mutable __m512 sd{}, sm{};
  // Lane k of sd, and of sm, broadcast (after the super-block's scales where c starts another).
  void scales(int64_t c, int ks, __m512& d, int km, __m512& m) const {
    if ((c >> 3) != at) {
      at = c >> 3;
      Scales::of(this->block(c), sd, sm);
    }
    d = _mm512_permutexvar_ps(_mm512_set1_epi32(ks), sd);
    m = _mm512_permutexvar_ps(_mm512_set1_epi32(km), sm);
  }
};

// (q - 8) d through a 16-entry table (vpermps reads an index's low 4 bits), as DecInt4.
struct DecQ4_0 : GgmlDec<18, 1> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512 t = _mm512_mul_ps(table, _mm512_set1_ps(ggml_half(blk)));
    const __m128i v = load16(blk + 2);
    a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), t);
    b = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4)), t);
  }
};

struct DecQ4_1 : GgmlDec<20, 1> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(table, _mm512_set1_ps(ggml_half(blk))), _mm512_set1_ps(ggml_half(blk + 2)));
    const __m128i v = load16(blk + 4);
    a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), t);
    b = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4)), t);
  }
};

// Nibbles with the fifth bit of each value from qh (bit v: a 16-bit mask per half), as floats.
inline void q5_codes(const uint8_t* qs, uint32_t qh, __m512& a, __m512& b) {
  const __m128i v = load16(qs), m = _mm_set1_epi8(0xF), h = _mm_set1_epi8(0x10);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  a = u8_floats(_mm_mask_add_epi8(lo, __mmask16(qh), lo, h));
  b = u8_floats(_mm_mask_add_epi8(hi, __mmask16(qh >> 16), hi, h));
}

struct DecQ5_0 : GgmlDec<22, 1> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    q5_codes(blk + 6, qh, a, b);
    const __m512 d = _mm512_set1_ps(ggml_half(blk)), off = _mm512_set1_ps(16.0f);
    a = _mm512_mul_ps(_mm512_sub_ps(a, off), d);
    b = _mm512_mul_ps(_mm512_sub_ps(b, off), d);
  }
};

struct DecQ5_1 : GgmlDec<24, 1> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    uint32_t qh;
    std::memcpy(&qh, blk + 4, 4);
    q5_codes(blk + 8, qh, a, b);
    const __m512 d = _mm512_set1_ps(ggml_half(blk)), m = _mm512_set1_ps(ggml_half(blk + 2));
    a = _mm512_add_ps(_mm512_mul_ps(a, d), m);
    b = _mm512_add_ps(_mm512_mul_ps(b, d), m);
  }
};

struct DecQ8_0 : GgmlDec<34, 1> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const __m512 d = _mm512_set1_ps(ggml_half(blk));
    a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(blk + 2))), d);
    b = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(blk + 18))), d);
  }
};

// 2-bit codes (q >> 2s) & 3 of 32 bytes, as the halves' floats.
inline void crumbs(const uint8_t* q, int s, __m128i& lo, __m128i& hi) {
  const __m128i n = _mm_cvtsi32_si128(2 * s), m = _mm_set1_epi8(3);
  lo = _mm_and_si128(_mm_srl_epi16(load16(q), n), m);
  hi = _mm_and_si128(_mm_srl_epi16(load16(q + 16), n), m);
}

// Q2_K: sd lane i = d * scale i, sm lane i = dmin * min i (16 columns each).
struct ScalesQ2_K {
  static void of(const uint8_t* blk, __m512& sd, __m512& sm) {
    const __m128i v = load16(blk), m4 = _mm_set1_epi8(0xF);
    sd = _mm512_mul_ps(u8_floats(_mm_and_si128(v, m4)), _mm512_set1_ps(ggml_half(blk + 80)));
    sm = _mm512_mul_ps(u8_floats(_mm_and_si128(_mm_srli_epi16(v, 4), m4)), _mm512_set1_ps(ggml_half(blk + 82)));
  }
};
struct DecQ2_K : KDec<84, ScalesQ2_K> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const int j = int(c & 7), n = j >> 2, s = j & 3;
    __m128i lo, hi;
    crumbs(blk + 16 + 32 * n, s, lo, hi);
    __m512 d, m;
    scales(c, 2 * j, d, 2 * j, m);
    a = _mm512_sub_ps(_mm512_mul_ps(u8_floats(lo), d), m);
    scales(c, 2 * j + 1, d, 2 * j + 1, m);
    b = _mm512_sub_ps(_mm512_mul_ps(u8_floats(hi), d), m);
  }
};

// Q3_K: sd lane i = d * (scale i - 32).
struct ScalesQ3_K {
  static void of(const uint8_t* blk, __m512& sd, __m512& sm) {
    sd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales_k3(blk + 96))), _mm512_set1_ps(ggml_half(blk + 108)));
    sm = sd;
  }
};
struct DecQ3_K : KDec<110, ScalesQ3_K> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const int j = int(c & 7), n = j >> 2, s = j & 3;
    __m128i lo, hi;
    crumbs(blk + 32 + 32 * n, s, lo, hi);
    // The high bit set adds 4 (the offset -4 below): its bit 4n + s of hmask.
    const __m128i bit = _mm_set1_epi8(char(1 << (4 * n + s))), four = _mm_set1_epi8(4);
    lo = _mm_mask_add_epi8(lo, _mm_test_epi8_mask(load16(blk), bit), lo, four);
    hi = _mm_mask_add_epi8(hi, _mm_test_epi8_mask(load16(blk + 16), bit), hi, four);
    const __m512 off = _mm512_set1_ps(4.0f);
    __m512 da, db;
    scales(c, 2 * j, da, 2 * j + 1, db);  // sm = sd: the second scale from it
    a = _mm512_mul_ps(_mm512_sub_ps(u8_floats(lo), off), da);
    b = _mm512_mul_ps(_mm512_sub_ps(u8_floats(hi), off), db);
  }
};

// The nibbles of sub-block j (low for even j, high for odd) of 32 bytes q.
inline void nibbles(const uint8_t* q, int j, __m128i& lo, __m128i& hi) {
  const __m128i n = _mm_cvtsi32_si128(4 * (j & 1)), m = _mm_set1_epi8(0xF);
  lo = _mm_and_si128(_mm_srl_epi16(load16(q), n), m);
  hi = _mm_and_si128(_mm_srl_epi16(load16(q + 16), n), m);
}

// Q4_K, Q5_K: sd lane k4_scale_byte(j) = d * scale j, sm lane k4_min_byte(j) = dmin * min j.
struct ScalesK4 {
  static void of(const uint8_t* blk, __m512& sd, __m512& sm) {
    const __m512 v = u8_floats(scales_mins_k4(blk + 4));
    sd = _mm512_mul_ps(v, _mm512_set1_ps(ggml_half(blk)));
    sm = _mm512_mul_ps(v, _mm512_set1_ps(ggml_half(blk + 2)));
  }
};

struct DecQ4_K : KDec<144, ScalesK4> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const int j = int(c & 7);
    __m512 d, m;
    scales(c, k4_scale_byte(j), d, k4_min_byte(j), m);
    // d sc q - dmin m for q = 0..15, indexed by the nibbles (vpermps reads an index's low 4 bits).
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 t = _mm512_sub_ps(_mm512_mul_ps(table, d), m);
    const __m128i n = _mm_cvtsi32_si128(4 * (j & 1));
    const uint8_t* q = blk + 16 + 32 * (j >> 1);
    a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srl_epi16(load16(q), n)), t);
    b = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srl_epi16(load16(q + 16), n)), t);
  }
};

struct DecQ5_K : KDec<176, ScalesK4> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const int j = int(c & 7);
    __m512 d, m;
    scales(c, k4_scale_byte(j), d, k4_min_byte(j), m);
    __m128i lo, hi;
    nibbles(blk + 48 + 32 * (j >> 1), j, lo, hi);
    const __m128i bit = _mm_set1_epi8(char(1 << j)), sixteen = _mm_set1_epi8(16);
    lo = _mm_mask_add_epi8(lo, _mm_test_epi8_mask(load16(blk + 16), bit), lo, sixteen);
    hi = _mm_mask_add_epi8(hi, _mm_test_epi8_mask(load16(blk + 32), bit), hi, sixteen);
    a = _mm512_sub_ps(_mm512_mul_ps(u8_floats(lo), d), m);
    b = _mm512_sub_ps(_mm512_mul_ps(u8_floats(hi), d), m);
  }
};

// Q6_K: sd lane i = d * scale i (16 columns each).
struct ScalesQ6_K {
  static void of(const uint8_t* blk, __m512& sd, __m512& sm) {
    sd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(blk + 192))), _mm512_set1_ps(ggml_half(blk + 208)));
    sm = sd;
  }
};
struct DecQ6_K : KDec<210, ScalesQ6_K> {
  void decode(int64_t c, __m512& a, __m512& b) const {
    const uint8_t* blk = block(c);
    const int j = int(c & 7), n = j >> 2, m = j & 3;
    const uint8_t* ql = blk + 64 * n + 32 * (m & 1);
    const uint8_t* qh = blk + 128 + 32 * n;
    const __m128i ns = _mm_cvtsi32_si128(4 * (m >> 1)), hs = _mm_cvtsi32_si128(2 * m);
    const __m128i m4 = _mm_set1_epi8(0xF), m2 = _mm_set1_epi8(3);
    auto codes = [&](int o) {
      const __m128i low = _mm_and_si128(_mm_srl_epi16(load16(ql + o), ns), m4);
      const __m128i high = _mm_and_si128(_mm_srl_epi16(load16(qh + o), hs), m2);
      return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
    };
    // Chunk j's halves take scales 2j and 2j + 1 (8n + 2m + l / 16).
    __m512 da, db;
    scales(c, 2 * j, da, 2 * j + 1, db);
    a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes(0))), da);
    b = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes(16))), db);
  }
};

}  // namespace

}  // namespace mla::cpu::avx512
