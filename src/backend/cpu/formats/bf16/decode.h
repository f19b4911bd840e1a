// BF16 weights (tensor/matrix.h), and BF16_PAIRS32, the same values rewritten at load in blocks
// of 32 rows as column pairs (formats/bf16/repack.cpp). Row-major decoders:
//   float32 (DecBF16): a = even columns (word << 16), b = odd columns (word & 0xffff0000)
//     (Layout::EvenOdd)
//   bf16 (BfDecBF16): natural order (a = columns 0..31, b = 32..63), no conversion
//     (Layout64::Natural)
// BF16_PAIRS32 has no row decoder: its GEMVs and GEMMs walk the blocks (formats/bf16/kernels.cpp,
// dpbf16_gemm.h, fma_gemm.h), and a row as bf16 is gathered from its block.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/element.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// One weight, as MatrixView::dequant_row computes it.
inline float bf16_element(const MatrixView& W, int64_t r, int64_t k) { return bf16_to_f32(stored<uint16_t>(W, r, k)); }
inline float pairs32_element(const MatrixView& W, int64_t r, int64_t k) {
  return bf16_to_f32(static_cast<const uint16_t*>(W.data)[pairs32_word(r, k, W.cols)]);
}

// The decoders have internal linkage: each kernel file's tile walks over them are its own (as
// one file's were), which lets the compiler specialize them to their callers.
namespace {

struct DecBF16 {
  static constexpr bool kGroupScales = false;  // the kernels hand it no scales
  const uint16_t* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 2); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    __m512i v = _mm512_loadu_si512(row + c * kChunk);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return bf16_element(W, r, k); }
};

struct BfDecBF16 {
  static constexpr int kStepsPerScale = 0;  // no scale
  static constexpr bool kGroupScales = false, kSubnormals = false;
  const uint16_t* row;
  void prefetch(int64_t s) const { prefetch_at(row, s * kStep * 2), prefetch_at(row, s * kStep * 2 + 64); }
  uint64_t decode(int64_t s, __m512i& a, __m512i& b) const {
    a = _mm512_loadu_si512(row + s * kStep);
    b = _mm512_loadu_si512(row + s * kStep + 32);
    return 0;
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return bf16_element(W, r, k); }
};

}  // namespace

}  // namespace mla::cpu::avx512
