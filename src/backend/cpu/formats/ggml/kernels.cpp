// The registry entries of llama.cpp's block formats (Q4_0 .. Q8_0, Q2_K .. Q6_K; tensor/ggml_blocks.h).
#include <array>

#include "backend/cpu/formats/element.h"
#include "backend/cpu/formats/registry.h"
#include "tensor/ggml_blocks.h"

namespace mla::cpu {

namespace {

// Weight (r, k): the reference dequantizer over the block holding it.
float ggml_element(const MatrixView& W, int64_t r, int64_t k) {
  const GgmlBlock b = ggml_block(W.format);
  std::array<float, 256> vals;
  ggml_dequantize(W.format, avx512::row_bytes_of(W, r) + size_t(k / b.values) * b.bytes, b.values, vals.data());
  return vals[size_t(k % b.values)];
}

}  // namespace

extern const FormatKernels kQ4_0Format{.format = WeightFormat::Q4_0, .name = "q4_0", .element = ggml_element};
extern const FormatKernels kQ4_1Format{.format = WeightFormat::Q4_1, .name = "q4_1", .element = ggml_element};
extern const FormatKernels kQ5_0Format{.format = WeightFormat::Q5_0, .name = "q5_0", .element = ggml_element};
extern const FormatKernels kQ5_1Format{.format = WeightFormat::Q5_1, .name = "q5_1", .element = ggml_element};
extern const FormatKernels kQ8_0Format{.format = WeightFormat::Q8_0, .name = "q8_0", .element = ggml_element};
extern const FormatKernels kQ2_KFormat{.format = WeightFormat::Q2_K, .name = "q2_k", .element = ggml_element};
extern const FormatKernels kQ3_KFormat{.format = WeightFormat::Q3_K, .name = "q3_k", .element = ggml_element};
extern const FormatKernels kQ4_KFormat{.format = WeightFormat::Q4_K, .name = "q4_k", .element = ggml_element};
extern const FormatKernels kQ5_KFormat{.format = WeightFormat::Q5_K, .name = "q5_k", .element = ggml_element};
extern const FormatKernels kQ6_KFormat{.format = WeightFormat::Q6_K, .name = "q6_k", .element = ggml_element};

}  // namespace mla::cpu
