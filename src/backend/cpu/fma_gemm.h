// bf16-weight GEMM on float32 FMAs for the fast precision's prompt-sized products on CPUs whose
// AVX-512 FMA outruns VDPBF16PS (dispatch.h: CpuFeatures::fma_gemm). On the development Xeon a
// zmm VDPBF16PS retires about one per 2 cycles (64 FLOPs) while VFMADD231PS retires two a cycle
// (2 x 32 FLOPs): twice the FLOPs for float32 FMAs on weights widened from bf16 in registers.
// On a CPU where VDPBF16PS runs at full rate (AMD Zen 4: one a cycle against one FMA) the
// balance is the other way, so dispatch measures it (fma_beats_vdpbf16ps).
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

// The compute peak of this path (compute_peak.h): `iters` rounds of 16 VFMADD231PS on zmm
// registers into 16 accumulators, operands 1.0 and `b`. Returns the sum of every lane at the end.
double fma_peak_loop(int64_t iters, float b);

// Whether float32 FMAs deliver at least 1.5x the FLOPs of VDPBF16PS on this core, timed with the
// two peak loops (about a millisecond each, best of 3). The FMA path pays for its transposes and
// widenings (it reaches about 0.65 of its loop where the VDPBF16PS kernel reaches 0.9 of its own),
// so it is chosen only where its peak is well ahead.
bool fma_beats_vdpbf16ps();

}  // namespace mla::cpu
