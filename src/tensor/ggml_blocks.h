// llama.cpp's block formats (ggml's Q4_0 .. Q8_0 and the K-quants Q2_K .. Q6_K) as GGUF files
// store them: each row of a weight matrix is cols / block_values blocks of block_bytes bytes,
// every block carrying its own scales. The layouts are ggml's (ggml-common.h's block_q4_0 ...
// block_q6_K); the scalar dequantizers here are the reference the kernels
// (backend/cpu/formats/ggml/) are tested against, and are themselves checked bit for bit against
// llama.cpp's gguf-py (tests/tensor/test_ggml_blocks.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/matrix.h"

namespace mla {

struct GgmlBlock {
  int64_t values;  // weights per block: 32, or 256 for the K-quants
  size_t bytes;    // bytes per block
};

// The block shape of a ggml block format (WeightFormat::Q4_0 .. Q6_K); {0, 0} for other formats.
GgmlBlock ggml_block(WeightFormat f);
inline bool is_ggml_block(WeightFormat f) { return ggml_block(f).values > 0; }

// Dequantizes n weights (a whole number of blocks) stored at `blocks` in format f to out[0, n),
// exactly as ggml's dequantize_row_<type> does (the f16 scales converted exactly, products in
// float32 in ggml's order).
void ggml_dequantize(WeightFormat f, const void* blocks, int64_t n, float* out);

}  // namespace mla
