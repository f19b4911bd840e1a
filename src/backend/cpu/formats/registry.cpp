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
};

}  // namespace

const FormatKernels& format_kernels(WeightFormat f) {
  const auto i = size_t(f);
  if (i >= std::size(kRegistry))
    throw std::invalid_argument("format_kernels: weight format " + std::to_string(int(f)) + " has no entry");
  return *kRegistry[i];
}

}  // namespace mla::cpu
