// CPU kernels as pure functions of their arguments: raw arrays, weight views and the CPU
// context (context.h), which says the precision, the thread count of their parallel regions and
// the dispatch thresholds; nothing process-wide decides what they compute. They allocate
// nothing the caller sees and own nothing. float32 activations, float32 accumulation.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/context.h"
#include "backend/cpu/formats/gemv.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// y[t, :] = W x[t, :] for t < T.  x: [T, W.cols] with row stride ldx; y: [T, W.rows], stride ldy.
// Runs on the kernel matmul_kernel(ctx, T, W, features(ctx)) names (dispatch.h): small T
// (decode) streams each weight row once through the fused AVX-512 kernels of gemv.h; larger T,
// in the fast precision a bf16 GEMM on AMX or oneDNN (gemm.h), in the precise one row blocks
// dequantized to float32 and an sgemm.
void matmul(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);
inline void matmul(const Context& ctx, const float* x, int64_t T, const MatrixView& W, float* y) {
  matmul(ctx, x, T, W.cols, W, y, W.rows);
}

// Several products y = W x, each computed as matmul computes it; the few-token ones (decode)
// run together in one parallel region (rows of all their weights split across the threads).
// Jobs may share x; outputs must not overlap.
using MatmulJob = GemvJob;  // backend/cpu/gemv.h
void matmul_batch(const Context& ctx, std::span<const MatmulJob> jobs);

// Row-major float32 GEMM, C[M,N] = alpha * op(A) op(B) + beta * C (oneDNN sgemm, on
// ctx.num_threads() threads; on the calling thread alone inside a parallel region).
void sgemm(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of n values with the given strides (split
// across ctx's threads when there are many). out may be x.
void rmsnorm(const Context& ctx, const float* x, int64_t T, int64_t n, int64_t ldx, const float* w, float eps, float* out, int64_t ldo);

// gate_up: [T, 2n] as (gate | up) per row -> out[T, n] = silu(gate) * up (rows split across
// ctx's threads when there are many).
void silu_mul(const Context& ctx, const float* gate_up, int64_t T, int64_t n, float* out);

// Rotates interleaved (even, odd) pairs of x[0..2*half) by angle a_i with cos_i, sin_i given.
void rope_interleaved(float* x, const float* cos, const float* sin, int64_t half);

// In-place numerically stable softmax of n values; returns log-sum-exp (natural log).
float softmax_inplace(float* x, int64_t n);

}  // namespace mla::cpu
