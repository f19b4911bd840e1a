// The kernel of each product (see dispatch.h). What a weight format has (its kernels, the tokens
// its GEMVs take) comes from its registry entry (formats/registry.h); the rules below name no
// format.
#include "backend/cpu/dispatch.h"

#include "backend/cpu/common/amx.h"
#include "backend/cpu/common/avx512.h"
#include "backend/cpu/compute_peak.h"
#include "backend/cpu/formats/registry.h"

#include <limits>

namespace mla::cpu {

namespace {

using avx512::kChunk;          // columns of one AVX-512 decode
using avx512::kStep;           // columns of one bf16 GEMV step
constexpr int64_t kAmxGemmMaxTokens = 128;  // the AMX GEMM below this; oneDNN from it (gemm.cpp)
// The FMA GEMM from this many tokens: below it the transpose of each 32-row block costs more than
// the FMAs gain. One thread, 1408 x 2048 bf16 in L2 (GFLOPS, FMA against VDPBF16PS): 8 tokens
// 48 against 76, 16 tokens 83 against 74, 24 tokens 98 against 73, 48 tokens 112 against 82.
constexpr int64_t kFmaGemmMinTokens = 16;

}  // namespace

CpuFeatures host_features() {
  static const CpuFeatures f{amx_available(), fma_beats_vdpbf16ps()};
  return f;
}

CpuFeatures features(const Context& ctx) {
  CpuFeatures f = host_features();
  f.amx = f.amx && ctx.amx;
  if (ctx.vector_gemm != Context::VectorGemm::Auto) f.fma_gemm = ctx.vector_gemm == Context::VectorGemm::Fma;
  return f;
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::GemvReference: return "gemv-reference";
    case Kernel::GemvF32: return "gemv-f32";
    case Kernel::GemvBf16: return "gemv-bf16";
    case Kernel::GemvAmxFp8: return "gemv-amx-fp8";
    case Kernel::GemvVnni: return "gemv-vnni";
    case Kernel::AmxGemm: return "amx-gemm";
    case Kernel::Dpbf16Gemm: return "vdpbf16ps-gemm";
    case Kernel::FmaGemm: return "fma-gemm";
    case Kernel::VnniGemm: return "vnni-gemm";
    case Kernel::OnednnBf16: return "onednn-bf16";
    case Kernel::Sgemm: return "sgemm";
    case Kernel::DequantSgemm: return "dequant-sgemm";
  }
  return "?";
}

// Up to this many tokens the products run on the GEMV kernels (gemv.h: weight rows streamed and
// dotted with 4 tokens at a time, so 12 tokens read a weight 3 times, from cache after the
// first). In the precise mode up to 16: its alternative, weights dequantized to float32 for
// sgemm, measured 3-9x slower there (bench/int4_expert). In the fast mode, FP8 and INT4 weights
// up to 12 tokens: batched decode of 64 sequences (5-12 tokens per expert, mla bench --batches
// 64) ran 61-74 tokens/s in bf16 with oneDNN's GEMM from 5 tokens on and 75-83 with the GEMV up
// to 12 (alternating runs); FP8 and INT4 gained more, and against the AMX kernel (dequantizing
// 32 rows at a time) they still ran 104-112 against 100-104 (FP8) and 130-132 against 108-110
// (INT4). bf16 weights, which the AMX kernel reads in place, go to it from 5 tokens on: 95-106
// tokens/s at batch 64 with the GEMV up to 12, 106-124 with it up to 4 (alternating runs).
// FP8 on AMX tiles (amx.h) costs about the same for 2 or 16 tokens: the GEMV takes up to 16
// (batch 16: 92.8 and 88.6 tokens/s against 85.5 and 86.6 with 12; batch 64 within the noise).
// INT8 groups (a byte a weight, as FP8) take FP8's and INT4's 12 without AMX tiles: not measured apart.
int64_t gemv_max_tokens(const Context& ctx, const MatrixView& W, const CpuFeatures& f) {
  if (ctx.one_token_kernels) return std::numeric_limits<int64_t>::max();
  if (!ctx.fast()) return 16;
  const FormatKernels& k = format_kernels(W.format);
  if (k.gemv_amx && f.amx) return kAmxGemvTokens;
  return k.fast_gemv_tokens;
}

