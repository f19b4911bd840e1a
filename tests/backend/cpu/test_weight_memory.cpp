// WeightArena: views copied onto huge pages read the same values, slices of one tensor keep
// sharing memory, and the scales of FP8 / INT4 row slices move with them.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/weight_memory.h"
#include "tensor/dtype.h"

namespace {

using mla::MatrixView;
using mla::WeightFormat;

std::vector<float> rows_of(const MatrixView& v) {
  std::vector<float> out(size_t(v.rows * v.cols));
  for (int64_t r = 0; r < v.rows; ++r) v.dequant_row(r, out.data() + r * v.cols);
  return out;
}

TEST(WeightArena, CopiesAndRepointsViews) {
  // One buffer holding an FP8 tensor (300 x 256) then its scales, like a safetensors file;
  // an INT4 tensor with its scales in a second buffer.
  std::vector<uint8_t> file(300 * 256 + 3 * 2 * 4);
  for (size_t i = 0; i < 300 * 256; ++i) file[i] = uint8_t((i * 37) % 251) & 0x7e;
  for (int i = 0; i < 6; ++i) {
    float s = 0.5f + float(i);
    std::memcpy(&file[300 * 256 + 4 * size_t(i)], &s, 4);
  }
  MatrixView fp8;
  fp8.format = WeightFormat::FP8_BLOCK128;
  fp8.rows = 300;
  fp8.cols = 256;
  fp8.data = file.data();
  fp8.scales = file.data() + 300 * 256;
  fp8.scale_cols = 2;
  MatrixView slice = fp8.slice_rows(130, 100);  // reads scale row 1

  std::vector<uint8_t> packed(64 * 64 / 2 + 64 * 2 * 2);
  for (size_t i = 0; i < 64 * 32; ++i) packed[i] = uint8_t(i * 11);
  for (int i = 0; i < 128; ++i) {
    uint16_t h = mla::f32_to_bf16(0.25f * float(i % 7 + 1));
    std::memcpy(&packed[64 * 32 + 2 * size_t(i)], &h, 2);
  }
  MatrixView int4;
  int4.format = WeightFormat::INT4_GROUP;
  int4.rows = 64;
  int4.cols = 64;
  int4.data = packed.data();
  int4.scales = packed.data() + 64 * 32;
  int4.group_size = 32;
  int4.scale_cols = 2;
  MatrixView int4_slice = int4.slice_rows(40, 24);

  const auto want_fp8 = rows_of(fp8), want_slice = rows_of(slice), want_int4 = rows_of(int4),
             want_int4_slice = rows_of(int4_slice);
  const MatrixView before = fp8;
  {
    mla::cpu::WeightArena arena;
    MatrixView* views[] = {&fp8, &slice, &int4, &int4_slice};
    arena.adopt(mla::cpu::Context{}, views);
    EXPECT_NE(fp8.data, before.data);
    // Every byte read is copied (and at most a small gap, when the two buffers sit close).
    EXPECT_GE(arena.bytes(), file.size() + packed.size());
    EXPECT_LE(arena.bytes(), file.size() + packed.size() + 64);
    // The slice still sits 130 rows into its tensor, its scales still the tensor's.
    EXPECT_EQ(static_cast<const uint8_t*>(slice.data), static_cast<const uint8_t*>(fp8.data) + 130 * 256);
    EXPECT_EQ(slice.scales, fp8.scales);
    EXPECT_EQ(int4_slice.scales, int4.scales);
    std::memset(file.data(), 0, file.size());  // the originals are no longer read
    std::memset(packed.data(), 0, packed.size());
    EXPECT_EQ(rows_of(fp8), want_fp8);
    EXPECT_EQ(rows_of(slice), want_slice);
    EXPECT_EQ(rows_of(int4), want_int4);
    EXPECT_EQ(rows_of(int4_slice), want_int4_slice);
  }
}

TEST(WeightArena, Placement) {
  using mla::cpu::WeightPlacement;
  EXPECT_FALSE(mla::cpu::should_copy_weights(WeightPlacement::Mapped, 1));
  EXPECT_TRUE(mla::cpu::should_copy_weights(WeightPlacement::HugePages, size_t(1) << 50));
  EXPECT_FALSE(mla::cpu::should_copy_weights(WeightPlacement::Auto, size_t(1) << 50));  // more than any machine has
  EXPECT_EQ(mla::cpu::Context().weights, WeightPlacement::Auto);
}

}  // namespace
