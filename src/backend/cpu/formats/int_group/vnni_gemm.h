// INT4 / INT8 group weights x int8 activations on AVX-512 VNNI, the fast precision's
// prompt-sized products of those formats on CPUs without AMX (dispatch.h: Kernel::VnniGemm,
// Context::int8_activations). VPDPBUSD multiplies 64 unsigned bytes by 64 signed bytes and adds
// each group of 4 products into one of 16 int32 lanes: 64 multiply-adds an instruction, against
// 16 for a float32 FMA and 32 for VDPBF16PS, at the same rate as VDPBF16PS on AMD Zen 5 (2 a
// cycle: compute_peak.h's loops, about 1024 GOPS and 507 GFLOPS a thread).
//
// The activations are quantized per token and chunk of 32 columns (the weights' group or a
// part of it) to int8 codes q = round(x * 127 / m), m the chunk's largest magnitude, with the
// float32 scale m / 127 (gemm.h: activations_int8), as llama.cpp's Q8_0 activations are: each
// activation moves by at most half a step, m / 254. The weights' codes go in unsigned, biased
// (an INT8 code + 128; an INT4 nibble as stored, the code + 8): the bias times the chunk's sum of
// activation codes is taken off by starting the chunk's integer sum at minus that product.
//
// Per block of 16 weight rows, the codes are first reordered into a per-thread buffer of column
// quads (for each 4 columns, the 16 rows' 4 bytes side by side: one zmm), and the group scales
// into one vector of 16 rows per chunk (the WORDS16 formats lie in that order already, INT4 a chunk's
// nibbles unpacked by an AND and a shift as the kernel loads them). Two blocks (32 rows) then
// run together over token groups of up to 6: per chunk and token, each column quad's 4
// activation bytes broadcast into a register once for both blocks' VPDPBUSD (16 a chunk), then
// per block a conversion, a scale product and an FMA into the float32 sum (bench/matmul, 48 tokens through 2816 x 2048 INT4 experts on 2
// threads of the AMD Zen 5 VM: 0.59-0.60 of the VPDPBUSD peak, against 0.49 for one block over
// up to 12 tokens with the activations as the instruction's broadcast memory operand, which a
// last block of 16 rows or fewer still takes). The integer sums are exact (at most
// 32 x 255 x 127 + 128 x 32 x 127 in magnitude, below 2^24 so the conversion is too);
// per chunk and output two float32 roundings (the scales' product, the FMA). Internal to
// src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/formats/int_group/scales.h"
#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// A block of 16 INT4_WORDS16 rows where it lies, as the VNNI GEMM and the decode GEMV (vnni_gemv.h)
// both read it: chunk c's 4 words of the 16 rows hold bytes 4v .. 4v + 3 of each row's chunk,
// whose low nibbles are code vector v and high nibbles code vector v + 4 (each word loaded
// twice, from L1: two registers a chunk instead of eight, beside 12 tokens' 24).
struct Words16Block {
  static constexpr int64_t kChunkBytes = 256;  // a chunk of 32 columns of the 16 rows
  const uint32_t* p;
  const uint16_t* s;  // the block's bf16 scales, [group][16]
  int64_t per;        // chunks per group
  [[gnu::always_inline]] __m512i code(int64_t c, int j) const {
    const __m512i x = _mm512_loadu_si512(p + (c * 4 + (j & 3)) * 16);
    return _mm512_and_si512(j < 4 ? x : _mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0f));
  }
  [[gnu::always_inline]] __m512 scale(int64_t c) const { return avx512::words16_scales(s + (per == 1 ? c : c / per) * 16); }
};

// A block of INT8_WORDS16 where it lies: vnni_pack_rows16's code vectors already, with
// INT4_WORDS16's bf16 scales.
struct Int8Words16Block : Words16Block {
  static constexpr int64_t kChunkBytes = 512;
  [[gnu::always_inline]] __m512i code(int64_t c, int j) const { return _mm512_loadu_si512(p + (c * 8 + j) * 16); }
};

// The block of rows n .. n + 15 of a WORDS16 W (Block: Words16Block for INT4_WORDS16,
// Int8Words16Block for INT8_WORDS16).
template <class Block>
Block words16_block(const MatrixView& W, int64_t n) {
  const Words16Block b{reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes()),
                       static_cast<const uint16_t*>(W.scales) + words16_scale(W.row0 + n, 0, W.scale_cols),
                       W.group_size / 32};
  return Block{b};
}

// The bias of W's unsigned codes (128 for INT8, 8 for INT4); W's format must be one of those.
int vnni_weight_bias(WeightFormat f);

// Rows n0 .. n0 + rows - 1 of W (INT4 or INT8 groups, W.cols % 32 == 0, rows <= 16) reordered:
// packed[(k / 4) * 16 + r] holds row r's biased codes of columns k .. k + 3, the columns of each
// chunk of 32 in W's layout (formats/registry.h); scales[c * 16 + r] is
// row r's group scale for chunk c. Rows past `rows` get zero scales. packed: K / 4 x 16 dwords,
// 64-byte aligned; scales: K / 32 x 16 floats, 64-byte aligned.
void vnni_pack_rows16(const MatrixView& W, int64_t n0, int64_t rows, uint32_t* packed, float* scales);

// y[t, r] = sum over chunks c of scales[c, r] * qs[t, c] * (sum over the chunk's columns of
// (packed codes - bias) * q codes) for r < rows (at most 16), t < M: the activations' codes q
// (M x K int8, ldq apart, in the packed columns' order), their scales qs and corrections qc
// (M x K / 32 each, lds apart; qc = -bias * the chunk's sum of codes). Single-threaded; callers
// split the rows.
void vnni_gemm_rows16(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t K, int64_t ldq,
                      int64_t lds, const uint32_t* packed, const float* scales, int64_t rows, float* y, int64_t ldy);

// The same for 32 rows packed as two blocks of 16 back to back (vnni_pack_rows16's words, then
// its scales, of rows 0..15 at packed and scales, of rows 16..31 K / 4 x 16 words and K / 32 x 16
// floats on), up to 6 tokens at a time, each token's activation bytes broadcast once for both.
void vnni_gemm_rows32(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t K, int64_t ldq,
                      int64_t lds, const uint32_t* packed, const float* scales, float* y, int64_t ldy);

// The same on rows n0 .. n0 + rows - 1 of an INT4_WORDS16 or INT8_WORDS16 W (n0 a multiple of 16, rows 16 or 32),
// read where they lie; K = W.cols. 32 rows run as two blocks side by side, up to 6 tokens at a
// time, each token's activation bytes broadcast once for both.
void vnni_gemm_words16(const int8_t* q, const float* qs, const int32_t* qc, int64_t M, int64_t ldq, int64_t lds,
                       const MatrixView& W, int64_t n0, int64_t rows, float* y, int64_t ldy);

// y[t, :] = W x[t, :] for INT4 / INT8 group weights (groups a multiple of 32) on int8
// activations: each token's chunks of 32 columns quantized to int8 (activations_int8), the
// products on VNNI's VPDPBUSD (the kernels above), float32 sums of the chunks' scaled integer sums. On
// ctx's threads. Kernel::VnniGemm (dispatch.h).
void matmul_vnni(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

}  // namespace mla::cpu