// Row-major INT8 weights stay on the float32 GEMV in the fast precision too (bf16_kernel is
// false for them): decoding int8 to float32 for FMAs takes fewer instructions than going on to
// bf16 for VDPBF16PS. bench/matmul --quick, 2 threads, AMD Zen 5, one token, five runs, float32
// against bf16 GB/s in each: 1408 x 2048 from DRAM 24.5-31.7 against 24.2-30.0, 2048 x 1408
// 24.2-28.7 against 24.1-27.2 (float32 ahead in 9 of 10 pairs), 256 x 2048 in L2 (one thread)
// 28.2-40.9 against 25.0-30.8; mla bench --weights int8 decode, 3 alternating pairs: 29.96-32.61
// against 28.43-30.55 tokens/s (+5 to +7% in each pair).
// Repacked at load (INT8_WORDS16, where the prompt runs on int8 activations) they take the VNNI
// GEMV (GemvVnni): one VPDPBUSD per 64 weight bytes, one sequential stream. mla bench --weights
// int8 --depth 0 (2 threads, AMD Zen 5, 4 alternating pairs against the float32 GEMV on the
// row-major weights): decode 28.96 / 29.68 / 27.43 / 27.57 against 25.45 / 22.82 / 24.14 / 25.22
// tokens/s; the prompt, whose VNNI GEMM then reads the blocks in place, 720 / 657 / 616 / 662
// against 554 / 515 / 543 / 535 tokens/s.
// INT4_WORDS16 takes it too (before: the VDPBF16PS GEMV at one token, the float32 one beyond, on
// the same blocks), so that decode computes as the prompt does. A decode step's MoE products
// (5 layers of bf16 shared experts and 6 of 64 INT4 experts from DRAM, 2 threads, AMD Zen 5,
// alternating in one process, 3 runs of 61 rounds): 1.03-1.06x; one token through batches of 12
// INT4 experts 1408 x 2048 from L3 1.22x, 4 tokens from DRAM 1.41x; mla bench --weights int4
// --batches 4 8 (alternating builds): batch 8 124.3 / 112.9 -> 146.9 / 138.8 tokens/s, batch 4
// 86.3 / 70.0 -> 88.9 / 74.8.
Kernel gemv_kernel(const Context& ctx, int64_t T, const MatrixView& W, const CpuFeatures& f) {
  if (ctx.one_token_kernels) T = 1;
  const FormatKernels& k = format_kernels(W.format);
  if (!fused_kernels(W)) return Kernel::GemvReference;
  if (k.gemv_vnni && ctx.fast() && ctx.int8_activations) return Kernel::GemvVnni;
  if (!k.gemv_f32) return Kernel::GemvReference;
  if (ctx.fast() && f.amx && T >= 2 && T <= kAmxGemvTokens && W.cols >= kStep && k.gemv_amx) return Kernel::GemvAmxFp8;
  if (ctx.fast() && T <= ctx.gemv_bf16_max_tokens && k.gemv_bf16 && W.cols % k.gemv_bf16_cols == 0)
    return Kernel::GemvBf16;
  return Kernel::GemvF32;
}

Kernel gemm_bf16_kernel(int64_t T, const MatrixView& W, const CpuFeatures& f) {
  if (W.cols % kChunk != 0) return Kernel::OnednnBf16;
  if (!f.amx) return f.fma_gemm && T >= kFmaGemmMinTokens ? Kernel::FmaGemm : Kernel::Dpbf16Gemm;
  return T < kAmxGemmMaxTokens ? Kernel::AmxGemm : Kernel::OnednnBf16;
}

Kernel matmul_kernel(const Context& ctx, int64_t T, const MatrixView& W, const CpuFeatures& f) {
  if (T <= gemv_max_tokens(ctx, W, f)) return gemv_kernel(ctx, T, W, f);
  if (ctx.fast() && fused_kernels(W)) {
    if (format_kernels(W.format).gemm_int8 && ctx.int8_activations && !f.amx) return Kernel::VnniGemm;
    return gemm_bf16_kernel(T, W, f);
  }
  return format_kernels(W.format).sgemm ? Kernel::Sgemm : Kernel::DequantSgemm;
}

// Without AMX the fast precision scores on VDPBF16PS where it outruns the float32 FMAs, which
// the same timing as the GEMM's decides (CpuFeatures::fma_gemm false). On the 2-core
// development Xeon (no AMX granted, fma_gemm true) mla bench --dsa timed the VDPBF16PS kernel
// slower at every context (scoring 65,536 keys of 64 x 128: 46.9 ms against 38.5 ms; 16,384: 7.5
// against 6.9; 4,096: 1.18 against 0.95), as the GEMV's measurements found (context.h:
// VDPBF16PS retires ~0.45 a cycle against 1.85 FMAs). On a 2-vCPU AMD EPYC Zen 5 (fma_gemm
// false: both retire about 2 a cycle, and VDPBF16PS does twice an FMA's multiply-adds) the same
// bench timed it 4.4x faster at 65,536 keys (1.45 ms against 6.32 ms), 2.5x at 16,384 (0.37
// against 0.90) and 2.2x at 4,096 (0.12 against 0.25). The precise precision scores in float32.
IndexKernel index_kernel(const Context& ctx, int64_t dim, const CpuFeatures& f) {
  if (!ctx.fast() || dim % 32 != 0) return IndexKernel::F32;
  if (f.amx) return IndexKernel::Amx;
  return f.fma_gemm ? IndexKernel::F32 : IndexKernel::Bf16;
}

}  // namespace mla::cpu
