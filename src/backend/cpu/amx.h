// bf16 GEMM on AMX tiles, written for the shape of an inference engine: the weights, [N, K]
// row-major as the checkpoint stores them, are the A operand (16 rows x 32 values per tile),
// copied 32 rows at a time into tile order just before use (or dequantized into it), so no
// weight layout is prepared ahead; the activations (small: M tokens x K) go into the VNNI
// layout of B tiles once per call. Each tile step computes a 32-row x 32-token block
// (2 x 2 accumulator tiles). Weight row blocks are handed to the threads dynamically.
#pragma once
#include <cstdint>

#include "tensor/matrix.h"

namespace mla::cpu {

// The CPU has AMX-BF16 and the kernel granted this process the tile state.
bool amx_available();

// Activations x_bf16 [M, K] (row stride ldx, K a multiple of 32) into the B-tile layout:
// for each block of 16 tokens and each step of 32 columns, 16 rows of column pairs x 16 tokens
// (1 KiB). Tokens past M are zero. out must hold amx_packed_size(M, K) values.
int64_t amx_packed_size(int64_t M, int64_t K);
void amx_pack_activations(const uint16_t* x_bf16, int64_t M, int64_t K, int64_t ldx, uint16_t* out);

// y[t, n] = sum_k x[t, k] W[n, k] for t < M, n < W.rows (float32, row stride ldy), xp from
// amx_pack_activations of x in the column order gemm.h's dequant_rows_bf16 gives W's format
// (natural for bf16). Other formats are dequantized 32 rows at a time into a per-thread buffer. Runs on the OpenMP threads. W.cols a multiple of 32.
void amx_gemm(const uint16_t* xp, int64_t M, const MatrixView& W, float* y, int64_t ldy);

}  // namespace mla::cpu
