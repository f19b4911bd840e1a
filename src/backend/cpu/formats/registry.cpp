// The registry (see registry.h): one line per stored format, in the enum's order, each naming the
// entry its folder defines.
#include "backend/cpu/formats/registry.h"

#include <iterator>
#include <stdexcept>
#include <string>

namespace mla::cpu {

extern const FormatKernels kF32Format, kF16Format;                       // formats/f32_f16/
extern const FormatKernels kBf16Format, kBf16Pairs32Format;              // formats/bf16/
extern const FormatKernels kFp8Block128Format;                           // formats/fp8_block128/
extern const FormatKernels kInt4GroupFormat, kInt4Words16Format;         // formats/int4/
extern const FormatKernels kInt8GroupFormat, kInt8Words16Format;         // formats/int8/
extern const FormatKernels kQ4_0Format, kQ4_1Format, kQ5_0Format, kQ5_1Format, kQ8_0Format;  // formats/ggml/
extern const FormatKernels kQ2_KFormat, kQ3_KFormat, kQ4_KFormat, kQ5_KFormat, kQ6_KFormat;  // formats/ggml/

namespace {

// Indexed by the WeightFormat's value.
constexpr const FormatKernels* kRegistry[] = {
    &kF32Format,          // F32
    &kBf16Format,         // BF16
    &kF16Format,          // F16
    &kFp8Block128Format,  // FP8_BLOCK128
    &kInt4GroupFormat,    // INT4_GROUP
    &kInt8GroupFormat,    // INT8_GROUP
    &kBf16Pairs32Format,  // BF16_PAIRS32
    &kInt4Words16Format,  // INT4_WORDS16
    &kInt8Words16Format,  // INT8_WORDS16
    &kQ4_0Format,         // Q4_0
    &kQ4_1Format,         // Q4_1
    &kQ5_0Format,         // Q5_0
    &kQ5_1Format,         // Q5_1
    &kQ8_0Format,         // Q8_0
    &kQ2_KFormat,         // Q2_K
    &kQ3_KFormat,         // Q3_K
    &kQ4_KFormat,         // Q4_K
    &kQ5_KFormat,         // Q5_K
    &kQ6_KFormat,         // Q6_K
};

}  // namespace

const FormatKernels& format_kernels(WeightFormat f) {
  const auto i = size_t(f);
  if (i >= std::size(kRegistry))
    throw std::invalid_argument("format_kernels: weight format " + std::to_string(int(f)) + " has no entry");
  return *kRegistry[i];
}

}  // namespace mla::cpu
