// INT4_GROUP weights (tensor/matrix.h): int32 words of 8 nibbles (q + 8), low nibble first, and
// a bf16 scale per group; INT4_WORDS16, the same words rewritten at load in blocks of 16 rows
// (formats/int_group/repack.cpp). Row-major decoders:
//   float32 (DecInt4): a = even columns, b = odd (Layout::EvenOdd): each byte's low / high
//     nibble, zero-extended to a lane, indexes a 16-entry table of (q - 8) * scale (vpermps)
//   bf16 (BfDecInt4): a = low nibbles (even columns), b = high nibbles (odd columns) of the 32
//     bytes (Layout64::EvenOdd), zero-extended to words, through a 32-word table of bf16(q - 8)
//     (vpermw reads 5 bits: the table repeats, so the next nibble's low bit does not matter).
//     Lanes 0..7 hold columns 0..31 (group of chunk 2s), lanes 8..15 columns 32..63 (chunk
//     2s + 1).
// INT4_WORDS16's GEMVs read the blocks in place (formats/int4/kernels.cpp; Layout64::Words16 on bf16
// activations, VPDPBUSD on int8 ones: formats/int_group/vnni_gemv.h).
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
// The code q - 8 of column k from the word that holds it.
inline float int4_code(uint32_t w, int64_t k) { return float(int((w >> (4 * (k % 8))) & 0xF) - 8); }
inline float int4_element(const MatrixView& W, int64_t r, int64_t k) {
  return int4_code(stored<uint32_t>(W, r, k / 8), k) * group_scale(W, r, k);
}
inline float int4_words16_element(const MatrixView& W, int64_t r, int64_t k) {
  return int4_code(static_cast<const uint32_t*>(W.data)[words16_word(r, k, W.cols)], k) * words16_group_scale(W, r, k);
}

// The decoders have internal linkage: each kernel file's tile walks over them are its own (as
// one file's were), which lets the compiler specialize them to their callers.
namespace {

struct DecInt4 {
  static constexpr bool kGroupScales = true;  // scale: the row's group_chunk_scales
  const uint8_t* row;
  const float* scale;  // per chunk, float32
  void prefetch(int64_t c) const {
    if ((c & 3) == 0) prefetch_at(row, c * 16);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    // Byte i holds columns 2i (low nibble) and 2i+1 (high nibble). vpermps reads the low 4 bits
    // of each index: byte i zero-extended gives the low nibble; the 16-bit shift by 4 (a 128-bit
    // op, which leaves the 512-bit ports to the rest) brings each byte's high nibble down.
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * 16));
    const __m512 t = _mm512_mul_ps(table, _mm512_set1_ps(scale[c]));
    a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), t);
    b = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4)), t);
  }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return int4_element(W, r, k); }
};

// bf16 bits of the integers -8..7, repeated: entry i is bf16((i & 15) - 8).
constexpr uint16_t bf16_of_small_int(int q) {
  if (q == 0) return 0;
  const uint16_t sign = q < 0 ? 0x8000 : 0;
  int a = q < 0 ? -q : q, e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return uint16_t(sign | (127 + e) << 7 | ((a << (7 - e)) & 0x7f));
}

// vpermw's table of INT4 codes: word i holds bf16((i & 15) - 8), the code of i's low nibble
// (vpermw reads an index's low 5 bits: bit 4 may hold anything).
alignas(64) inline constexpr uint16_t kInt4Bf16[32] = {
#define MLA_Q(i) bf16_of_small_int(((i) & 15) - 8)
    MLA_Q(0),  MLA_Q(1),  MLA_Q(2),  MLA_Q(3),  MLA_Q(4),  MLA_Q(5),  MLA_Q(6),  MLA_Q(7),
    MLA_Q(8),  MLA_Q(9),  MLA_Q(10), MLA_Q(11), MLA_Q(12), MLA_Q(13), MLA_Q(14), MLA_Q(15),
    MLA_Q(16), MLA_Q(17), MLA_Q(18), MLA_Q(19), MLA_Q(20), MLA_Q(21), MLA_Q(22), MLA_Q(23),
    MLA_Q(24), MLA_Q(25), MLA_Q(26), MLA_Q(27), MLA_Q(28), MLA_Q(29), MLA_Q(30), MLA_Q(31)};
#undef MLA_Q

struct BfDecInt4 {
  static constexpr int kStepsPerScale = 1;
  static constexpr bool kGroupScales = true, kSubnormals = false;
  const uint8_t* row;
  const float* scales;  // per chunk of 32 columns, float32, readable 16 past the last chunk
  void prefetch(int64_t s) const {
    if ((s & 1) == 0) prefetch_at(row, s * 32);
  }
  uint64_t decode(int64_t s, __m512i& a, __m512i& b) const {
    const __m512i table = _mm512_load_si512(kInt4Bf16);
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + s * 32)));
    a = _mm512_permutexvar_epi16(v, table);
    b = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table);
    return 0;
  }
  __m512 scale(int64_t s) const { return chunk_pair_scale(scales, s); }
  // The scalar reference, for the columns past the last full chunk.
  static float element(const MatrixView& W, int64_t r, int64_t k) { return int4_element(W, r, k); }
};

}  // namespace

}  // namespace mla::cpu::avx512
