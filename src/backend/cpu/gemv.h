// Matrix-vector products for a few tokens (decode), y[t, n] = W.row(n) . x[t, :], with the
// weights dequantized inside the kernel: each weight row is read from memory once per call,
// converted in registers (AVX-512) and dotted with every token. Bound by memory bandwidth.
// Output rows are split across the OpenMP threads. Every WeightFormat has a fast kernel (INT4
// when its group size is a multiple of 32; other group sizes use the reference).
// Precision (cpu::precision()): precise: float32 activations, weights decoded to float32, FMA.
// fast: for bf16, FP8 and INT4 weights, the activations are rounded to bf16 (nearest even) once
// per call and the weights decoded exactly to bf16 and dotted by VDPBF16PS (products exact,
// sums float32): fewer instructions per weight byte. F32 and F16 weights: float32 in both.
// With AMX, fast FP8 products of 2 to 16 tokens run on tiles instead (amx.h), also on bf16
// activations: one tile product serves all the tokens.
#pragma once
#include <cstdint>
#include <span>

#include "tensor/matrix.h"

namespace mla::cpu {

// x: [T, W.cols], row stride ldx; y: [T, W.rows], row stride ldy. Any T; costs grow with T
// (the conversion is shared by up to 4 tokens at a time), so matmul uses it for small T.
// FP8 note: e4m3 NaN codes (0x7f, 0xff) read as +-480 here, not NaN.
void gemv(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

// Several products in one parallel region: the weight rows of all jobs, laid end to end, are
// split across the threads by bytes. Jobs may share x; their outputs must not overlap.
struct GemvJob {
  const float* x;
  int64_t T, ldx;
  MatrixView W;
  float* y;
  int64_t ldy;
};
void gemv_batch(std::span<const GemvJob> jobs);

// Fast precision: the bf16 kernels serve products of at most this many tokens (default 1), the
// float32 kernels the rest (FP8 on AMX excepted, above). Measured on a Xeon with AVX512-BF16 (bench/matmul --l2): VDPBF16PS
// retires about 0.45 per cycle against 1.85 FMAs, so only at 1 token, where the cheaper decode
// to bf16 pays, are the bf16 kernels faster (bf16, FP8: ~15-20% in L2; INT4: even); from 2
// tokens on they are slower. Process-wide; tests raise it to reach the multi-token tiles.
int64_t gemv_bf16_max_tokens();
void set_gemv_bf16_max_tokens(int64_t T);

// The plain reference: MatrixView::dequant_row then a float dot product, one row at a time.
void gemv_reference(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

}  // namespace mla::cpu
