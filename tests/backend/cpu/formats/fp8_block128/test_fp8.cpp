// FP8 block-128 weights: every e4m3 code through every kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/formats/matrices.h"
#include "tensor/dtype.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

TEST(Fp8, DecodesEveryCode) {
  // One row of 256 codes (all but the two NaNs mapped to 0), scale 1 then 3 per 128 columns.
  std::vector<uint8_t> codes(256);
  for (int k = 0; k < 256; ++k) codes[size_t(k)] = ((k & 0x7f) == 0x7f) ? 0 : uint8_t(k);
  std::vector<float> scales = {1.0f, 3.0f};
  MatrixView v;
  v.format = WeightFormat::FP8_BLOCK128;
  v.rows = 1;
  v.cols = 256;
  v.data = codes.data();
  v.scales = scales.data();
  v.scale_cols = 2;
  for (int k = 0; k < 256; ++k) {
    const float want = mla::fp8e4m3_to_f32(codes[size_t(k)]) * (k < 128 ? 1.0f : 3.0f);
    EXPECT_EQ(fast_element(kPrecise, v, 0, k), want) << "code " << int(codes[size_t(k)]);
    // The bf16 kernel: e4m3 bits as bf16 (exponent-0 codes, bf16 denormals that VDPBF16PS
    // reads as zero, through the subnormal fix-up), times 2^-120, the activation times 2^64.
    EXPECT_EQ(fast_element(kFastBf16, v, 0, k), want) << "bf16 kernel, code " << int(codes[size_t(k)]);
  }
  {
    // Every code against an activation of 1.5 (a bf16 with a mantissa bit) on 4 tokens and 4 rows
    // (a full tile), each row a rotation of the codes: y[t][r] sums code (k + r) % 256 * x.
    const mla::cpu::Context& ctx = kFastBf16;
    std::vector<uint8_t> rot(4 * 256);
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 256; ++k) rot[size_t(r * 256 + k)] = codes[size_t((k + r) % 256)];
    MatrixView m = v;
    m.rows = 4;
    m.data = rot.data();
    for (int k = 0; k < 256; k += 7) {
      std::vector<float> x(4 * 256, 0.0f), y(16);
      for (int t = 0; t < 4; ++t) x[size_t(t * 256 + k)] = 1.5f * float(t + 1);
      mla::cpu::gemv(ctx, x.data(), 4, 256, m, y.data(), 4);
      for (int t = 0; t < 4; ++t)
        for (int r = 0; r < 4; ++r)
          EXPECT_EQ(y[size_t(t * 4 + r)],
                    mla::fp8e4m3_to_f32(rot[size_t(r * 256 + k)]) * (k < 128 ? 1.0f : 3.0f) * 1.5f * float(t + 1))
              << "bf16 kernel, row " << r << " token " << t << " column " << k;
    }
  }
  EXPECT_EQ(mla::fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(mla::fp8e4m3_to_f32(0xfe), -448.0f);
}


}  // namespace
