// FP8_BLOCK128 weights (tensor/matrix.h): e4m3 codes, a byte a weight, and a float32 scale per
// block of 128 x 128 weights of the whole tensor. Decoders:
//   float32 (DecFP8): sign-extended byte << 20, masked: the e4m3 bits as a float32, 2^-120 times
//     the value (block scales are applied by the caller); natural order (Layout::Natural)
//   bf16 (BfDecFP8): a = per 128-bit lane L, columns 16L..16L+7, b = 16L+8..16L+15 (unpacklo /
//     unpackhi of bytes into words; Layout64::Fp8Unpack). Word = the e4m3 bits S EEEE MMM placed
//     as bf16 bits S 0000EEEE MMM0000 (the same as the byte in a word's high half,
//     arithmetic-shifted right by 4, masked with 0x87f0): a bf16 2^-120 times the value. Two
//     GF2P8AFFINEQB build the words' high bytes (S0000EEE) and low bytes (EMMM0000) of all 64
//     bytes at once, unpack interleaves them. Exponent-0 codes come out as bf16 denormals, which
//     VDPBF16PS reads as zero: decode() reports them (a mask of the step's bytes) so that the
//     caller adds the subnormals' products itself.
// The kernels scale the activations by 2^64 and the sums by 2^56 to undo the 2^-120, keeping
// both far from float32's range limits.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/element.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// The float32 GEMV (formats/fp8_block128/kernels.cpp): the activations times a row block's scales
// and 2^64, the sums times 2^56 (2^64 * 2^56 = 2^120).
constexpr float kFp8XScale = 18446744073709551616.0f;  // 2^64
constexpr float kFp8YScale = 72057594037927936.0f;     // 2^56
// The bf16 kernels (VDPBF16PS, AMX tiles): the activations times 2^64 before rounding, the sums
// times 2^56, the subnormals' sums (BfDecFP8::subnormal_products) times 2^-64.
constexpr float kFp8FastXScale = 18446744073709551616.0f;       // 2^64
constexpr float kFp8FastPost = 72057594037927936.0f;            // 2^56
constexpr float kFp8FastFix = 1.0f / 18446744073709551616.0f;  // 2^-64

// One weight, as MatrixView::dequant_row computes it.
inline float fp8_element(const MatrixView& W, int64_t r, int64_t k) {
  return fp8e4m3_to_f32(stored<uint8_t>(W, r, k)) *
         static_cast<const float*>(W.scales)[((W.row0 + r) / 128) * W.scale_cols + k / 128];
}

// The decoders have internal linkage: each kernel file's tile walks over them are its own (as
// one file's were), which lets the compiler specialize them to their callers.
namespace {

inline __m512 fp8_bits(__m512i sx) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(sx, 20), _mm512_set1_epi32(int(0x87f00000u))));
}

struct DecFP8 {
  static constexpr bool kGroupScales = false;  // block scales: applied by the caller
  const uint8_t* row;
  void prefetch(int64_t c) const {
    if ((c & 1) == 0) prefetch_at(row, c * kChunk);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = fp8_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * kChunk))));
    b = fp8_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * kChunk + 16))));
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return fp8_element(W, r, k); }
};

struct BfDecFP8 {
  static constexpr int kStepsPerScale = 2;  // one block scale per 128 columns
  static constexpr bool kGroupScales = false, kSubnormals = true;
  static constexpr float kFixScale = kFp8FastFix;  // subnormal_products' sums, as the kernels hold x
  const uint8_t* row;
  const float* scales;  // the row block's scales, one per 128 columns
  void prefetch(int64_t s) const { prefetch_at(row, s * kStep); }
  // Bit matrices of GF2P8AFFINEQB: output bit i is the parity of (byte 7 - i of the matrix) & x.
  static constexpr uint64_t gf_matrix(const int (&src)[8]) {  // src[i]: input bit to output bit i, or -1
    uint64_t m = 0;
    for (int i = 0; i < 8; ++i)
      if (src[i] >= 0) m |= uint64_t(1u << src[i]) << (8 * (7 - i));
    return m;
  }
  static constexpr int kHigh[8] = {4, 5, 6, -1, -1, -1, -1, 7};  // S0000EEE: E3..E1, sign
  static constexpr int kLow[8] = {-1, -1, -1, -1, 0, 1, 2, 3};   // EMMM0000: E0, mantissa
  // The words of 64 codes (a, b), and the codes with exponent field 0 (zero and the
  // subnormals, which need fixing up).
  static uint64_t words(__m512i raw, __m512i& a, __m512i& b) {
    const __m512i hi = _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(int64_t(gf_matrix(kHigh))), 0);
    const __m512i lo = _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(int64_t(gf_matrix(kLow))), 0);
    a = _mm512_unpacklo_epi8(lo, hi);
    b = _mm512_unpackhi_epi8(lo, hi);
    return _mm512_testn_epi8_mask(raw, _mm512_set1_epi8(0x78));
  }
  // Calls add(w, v) for each subnormal code among a step's 64 bytes (mask: the codes of
  // exponent field 0, as words() reports them; zeros are skipped): v = its value times scale,
  // w = the word (0..63: a, then b) that holds it.
  template <class Add>
  static void subnormals(const uint8_t* bytes, uint64_t mask, float scale, Add&& add) {
    while (mask) {
      const int i = __builtin_ctzll(mask);
      mask &= mask - 1;
      const int m = bytes[i] & 7;
      if (m == 0) continue;
      add(((i >> 3) & 1) * 32 + (i >> 4) * 8 + (i & 7), float(bytes[i] & 0x80 ? -m : m) * (1.0f / 512.0f) * scale);
    }
  }
  uint64_t decode(int64_t s, __m512i& a, __m512i& b) const {
    return words(_mm512_loadu_si512(row + s * kStep), a, b);
  }
  __m512 scale(int64_t s) const { return _mm512_set1_ps(scales[s / kStepsPerScale]); }
  // The products of the subnormal codes among a step's 64 bytes (mask: exponent field 0), which
  // VDPBF16PS reads as zero: fix[t] += code * scale * x, x as the kernel holds it (times 2^64).
  // Rare in trained weights (values under 2^-6 of the format's 448).
  template <int TT>
  [[gnu::noinline, gnu::cold]] static void subnormal_products(const uint8_t* bytes, uint64_t mask, const uint16_t* xs,
                                                              int64_t ldxp, float scale, float* fix) {
    subnormals(bytes, mask, scale, [&](int w, float v) {
      for (int t = 0; t < TT; ++t) fix[t] += v * bf16_to_f32(xs[t * ldxp + w]);
    });
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return fp8_element(W, r, k); }
};

}  // namespace

}  // namespace mla::cpu::avx512
