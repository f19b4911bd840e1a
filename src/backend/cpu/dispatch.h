// Which kernel computes a product y = W x of T tokens: one pure function of the context (its
// precision and bf16 threshold), T, the weight's format and the CPU's features. matmul,
// matmul_batch and gemv_batch run what it returns; tests pin its table for CPUs with and
// without AMX (the features are an argument, so the table is checked on any machine).
#pragma once
#include <cstdint>

#include "backend/cpu/context.h"
#include "backend/cpu/index_score.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// What the CPU offers beyond the AVX-512 (F, BW, VL, BF16) the engine is built for.
struct CpuFeatures {
  bool amx = false;       // AMX-BF16 tiles, granted to this process by the kernel
  bool fma_gemm = false;  // float32 FMAs outrun VDPBF16PS here (fma_beats_vdpbf16ps, timed once)
};
CpuFeatures host_features();  // this machine's (detected once)
// The features the kernels of ctx may use: the host's, without AMX where ctx.amx is false, with
// fma_gemm as ctx.vector_gemm sets it.
CpuFeatures features(const Context& ctx);

enum class Kernel {
  GemvReference,  // MatrixView::dequant_row and a float dot product: INT4 / INT8 groups not a multiple of 32
  GemvF32,        // fused dequantize-and-FMA GEMV on float32 activations (gemv.h)
  GemvBf16,       // the GEMV's VDPBF16PS kernels on bf16 activations (fast; bf16, FP8, INT4)
  GemvAmxFp8,     // FP8 rows decoded onto AMX tiles, 2 to 16 tokens (fast; amx.h)
  GemvVnni,       // INT4 / INT8_WORDS16 blocks, ggml block formats x int8 activations on VPDPBUSD (fast, int8_activations; gemv.h)
  AmxGemm,        // bf16 GEMM on AMX tiles, amx_gemm_rows32, 32 weight rows at a time (fast; gemm.h)
  Dpbf16Gemm,     // bf16 GEMM on VDPBF16PS, dpbf16_gemm_rows32, activations row-major (fast, no AMX; dpbf16_gemm.h)
  FmaGemm,        // bf16 weights x float32 activations on FMAs, fma_gemm_rows32 (fast, no AMX; fma_gemm.h)
  VnniGemm,       // INT4 / INT8 weights x int8 activations on VPDPBUSD, matmul_vnni (fast, no AMX; vnni_gemm.h)
  OnednnBf16,     // oneDNN's bf16 matmul primitive (fast; gemm.h)
  Sgemm,          // float32 weights straight into oneDNN's sgemm (precise)
  DequantSgemm,   // blocks of rows dequantized to float32, then sgemm (precise)
};
const char* kernel_name(Kernel k);
inline bool is_gemv(Kernel k) { return k <= Kernel::GemvVnni; }

// Up to this many tokens matmul runs a product on the GEMV kernels (see dispatch.cpp for the
// measurements): 16 in the precise precision; in the fast one 16 for FP8 with AMX, 4 for bf16
// weights (either order), 12 for the other formats.
int64_t gemv_max_tokens(const Context& ctx, const MatrixView& W, const CpuFeatures& f);

// The kernel of the GEMV family that gemv and gemv_batch run a product of T tokens on (any T).
// The WORDS16 formats (repacked at load where the prompt's products run on int8 activations)
// take GemvVnni there; in any other context INT8_WORDS16 takes the reference and INT4_WORDS16
// the float32 or bf16 GEMVs.
Kernel gemv_kernel(const Context& ctx, int64_t T, const MatrixView& W, const CpuFeatures& f);

// The bf16 GEMM of a product past the GEMV's tokens (matmul_bf16, gemm.h) where K is a multiple
// of 32: AmxGemm up to 127 tokens where the CPU has AMX (OnednnBf16 from 128 on); without AMX,
// FmaGemm from 16 tokens where f.fma_gemm, else Dpbf16Gemm. Other K: OnednnBf16.
Kernel gemm_bf16_kernel(int64_t T, const MatrixView& W, const CpuFeatures& f);

// The kernel matmul runs a product of T tokens on: the GEMV's up to gemv_max_tokens; past it,
// in the fast precision, VnniGemm for INT4 / INT8 weights without AMX where ctx.int8_activations,
// else the bf16 GEMM of gemm_bf16_kernel; in the precise precision sgemm (float32 weights) or blocks dequantized to
// float32 for sgemm. INT4 / INT8 groups not a multiple of 32 have no bf16 GEMM: dequantized sgemm.
// Reads only W's format, cols and group_size.
Kernel matmul_kernel(const Context& ctx, int64_t T, const MatrixView& W, const CpuFeatures& f);

// The DeepSeek Sparse Attention indexer's scoring kernel (index_score.h) for keys of `dim`
// values: in the fast precision, where dim % 32 == 0, Amx where the CPU has AMX, else Bf16
// (VDPBF16PS) unless f.fma_gemm says float32 FMAs outrun it; otherwise F32 (dispatch.cpp has
// the measurements). dim % 32 != 0 has no kernel: the caller scores on the reference.
IndexKernel index_kernel(const Context& ctx, int64_t dim, const CpuFeatures& f);

}  // namespace mla::cpu
