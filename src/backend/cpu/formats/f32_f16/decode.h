// F32 and F16 weights (tensor/matrix.h): rows of float32 or IEEE half values, natural column
// order in every decoder (Layout::Natural). No scales. Their products keep the float32 kernels in
// both precisions; the prompt's bf16 GEMMs round them to bf16 first (formats/gemm.h).
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
inline float f32_element(const MatrixView& W, int64_t r, int64_t k) { return stored<float>(W, r, k); }
inline float f16_element(const MatrixView& W, int64_t r, int64_t k) { return f16_to_f32(stored<uint16_t>(W, r, k)); }

// The decoders have internal linkage: each kernel file's tile walks over them are its own (as
// one file's were), which lets the compiler specialize them to their callers.
namespace {

struct DecF32 {
  static constexpr bool kGroupScales = false;  // the kernels hand it no scales
  const float* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 4), prefetch_at(row, c * kChunk * 4 + 64); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = _mm512_loadu_ps(row + c * kChunk);
    b = _mm512_loadu_ps(row + c * kChunk + 16);
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return f32_element(W, r, k); }
};

struct DecF16 {
  static constexpr bool kGroupScales = false;  // the kernels hand it no scales
  const uint16_t* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 2); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kChunk)));
    b = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kChunk + 16)));
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return f16_element(W, r, k); }
};

}  // namespace

}  // namespace mla::cpu::avx512
