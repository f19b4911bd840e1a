// concat_rows: two weight views whose rows are adjacent in memory read as one.
#include <gtest/gtest.h>

#include <vector>

#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace {

using mla::MatrixView;
using mla::WeightFormat;

MatrixView bf16_view(const uint16_t* p, int64_t rows, int64_t cols) {
  MatrixView v;
  v.format = WeightFormat::BF16;
  v.rows = rows;
  v.cols = cols;
  v.data = p;
  return v;
}

TEST(MatrixView, ConcatRowsOfAdjacentTensors) {
  std::vector<uint16_t> mem(5 * 8);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = mla::f32_to_bf16(float(i));
  const MatrixView gate = bf16_view(mem.data(), 2, 8), up = bf16_view(mem.data() + 16, 3, 8);
  auto both = mla::concat_rows(gate, up);
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->rows, 5);
  std::vector<float> row(8);
  both->dequant_row(3, row.data());  // up's second row
  EXPECT_EQ(row[0], 24.0f);
  EXPECT_EQ(row[7], 31.0f);

  // Not adjacent (a gap, or the other order), different widths or formats: no single view.
  EXPECT_FALSE(mla::concat_rows(gate, bf16_view(mem.data() + 24, 2, 8)).has_value());
  EXPECT_FALSE(mla::concat_rows(up, gate).has_value());
  EXPECT_FALSE(mla::concat_rows(bf16_view(mem.data(), 2, 8), bf16_view(mem.data() + 16, 2, 4)).has_value());
  MatrixView fp8 = gate, fp8b = up;
  fp8.format = fp8b.format = WeightFormat::FP8_BLOCK128;
  fp8b.data = static_cast<const uint8_t*>(fp8.data) + fp8.bytes();
  EXPECT_FALSE(mla::concat_rows(fp8, fp8b).has_value());  // scales live beside each tensor
}

}  // namespace
