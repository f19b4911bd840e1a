// Matrix-vector products for a few tokens (decode), y[t, n] = W.row(n) . x[t, :], with the
// weights dequantized inside the kernel: each weight row is read from memory once per call,
// converted in registers (AVX-512) and dotted with every token. Bound by memory bandwidth.
// Output rows are split across the context's threads (context.h). Every WeightFormat has a fast
// kernel (INT4 and INT8 when the group size is a multiple of 32; other group sizes use the reference).
// Which kernel runs a product is gemv_kernel(ctx, T, W, features(ctx)) (dispatch.h).
// Precision (Context::precision): precise: float32 activations, weights decoded to float32, FMA.
// fast: for bf16, FP8 and INT4 weights, the activations are rounded to bf16 (nearest even) once
// per call and the weights decoded exactly to bf16 and dotted by VDPBF16PS (products exact,
// sums float32): fewer instructions per weight byte. F32, F16 and INT8 weights: float32 in both
// (for INT8 the conversion on to bf16 costs more than VDPBF16PS saves). INT4 and INT8 repacked
// at load (INT4_WORDS16, INT8_WORDS16: only where the prompt's products run on int8 activations)
// on VNNI's VPDPBUSD, the activations quantized to int8 per chunk of 32 as the prompt's VNNI GEMM
// does (vnni_gemm.h), with the same results.
// With AMX, fast FP8 products of 2 to 16 tokens run on tiles instead (amx.h), also on bf16
// activations: one tile product serves all the tokens.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// x: [T, W.cols], row stride ldx; y: [T, W.rows], row stride ldy. Any T; costs grow with T
// (the conversion is shared by up to 4 tokens at a time), so matmul uses it for small T.
// FP8 note: e4m3 NaN codes (0x7f, 0xff) read as +-480 here, not NaN.
void gemv(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

// Several products in one parallel region: the weight rows of all jobs, laid end to end, are
// split across ctx's threads by bytes. Jobs may share x; their outputs must not overlap.
struct GemvJob {
  const float* x;
  int64_t T, ldx;
  MatrixView W;
  float* y;
  int64_t ldy;
};
void gemv_batch(const Context& ctx, std::span<const GemvJob> jobs);

// The plain reference: MatrixView::dequant_row then a float dot product, one row at a time.
void gemv_reference(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy);

}  // namespace mla::cpu
