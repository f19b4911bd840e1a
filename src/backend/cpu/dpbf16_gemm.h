// bf16 GEMM on VDPBF16PS for the fast precision's prompt-sized products on CPUs with AVX-512
// BF16 and no AMX (gemm.cpp chooses it there, or where Context::amx is false, when K is a
// multiple of 32). It takes the operands exactly as the AMX kernel does (amx.h): the weights
// row-major bf16 where they lie, the activations packed by amx_pack_activations, in which the
// 16 tokens of a block sit side by side for each column pair, i.e. one zmm register of 16 lanes
// holding one (x[t, 2p], x[t, 2p + 1]) pair per token. Each VDPBF16PS multiplies that register by
// one weight pair W[r, 2p..2p+1] broadcast to every lane: 16 tokens x 2 columns of one row.
// Internal to src/backend/cpu.
#pragma once
#include <cstdint>

namespace mla::cpu {

// y[t, r] = sum over k of W[r, k] x[t, k] for r < rows (at most 32), t < M: the contract of
// amx_gemm_rows32 (xp packed by amx_pack_activations, W readable for 32 rows of K values ldw
// apart, K % 32 == 0). Per output one float32 chain over the column pairs. Single-threaded.
void dpbf16_gemm_rows32(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows,
                        bool prefetch, float* y, int64_t ldy);

// The compute peak (compute_peak.h): `iters` rounds of 16 VDPBF16PS on zmm registers into 16
// accumulators (16 lanes += 2 bf16 products each), operands in registers: 1.0 and `b` in every
// bf16 word. Returns the sum of every accumulator lane at the end.
double dpbf16_peak_loop(int64_t iters, float b);

}  // namespace mla::cpu
