// What the formats' row_bf16 kernels (formats/registry.h) share: a weight row's chunks of 32
// columns through a float32 decoder (formats/<format>/decode.h) into bf16 for the prompt's GEMMs,
// columns in the decoder's lane order. The rows come from memory (a prompt's experts, read once):
// the decoder's prefetch runs ahead as in the GEMV kernels. Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/element.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// a and b (the chunk's two halves, lane order) as 32 bf16 at dst, rounded to nearest even.
inline void store_bf16x32(uint16_t* dst, __m512 a, __m512 b) {
  _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

// Chunks [0, Kc) of dec's row as bf16 into out.
template <class Dec>
inline void decoded_row_bf16(const Dec& dec, int64_t Kc, uint16_t* out) {
  const __m512 s = _mm512_set1_ps(1.0f);
  for (int64_t c = 0; c < Kc; ++c) {
    dec.prefetch(c);
    __m512 a, b;
    dec.decode(c, a, b);
    store_bf16x32(out + c * kChunk, _mm512_mul_ps(a, s), _mm512_mul_ps(b, s));
  }
}

}  // namespace mla::cpu::avx512
