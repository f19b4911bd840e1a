// INT8_GROUP weights (tensor/matrix.h): an int8 q per weight (value q x scale) and a bf16 scale
// per group; INT8_WORDS16, the same codes biased to unsigned (q + 128) in blocks of 16 rows
// (formats/int_group/repack.cpp), which only the VNNI kernels read in place
// (formats/int_group/vnni_gemv.h, vnni_gemm.h).
// Decoder (DecInt8): natural order (Layout::Natural), each byte sign-extended and converted, times
// the chunk's scale. INT8 has no bf16 decoder: its float32 kernel (sign-extend, convert, FMA)
// streams faster than a conversion on to bf16 before VDPBF16PS could (gemv_kernel, dispatch.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/element.h"
#include "backend/cpu/formats/int_group/scales.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// One weight, as MatrixView::dequant_row computes it.
inline float int8_element(const MatrixView& W, int64_t r, int64_t k) {
  return float(stored<int8_t>(W, r, k)) * group_scale(W, r, k);
}
inline float int8_words16_element(const MatrixView& W, int64_t r, int64_t k) {
  const uint8_t b = static_cast<const uint8_t*>(W.data)[4 * int8_words16_word(r, k, W.cols) + k % 4];
  return float(int(b) - 128) * words16_group_scale(W, r, k);
}

// The decoders have internal linkage: each kernel file's tile walks over them are its own (as
// one file's were), which lets the compiler specialize them to their callers.
namespace {

// Bytes c*32 .. c*32+31 of an int8 row as float32 (natural order).
inline void int8_floats(const uint8_t* p, __m512& a, __m512& b) {
  a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
}

struct DecInt8 {
  static constexpr bool kGroupScales = true;  // scale: the row's group_chunk_scales
  const uint8_t* row;
  const float* scale;  // per chunk, float32
  void prefetch(int64_t c) const {
    if ((c & 1) == 0) prefetch_at(row, c * kChunk);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    int8_floats(row + c * kChunk, a, b);
    const __m512 s = _mm512_set1_ps(scale[c]);
    a = _mm512_mul_ps(a, s);
    b = _mm512_mul_ps(b, s);
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return int8_element(W, r, k); }
};

}  // namespace

}  // namespace mla::cpu::avx512
