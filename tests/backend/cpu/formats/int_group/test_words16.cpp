// INT4_WORDS16 and INT8_WORDS16, integer groups repacked at load in blocks of 16 rows, on every
// kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"
#include "backend/cpu/formats/matrices.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/repack.h"
#include "tensor/dtype.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

// INT4_WORDS16 and INT8_WORDS16 (repack.h): INT4 and INT8 groups repacked in blocks of 16 rows
// hold the same weights (dequant_row, element, row slices in whole blocks, a view that starts
// inside its tensor's scales), and every kernel matmul dispatches them to computes their
// products: the VNNI GEMM reading the blocks in place must equal, bit for bit, the same GEMM on
// the row-major matrix (which packs each block into the order it then computes in); the GEMVs
// (float32 FMAs, and VDPBF16PS on bf16 activations) and the bf16 GEMMs (each row unpacked first)
// within the float32 bound of their summation (below).
TEST(Repack, Words16HoldsTheSameWeights) {
  std::mt19937 rng(23);
  const mla::cpu::Context ctx = kFast;
  for (const WeightFormat f : {WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP}) {
    const WeightFormat to = f == WeightFormat::INT8_GROUP ? WeightFormat::INT8_WORDS16 : WeightFormat::INT4_WORDS16;
    const std::string what = mla::weight_format_name(to);
    Owned m = random_matrix(f, 96, 160, rng);
    std::vector<uint8_t> copy = m.data, scopy = m.scales;
    MatrixView p = m.view;
    p.data = copy.data();
    p.scales = scopy.data();
    ASSERT_TRUE(mla::cpu::words16_eligible(p)) << what;
    mla::cpu::repack_words16(ctx, p);
    ASSERT_EQ(p.format, to);
    ASSERT_NE(std::memcmp(copy.data(), m.data.data(), copy.size()), 0) << what << ": nothing moved";
    ASSERT_NE(std::memcmp(scopy.data(), m.scales.data(), scopy.size()), 0) << what << ": no scale moved";
    std::vector<float> a(160), b(160);
    for (int64_t r = 0; r < 96; ++r) {
      m.view.dequant_row(r, a.data());
      p.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r;
      for (int64_t k : {0, 1, 3, 4, 7, 8, 31, 32, 159})
        ASSERT_EQ(mla::cpu::element(p, r, k), a[size_t(k)]) << what << " row " << r << " column " << k;
    }
    const MatrixView s = p.slice_rows(32, 48);
    for (int64_t r = 0; r < 48; ++r) {
      m.view.dequant_row(32 + r, a.data());
      s.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " sliced row " << r;
    }
    EXPECT_THROW((void)p.slice_rows(8, 16), std::out_of_range);
    // A view of rows 16.. of its tensor (row0 16: its scales begin inside the tensor's) repacks
    // its own rows and scales and leaves the others.
    std::vector<uint8_t> copy2 = m.data, scopy2 = m.scales;
    MatrixView whole = m.view;
    whole.data = copy2.data();
    whole.scales = scopy2.data();
    MatrixView part = whole.slice_rows(16, 32);
    mla::cpu::repack_words16(ctx, part);
    for (int64_t r = 0; r < 32; ++r) {
      m.view.dequant_row(16 + r, a.data());
      part.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r << " of the slice";
    }
    for (int64_t r : {0, 15, 48, 95}) {
      m.view.dequant_row(r, a.data());
      whole.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r << " outside the slice";
    }
    Owned odd = random_matrix(f, 40, 64, rng);
    EXPECT_FALSE(mla::cpu::words16_eligible(odd.view));
    EXPECT_THROW(mla::cpu::repack_words16(ctx, odd.view), std::invalid_argument);
    EXPECT_FALSE(mla::cpu::words16_eligible(m.view.slice_rows(8, 16)));  // starts inside a block
    Owned g48 = random_matrix(f, 32, 96, rng, 48);
    EXPECT_FALSE(mla::cpu::words16_eligible(g48.view));
  }
  Owned fp8 = random_matrix(WeightFormat::FP8_BLOCK128, 32, 64, rng);
  EXPECT_FALSE(mla::cpu::words16_eligible(fp8.view));
}

