// A row of a WORDS16 matrix (INT4_WORDS16, INT8_WORDS16) as bf16 for the prompt's bf16 GEMMs
// (the VNNI GEMM reads the blocks in place; this is the bf16 GEMMs' way in): the row's words
// gathered from its block (INT8: unbiased again), then decoded as the row-major format's are.
// Internal to src/backend/cpu.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/int_group/scales.h"
#include "backend/cpu/formats/rows_bf16.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// Dec: the row-major format's float32 decoder (DecInt4, DecInt8); Codes: codes per 32-bit word
// (8, 4); bias: what the words hold added to each code's byte (INT8_WORDS16: 0x80808080).
// Row n's words_per_row words gathered from its block of 16 rows, each XORed with bias, into
// this thread's buffer (valid until its next call).
inline const uint32_t* words16_row_words(const MatrixView& W, int64_t n, int64_t words_per_row, uint32_t bias) {
  thread_local std::vector<uint32_t> words;
  words.resize(size_t(words_per_row));
  const uint32_t* block = static_cast<const uint32_t*>(W.data) + (n / 16) * 16 * words_per_row;
  for (int64_t d = 0; d < words_per_row; ++d) words[size_t(d)] = block[d * 16 + n % 16] ^ bias;
  return words.data();
}

template <class Dec, int Codes>
void words16_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales, uint32_t bias) {
  const int64_t K = W.cols, Kc = K / kChunk;
  const uint32_t* words = words16_row_words(W, n, K / Codes, bias);
  group_chunk_scales(W, n, Kc, scales);
  decoded_row_bf16(Dec{reinterpret_cast<const uint8_t*>(words), scales}, Kc, out);
}

}  // namespace mla::cpu::avx512
