// The compute peak of the instruction a fast-precision prompt multiplies with: a register-only
// loop of AMX TDPBF16PS tiles (the path of a CPU with AMX), of AVX-512 VDPBF16PS (a CPU with
// AVX-512 BF16 and no AMX, or Context::amx false) or of float32 VFMADD231PS (where those outrun
// VDPBF16PS: dispatch.h, CpuFeatures::fma_gemm), on each of n threads at once. `mla bench`
// sets the prompt's FLOP rate against it, as it sets decode against the memory read loop.
#pragma once
#include <cstdint>

#include "backend/cpu/context.h"

namespace mla::cpu {

enum class PeakPath { AmxTiles, Vdpbf16ps, Fma, Vnni };
// "TDPBF16PS (AMX tiles)", "VDPBF16PS (AVX-512 BF16)", "VFMADD231PS (AVX-512 float32 FMA)",
// "VPDPBUSD (AVX-512 VNNI int8)"
const char* peak_path_name(PeakPath p);

// The path the prompt's products take in ctx on this CPU (dispatch.h: features(ctx)); with
// int_weights (the model's routed experts are INT4 / INT8 groups) the VNNI GEMM's where the
// dispatch sends those products to it (Kernel::VnniGemm).
PeakPath prompt_peak_path(const Context& ctx, bool int_weights = false);

// Floating-point operations of one instruction (a multiply and an add per product):
//  TDPBF16PS on full tiles: 16 x 16 float32 outputs, each the sum of 16 pairs = 32 products:
//    2 * 16 * 16 * 32 = 16384;
//  VDPBF16PS on zmm: 16 float32 lanes, each 2 products: 2 * 16 * 2 = 64;
//  VFMADD231PS on zmm: 16 lanes, one product each: 2 * 16 = 32;
//  VPDPBUSD on zmm: 16 int32 lanes, each 4 byte products: 2 * 16 * 4 = 128 (integer operations).
double flops_per_instruction(PeakPath p);

// One thread's loop (amx_peak_loop, dpbf16_peak_loop, fma_peak_loop, vnni_peak_loop): `iters` rounds with the second operand
// `b` everywhere (the first is 1.0). instructions: how many the loop issued; sum: the sum of
// every output after it, which is instructions * products per instruction * b while it is
// exact in float32 (the unit test's check of flops_per_instruction).
struct PeakRun {
  int64_t instructions = 0;
  double sum = 0;
};
PeakRun peak_loop(PeakPath p, int64_t iters, float b);

// GFLOPS of the loop run on `threads` threads at once (each `iters` rounds; wall time of the
// region), best of `passes`. Requires the path on this CPU (AMX: amx_available()).
double peak_gflops(PeakPath p, int threads, int passes, int64_t iters);

// Whether float32 FMAs deliver at least 1.5x the FLOPs of VDPBF16PS on this core, timed with the
// two peak loops on one thread (about a millisecond each, best of 3): dispatch.h's
// CpuFeatures::fma_gemm. The FMA GEMM pays for its transposes and widenings (a 512-token prompt
// ran 0.62-0.66 of the FMA loop where the VDPBF16PS kernel ran 0.81-0.88 of its own), so it is
// chosen only where its peak is well ahead.
bool fma_beats_vdpbf16ps();

// Rounds per thread for a loop of about `ms` milliseconds on a core of a few GHz (TDPBF16PS
// about 16 cycles, VDPBF16PS and VFMADD231PS 2 per cycle at best).
int64_t peak_iters(PeakPath p, double ms);

}  // namespace mla::cpu
