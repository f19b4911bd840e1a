// The CPU context: every setting that decides what the CPU kernels compute and how they run.
// There are no process-wide switches: a Model keeps the Context it was loaded with
// (Model::load) and hands it to every kernel it calls (matmul, matmul_batch, gemv, the
// attention's thread split, rmsnorm, ...); a test builds the contexts it compares. A
// default-constructed Context is the library's default: float32 precision, every core,
// weights placed automatically, the measured dispatch thresholds.
#pragma once
#include <cstdint>

#include "backend/cpu/precision.h"

namespace mla::cpu {

// Whether Model::load copies the weights into a WeightArena on huge pages (weight_memory.h):
// Auto when the weights take less than half of the memory available (MemAvailable); Mapped
// leaves them memory-mapped.
enum class WeightPlacement { Auto, HugePages, Mapped };

struct Context {
  Precision precision = Precision::Precise;
  // Threads of every OpenMP region a kernel opens (num_threads clause; oneDNN's calls get the
  // same count). 0: all cores, or OMP_NUM_THREADS where set (OpenMP's default, never changed
  // by the library).
  int threads = 0;
  WeightPlacement weights = WeightPlacement::Auto;
  // Fast precision: the VDPBF16PS GEMV serves products of at most this many tokens, the float32
  // GEMV the rest (FP8 on AMX tiles excepted; dispatch.h). Measured on a Xeon with AVX512-BF16
  // (bench/matmul --l2): VDPBF16PS retires about 0.45 per cycle against 1.85 FMAs, so only at 1
  // token, where the cheaper decode to bf16 pays, are the bf16 kernels faster (bf16, FP8:
  // ~15-20% in L2; INT4: even); from 2 tokens on they are slower. Tests raise it to reach the
  // multi-token bf16 tiles.
  int64_t gemv_bf16_max_tokens = 1;
  // Every product runs on the kernel a product of one token would (dispatch.h), whatever its
  // token count, and the absorbed attention takes each query on its own: every row of a pass
  // then computes exactly what a one-token decode step computes (the GEMV kernels treat each
  // token alone). Speculative decoding verifies its drafts this way, so that greedy output is
  // the same token for token with and without speculation. Slower than the usual choice past a
  // few tokens.
  bool one_token_kernels = false;
  // Whether the fast precision may use AMX tiles where the CPU has them (the GEMMs, the FP8
  // GEMV tiles, the expanded attention). False runs the kernels of a CPU with AVX-512 BF16 and
  // no AMX (VDPBF16PS), so that path is measured and tested on an AMX machine too.
  bool amx = true;
  // Where AMX is not used, which kernel runs the fast precision's prompt-sized bf16 products
  // (dispatch.h): VDPBF16PS (dpbf16_gemm.h) or float32 FMAs on weights widened from bf16
  // (fma_gemm.h). Auto takes the FMAs on a CPU where their peak measures at least 1.5x
  // VDPBF16PS's FLOPs (CpuFeatures::fma_gemm: the development Xeon, 2x), else VDPBF16PS.
  enum class VectorGemm { Auto, Vdpbf16ps, Fma };
  VectorGemm vector_gemm = VectorGemm::Auto;
  // Where AMX is not used, whether the fast precision's prompt-sized products of INT4 / INT8
  // group weights quantize the activations to int8 per chunk of 32 columns (a float32 scale
  // each, as llama.cpp's Q8_0 activations) and run on VNNI's VPDPBUSD (vnni_gemm.h: 64
  // multiply-adds an instruction against a float32 FMA's 16); with repack_weights, decode's INT4
  // and INT8 products too (INT4_WORDS16, INT8_WORDS16). False keeps those products on the bf16 /
  // float32 GEMMs above, activations as vector_gemm's kernel takes them.
  bool int8_activations = true;
  // Where the fast precision runs without AMX, whether Model::load rewrites the weights that only
  // matrix products read (the MLPs and experts, the attention's projections but kv_b, lm_head),
  // where they lie in its WeightArena, into the order the prompt's GEMMs compute in (repack.h):
  // bf16 into BF16_PAIRS32 (the VDPBF16PS and FMA GEMMs), INT4 and INT8 groups into
  // INT4_WORDS16 and INT8_WORDS16 (the VNNI GEMM, where int8_activations), so that a prompt's
  // products read them in place; decode's products of both then run on int8 activations too
  // (gemv.cpp's VNNI GEMV). False keeps them as stored.
  bool repack_weights = true;
  // DeepSeek Sparse Attention's indexer in the official code's FP8 arithmetic (model/indexer.h):
  // its queries and keys rounded to e4m3 with one scale per 128 values (power-of-two scales
  // where the checkpoint's scale_fmt is ue8m0) before they are scored; the products and sums
  // stay float32, as in DeepSeek's fp8_index. False scores the unrounded values (float32, or
  // bf16 q on the fast precision's kernels). Selected positions can change where two index
  // scores are close: the tests report how many, and the logits' distance, as for the fast
  // precision.
  bool fp8_indexer = false;

  // The thread count the kernels use: threads, or OpenMP's default when it is 0 (at least 1).
  int num_threads() const;
  bool fast() const { return precision == Precision::Fast; }
};

// A thread count as Context::threads reads it: n when positive, else OpenMP's default.
int threads_or_default(int n);

}  // namespace mla::cpu
