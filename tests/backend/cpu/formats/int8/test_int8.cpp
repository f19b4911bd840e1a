// INT8 groups: every code in every column through every kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/formats/matrices.h"
#include "tensor/dtype.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

TEST(Int8, EveryCodeInEveryColumnOfEveryKernel) {
  // Rows of 160 int8 codes (five chunks of 32), group 32 with power-of-two scales, so every
  // product is exact: value i = r * 160 + k holds code 37 i % 256 - 128 (37 is odd: each run of
  // 256 values takes every code from -128 to 127, five times over at varying columns). Each
  // value is read back through a one-hot x by the GEMV of both precisions (INT8 has only the
  // float32 kernel: gemv_kernel) and the prompt path (the bf16 GEMM on dequantized rows: AMX
  // below 128 tokens where the CPU has it, oneDNN from 128), and must equal code * scale exactly.
  constexpr int R = 8, C = 160, G = 32;
  std::vector<int8_t> codes(size_t(R * C));
  std::vector<uint16_t> sc(size_t(R * (C / G)));
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < C; ++k) codes[size_t(r * C + k)] = int8_t((r * C + k) * 37 % 256 - 128);
    for (int g = 0; g < C / G; ++g) sc[size_t(r * (C / G) + g)] = mla::f32_to_bf16(std::ldexp(1.0f, g - r));
  }
  MatrixView v;
  v.format = WeightFormat::INT8_GROUP;
  v.rows = R;
  v.cols = C;
  v.data = codes.data();
  v.scales = sc.data();
  v.group_size = G;
  v.scale_cols = C / G;
  std::vector<float> row(C);
  for (int r = 0; r < R; ++r) {
    v.dequant_row(r, row.data());
    for (int k = 0; k < C; ++k)
      ASSERT_EQ(row[size_t(k)], float(codes[size_t(r * C + k)]) * std::ldexp(1.0f, k / G - r)) << "reference";
  }
  std::vector<float> x(size_t(C) * 130, 0.0f);  // up to 130 one-hot tokens (the prompt path)
  for (int k = 0; k < C; ++k) {
    std::fill(x.begin(), x.begin() + C, 0.0f);
    x[size_t(k)] = 1.0f;
    for (const mla::cpu::Context* ctx : {&kPrecise, &kFastBf16}) {
      std::vector<float> y(R);
      mla::cpu::gemv(*ctx, x.data(), 1, C, v, y.data(), R);
      for (int r = 0; r < R; ++r)
        EXPECT_EQ(y[size_t(r)], float(codes[size_t(r * C + k)]) * std::ldexp(1.0f, k / G - r))
            << (ctx == &kPrecise ? "precise" : "fast") << " GEMV, row " << r << " column " << k;
    }
  }
  // The prompt path: token t is one-hot at column t % C.
  for (int T : {100, 130}) {
    std::fill(x.begin(), x.end(), 0.0f);
    for (int t = 0; t < T; ++t) x[size_t(t) * C + size_t(t % C)] = 1.0f;
    std::vector<float> y(size_t(T * R));
    mla::cpu::matmul_bf16(kFastBf16, x.data(), T, C, v, y.data(), R);
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) {
        const int k = t % C;
        EXPECT_EQ(y[size_t(t * R + r)], float(codes[size_t(r * C + k)]) * std::ldexp(1.0f, k / G - r))
            << "prompt path, " << T << " tokens, token " << t << " row " << r;
      }
  }
}


}  // namespace
