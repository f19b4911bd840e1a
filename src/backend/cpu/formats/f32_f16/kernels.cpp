// The kernels of F32 and F16 weights (decode.h has their layout) and their registry entries: the
// float32 GEMVs over the tile walk (gemv_rows.h) in both precisions, and a row as bf16 for the
// prompt's fast GEMMs. In the precise precision F32 weights go to sgemm as they are.
#include "backend/cpu/formats/f32_f16/decode.h"
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"

namespace mla::cpu {

namespace avx512 {
namespace {

void f32_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { job.segment<DecF32>(n0, n1, job.xp, 1.0f); }
void f16_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { job.segment<DecF16>(n0, n1, job.xp, 1.0f); }

void f32_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float*) {
  decoded_row_bf16(DecF32{reinterpret_cast<const float*>(row_bytes_of(W, n))}, W.cols / kChunk, out);
}
void f16_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float*) {
  decoded_row_bf16(DecF16{reinterpret_cast<const uint16_t*>(row_bytes_of(W, n))}, W.cols / kChunk, out);
}

}  // namespace
}  // namespace avx512

using namespace avx512;

// The registry's entries (formats/registry.cpp).
extern const FormatKernels kF32Format{.format = WeightFormat::F32, .name = "f32", .element = f32_element,
    .gemv_f32 = f32_rows_f32, .row_bf16 = f32_row_bf16, .sgemm = true};
extern const FormatKernels kF16Format{.format = WeightFormat::F16, .name = "f16", .element = f16_element,
    .gemv_f32 = f16_rows_f32, .row_bf16 = f16_row_bf16};

}  // namespace mla::cpu
