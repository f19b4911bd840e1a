// The registry of weight formats (formats/registry.h): one entry per WeightFormat, each naming
// its format, and facts that agree with tensor/matrix.h's layouts.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "backend/cpu/formats/registry.h"
#include "tensor/matrix.h"

namespace {

using mla::WeightFormat;
using mla::cpu::format_kernels;
using mla::cpu::FormatKernels;

const WeightFormat kAll[] = {WeightFormat::F32,          WeightFormat::BF16,         WeightFormat::F16,
                             WeightFormat::FP8_BLOCK128, WeightFormat::INT4_GROUP,   WeightFormat::INT8_GROUP,
                             WeightFormat::BF16_PAIRS32, WeightFormat::INT4_WORDS16, WeightFormat::INT8_WORDS16,
                             WeightFormat::Q4_0,         WeightFormat::Q4_1,         WeightFormat::Q5_0,
                             WeightFormat::Q5_1,         WeightFormat::Q8_0,         WeightFormat::Q2_K,
                             WeightFormat::Q3_K,         WeightFormat::Q4_K,         WeightFormat::Q5_K,
                             WeightFormat::Q6_K};

TEST(FormatRegistry, EveryFormatHasItsEntry) {
  for (WeightFormat f : kAll) {
    const FormatKernels& k = format_kernels(f);
    EXPECT_EQ(k.format, f) << mla::weight_format_name(f);
    EXPECT_EQ(std::string(k.name), mla::weight_format_name(f));
    EXPECT_NE(k.element, nullptr) << k.name;      // the scalar reference
    EXPECT_NE(k.row_bf16, nullptr) << k.name;     // the prompt's bf16 GEMMs take every format
    EXPECT_EQ(k.groups, mla::is_int_group(f)) << k.name;
    EXPECT_EQ(k.row_block > 1, f == WeightFormat::BF16_PAIRS32 || mla::is_words16(f)) << k.name;
    EXPECT_EQ(k.vnni_bias != 0, mla::is_int_group(f)) << k.name;
    EXPECT_EQ(k.gemm_int8 != nullptr, mla::is_int_group(f)) << k.name;
    // A format with a GEMV on bf16 or int8 activations has the float32 one too, but for
    // INT8_WORDS16, which only VPDPBUSD reads in place.
    if (k.gemv_bf16 || k.gemv_amx) EXPECT_NE(k.gemv_f32, nullptr) << k.name;
  }
  EXPECT_THROW(format_kernels(WeightFormat(99)), std::invalid_argument);
}

TEST(FormatRegistry, RepackTargetsAreRegisteredLayouts) {
  for (WeightFormat f : kAll) {
    const FormatKernels& k = format_kernels(f);
    if (k.repacked == f) {
      EXPECT_EQ(k.repack, nullptr) << k.name;
      continue;
    }
    ASSERT_NE(k.repack, nullptr) << k.name;
    ASSERT_NE(k.repack_eligible, nullptr) << k.name;
    EXPECT_EQ(format_kernels(k.repacked).repacked, k.repacked) << k.name << ": a repacked layout is final";
    EXPECT_GT(format_kernels(k.repacked).row_block, 1) << k.name;
  }
}

}  // namespace
