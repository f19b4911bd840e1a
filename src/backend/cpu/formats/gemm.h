// Prompt-sized matrix products in fast precision: bf16 x bf16 -> float32 GEMMs where the inner
// dimension is a multiple of 32 on our AMX kernel (amx.h, up to 127 tokens) where the CPU has AMX
// and Context::amx allows, on our VDPBF16PS kernel (dpbf16_gemm.h, any token count) where not,
// or bf16 weights x float32 activations on FMAs (fma_gemm.h) where those outrun VDPBF16PS;
// otherwise on oneDNN's matmul primitive. Weights in bf16 are used in place; other formats are
// decoded block by block into bf16 by their registry entry's row_bf16 (formats/registry.h). INT4 and
// INT8 products on int8 activations are the VNNI GEMM's (formats/int_group/vnni_gemm.h).
#pragma once
#include <cstdint>

#include "backend/cpu/context.h"
#include "backend/cpu/formats/activations.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// y[t, :] = W x[t, :] for t < T, weights rounded to bf16 and activations too (round to nearest
// even; the FMA kernel keeps them in float32), float32 accumulation. x: [T, W.cols] stride ldx; y: [T, W.rows] stride ldy. On the kernel
// gemm_bf16_kernel(T, W, features(ctx)) names (dispatch.h), on ctx's threads.
void matmul_bf16(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);


// C[M, N] (float32, stride ldc) = A[M, K] (bf16, stride lda) . B[N, K]^T (bf16, stride ldb).
// oneDNN primitives are created once per shape and thread count and kept (callers bucket M to
// bound their number); they run on ctx.num_threads() threads.
void gemm_bf16_nt(const Context& ctx, const uint16_t* A, int64_t M, int64_t lda, const uint16_t* B, int64_t N, int64_t ldb, int64_t K,
                  float* C, int64_t ldc);

// Rows [n0, n1) of W as bf16 into dst (row stride ld), columns in the lane layout of W's format
// (formats/registry.h) for every full chunk of 32 and in natural order after. Single-threaded.
void dequant_rows_bf16(const MatrixView& W, int64_t n0, int64_t n1, uint16_t* dst, int64_t ld);


}  // namespace mla::cpu
