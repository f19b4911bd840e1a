// Plain references of small_gemm.h's products: one output at a time, the sum in double.
#include "backend/cpu/attention/small_gemm.h"

namespace mla::cpu::ref {

namespace {
float finish(double sum, float alpha, float beta, const float* c) {
  return float(double(alpha) * sum + (beta == 0.0f ? 0.0 : double(beta) * double(*c)));
}

// B's element (j, k) lies at B[j * bj + k * bk]: (ldb, 1) for B as [N, K], (1, ldb) for [K, N].
void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t bj,
              int64_t bk, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(A[i * lda + k]) * double(B[j * bj + k * bk]);
      C[i * ldc + j] = finish(s, alpha, beta, C + i * ldc + j);
    }
}
}  // namespace

void gemm_nt_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc) {
  gemm_f32(M, N, K, alpha, A, lda, B, ldb, 1, beta, C, ldc);
}

void gemm_nn_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc) {
  gemm_f32(M, N, K, alpha, A, lda, B, 1, ldb, beta, C, ldc);
}

}  // namespace mla::cpu::ref
