// bf16-weight GEMM on float32 FMAs for the fast precision's prompt-sized products on CPUs whose
// AVX-512 FMA outruns VDPBF16PS (dispatch.h: CpuFeatures::fma_gemm). On the development Xeon a
// zmm VDPBF16PS retires about one per 2 cycles (64 FLOPs) while VFMADD231PS retires two a cycle
// (2 x 32 FLOPs): twice the FLOPs for float32 FMAs on weights widened from bf16 in registers.
// On a CPU where VDPBF16PS runs at full rate (AMD Zen 4: one a cycle against one FMA) the
// balance is the other way, so dispatch measures it (compute_peak.h: fma_beats_vdpbf16ps).
//
// Per block of 32 weight rows, the rows are first transposed into a per-thread buffer of column
// pairs (16 KiB per 256 columns: for each pair, the 32 rows' (W[r, 2p], W[r, 2p + 1]) words side
// by side, two zmm), then every token group of up to 12 runs over it: per column pair, 2 loads,
// 4 widenings (a shift and a mask), 2 x 12 broadcasts of the float32 activations and 48 FMAs into
// 24 accumulators of 16 output rows each. No operand is padded and no activation is rounded.
// Internal to src/backend/cpu.
#pragma once
#include <cstdint>

namespace mla::cpu {

// y[t, r] = sum over k of W[r, k] x[t, k] for r < rows (at most 32), t < M. x: float32 tokens
// of K values, ldx apart; W: bf16 rows of K values, ldw apart, readable for 32 rows; K % 32 == 0.
// Per output one float32 FMA chain over the columns. Single-threaded; callers split the rows.
void fma_gemm_rows32(const float* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* W, int64_t ldw,
                     int64_t rows, float* y, int64_t ldy);

// The same on a block of 32 rows stored as column pairs (BF16_PAIRS32: the buffer the call
// above packs), read where it lies: p its K / 2 x 32 words.
void fma_gemm_packed_rows32(const float* x, int64_t M, int64_t K, int64_t ldx, const uint32_t* p, int64_t rows,
                            float* y, int64_t ldy);

}  // namespace mla::cpu
