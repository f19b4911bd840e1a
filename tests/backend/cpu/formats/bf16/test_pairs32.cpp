// BF16_PAIRS32, bf16 weights repacked at load as column pairs, on every kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/formats/matrices.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/repack.h"
#include "tensor/dtype.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

// BF16_PAIRS32 (repack.h): a bf16 matrix repacked holds the same weights (dequant_row, element,
// row slices in whole blocks, gate and up concatenated), and every kernel matmul dispatches it
// to computes its products: the GEMV of a few tokens (float32 FMAs on the float32 activations,
// per output two chains of K / 2 columns), the VDPBF16PS and FMA GEMMs reading the blocks in
// place, which must equal, bit for bit, the same kernels on the row-major matrix (they pack
// each block into exactly this order first), and AMX / oneDNN, which unpack it again.
TEST(Repack, Pairs32HoldsTheSameWeights) {
  std::mt19937 rng(5);
  Owned m = random_matrix(WeightFormat::BF16, 96, 160, rng);
  std::vector<uint8_t> copy = m.data;
  MatrixView p = m.view;
  p.data = copy.data();
  mla::cpu::Context ctx = kFastBf16;
  ASSERT_TRUE(mla::cpu::pairs32_eligible(p));
  mla::cpu::repack_pairs32(ctx, p);
  ASSERT_EQ(p.format, WeightFormat::BF16_PAIRS32);
  ASSERT_NE(std::memcmp(copy.data(), m.data.data(), copy.size()), 0) << "nothing moved";
  std::vector<float> a(160), b(160);
  for (int64_t r = 0; r < 96; ++r) {
    m.view.dequant_row(r, a.data());
    p.dequant_row(r, b.data());
    ASSERT_EQ(a, b) << "row " << r;
    for (int64_t k : {0, 1, 31, 32, 159}) ASSERT_EQ(mla::cpu::element(p, r, k), a[size_t(k)]);
  }
  const MatrixView s = p.slice_rows(32, 64);
  for (int64_t r = 0; r < 64; ++r) {
    m.view.dequant_row(32 + r, a.data());
    s.dequant_row(r, b.data());
    ASSERT_EQ(a, b) << "sliced row " << r;
  }
  EXPECT_THROW((void)p.slice_rows(16, 32), std::out_of_range);
  const auto both = mla::concat_rows(p.slice_rows(0, 32), p.slice_rows(32, 64));
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->rows, 96);
  Owned odd = random_matrix(WeightFormat::BF16, 40, 64, rng);
  EXPECT_FALSE(mla::cpu::pairs32_eligible(odd.view));
  EXPECT_THROW(mla::cpu::repack_pairs32(ctx, odd.view), std::invalid_argument);
}

TEST(Repack, Pairs32ProductsOnEveryKernel) {
  std::mt19937 rng(17);
  mla::cpu::Context dp = kFast, fma = kFast, host = kFast, precise = kPrecise;
  dp.amx = fma.amx = false;
  dp.vector_gemm = mla::cpu::Context::VectorGemm::Vdpbf16ps;
  fma.vector_gemm = mla::cpu::Context::VectorGemm::Fma;
  EXPECT_TRUE(mla::cpu::reads_pairs32(dp));
  EXPECT_FALSE(mla::cpu::reads_pairs32(precise));
  mla::cpu::Context off = dp;
  off.repack_weights = false;
  EXPECT_FALSE(mla::cpu::reads_pairs32(off));
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 2048}, {96, 160}, {32, 32}}) {
    Owned m = random_matrix(WeightFormat::BF16, rows, cols, rng);
    std::vector<uint8_t> copy = m.data;
    MatrixView p = m.view;
    p.data = copy.data();
    mla::cpu::repack_pairs32(dp, p);
    for (const auto& [ctx, name] : {std::pair{&dp, "vdpbf16ps"}, {&fma, "fma"}, {&host, "host"}, {&precise, "precise"}})
      for (int64_t T : {1, 2, 3, 4, 5, 7, 12, 13, 16, 17, 33, 48, 100}) {
        const int64_t ldx = cols + 3, ldy = rows + 5;
        auto x = random_vec(size_t(T * ldx), rng);
        std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
        mla::cpu::matmul(*ctx, x.data(), T, ldx, p, y.data(), ldy);
        mla::cpu::matmul(*ctx, x.data(), T, ldx, m.view, ref.data(), ldy);
        const mla::cpu::Kernel k = mla::cpu::matmul_kernel(*ctx, T, p, mla::cpu::features(*ctx));
        const std::string what = std::string(name) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                 " T=" + std::to_string(T) + " on " + mla::cpu::kernel_name(k);
        // The bf16 GEMMs and GEMV round the activations to bf16 (the FMA GEMM, the float32
        // GEMV and sgemm do not); per output at most one rounding a column in float32.
        const bool rounded = k == mla::cpu::Kernel::Dpbf16Gemm || k == mla::cpu::Kernel::AmxGemm ||
                             k == mla::cpu::Kernel::OnednnBf16 || k == mla::cpu::Kernel::GemvBf16;
        expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, (double(cols) + 16) * std::ldexp(1.0, -24), 1e-30, false,
                          what, rounded);
        const bool same_kernel = k == mla::cpu::matmul_kernel(*ctx, T, m.view, mla::cpu::features(*ctx));
        if (same_kernel && (k == mla::cpu::Kernel::FmaGemm ||
                            (k == mla::cpu::Kernel::Dpbf16Gemm && T >= mla::cpu::kDpbf16PairsMinTokens))) {
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < rows; ++n)
              ASSERT_EQ(y[size_t(t * ldy + n)], ref[size_t(t * ldy + n)]) << what << " row " << n << " token " << t;
        }
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << what << ": wrote past the rows";
      }
  }
}


}  // namespace
