// CPU kernels as pure functions over raw arrays and weight views: they allocate nothing the
// caller sees and own nothing. float32 activations, float32 accumulation.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/gemv.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// y[t, :] = W x[t, :] for t < T.  x: [T, W.cols] with row stride ldx; y: [T, W.rows], stride ldy.
// Small T (decode) streams each weight row once through the fused AVX-512 kernels of gemv.h.
// Larger T: in Precision::Fast (precision.h) a bf16 AMX GEMM (gemm.h); in Precision::Precise
// row blocks dequantized to float32 and an sgemm.
void matmul(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);
inline void matmul(const float* x, int64_t T, const MatrixView& W, float* y) { matmul(x, T, W.cols, W, y, W.rows); }

// Several products y = W x, each computed as matmul computes it; the few-token ones (decode)
// run together in one parallel region (rows of all their weights split across the threads).
// Jobs may share x; outputs must not overlap.
using MatmulJob = GemvJob;  // backend/cpu/gemv.h
void matmul_batch(std::span<const MatmulJob> jobs);

// Row-major float32 GEMM, C[M,N] = alpha * op(A) op(B) + beta * C (oneDNN sgemm).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of n values with the given strides (split
// across the threads when there are many). out may be x.
void rmsnorm(const float* x, int64_t T, int64_t n, int64_t ldx, const float* w, float eps, float* out, int64_t ldo);

// gate_up: [T, 2n] as (gate | up) per row -> out[T, n] = silu(gate) * up.
void silu_mul(const float* gate_up, int64_t T, int64_t n, float* out);

// Rotates interleaved (even, odd) pairs of x[0..2*half) by angle a_i with cos_i, sin_i given.
void rope_interleaved(float* x, const float* cos, const float* sin, int64_t half);

// In-place numerically stable softmax of n values; returns log-sum-exp (natural log).
float softmax_inplace(float* x, int64_t n);

int num_threads();
void set_num_threads(int n);

}  // namespace mla::cpu
