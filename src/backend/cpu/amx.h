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

}  // namespace mla::cpu
