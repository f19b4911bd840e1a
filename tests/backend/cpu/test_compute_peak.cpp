// The compute-peak probe (backend/cpu/compute_peak.h): the FLOPs it credits each instruction
// with, checked against what its own loop computes. With the first operand 1.0 and the second b
// (a power of two), every product is b and every output sums them exactly, so the sum of the
// outputs is instructions x products per instruction x b: a wrong count per instruction, or a
// loop that issues fewer instructions than it reports, fails.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/compute_peak.h"
#include "backend/cpu/dispatch.h"

namespace {

using mla::cpu::PeakPath;

void expect_flops_match_the_loop(PeakPath p) {
  const float b = std::ldexp(1.0f, -10);
  for (int64_t iters : {1, 7, 1000}) {
    const mla::cpu::PeakRun r = mla::cpu::peak_loop(p, iters, b);
    ASSERT_GT(r.instructions, 0);
    const double products = r.sum / double(b);
    EXPECT_EQ(products, double(r.instructions) * mla::cpu::flops_per_instruction(p) / 2)
        << mla::cpu::peak_path_name(p) << " iters " << iters;
  }
}

TEST(ComputePeak, Vdpbf16psFlopsPerInstruction) {
  // The engine is built for AVX-512 BF16: every CPU it runs on has this path.
  EXPECT_EQ(mla::cpu::flops_per_instruction(PeakPath::Vdpbf16ps), 64.0);
  expect_flops_match_the_loop(PeakPath::Vdpbf16ps);
}

TEST(ComputePeak, FmaFlopsPerInstruction) {
  EXPECT_EQ(mla::cpu::flops_per_instruction(PeakPath::Fma), 32.0);
  expect_flops_match_the_loop(PeakPath::Fma);
}

TEST(ComputePeak, VnniOpsPerInstruction) {
  // AVX-512 VNNI comes with AVX-512 BF16 on every CPU that has the latter (Cooper Lake, Sapphire
  // Rapids on, AMD Zen 4 on).
  EXPECT_EQ(mla::cpu::flops_per_instruction(PeakPath::Vnni), 128.0);
  expect_flops_match_the_loop(PeakPath::Vnni);
}

TEST(ComputePeak, AmxTilesFlopsPerInstruction) {
  if (!mla::cpu::amx_available()) GTEST_SKIP() << "this CPU has no AMX-BF16 tiles (or the kernel did not grant them)";
  EXPECT_EQ(mla::cpu::flops_per_instruction(PeakPath::AmxTiles), 16384.0);
  expect_flops_match_the_loop(PeakPath::AmxTiles);
}

TEST(ComputePeak, PathFollowsTheContext) {
  using VectorGemm = mla::cpu::Context::VectorGemm;
  mla::cpu::Context ctx;
  ctx.precision = mla::cpu::Precision::Fast;
  const auto host = mla::cpu::host_features();
  EXPECT_EQ(mla::cpu::prompt_peak_path(ctx),
            host.amx ? PeakPath::AmxTiles : host.fma_gemm ? PeakPath::Fma : PeakPath::Vdpbf16ps);
  ctx.amx = false;
  EXPECT_EQ(mla::cpu::prompt_peak_path(ctx), host.fma_gemm ? PeakPath::Fma : PeakPath::Vdpbf16ps);
  ctx.vector_gemm = VectorGemm::Vdpbf16ps;
  EXPECT_EQ(mla::cpu::prompt_peak_path(ctx), PeakPath::Vdpbf16ps);
  ctx.vector_gemm = VectorGemm::Fma;
  EXPECT_EQ(mla::cpu::prompt_peak_path(ctx), PeakPath::Fma);
  // INT4 / INT8 experts: the VNNI GEMM's, unless the context keeps their activations in bf16.
  EXPECT_EQ(mla::cpu::prompt_peak_path(ctx, true), PeakPath::Vnni);
  ctx.int8_activations = false;
  EXPECT_EQ(mla::cpu::prompt_peak_path(ctx, true), PeakPath::Fma);
}

TEST(ComputePeak, MeasuresAPositiveRate) {
  const PeakPath p = mla::cpu::host_features().amx ? PeakPath::AmxTiles : PeakPath::Vdpbf16ps;
  EXPECT_GT(mla::cpu::peak_gflops(p, 1, 1, mla::cpu::peak_iters(p, 1)), 0.0);
}

}  // namespace
