// The kernels of llama.cpp's block formats (decode.h has their layouts), one set per format, for
// their registry entries (kernels.cpp): the float32 decode GEMV over the shared tile walk
// (gemv_rows.h) and a row as bf16 for the prompt's bf16 GEMMs (rows.cpp), and the GEMV on int8
// activations (VPDPBUSD; vnni_gemv.cpp) with the activations it quantizes its own way
// (vnni.h). Internal to src/backend/cpu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/formats/registry.h"
#include "tensor/matrix.h"

namespace mla::cpu::ggml {

// The VNNI GEMV moves the codes' bits with GFNI's GF2P8AFFINEQB beside AVX-512 VNNI (every CPU
// with both and AVX-512 BF16 but Cooper Lake): without them the formats keep the float32 GEMV.
#if defined(__GFNI__) && defined(__AVX512VNNI__)
#define MLA_GGML_VNNI 1
#endif

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

#ifdef MLA_GGML_VNNI
// vnni_gemv.cpp: the GEMV on int8 activations, and the activations of the block-32 formats
// (blocks of 32 columns) and of the K-quants (256) in vnni.h's layout
void q4_0_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q4_1_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q5_0_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q5_1_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q8_0_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q2_k_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q3_k_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q4_k_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q5_k_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
void q6_k_rows_vnni(const avx512::GemvVnniRows& job, int64_t n0, int64_t n1);
size_t block32_x_bytes(int64_t K);
void block32_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out);
size_t kquant_x_bytes(int64_t K);
void kquant_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out);
void kquant_x_k4(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out);  // Q4_K, Q5_K's order
inline size_t kquant_x_k4_bytes(int64_t K) { return kquant_x_bytes(K); }
void q2_k_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out);  // Q2_K's order
inline size_t q2_k_x_bytes(int64_t K) { return kquant_x_bytes(K); }
#endif

}  // namespace mla::cpu::ggml