// y = W x of INT4 or INT8 groups on int8 activations as integers: per token and chunk of 32 columns,
// the exact sum of the weights' codes times the activations' codes (activations_int8), times
// both scales, summed in double: what the VNNI kernels compute before their float32 roundings.
// Each output's value and the sum of its chunks' magnitudes.
std::vector<std::pair<double, double>> vnni_exact(const MatrixView& W, const float* x, int64_t T, int64_t ldx) {
  const int64_t K = W.cols, Kc = K / 32;
  std::vector<int8_t> q(size_t(T * K));
  std::vector<float> qs(size_t(T * Kc));
  std::vector<int32_t> qc(size_t(T * Kc));
  mla::cpu::activations_int8(x, T, ldx, K, WeightFormat::INT8_GROUP, 128, q.data(), K, qs.data(), qc.data(), Kc);
  // The weight's code: INT8 a signed byte, INT4 nibble k % 8 of the row's word k / 8, less 8.
  auto code = [&](int64_t n, int64_t k) -> int64_t {
    const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
    if (W.format == WeightFormat::INT8_GROUP) return int8_t(row[k]);
    return int64_t((row[k / 2] >> (4 * (k % 2))) & 0xf) - 8;
  };
  const uint16_t* scales = static_cast<const uint16_t*>(W.scales);
  std::vector<std::pair<double, double>> y(size_t(T * W.rows));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < W.rows; ++n) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < Kc; ++c) {
        int64_t dot = 0;
        for (int64_t k = c * 32; k < c * 32 + 32; ++k) dot += code(n, k) * q[size_t(t * K + k)];
        const double s = mla::bf16_to_f32(scales[(W.row0 + n) * W.scale_cols + c * 32 / W.group_size]);
        const double term = double(dot) * s * double(qs[size_t(t * Kc + c)]);
        sum += term;
        mag += std::fabs(term);
      }
      y[size_t(t * W.rows + n)] = {sum, mag};
    }
  return y;
}

