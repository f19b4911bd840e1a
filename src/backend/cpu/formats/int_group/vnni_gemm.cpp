// INT4 / INT8 group weights x int8 activations on AVX-512 VNNI (see vnni_gemm.h).
#include "backend/cpu/formats/int_group/vnni_gemm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/formats/int_group/scales.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/common/transpose_avx512.h"

namespace mla::cpu {

namespace {

constexpr int kRows = 16;    // weight rows per block: the lanes of one zmm
constexpr int kTokens = 12;  // most tokens per register block: 12 integer and 12 float32 sums

// One row's biased codes of 64 columns (or 32 where `half`) as 64 bytes in the packed order.
inline __m512i row_codes(const MatrixView& W, const uint8_t* row, int64_t k0, bool half) {
  if (W.format == WeightFormat::INT8_GROUP) {
    const __m512i bias = _mm512_set1_epi8(char(0x80));
    const __m512i v = half ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k0)))
                           : _mm512_loadu_si512(row + k0);
    return _mm512_xor_si512(v, bias);
  }
  // INT4: byte i of a chunk's 16 holds columns 2i (low nibble) and 2i + 1 (high): per chunk the
  // 16 low nibbles, then the 16 high ones (Layout::EvenOdd).
  const __m256i nib = _mm256_set1_epi8(0x0f);
  if (half) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0 / 2));
    const __m128i lo = _mm_and_si128(v, _mm256_castsi256_si128(nib));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm256_castsi256_si128(nib));
    return _mm512_inserti32x4(_mm512_zextsi128_si512(lo), hi, 1);
  }
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k0 / 2));
  const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
  // 128-bit lanes (lo c, lo c+1, hi c, hi c+1) into (lo c, hi c, lo c+1, hi c+1).
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

// A block of 16 rows as vnni_pack_rows16 leaves it: chunk c's 8 code vectors and its scales.
struct PackedBlock {
  const uint32_t* p;
  const float* ws;
  [[gnu::always_inline]] __m512i code(int64_t c, int j) const { return _mm512_load_si512(p + (c * 8 + j) * kRows); }
  [[gnu::always_inline]] __m512 scale(int64_t c) const { return _mm512_load_ps(ws + c * kRows); }
};

// y[t, 0..15] for T tokens over the block; rows past `rows` not stored.
template <int T, class Block>
void micro(const Block blk, const int8_t* q, int64_t ldq, const float* qs, const int32_t* qc, int64_t lds, int64_t K,
           int rows, float* y, int64_t ldy) {
  __m512 f[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) f[t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 32; ++c) {
    __m512i acc[T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) acc[t] = _mm512_set1_epi32(qc[t * lds + c]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w = blk.code(c, j);
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) {
        // The activations' 4 bytes as the instruction's broadcast memory operand: GCC 12 emits
        // the intrinsic with a separate VPBROADCASTD per product.
        const void* a = q + t * ldq + c * 32 + 4 * j;
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc[t]) : "v"(w), "m"(*static_cast<const int32_t*>(a)));
      }
    }
    const __m512 s = blk.scale(c);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t)
      f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(s, _mm512_set1_ps(qs[t * lds + c])), f[t]);
  }
  const __mmask16 m = __mmask16((1u << rows) - 1);
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, m, f[t]);
}

// The same for two blocks of 16 rows (32 rows) and up to kPairTokens tokens: each token's 4
// activation bytes broadcast once into a register and multiplied into both blocks' sums, so a
// VPDPBUSD takes half a load instead of one (the 16-row kernel's broadcast memory operand). y's
// rows 0..15 from b0, 16..31 from b1.
constexpr int kPairTokens = 6;  // 12 integer and 12 float32 sums, 2 code vectors, a broadcast
template <int T, class Block>
void micro_pair(const Block b0, const Block b1, const int8_t* q, int64_t ldq, const float* qs, const int32_t* qc,
                int64_t lds, int64_t K, float* y, int64_t ldy) {
  __m512 f0[T], f1[T];
#pragma GCC unroll 6
  for (int t = 0; t < T; ++t) f0[t] = f1[t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 32; ++c) {
    __m512i a0[T], a1[T];
#pragma GCC unroll 6
    for (int t = 0; t < T; ++t) a0[t] = a1[t] = _mm512_set1_epi32(qc[t * lds + c]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w0 = b0.code(c, j), w1 = b1.code(c, j);
#pragma GCC unroll 6
      for (int t = 0; t < T; ++t) {
        int32_t x4;
        std::memcpy(&x4, q + t * ldq + c * 32 + 4 * j, 4);
        const __m512i x = _mm512_set1_epi32(x4);
        a0[t] = _mm512_dpbusd_epi32(a0[t], w0, x);
        a1[t] = _mm512_dpbusd_epi32(a1[t], w1, x);
      }
    }
    const __m512 s0 = b0.scale(c), s1 = b1.scale(c);
#pragma GCC unroll 6
    for (int t = 0; t < T; ++t) {
      const __m512 xs = _mm512_set1_ps(qs[t * lds + c]);
      f0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[t]), _mm512_mul_ps(s0, xs), f0[t]);
      f1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[t]), _mm512_mul_ps(s1, xs), f1[t]);
    }
  }
