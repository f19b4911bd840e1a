// Prompt-sized matrix products in fast precision: bf16 x bf16 -> float32 GEMMs where the inner
// dimension is a multiple of 32 on our AMX kernel (amx.h, up to 127 tokens) where the CPU has AMX
// and Context::amx allows, on our VDPBF16PS kernel (dpbf16_gemm.h, any token count) where not,
// or bf16 weights x float32 activations on FMAs (fma_gemm.h) where those outrun VDPBF16PS;
// otherwise on oneDNN's matmul primitive. Weights in bf16 are used in place; other formats are dequantized
// block by block into bf16 with the AVX-512 decoders.
#pragma once
#include <cstdint>

#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// y[t, :] = W x[t, :] for t < T, weights rounded to bf16 and activations too (round to nearest
// even; the FMA kernel keeps them in float32), float32 accumulation. x: [T, W.cols] stride ldx; y: [T, W.rows] stride ldy. On the kernel
// gemm_bf16_kernel(T, W, features(ctx)) names (dispatch.h), on ctx's threads.
void matmul_bf16(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

// y[t, :] = W x[t, :] for INT4 / INT8 group weights (groups a multiple of 32) on int8
// activations: each token's chunks of 32 columns quantized to int8 (activations_int8), the
// products on VNNI's VPDPBUSD (vnni_gemm.h), float32 sums of the chunks' scaled integer sums. On
// ctx's threads. Kernel::VnniGemm (dispatch.h).
void matmul_vnni(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

// C[M, N] (float32, stride ldc) = A[M, K] (bf16, stride lda) . B[N, K]^T (bf16, stride ldb).
// oneDNN primitives are created once per shape and thread count and kept (callers bucket M to
// bound their number); they run on ctx.num_threads() threads.
void gemm_bf16_nt(const Context& ctx, const uint16_t* A, int64_t M, int64_t lda, const uint16_t* B, int64_t N, int64_t ldb, int64_t K,
                  float* C, int64_t ldc);

// Rows [n0, n1) of W as bf16 into dst (row stride ld), columns in the lane layout of W's format
// (decode_avx512.h) for every full chunk of 32 and in natural order after. Single-threaded.
void dequant_rows_bf16(const MatrixView& W, int64_t n0, int64_t n1, uint16_t* dst, int64_t ld);

// Activations x [T, K] as bf16 into dst (row stride ld) in the same column order as
// dequant_rows_bf16 uses for `format` (natural when `permute` is false).
void activations_bf16(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, bool permute,
                      uint16_t* dst, int64_t ld);

// Activations x [T, K] as float32 into dst (row stride ld), permuted within each chunk of 32
// into the column order dequant_rows_bf16 uses for `format` (the FMA kernel's decoded rows).
void activations_f32_permuted(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, float* dst,
                              int64_t ld);

// Activations x [T, K] (K % 32 == 0) as int8 codes for the VNNI GEMM: per token and chunk c of 32
// columns, m the chunk's largest magnitude, q = round(x * (127 / m)) (to nearest even, float32
// arithmetic) into q[t * ldq + c * 32 ...] in the column order dequant_rows_bf16 uses for `format`,
// qs[t * lds + c] = m / 127, and qc[t * lds + c] = -bias * the sum of the chunk's codes
// (vnni_weight_bias). A chunk of zeros: codes and scale 0.
void activations_int8(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, int bias, int8_t* q,
                      int64_t ldq, float* qs, int32_t* qc, int64_t lds);

}  // namespace mla::cpu
