// A non-owning view of a weight matrix as the checkpoint stores it, [rows = out, cols = in],
// used as y = W x. Weights stay in their stored format (BF16, F16, F32, block-FP8 with 128x128
// scales, INT4 or INT8 groups) and are dequantized on the fly, a row at a time, by the kernels.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "tensor/dtype.h"

namespace mla {

enum class WeightFormat {
  F32,
  BF16,
  F16,
  FP8_BLOCK128,  // e4m3 values; scales float32 [ceil(rows/128), ceil(cols/128)] of the whole tensor
  INT4_GROUP,    // int32 words of 8 nibbles (q + 8), low nibble first; scales bf16 [rows, cols/group]
  INT8_GROUP,    // int8 q per weight (value q x scale); scales bf16 [rows, cols/group]
  // bf16 in blocks of 32 rows (rows and cols multiples of 32), each block as column pairs: the
  // dword (W[r, 2p], W[r, 2p + 1]) of the block's row r at word p * 32 + r. The order the
  // VDPBF16PS and FMA prompt GEMMs compute in, so they read the weights where they lie;
  // repack_pairs32 (backend/cpu/repack.h) converts BF16 experts to it at load.
  BF16_PAIRS32,
  // INT4 groups in blocks of 16 rows (rows a multiple of 16, columns of 32, groups of 32): word
  // d of INT4_GROUP's row r of a block (8 nibbles, columns 8d .. 8d + 7) at word d * 16 + r,
  // and the bf16 scale of group g at g * 16 + r of the block's scales. One zmm then holds 16
  // rows' 8 columns: the order the VNNI GEMM multiplies in (vnni_gemm.h), so it reads the
  // blocks in place; repack_words16 (backend/cpu/repack.h) converts INT4 experts at load.
  INT4_WORDS16,
  // INT8 groups in blocks of 16 rows (the same conditions): dword d of INT8_GROUP's row r of a
  // block (columns 4d .. 4d + 3), each code biased to unsigned (q + 128), at word d * 16 + r,
  // and the scales as INT4_WORDS16's. One zmm holds 16 rows' 4 columns, VPDPBUSD's unsigned
  // operand as the VNNI GEMM and GEMV multiply it (vnni_gemm.h, gemv.cpp); repack_words16
  // converts INT8 weights at load.
  INT8_WORDS16,
  // llama.cpp's block formats as a GGUF file stores them (tensor/ggml_blocks.h): each row is
  // cols / 32 blocks (cols / 256 for the K-quants), each block carrying its own scales.
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
};

// The bf16 word of weight (r, k) in a BF16_PAIRS32 matrix of `cols` columns, counted from its data.
inline int64_t pairs32_word(int64_t r, int64_t k, int64_t cols) {
  return (r / 32) * 32 * cols + ((k / 2) * 32 + r % 32) * 2 + k % 2;
}

// The word holding weight (r, k) of an INT4_WORDS16 matrix of `cols` columns, counted from its
// data (nibble k % 8 of it), and the index of its scale among the view's scales (row0 + r: the
// row within the whole tensor, groups of `group_size` columns, `scale_cols` of them).
inline int64_t words16_word(int64_t r, int64_t k, int64_t cols) { return (r / 16) * 2 * cols + (k / 8) * 16 + r % 16; }
// The dword holding weight (r, k) of an INT8_WORDS16 matrix (byte k % 4 of it).
inline int64_t int8_words16_word(int64_t r, int64_t k, int64_t cols) {
  return (r / 16) * 4 * cols + (k / 4) * 16 + r % 16;
}
inline int64_t words16_scale(int64_t r, int64_t g, int64_t scale_cols) {
  return (r / 16) * 16 * scale_cols + g * 16 + r % 16;
}

// The formats of integer groups with one bf16 scale per group of a row (INT4, INT8).
inline bool is_int_group(WeightFormat f) {
  return f == WeightFormat::INT4_GROUP || f == WeightFormat::INT8_GROUP || f == WeightFormat::INT4_WORDS16 ||
         f == WeightFormat::INT8_WORDS16;
}
// The formats stored in blocks of 16 rows (INT4_WORDS16, INT8_WORDS16).
inline bool is_words16(WeightFormat f) { return f == WeightFormat::INT4_WORDS16 || f == WeightFormat::INT8_WORDS16; }

const char* weight_format_name(WeightFormat f);

struct MatrixView {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;    // row r starts at data + r * row_bytes() (BF16_PAIRS32: rows 32b.. at 32b * row_bytes())
  const void* scales = nullptr;  // FP8_BLOCK128: f32 block scales; INT4/INT8_GROUP: bf16 group scales (ggml blocks: none)
  int64_t row0 = 0;              // first row within the whole stored tensor (for FP8 block scales)
  int64_t scale_cols = 0;        // FP8: ceil(cols/128); INT4, INT8: cols / group_size
  int64_t group_size = 0;        // INT4 and INT8 only

  size_t row_bytes() const;
  size_t bytes() const { return row_bytes() * size_t(rows); }  // weight bytes, scales not counted
  size_t scale_bytes() const;
  // Writes row r (0-based within this view) as float32 to out[0..cols).
  void dequant_row(int64_t r, float* out) const;
  // Rows [first, first + count); BF16_PAIRS32 only in whole blocks of 32, the WORDS16 formats of 16
  // (else out_of_range).
  MatrixView slice_rows(int64_t first, int64_t count) const;
};

// a's rows then b's as one view, when b's rows follow a's directly in memory (a checkpoint
// stores gate_proj then up_proj: one product instead of two). Formats without scales only, and
// BF16_PAIRS32 (whose a ends on a whole block)
// (FP8, INT4 and INT8 keep their scales beside each tensor); otherwise nullopt.
std::optional<MatrixView> concat_rows(const MatrixView& a, const MatrixView& b);

}  // namespace mla