#pragma GCC unroll 6
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(y + t * ldy, f0[t]);
    _mm512_storeu_ps(y + t * ldy + 16, f1[t]);
  }
}

template <class Block>
void gemm_block(const Block& blk, const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t K,
                int64_t ldq, int64_t lds, int64_t rows, float* y, int64_t ldy) {
  for_each_token_group<kTokens>(M, [&](auto n, int64_t t0) {
    micro<decltype(n)::value>(blk, q + t0 * ldq, ldq, qs + t0 * lds, qc + t0 * lds, lds, K, int(rows), y + t0 * ldy,
                              ldy);
  });
}

// One block of 16 rows (b0; rows 16) or two side by side (b0, b1; rows 32) of a WORDS16 format,
// where they lie.
template <class Block>
void blocks_words16(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t ldq, int64_t lds,
                    int64_t K, const Block b0, const Block b1, int64_t rows, float* y, int64_t ldy) {
  if (rows == kRows) {
    gemm_block(b0, q, qs, qc, M, K, ldq, lds, kRows, y, ldy);
    return;
  }
  for_each_token_group<kPairTokens>(M, [&](auto n, int64_t t0) {
    micro_pair<decltype(n)::value>(b0, b1, q + t0 * ldq, ldq, qs + t0 * lds, qc + t0 * lds, lds, K, y + t0 * ldy, ldy);
  });
}

}  // namespace

int vnni_weight_bias(WeightFormat f) {
  const int bias = format_kernels(f).vnni_bias;
  if (bias == 0) throw std::invalid_argument(std::string("vnni_weight_bias: ") + weight_format_name(f));
  return bias;
}

void vnni_pack_rows16(const MatrixView& W, int64_t n0, int64_t rows, uint32_t* packed, float* scales) {
  const int64_t K = W.cols, Kc = K / 32;
  const size_t row_bytes = W.row_bytes();
  const uint8_t* base = static_cast<const uint8_t*>(W.data);
  // A missing row repeats the last one (its results are not stored; its scales are zero).
  auto row_of = [&](int i) { return base + size_t(n0 + std::min<int64_t>(i, rows - 1)) * row_bytes; };
  for (int64_t k0 = 0; k0 < K; k0 += 64) {
    const bool half = K - k0 < 64;
    __m512i r[16];
    for (int i = 0; i < kRows; ++i) r[i] = row_codes(W, row_of(i), k0, half);
    transpose16(r);
    for (int j = 0; j < (half ? 8 : 16); ++j) _mm512_store_si512(packed + (k0 / 4 + j) * kRows, r[j]);
  }
  thread_local std::vector<float> s;
  if (s.size() < size_t(Kc)) s.resize(size_t(Kc));
  for (int i = 0; i < kRows; ++i) {
    if (i < rows) avx512::group_chunk_scales(W, n0 + i, Kc, s.data());
    for (int64_t c = 0; c < Kc; ++c) scales[c * kRows + i] = i < rows ? s[size_t(c)] : 0.0f;
  }
}

void vnni_gemm_rows16(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t K, int64_t ldq,
                      int64_t lds, const uint32_t* packed, const float* scales, int64_t rows, float* y, int64_t ldy) {
  gemm_block(PackedBlock{packed, scales}, q, qs, qc, M, K, ldq, lds, rows, y, ldy);
}

void vnni_gemm_rows32(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t K, int64_t ldq,
                      int64_t lds, const uint32_t* packed, const float* scales, float* y, int64_t ldy) {
  const PackedBlock b0{packed, scales}, b1{packed + K / 4 * kRows, scales + K / 32 * kRows};
  for_each_token_group<kPairTokens>(M, [&](auto n, int64_t t0) {
    micro_pair<decltype(n)::value>(b0, b1, q + t0 * ldq, ldq, qs + t0 * lds, qc + t0 * lds, lds, K, y + t0 * ldy, ldy);
  });
}

void vnni_gemm_words16(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t ldq, int64_t lds,
                       const MatrixView& W, int64_t n0, int64_t rows, float* y, int64_t ldy) {
  auto run = [&](auto kind) {
    using Block = decltype(kind);
    const Block b0 = words16_block<Block>(W, n0), b1 = rows == 16 ? b0 : words16_block<Block>(W, n0 + 16);
    blocks_words16(q, qs, qc, M, ldq, lds, W.cols, b0, b1, rows, y, ldy);
  };
  if (W.format == WeightFormat::INT8_WORDS16) run(Int8Words16Block{});
  else run(Words16Block{});
}

}  // namespace mla::cpu
