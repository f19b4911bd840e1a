// The kernels of INT8_GROUP and INT8_WORDS16 weights (decode.h has their layouts) and their
// registry entries: the row-major float32 GEMV over the tile walk (gemv_rows.h) in both
// precisions, the WORDS16 GEMV on int8 activations (formats/int_group/vnni_gemv.h; elsewhere
// INT8_WORDS16 runs on the reference), and a row as bf16 for the prompt's bf16 GEMMs. The
// prompt's INT8 products on int8 activations are the VNNI GEMM (formats/int_group/vnni_gemm.h);
// the load-time rewrite into blocks is formats/int_group/repack.cpp.
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/int8/decode.h"
#include "backend/cpu/formats/int_group/scales.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"
#include "backend/cpu/formats/int_group/vnni_gemv.h"
#include "backend/cpu/formats/int_group/words16.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"
#include "backend/cpu/repack.h"

namespace mla::cpu {

namespace avx512 {
namespace {

void int8_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { job.segment<DecInt8>(n0, n1, job.xp, 1.0f); }
void int8_words16_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) {
  vnni_words16_rows<Int8Words16Block>(job, n0, n1);
}

void int8_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales) {
  const int64_t Kc = W.cols / kChunk;
  group_chunk_scales(W, n, Kc, scales);
  decoded_row_bf16(DecInt8{row_bytes_of(W, n), scales}, Kc, out);
}
void int8_words16_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales) {
  words16_row_bf16<DecInt8, 4>(W, n, out, scales, 0x80808080u);
}

}  // namespace
}  // namespace avx512

using namespace avx512;

// The registry's entries (formats/registry.cpp).
extern const FormatKernels kInt8GroupFormat{.format = WeightFormat::INT8_GROUP, .name = "int8-group",
    .element = int8_element, .groups = true, .gemv_f32 = int8_rows_f32, .row_bf16 = int8_row_bf16,
    .gemm_int8 = matmul_vnni, .vnni_bias = 128, .repacked = WeightFormat::INT8_WORDS16,
    .repack_eligible = words16_eligible, .repack = repack_words16};
extern const FormatKernels kInt8Words16Format{.format = WeightFormat::INT8_WORDS16, .name = "int8-words16",
    .row_block = 16, .element = int8_words16_element, .groups = true, .gemv_vnni = int8_words16_rows_vnni,
    .row_bf16 = int8_words16_row_bf16, .gemm_int8 = matmul_vnni, .vnni_bias = 128};

}  // namespace mla::cpu
