// The registry entries of llama.cpp's block formats (Q4_0 .. Q8_0, Q2_K .. Q6_K; decode.h has
// their layouts): the float32 decode GEMV and a row as bf16 for the prompt's bf16 GEMMs
// (rows.cpp), and the decode GEMV on int8 activations with its own activations (vnni_gemv.cpp,
// where the CPU has GFNI) of every format.
#include "backend/cpu/formats/ggml/decode.h"
#include "backend/cpu/formats/ggml/kernels.h"
#include "backend/cpu/formats/registry.h"

namespace mla::cpu {

using avx512::ggml_element;

// A format's VNNI GEMV and the quantizer of its activations, where they are built.
#ifdef MLA_GGML_VNNI
#define GGML_VNNI(rows, x) .gemv_vnni = ggml::rows, .vnni_x_bytes = ggml::x##_bytes, .vnni_x = ggml::x
#else
#define GGML_VNNI(rows, x) .gemv_vnni = nullptr
#endif

extern const FormatKernels kQ4_0Format{.format = WeightFormat::Q4_0, .name = "q4_0", .element = ggml_element,
    .gemv_f32 = ggml::q4_0_rows_f32, GGML_VNNI(q4_0_rows_vnni, block32_x),
    .row_bf16 = ggml::q4_0_row_bf16};
extern const FormatKernels kQ4_1Format{.format = WeightFormat::Q4_1, .name = "q4_1", .element = ggml_element,
    .gemv_f32 = ggml::q4_1_rows_f32, GGML_VNNI(q4_1_rows_vnni, block32_x),
    .row_bf16 = ggml::q4_1_row_bf16};
extern const FormatKernels kQ5_0Format{.format = WeightFormat::Q5_0, .name = "q5_0", .element = ggml_element,
    .gemv_f32 = ggml::q5_0_rows_f32, GGML_VNNI(q5_0_rows_vnni, block32_x),
    .row_bf16 = ggml::q5_0_row_bf16};
extern const FormatKernels kQ5_1Format{.format = WeightFormat::Q5_1, .name = "q5_1", .element = ggml_element,
    .gemv_f32 = ggml::q5_1_rows_f32, GGML_VNNI(q5_1_rows_vnni, block32_x),
    .row_bf16 = ggml::q5_1_row_bf16};
extern const FormatKernels kQ8_0Format{.format = WeightFormat::Q8_0, .name = "q8_0", .element = ggml_element,
    .gemv_f32 = ggml::q8_0_rows_f32, GGML_VNNI(q8_0_rows_vnni, block32_x),
    .row_bf16 = ggml::q8_0_row_bf16};
extern const FormatKernels kQ2_KFormat{.format = WeightFormat::Q2_K, .name = "q2_k", .element = ggml_element,
    .gemv_f32 = ggml::q2_k_rows_f32, GGML_VNNI(q2_k_rows_vnni, q2_k_x),
    .row_bf16 = ggml::q2_k_row_bf16};
extern const FormatKernels kQ3_KFormat{.format = WeightFormat::Q3_K, .name = "q3_k", .element = ggml_element,
    .gemv_f32 = ggml::q3_k_rows_f32, GGML_VNNI(q3_k_rows_vnni, kquant_x),
    .row_bf16 = ggml::q3_k_row_bf16};
extern const FormatKernels kQ4_KFormat{.format = WeightFormat::Q4_K, .name = "q4_k", .element = ggml_element,
    .gemv_f32 = ggml::q4_k_rows_f32, GGML_VNNI(q4_k_rows_vnni, kquant_x_k4),
    .row_bf16 = ggml::q4_k_row_bf16};
extern const FormatKernels kQ5_KFormat{.format = WeightFormat::Q5_K, .name = "q5_k", .element = ggml_element,
    .gemv_f32 = ggml::q5_k_rows_f32, GGML_VNNI(q5_k_rows_vnni, kquant_x_k4),
    .row_bf16 = ggml::q5_k_row_bf16};
extern const FormatKernels kQ6_KFormat{.format = WeightFormat::Q6_K, .name = "q6_k", .element = ggml_element,
    .gemv_f32 = ggml::q6_k_rows_f32, GGML_VNNI(q6_k_rows_vnni, kquant_x),
    .row_bf16 = ggml::q6_k_row_bf16};

#undef GGML_VNNI

}  // namespace mla::cpu