// The float32 bound of the GEMVs and bf16 GEMMs on the WORDS16 formats: per output and chunk of
// 32 columns, 4 chains of 8 products (float32 FMAs, or VDPBF16PS's exact products added in
// pairs), 3 additions, the group scale's product and the FMA into the total (a chain of
// cols / 32); the reference's float32 weights one more. m = cols / 8 + 16 roundings of u = 2^-24
// bound it. The WORDS16 formats' decode GEMV (VNNI, int8 activations) computes the VNNI GEMM's
// operations in the same order: the same results bit for bit, and within (cols / 32 + 2) u of
// the exact integer arithmetic (vnni_exact).
TEST(Repack, Words16ProductsOnEveryKernel) {
  std::mt19937 rng(29);
  mla::cpu::Context vnni = kFast, dp = kFast, bf16 = kFastBf16, host = kFast, precise = kPrecise;
  vnni.amx = dp.amx = bf16.amx = false;
  dp.int8_activations = false;
  dp.vector_gemm = mla::cpu::Context::VectorGemm::Vdpbf16ps;
  EXPECT_TRUE(mla::cpu::reads_words16(vnni));
  EXPECT_FALSE(mla::cpu::reads_words16(dp));
  EXPECT_FALSE(mla::cpu::reads_words16(precise));
  mla::cpu::Context off = vnni;
  off.repack_weights = false;
  EXPECT_FALSE(mla::cpu::reads_words16(off));
  struct Shape {
    int64_t rows, cols, group;
  };
  for (const WeightFormat f : {WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP})
    for (const Shape sh : {Shape{64, 2048, 32}, {48, 256, 64}, {32, 384, 128}, {16, 96, 32}}) {
      Owned m = random_matrix(f, sh.rows, sh.cols, rng, sh.group);
      std::vector<uint8_t> copy = m.data, scopy = m.scales;
      MatrixView p = m.view;
      p.data = copy.data();
      p.scales = scopy.data();
      mla::cpu::repack_words16(vnni, p);
      // The host context may use AMX, which never sees the WORDS16 formats in a model (repack.h:
      // reads_words16); its products of them are still defined, as above.
      for (const auto& [ctx, name] :
           {std::pair{&vnni, "vnni"}, {&dp, "vdpbf16ps"}, {&bf16, "bf16 gemv"}, {&host, "host"}, {&precise, "precise"}})
        for (int64_t T : {1, 2, 3, 4, 5, 7, 12, 13, 16, 17, 33, 48}) {
          const int64_t ldx = sh.cols + 3, ldy = sh.rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
          mla::cpu::matmul(*ctx, x.data(), T, ldx, p, y.data(), ldy);
          mla::cpu::matmul(*ctx, x.data(), T, ldx, m.view, ref.data(), ldy);
          const mla::cpu::Kernel k = mla::cpu::matmul_kernel(*ctx, T, p, mla::cpu::features(*ctx));
          const std::string what = std::string(mla::weight_format_name(p.format)) + " " + name + " " +
                                   std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " g" +
                                   std::to_string(sh.group) + " T=" + std::to_string(T) + " on " +
                                   mla::cpu::kernel_name(k);
          if (k == mla::cpu::Kernel::VnniGemm || k == mla::cpu::Kernel::GemvVnni) {
            // The row-major matrix through the VNNI GEMM itself (matmul would take its GEMV).
            if (k == mla::cpu::Kernel::GemvVnni) {
              std::fill(ref.begin(), ref.end(), -1.0f);
              mla::cpu::matmul_vnni(*ctx, x.data(), T, ldx, m.view, ref.data(), ldy);
              const auto exact = vnni_exact(m.view, x.data(), T, ldx);
              const double u = std::ldexp(1.0, -24) * double(sh.cols / 32 + 2);
              for (int64_t t = 0; t < T; ++t)
                for (int64_t n = 0; n < sh.rows; ++n) {
                  const auto [want, mag] = exact[size_t(t * sh.rows + n)];
                  ASSERT_LE(std::fabs(double(y[size_t(t * ldy + n)]) - want), u * mag + 1e-30)
                      << what << " row " << n << " token " << t;
                }
            } else {
              ASSERT_EQ(k, mla::cpu::matmul_kernel(*ctx, T, m.view, mla::cpu::features(*ctx))) << what;
            }
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = 0; n < sh.rows; ++n)
                ASSERT_EQ(y[size_t(t * ldy + n)], ref[size_t(t * ldy + n)]) << what << " row " << n << " token " << t;
          } else {
            // The bf16 GEMMs and GEMV round the activations to bf16 (the float32 GEMV and sgemm do
            // not); the GEMMs decode the weights to bf16 first ((q - 8) x scale rounded: the
            // reference rounds them too) and sum in their own order (oneDNN's, sgemm's): the bound of
            // the bf16 GEMMs' test, (cols + 16) u, for them.
            const bool gemv = k == mla::cpu::Kernel::GemvF32 || k == mla::cpu::Kernel::GemvBf16;
            const bool rounded = k == mla::cpu::Kernel::Dpbf16Gemm || k == mla::cpu::Kernel::AmxGemm ||
                                 k == mla::cpu::Kernel::OnednnBf16 || k == mla::cpu::Kernel::GemvBf16;
            const bool bf16_weights = !gemv && k != mla::cpu::Kernel::DequantSgemm && k != mla::cpu::Kernel::GemvReference;
            const double m_ = gemv ? double(sh.cols) / 8 + 16 : double(sh.cols) + 16;
            expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, m_ * std::ldexp(1.0, -24), 1e-30, bf16_weights, what,
                              rounded);
          }
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = sh.rows; n < ldy; ++n)
              ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << what << ": wrote past the rows";
        }
    }
}


}  // namespace
