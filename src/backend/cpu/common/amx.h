// bf16 GEMM on AMX tiles for the fast precision's prompt-sized products (gemm.cpp chooses it
// when the CPU has AMX and K is a multiple of 32). Weights are the A operand as they are stored
// (row-major bf16, a tile is 16 rows x 32 columns read with the row stride), so nothing is
// repacked per call; only the activations are packed, into the pair-interleaved B layout.
// Internal to src/backend/cpu.
#pragma once
#include <cstdint>

namespace mla::cpu {

// True when the CPU has AMX-BF16 and the kernel granted this process the tile state.
bool amx_available();

// Size in bf16 values of the packed activations of M tokens (M rounded up to 16) by K columns.
int64_t amx_packed_size(int64_t M, int64_t K);

// Packs x [M, K] (bf16, row stride ldx even, K % 32 == 0) into B tiles: for each block of 16
// tokens and each step of 32 columns, 16 column pairs x 16 tokens x 2 values. Tokens past M are
// zero.
void amx_pack_activations(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, uint16_t* out);

// y[t, r] = sum over k of W[r, k] x[t, k] for r < rows (at most 32), t < M, with xp packed by
// amx_pack_activations. W: bf16 rows of K values, ldw values apart; it must be readable for 32
// rows (callers pad a short last block). `prefetch`: W comes from memory rather than cache.
// Single-threaded; callers split the rows.
void amx_gemm_rows32(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows,
                     bool prefetch, float* y, int64_t ldy);

// ---- FP8 products of a few tokens (the fast precision's GEMV, gemv.cpp) ----------------------
// One TDPBF16PS multiplies 16 weight rows x 32 columns by 16 column pairs x up to 16 tokens, in
// about the time of 8 VDPBF16PS (5.6 ns against 0.62-0.74 ns here), whatever the token count.
// The FP8 weights are decoded to bf16 in registers and stored to the A tiles' buffers first.
// On the 2-core development machine (bench/matmul --quick, 1 GB of experts read from DRAM),
// 4 tokens streamed 15.1-17.8 GB/s against 11.7-12.5 for the float32 kernel; one token 17.1-17.9
// against 19.7-20.3 for the VDPBF16PS kernel, which therefore keeps single tokens.
constexpr int64_t kAmxGemvRows = 16, kAmxGemvTokens = 16;

// Loads the tile configuration of amx_gemv_fp8_rows16 for T tokens (1..16) on this thread.
void amx_gemv_begin(int64_t T);
void amx_gemv_end();

// c[r * T + t] = sum over the S steps of 64 columns of W[r, k] x[t, k] / 2^120 for the nr <= 16
// FP8 rows of w (row_bytes apart, each readable for S * 64 columns, all in one 128-row block
// whose scales are scales[0..]), between amx_gemv_begin(T) and amx_gemv_end().
//  xb: the activations (bf16) as B tiles, two per step (the step's words 0-31 and 32-63 in
//      the Fp8Unpack layout, formats/fp8_block128/decode.h): 16 pairs x T tokens x 2 values, 64 T a step.
//  The weights are decoded to bf16 words 2^-120 times their value (as BfDecFP8); each 128
//  columns sum in a tile of their own, added to c times their block scale. TDPBF16PS reads the
//  codes of exponent field 0 as zero: their products go to fix[r * T + t] instead
//  (code / 512 * scale * x, not divided by 2^120).
//  prefetch: the same columns of the rows `prefetch` bytes on are fetched into L2 as a step
//  reads its own (0: none).
void amx_gemv_fp8_rows16(const uint8_t* w, int64_t row_bytes, int64_t nr, int64_t S, int64_t T, const uint16_t* xb,
                         const float* scales, int64_t prefetch, float* c, float* fix);

// ---- The compute peak (compute_peak.h) ----------------------------------------------------
// `iters` rounds of 4 TDPBF16PS on full tiles (16 x 16 float32 += 16 x 32 bf16 . 16 pairs x 16
// x 2 bf16) into 4 accumulator tiles, operands loaded once: registers only. The A tiles hold
// 1.0, the B tiles `b`; returns the sum of every accumulator element at the end.
double amx_peak_loop(int64_t iters, float b);

}  // namespace mla::cpu
