// The kernels of llama.cpp's block formats (decode.h has their layouts), one set per format, for
// their registry entries (kernels.cpp): the float32 decode GEMV over the shared tile walk
// (gemv_rows.h) and a row as bf16 for the prompt's bf16 GEMMs (rows.cpp). Internal to
// src/backend/cpu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/formats/registry.h"
#include "tensor/matrix.h"

namespace mla::cpu::ggml {

// rows.cpp
void q4_0_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q4_0_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q4_1_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q4_1_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q5_0_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q5_0_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q5_1_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q5_1_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q8_0_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q8_0_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q2_k_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q2_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q3_k_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q3_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q4_k_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q4_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q5_k_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q5_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);
void q6_k_rows_f32(const avx512::GemvRows& job, int64_t n0, int64_t n1);
void q6_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales);

}  // namespace mla::cpu::ggml
