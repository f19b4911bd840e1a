// Small float32 products on the calling thread, allocating nothing: the absorb attention's two
// products per key block (attention.cpp), scores [M, n] = scale Q rows^T over dim = kv_lora +
// rope and acc [M, kv_lora] += P c_KV, with M = tokens x heads (16-128 rows in decode) and n <=
// 256 keys. oneDNN's sgemm allocates a packing workspace on every call; these read A and B in
// place (row-major, any strides) and keep everything in registers:
//  gemm_nt_f32: each output a dot product of two rows. Tiles of 4 rows x 4 columns hold 16
//    accumulators of 16 lanes along K (the K tail by masked loads); at the end one transposing
//    tree of adds turns the 16 vectors into the 16 sums of the tile. Rows in chunks of 8, so a
//    chunk of A stays in L1 while the rows of B stream past it.
//  gemm_nn_f32: B row-major [K, N]. Tiles of up to 6 rows x 64 columns (24 accumulators): per k
//    4 loads of B's row and 6 broadcast FMAs; K in chunks of 64 so B's slice [64, 64] stays in
//    L1 across the row tiles; the last column vector masked for N % 16.
// Both: C = alpha op + beta C; where beta == 0, C is only written (NaN there does not spread).
// Needs AVX-512F. References of both in small_gemm_reference.cpp; tests/backend/cpu/attention/test_small_gemm.cpp.
#pragma once
#include <cstdint>

namespace mla::cpu {

// C[M, N] = alpha A B^T + beta C: A [M, K] (row stride lda), B [N, K] (row stride ldb).
void gemm_nt_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc);
// C[M, N] = alpha A B + beta C: A [M, K] (row stride lda), B [K, N] (row stride ldb).
void gemm_nn_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc);

namespace ref {
// The same contracts, one output at a time, the sum in double and rounded once.
void gemm_nt_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc);
void gemm_nn_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc);
}  // namespace ref

}  // namespace mla::cpu
