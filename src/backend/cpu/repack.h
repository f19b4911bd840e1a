// Weights rewritten at load into the order a kernel computes in, so that the prompt's GEMMs
// read them where they lie instead of reordering every block of rows on every call (as
// ik_llama.cpp's run-time repacking, -rtr, does for its kernels).
//
// BF16_PAIRS32 (tensor/matrix.h): without AMX the VDPBF16PS and FMA GEMMs (dpbf16_gemm.h,
// fma_gemm.h) multiply a block of 32 rows as column pairs, which they otherwise transpose into a
// per-thread buffer for each block and each call. 48 tokens through 64 experts of 2816 x 2048
// from DRAM, 2 threads, AMD Zen 5: 53-55 ms with the transpose in every call, 39-41 ms on
// blocks already in that order (the kernel's own rate, 0.95 of VDPBF16PS's peak).
#pragma once
#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// Whether ctx's products read BF16_PAIRS32 weights in place: the fast precision where AMX is not
// used (VDPBF16PS or FMA GEMMs; the GEMVs of a few tokens read it too, on float32 FMAs) and
// ctx.repack_weights is set. AMX tiles and oneDNN would have to unpack it again.
bool reads_pairs32(const Context& ctx);

// Whether W can be stored as BF16_PAIRS32: bf16, rows and columns multiples of 32.
bool pairs32_eligible(const MatrixView& W);

// Rewrites the bf16 rows of an eligible W in place (its memory writable, as a WeightArena's)
// as BF16_PAIRS32 and sets its format; the blocks of 32 rows are split across ctx's threads.
void repack_pairs32(const Context& ctx, MatrixView& W);

}  // namespace mla::cpu
