// llama.cpp's block formats (formats/ggml/): each format's float32 decoder, read back through the
// GEMV, equals the reference (tensor/ggml_blocks.h) bit for bit; the decode GEMV of 1 to 16
// tokens and the prompt's bf16 GEMMs match W x in double over odd row counts and columns of
// several blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/formats/gemv.h"
#include "backend/cpu/formats/matrices.h"
#include "backend/cpu/formats/registry.h"
#include "tensor/ggml_blocks.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

const WeightFormat kGgml[] = {WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
                              WeightFormat::Q8_0, WeightFormat::Q2_K, WeightFormat::Q3_K, WeightFormat::Q4_K,
                              WeightFormat::Q5_K, WeightFormat::Q6_K};

// Row lengths of one block, a few, and many (17 blocks of 32: not a multiple of 16 blocks).
std::vector<int64_t> cols_of(WeightFormat f) {
  if (mla::ggml_block(f).values == 32) return {32, 96, 544};
  return {256, 768, 1280};
}

std::string name_of(WeightFormat f, int64_t rows, int64_t cols, int64_t T) {
  return std::string(mla::weight_format_name(f)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
         " T=" + std::to_string(T);
}

TEST(Ggml, Float32DecodersEqualTheReference) {
  // Token t's activations are the unit vector e_{k0 + t}: each output of the float32 GEMV is then
  // one decoded weight times 1 among FMAs of zeros (exact), which must equal dequant_row's.
  std::mt19937 rng(41);
  for (WeightFormat f : kGgml) {
    const int64_t rows = 5, cols = cols_of(f)[1], T = 16;
    ASSERT_EQ(mla::cpu::gemv_kernel(kPrecise, T, MatrixView{f, rows, cols}, mla::cpu::host_features()),
              mla::cpu::Kernel::GemvF32);
    Owned m = random_matrix(f, rows, cols, rng);
    std::vector<float> ref(size_t(rows * cols));
    for (int64_t n = 0; n < rows; ++n) m.view.dequant_row(n, ref.data() + n * cols);
    for (int64_t k0 = 0; k0 < cols; k0 += T) {
      std::vector<float> x(size_t(T * cols), 0.0f), y(size_t(T * rows));
      for (int64_t t = 0; t < T; ++t) x[size_t(t * cols + k0 + t)] = 1.0f;
      mla::cpu::gemv(kPrecise, x.data(), T, cols, m.view, y.data(), rows);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < rows; ++n)
          ASSERT_EQ(y[size_t(t * rows + n)], ref[size_t(n * cols + k0 + t)])
              << mla::weight_format_name(f) << " row " << n << " column " << k0 + t;
    }
  }
}

TEST(Ggml, GemvMatchesReference) {
  // The float32 GEMV of any token count: decoded weights exact (above), each output summed in 32
  // chains of cols / 32 FMAs (a lane of a chunk's two halves), the halves added and the 16
  // lanes summed in 5 more: at most (cols / 32 + 5) roundings, (cols / 32 + 8) 2^-24 of the sum
  // of the terms' magnitudes against W x in double.
  std::mt19937 rng(43);
  for (WeightFormat f : kGgml)
    for (int64_t rows : {1, 3, 7, 33, 130})
      for (int64_t cols : cols_of(f)) {
        Owned m = random_matrix(f, rows, cols, rng);
        for (int64_t T = 1; T <= 16; ++T) {
          const int64_t ldx = cols + 3, ldy = rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f);
          mla::cpu::gemv(kPrecise, x.data(), T, ldx, m.view, y.data(), ldy);
          expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, (double(cols) / 32 + 8) * std::ldexp(1.0, -24), 1e-30,
                            false, name_of(f, rows, cols, T), false);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
        }
      }
}

TEST(Ggml, PromptGemmsMatchReference) {
  // The prompt's bf16 GEMMs on rows decoded through row_bf16 (Bf16Weights::Decoded): the decoded
  // weights rounded to bf16 are the reference's rounded (the float32 decoders are exact), so the
  // bounds of test_matmul.cpp's prompt-sized products hold: VDPBF16PS (cols / 16 + 16) 2^-24 of
  // the terms on bf16 activations, its paired kernel and the FMA kernel (cols + 16) 2^-24 (FMA:
  // float32 activations); AMX tiles, where the CPU has them, (cols / 2 + 16) 2^-24.
  std::mt19937 rng(47);
  for (auto vg : {mla::cpu::Context::VectorGemm::Vdpbf16ps, mla::cpu::Context::VectorGemm::Fma}) {
    mla::cpu::Context ctx = kFastBf16;
    ctx.vector_gemm = vg;
    for (WeightFormat f : kGgml)
      for (int64_t rows : {33, 77})
        for (int64_t cols : cols_of(f))
          for (int64_t T : {13, 17, 40, 70}) {
            Owned m = random_matrix(f, rows, cols, rng);
            const int64_t ldx = cols + 3, ldy = rows + 5;
            auto x = random_vec(size_t(T * ldx), rng);
            std::vector<float> y(size_t(T * ldy), -1.0f);
            mla::cpu::matmul_bf16(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
            const mla::cpu::Kernel k = mla::cpu::gemm_bf16_kernel(T, m.view, mla::cpu::features(ctx));
            const bool fma = k == mla::cpu::Kernel::FmaGemm;
            const bool pairs = k == mla::cpu::Kernel::Dpbf16Gemm && T >= mla::cpu::kDpbf16PairsMinTokens;
            const double per_column = fma || pairs ? 1.0 : k == mla::cpu::Kernel::AmxGemm ? 0.5 : 1.0 / 16;
            expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, (double(cols) * per_column + 16) * std::ldexp(1.0, -24),
                              0.0, true, name_of(f, rows, cols, T) + " on " + mla::cpu::kernel_name(k), !fma);
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
          }
  }
}

}  // namespace
