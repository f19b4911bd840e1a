// INT4 groups unpacked by every kernel against hand-packed words.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/formats/group_view.h"
#include "backend/cpu/formats/matrices.h"
#include "tensor/dtype.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

TEST(Int4, UnpacksHandPackedWords) {
  // One row of 64 values = 8 words; group 32, scales 0.5 and 2. Word w holds values 8w..8w+7,
  // low nibble first, each stored as q + 8.
  std::vector<int> q(64);
  for (int k = 0; k < 64; ++k) q[size_t(k)] = (k * 5) % 16 - 8;  // every code from -8 to 7
  q[7] = 7;    // highest nibble of word 0: the largest positive code
  q[15] = -8;  // highest nibble of word 1: the most negative code (stored 0)
  q[63] = -1;  // highest nibble of the last word
  std::vector<uint32_t> words(8, 0);
  for (int k = 0; k < 64; ++k) words[size_t(k / 8)] |= uint32_t(q[size_t(k)] + 8) << (4 * (k % 8));
  EXPECT_EQ(words[0] >> 28, 15u);
  EXPECT_EQ(words[1] >> 28, 0u);
  std::vector<uint16_t> scales = {mla::f32_to_bf16(0.5f), mla::f32_to_bf16(2.0f)};
  const MatrixView v = mla::test::group_view(WeightFormat::INT4_GROUP, words.data(), scales.data(), 1, 64, 32);
  std::vector<float> row(64);
  v.dequant_row(0, row.data());
  for (int k = 0; k < 64; ++k) {
    const float want = float(q[size_t(k)]) * (k < 32 ? 0.5f : 2.0f);
    EXPECT_EQ(row[size_t(k)], want) << "reference, value " << k;
    EXPECT_EQ(fast_element(kPrecise, v, 0, k), want) << "fast kernel, value " << k;
    EXPECT_EQ(fast_element(kFastBf16, v, 0, k), want) << "bf16 kernel, value " << k;
  }
  // Every code in every nibble position, in the bf16 kernel's steps of 64 columns and its
  // scalar tail (96 columns: one step, then 32): word w of row r holds codes (w + r + i) % 16.
  const mla::cpu::Context& ctx = kFastBf16;
  MatrixView m = v;
  m.rows = 4;
  m.cols = 96;
  m.scale_cols = 3;
  std::vector<uint32_t> packed(size_t(4 * 12));
  std::vector<uint16_t> sc(size_t(4 * 3));
  for (int r = 0; r < 4; ++r) {
    for (int w = 0; w < 12; ++w)
      for (int i = 0; i < 8; ++i) packed[size_t(r * 12 + w)] |= uint32_t((w + r + i) % 16) << (4 * i);
    for (int g = 0; g < 3; ++g) sc[size_t(r * 3 + g)] = mla::f32_to_bf16(std::ldexp(1.0f, g - r));
  }
  m.data = packed.data();
  m.scales = sc.data();
  for (int k = 0; k < 96; ++k) {
    std::vector<float> x(96, 0.0f), y(4);
    x[size_t(k)] = 1.0f;
    mla::cpu::gemv(ctx, x.data(), 1, 96, m, y.data(), 4);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(y[size_t(r)], float((k / 8 + r + k % 8) % 16 - 8) * std::ldexp(1.0f, k / 32 - r))
          << "bf16 kernel, row " << r << " column " << k;
  }
}


}  // namespace
