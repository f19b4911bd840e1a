// The dispatch rule (backend/cpu/dispatch.h): which kernel a product of T tokens runs on, for
// each precision, weight format and CPU (with and without AMX, passed in: the table holds on
// any machine), and the context's defaults.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/context.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/registry.h"
#include "tensor/matrix.h"

namespace {

using mla::MatrixView;
using mla::WeightFormat;
using mla::cpu::Context;
using mla::cpu::CpuFeatures;
using mla::cpu::Kernel;

MatrixView weight(WeightFormat f, int64_t cols = 7168, int64_t group = 32) {
  MatrixView w;  // the rule reads the format, the columns and the INT4 / INT8 group size, never the data
  w.format = f;
  w.rows = 2048;
  w.cols = cols;
  w.group_size = mla::is_int_group(f) ? group : 0;
  return w;
}

Context context(mla::cpu::Precision p, int64_t bf16_max_tokens = 1) {
  Context c;
  c.precision = p;
  c.gemv_bf16_max_tokens = bf16_max_tokens;
  return c;
}

const int64_t kTokens[] = {1, 2, 4, 5, 12, 13, 16, 17, 127, 128, 1000};

// The kernels of matmul over kTokens, by short names, for reading the table below.
std::string row(const Context& ctx, const MatrixView& w, const CpuFeatures& f) {
  std::string s;
  for (int64_t T : kTokens) {
    switch (mla::cpu::matmul_kernel(ctx, T, w, f)) {
      case Kernel::GemvReference: s += " ref"; break;
      case Kernel::GemvF32: s += " f32"; break;
      case Kernel::GemvBf16: s += " bf16"; break;
      case Kernel::GemvAmxFp8: s += " tile"; break;
      case Kernel::GemvVnni: s += " vgemv"; break;
      case Kernel::AmxGemm: s += " amx"; break;
      case Kernel::Dpbf16Gemm: s += " dp"; break;
      case Kernel::FmaGemm: s += " fma"; break;
      case Kernel::VnniGemm: s += " vnni"; break;
      case Kernel::OnednnBf16: s += " dnnl"; break;
      case Kernel::Sgemm: s += " sgemm"; break;
      case Kernel::DequantSgemm: s += " deq"; break;
    }
  }
  return s.substr(1);
}

struct Row {
  const char* name;
  MatrixView w;
  const char* kernels;  // over kTokens: 1 2 4 5 12 13 16 17 127 128 1000
};

TEST(Dispatch, FastWithAmx) {
  const Context fast = context(mla::cpu::Precision::Fast);
  const CpuFeatures amx{true};
  const Row rows[] = {
      {"f32", weight(WeightFormat::F32), "f32 f32 f32 f32 f32 amx amx amx amx dnnl dnnl"},
      {"f16", weight(WeightFormat::F16), "f32 f32 f32 f32 f32 amx amx amx amx dnnl dnnl"},
      {"bf16", weight(WeightFormat::BF16), "bf16 f32 f32 amx amx amx amx amx amx dnnl dnnl"},
      {"fp8", weight(WeightFormat::FP8_BLOCK128), "bf16 tile tile tile tile tile tile amx amx dnnl dnnl"},
      {"int4 g32", weight(WeightFormat::INT4_GROUP), "bf16 f32 f32 f32 f32 amx amx amx amx dnnl dnnl"},
      {"int4 g128", weight(WeightFormat::INT4_GROUP, 7168, 128), "bf16 f32 f32 f32 f32 amx amx amx amx dnnl dnnl"},
      {"int4 g48", weight(WeightFormat::INT4_GROUP, 7152, 48), "ref ref ref ref ref deq deq deq deq deq deq"},
      {"int8 g32", weight(WeightFormat::INT8_GROUP), "f32 f32 f32 f32 f32 amx amx amx amx dnnl dnnl"},
      {"int8 g64", weight(WeightFormat::INT8_GROUP, 7168, 64), "f32 f32 f32 f32 f32 amx amx amx amx dnnl dnnl"},
      {"int8 g48", weight(WeightFormat::INT8_GROUP, 7152, 48), "ref ref ref ref ref deq deq deq deq deq deq"},
      // K not a multiple of 32: no AMX GEMM; FP8 narrower than a 64-column step: no tiles.
      {"bf16 K=33", weight(WeightFormat::BF16, 33), "bf16 f32 f32 dnnl dnnl dnnl dnnl dnnl dnnl dnnl dnnl"},
      {"fp8 K=32", weight(WeightFormat::FP8_BLOCK128, 32), "bf16 f32 f32 f32 f32 f32 f32 amx amx dnnl dnnl"},
  };
  for (const Row& r : rows) EXPECT_EQ(row(fast, r.w, amx), r.kernels) << r.name;
}

TEST(Dispatch, FastWithoutAmx) {
  // No tiles: FP8 keeps the GEMV up to 12 tokens like INT4, every GEMM with K % 32 == 0 goes to
  // the VDPBF16PS GEMM at any token count, other K to oneDNN; INT4 / INT8 groups of a multiple of
  // 32 past the GEMV go to the VNNI GEMM on int8 activations.
  const Context fast = context(mla::cpu::Precision::Fast);
  const CpuFeatures no_amx{false};
  const Row rows[] = {
      {"f32", weight(WeightFormat::F32), "f32 f32 f32 f32 f32 dp dp dp dp dp dp"},
      {"f16", weight(WeightFormat::F16), "f32 f32 f32 f32 f32 dp dp dp dp dp dp"},
      {"bf16", weight(WeightFormat::BF16), "bf16 f32 f32 dp dp dp dp dp dp dp dp"},
      {"fp8", weight(WeightFormat::FP8_BLOCK128), "bf16 f32 f32 f32 f32 dp dp dp dp dp dp"},
      {"int4 g32", weight(WeightFormat::INT4_GROUP), "bf16 f32 f32 f32 f32 vnni vnni vnni vnni vnni vnni"},
      {"int4 g48", weight(WeightFormat::INT4_GROUP, 7152, 48), "ref ref ref ref ref deq deq deq deq deq deq"},
      {"bf16 K=7150", weight(WeightFormat::BF16, 7150), "bf16 f32 f32 dnnl dnnl dnnl dnnl dnnl dnnl dnnl dnnl"},
      {"int8 g32", weight(WeightFormat::INT8_GROUP), "f32 f32 f32 f32 f32 vnni vnni vnni vnni vnni vnni"},
      {"int8 g48", weight(WeightFormat::INT8_GROUP, 7152, 48), "ref ref ref ref ref deq deq deq deq deq deq"},
      // Repacked at load (repack.h): decode on the VNNI GEMV too.
      {"int8 words16", weight(WeightFormat::INT8_WORDS16), "vgemv vgemv vgemv vgemv vgemv vnni vnni vnni vnni vnni vnni"},
      {"int4 words16", weight(WeightFormat::INT4_WORDS16), "vgemv vgemv vgemv vgemv vgemv vnni vnni vnni vnni vnni vnni"},
  };
  for (const Row& r : rows) EXPECT_EQ(row(fast, r.w, no_amx), r.kernels) << r.name;
}

TEST(Dispatch, FastWithoutAmxWhereFmaOutrunsVdpbf16ps) {
  // The same, but from 16 tokens on the FMA GEMM takes what went to VDPBF16PS (the VNNI GEMM
  // keeps INT4 / INT8).
  const Context fast = context(mla::cpu::Precision::Fast);
  const CpuFeatures fma{false, true};
  const Row rows[] = {
      {"f32", weight(WeightFormat::F32), "f32 f32 f32 f32 f32 dp fma fma fma fma fma"},
      {"bf16", weight(WeightFormat::BF16), "bf16 f32 f32 dp dp dp fma fma fma fma fma"},
      {"fp8", weight(WeightFormat::FP8_BLOCK128), "bf16 f32 f32 f32 f32 dp fma fma fma fma fma"},
      {"int4 g32", weight(WeightFormat::INT4_GROUP), "bf16 f32 f32 f32 f32 vnni vnni vnni vnni vnni vnni"},
      {"int4 g48", weight(WeightFormat::INT4_GROUP, 7152, 48), "ref ref ref ref ref deq deq deq deq deq deq"},
      {"bf16 K=7150", weight(WeightFormat::BF16, 7150), "bf16 f32 f32 dnnl dnnl dnnl dnnl dnnl dnnl dnnl dnnl"},
      {"int8 g32", weight(WeightFormat::INT8_GROUP), "f32 f32 f32 f32 f32 vnni vnni vnni vnni vnni vnni"},
  };
  for (const Row& r : rows) EXPECT_EQ(row(fast, r.w, fma), r.kernels) << r.name;
  // With AMX, the tiles keep every product they took.
  EXPECT_EQ(row(fast, weight(WeightFormat::BF16), CpuFeatures{true, true}), "bf16 f32 f32 amx amx amx amx amx amx dnnl dnnl");
}

TEST(Dispatch, Int8ActivationsOffKeepsIntWeightsOnTheBf16Gemms) {
  // Context::int8_activations false: INT4 / INT8 prompts go where the other formats' go.
  Context fast = context(mla::cpu::Precision::Fast);
  fast.int8_activations = false;
  for (WeightFormat f : {WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP}) {
    const std::string one = f == WeightFormat::INT8_GROUP ? "f32" : "bf16";  // INT8: no bf16 GEMV
    EXPECT_EQ(row(fast, weight(f), CpuFeatures{false, false}), one + " f32 f32 f32 f32 dp dp dp dp dp dp");
    EXPECT_EQ(row(fast, weight(f), CpuFeatures{false, true}), one + " f32 f32 f32 f32 dp fma fma fma fma fma");
  }
  // INT8_WORDS16 (repacked where int8 activations were on): the GEMV's only kernel for it is
  // the VNNI one, so a context without them takes the reference.
  EXPECT_EQ(row(fast, weight(WeightFormat::INT8_WORDS16), CpuFeatures{false, false}),
            "ref ref ref ref ref dp dp dp dp dp dp");
  // INT4_WORDS16 keeps the bf16 and float32 GEMVs (gemv.cpp's words16 kernels).
  EXPECT_EQ(row(fast, weight(WeightFormat::INT4_WORDS16), CpuFeatures{false, false}),
            "bf16 f32 f32 f32 f32 dp dp dp dp dp dp");
  // The precise precision never quantizes activations.
  const Context precise = context(mla::cpu::Precision::Precise);
  EXPECT_EQ(row(precise, weight(WeightFormat::INT4_GROUP), CpuFeatures{false, true}),
            "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq");
}

TEST(Dispatch, ContextWithoutAmxTakesThePathOfACpuWithout) {
  // Context::amx false masks the host's AMX: the features the kernels see have none, so the
  // table is the one above on any CPU.
  // Context::vector_gemm then picks VDPBF16PS or the FMAs over the host's measured choice.
  Context ctx = context(mla::cpu::Precision::Fast);
  ctx.amx = false;
  EXPECT_FALSE(mla::cpu::features(ctx).amx);
  EXPECT_EQ(mla::cpu::features(ctx).fma_gemm, mla::cpu::host_features().fma_gemm);
  ctx.vector_gemm = Context::VectorGemm::Vdpbf16ps;
  EXPECT_EQ(row(ctx, weight(WeightFormat::BF16), mla::cpu::features(ctx)), "bf16 f32 f32 dp dp dp dp dp dp dp dp");
  ctx.vector_gemm = Context::VectorGemm::Fma;
  EXPECT_EQ(row(ctx, weight(WeightFormat::BF16), mla::cpu::features(ctx)), "bf16 f32 f32 dp dp dp fma fma fma fma fma");
  ctx.amx = true;
  EXPECT_EQ(mla::cpu::features(ctx).amx, mla::cpu::host_features().amx);
}

TEST(Dispatch, PreciseIgnoresAmxAndTheBf16Threshold) {
  // float32 throughout: the GEMV up to 16 tokens, then sgemm (dequantized blocks but for F32).
  const Row rows[] = {
      {"f32", weight(WeightFormat::F32), "f32 f32 f32 f32 f32 f32 f32 sgemm sgemm sgemm sgemm"},
      {"f16", weight(WeightFormat::F16), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq"},
      {"bf16", weight(WeightFormat::BF16), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq"},
      {"fp8", weight(WeightFormat::FP8_BLOCK128), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq"},
      {"int4 g32", weight(WeightFormat::INT4_GROUP), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq"},
      {"int4 g48", weight(WeightFormat::INT4_GROUP, 7152, 48), "ref ref ref ref ref ref ref deq deq deq deq"},
      {"int8 g32", weight(WeightFormat::INT8_GROUP), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq"},
      {"int8 g48", weight(WeightFormat::INT8_GROUP, 7152, 48), "ref ref ref ref ref ref ref deq deq deq deq"},
      {"int8 words16", weight(WeightFormat::INT8_WORDS16), "ref ref ref ref ref ref ref deq deq deq deq"},
      {"int4 words16", weight(WeightFormat::INT4_WORDS16), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq"},
  };
  for (const Context& ctx : {context(mla::cpu::Precision::Precise), context(mla::cpu::Precision::Precise, 1000)})
    for (bool amx : {true, false})
      for (const Row& r : rows) EXPECT_EQ(row(ctx, r.w, CpuFeatures{amx}), r.kernels) << r.name << " amx " << amx;
}

TEST(Dispatch, Bf16ThresholdMovesTheGemvKernels) {
  // Raised, the VDPBF16PS kernels serve every token count the GEMV takes; FP8 on AMX keeps its
  // tiles for 2 to 16 tokens; F32, F16 and INT8 have no bf16 GEMV; matmul's GEMM thresholds stay.
  const Context all = context(mla::cpu::Precision::Fast, int64_t(1) << 40);
  const CpuFeatures amx{true}, no_amx{false};
  EXPECT_EQ(row(all, weight(WeightFormat::BF16), amx), "bf16 bf16 bf16 amx amx amx amx amx amx dnnl dnnl");
  EXPECT_EQ(row(all, weight(WeightFormat::FP8_BLOCK128), amx), "bf16 tile tile tile tile tile tile amx amx dnnl dnnl");
  EXPECT_EQ(row(all, weight(WeightFormat::FP8_BLOCK128), no_amx), "bf16 bf16 bf16 bf16 bf16 dp dp dp dp dp dp");
  EXPECT_EQ(row(all, weight(WeightFormat::INT4_GROUP), amx), "bf16 bf16 bf16 bf16 bf16 amx amx amx amx dnnl dnnl");
  EXPECT_EQ(row(all, weight(WeightFormat::INT8_GROUP), amx), "f32 f32 f32 f32 f32 amx amx amx amx dnnl dnnl");
  EXPECT_EQ(row(all, weight(WeightFormat::INT8_GROUP), no_amx), "f32 f32 f32 f32 f32 vnni vnni vnni vnni vnni vnni");
  EXPECT_EQ(row(all, weight(WeightFormat::F16), amx), "f32 f32 f32 f32 f32 amx amx amx amx dnnl dnnl");
  // gemv and gemv_batch take any token count; beyond 16 FP8 leaves the tiles.
  EXPECT_EQ(mla::cpu::gemv_kernel(all, 100, weight(WeightFormat::BF16), amx), Kernel::GemvBf16);
  EXPECT_EQ(mla::cpu::gemv_kernel(all, 17, weight(WeightFormat::FP8_BLOCK128), amx), Kernel::GemvBf16);
  const Context fast = context(mla::cpu::Precision::Fast);
  EXPECT_EQ(mla::cpu::gemv_kernel(fast, 17, weight(WeightFormat::FP8_BLOCK128), amx), Kernel::GemvF32);
  EXPECT_EQ(mla::cpu::gemv_kernel(fast, 1, weight(WeightFormat::F32), amx), Kernel::GemvF32);
}

TEST(Dispatch, GemvTokensAndGemmKernelAgreeWithMatmul) {
  const Context fast = context(mla::cpu::Precision::Fast), precise;
  for (bool amx : {true, false})
    for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::FP8_BLOCK128,
                           WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP})
      for (const Context* ctx : {&fast, &precise}) {
        const CpuFeatures feat{amx};
        const MatrixView w = weight(f);
        const int64_t g = mla::cpu::gemv_max_tokens(*ctx, w, feat);
        for (int64_t T = 1; T <= 300; ++T) {
          const Kernel k = mla::cpu::matmul_kernel(*ctx, T, w, feat);
          EXPECT_EQ(mla::cpu::is_gemv(k), T <= g) << mla::cpu::kernel_name(k) << " T=" << T;
          if (T <= g) {
            EXPECT_EQ(k, mla::cpu::gemv_kernel(*ctx, T, w, feat));
          } else if (ctx->fast() && mla::is_int_group(f) && !amx) {
            EXPECT_EQ(k, Kernel::VnniGemm);
          } else if (ctx->fast()) {
            EXPECT_EQ(k, mla::cpu::gemm_bf16_kernel(T, w, feat));
          }
        }
      }
}

TEST(Dispatch, GgmlBlockFormats) {
  // llama.cpp's block formats: in the fast precision with int8 activations the VNNI GEMV up to
  // 12 tokens (where the build has it: formats/ggml/kernels.h), then the prompt's bf16 GEMMs on
  // rows decoded through row_bf16; otherwise the float32 GEMV; precise: float32, then dequantized
  // blocks into sgemm.
  const Context fast = context(mla::cpu::Precision::Fast), precise = context(mla::cpu::Precision::Precise);
  Context no_int8 = fast;
  no_int8.int8_activations = false;
  for (WeightFormat f : {WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
                         WeightFormat::Q8_0, WeightFormat::Q2_K, WeightFormat::Q3_K, WeightFormat::Q4_K,
                         WeightFormat::Q5_K, WeightFormat::Q6_K}) {
    const std::string name = mla::weight_format_name(f);
    const std::string gemv = mla::cpu::format_kernels(f).gemv_vnni ? "vgemv" : "f32";
    const std::string five = gemv + " " + gemv + " " + gemv + " " + gemv + " " + gemv;
    EXPECT_EQ(row(fast, weight(f), CpuFeatures{true}), five + " amx amx amx amx dnnl dnnl") << name;
    EXPECT_EQ(row(fast, weight(f), CpuFeatures{false}), five + " dp dp dp dp dp dp") << name;
    EXPECT_EQ(row(fast, weight(f), CpuFeatures{false, true}), five + " dp fma fma fma fma fma") << name;
    EXPECT_EQ(row(no_int8, weight(f), CpuFeatures{false}), "f32 f32 f32 f32 f32 dp dp dp dp dp dp") << name;
    EXPECT_EQ(row(precise, weight(f), CpuFeatures{false}), "f32 f32 f32 f32 f32 f32 f32 deq deq deq deq") << name;
  }
}

TEST(Dispatch, KernelNamesAreDistinct) {
  std::vector<std::string> names;
  for (Kernel k : {Kernel::GemvReference, Kernel::GemvF32, Kernel::GemvBf16, Kernel::GemvAmxFp8, Kernel::AmxGemm,
                   Kernel::Dpbf16Gemm, Kernel::FmaGemm, Kernel::VnniGemm, Kernel::OnednnBf16, Kernel::Sgemm, Kernel::DequantSgemm}) {
    for (const auto& n : names) EXPECT_NE(n, mla::cpu::kernel_name(k));
    names.push_back(mla::cpu::kernel_name(k));
  }
}

TEST(Context, DefaultsAndThreads) {
  const Context c;
  EXPECT_EQ(c.precision, mla::cpu::Precision::Precise);
  EXPECT_EQ(c.threads, 0);
  EXPECT_EQ(c.weights, mla::cpu::WeightPlacement::Auto);
  EXPECT_EQ(c.gemv_bf16_max_tokens, 1);
  EXPECT_TRUE(c.amx);  // AMX wherever the CPU has it
  EXPECT_EQ(c.vector_gemm, Context::VectorGemm::Auto);  // FMAs or VDPBF16PS as measured
  EXPECT_TRUE(c.int8_activations);  // INT4 / INT8 prompts on VNNI where AMX is not used
  EXPECT_GE(c.num_threads(), 1);  // 0: OpenMP's default
  Context three;
  three.threads = 3;
  EXPECT_EQ(three.num_threads(), 3);
  EXPECT_EQ(mla::cpu::threads_or_default(5), 5);
  EXPECT_EQ(mla::cpu::threads_or_default(0), c.num_threads());
}

}  // namespace
