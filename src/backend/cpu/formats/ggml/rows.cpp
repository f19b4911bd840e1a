// The float32 decode GEMV and the row-to-bf16 decoder of every ggml block format: the shared tile
// walk (gemv_rows.h) and decoded_row_bf16 (rows_bf16.h) over the format's decoder (decode.h).
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/ggml/decode.h"
#include "backend/cpu/formats/ggml/kernels.h"
#include "backend/cpu/formats/rows_bf16.h"

namespace mla::cpu::ggml {

namespace {

using namespace avx512;

template <class Dec>
void rows_f32(const GemvRows& job, int64_t n0, int64_t n1) {
  job.segment<Dec>(n0, n1, job.xp, 1.0f);
}

template <class Dec>
void row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float*) {
  decoded_row_bf16(Dec{row_bytes_of(W, n)}, W.cols / kChunk, out);
}

}  // namespace

void q4_0_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ4_0>(job, n0, n1); }
void q4_0_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ4_0>(W, n, out, s); }
void q4_1_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ4_1>(job, n0, n1); }
void q4_1_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ4_1>(W, n, out, s); }
void q5_0_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ5_0>(job, n0, n1); }
void q5_0_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ5_0>(W, n, out, s); }
void q5_1_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ5_1>(job, n0, n1); }
void q5_1_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ5_1>(W, n, out, s); }
void q8_0_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ8_0>(job, n0, n1); }
void q8_0_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ8_0>(W, n, out, s); }
void q2_k_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ2_K>(job, n0, n1); }
void q2_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ2_K>(W, n, out, s); }
void q3_k_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ3_K>(job, n0, n1); }
void q3_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ3_K>(W, n, out, s); }
void q4_k_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ4_K>(job, n0, n1); }
void q4_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ4_K>(W, n, out, s); }
void q5_k_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ5_K>(job, n0, n1); }
void q5_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ5_K>(W, n, out, s); }
void q6_k_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { rows_f32<DecQ6_K>(job, n0, n1); }
void q6_k_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* s) { row_bf16<DecQ6_K>(W, n, out, s); }

}  // namespace mla::cpu::ggml
