// The one map from a stored weight format (tensor/matrix.h's WeightFormat) to its kernels and the
// facts about it that the drivers and dispatch.h need: adding a format is a folder
// (formats/<format>/: decode.h, kernels.cpp, tests beside) and one line of the registry
// (registry.cpp). The drivers (formats/gemv.cpp, formats/gemm.cpp, ops.cpp) and the kernel choice
// (dispatch.cpp) read an entry; none of them names a format. docs/backend.md has the steps.
// Internal to src/backend/cpu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

namespace avx512 {
struct GemvRows;      // formats/gemv_rows.h: a GEMV job's rows on float32 activations
struct GemvFastRows;  // on bf16 activations (VDPBF16PS, AMX tiles)
struct GemvVnniRows;  // on int8 activations (VPDPBUSD)
}  // namespace avx512

// How the prompt's bf16 GEMMs (formats/gemm.h) take a format's weights.
enum class Bf16Weights {
  Decoded,  // 32 rows at a time through row_bf16 into a per-thread buffer
  InPlace,  // bf16 rows in natural column order, read where they lie
  Pairs32,  // blocks of 32 rows as column pairs (BF16_PAIRS32), read in place without AMX
};

struct FormatKernels {
  WeightFormat format;
  const char* name;

  // ---- layout: the lane order the decoders leave a row's columns in (decode.h); activations
  // are permuted into it
  avx512::Layout layout = avx512::Layout::Natural;        // float32 decode, a chunk of 32
  avx512::Layout64 layout64 = avx512::Layout64::Natural;  // bf16 decode, a step of 64
  int64_t row_block = 1;  // rows per stored block: GEMV work units are whole blocks (at least 16)

  // ---- the scalar reference: weight (r, k) of W as MatrixView::dequant_row computes it
  float (*element)(const MatrixView& W, int64_t r, int64_t k) = nullptr;

  // ---- decode: the GEMV's rows kernels, each for rows [n0, n1) of a prepared job; null where
  // the format has none (GemvReference: MatrixView::dequant_row and a float dot product)
  bool groups = false;  // INT4 / INT8 groups: the fused kernels need a group size of 32k
  void (*gemv_f32)(const avx512::GemvRows&, int64_t n0, int64_t n1) = nullptr;
  void (*gemv_bf16)(const avx512::GemvFastRows&, int64_t n0, int64_t n1) = nullptr;
  int64_t gemv_bf16_cols = 1;  // gemv_bf16 takes W where W.cols is a multiple of this
  float bf16_x_scale = 1.0f;   // the bf16 activations' factor (FP8: 2^64, decode.h)
  void (*gemv_amx)(const avx512::GemvFastRows&, int64_t n0, int64_t n1) = nullptr;  // 2 to 16 tokens
  void (*gemv_vnni)(const avx512::GemvVnniRows&, int64_t n0, int64_t n1) = nullptr;
  // gemv_vnni's activations where the format quantizes them its own way (the ggml formats, in
  // their blocks: formats/ggml/vnni.h) instead of per chunk of 32 (activations_int8): the bytes
  // a token takes for K columns, and the quantizer of T tokens into consecutive spans of that
  // many bytes from a 64-byte aligned out (GemvVnniRows::xb)
  size_t (*vnni_x_bytes)(int64_t K) = nullptr;
  void (*vnni_x)(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) = nullptr;
  int64_t fast_gemv_tokens = 12;  // gemv_max_tokens in the fast precision (dispatch.cpp)

  // ---- prompt: row n of W as bf16 into out[0, cols / 32 * 32), columns in `layout` order per
  // chunk of 32 (scales: room for cols / 32 floats); the GEMM driver writes the tail
  void (*row_bf16)(const MatrixView& W, int64_t n, uint16_t* out, float* scales) = nullptr;
  Bf16Weights bf16_weights = Bf16Weights::Decoded;
  // The GEMM on int8 activations (VPDPBUSD; INT4, INT8: formats/int_group/vnni_gemm.h) and the
  // bias its codes are stored or taken with (q + bias)
  void (*gemm_int8)(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y,
                    int64_t ldy) = nullptr;
  int vnni_bias = 0;
  bool sgemm = false;  // precise: W's rows are float32, straight into sgemm

  // ---- load: the layout repack.h rewrites an eligible W into (its own format where none)
  WeightFormat repacked = format;
  bool (*repack_eligible)(const MatrixView& W) = nullptr;
  void (*repack)(const Context& ctx, MatrixView& W) = nullptr;
};

// The entry of format f (throws std::invalid_argument for a value outside the enum).
const FormatKernels& format_kernels(WeightFormat f);

// Whether W runs on the fused kernels (dispatch.h's GEMVs, the fast GEMMs): every format but
// INT4 / INT8 groups of a size not a multiple of 32.
inline bool fused_kernels(const MatrixView& W) {
  return !format_kernels(W.format).groups || (W.group_size > 0 && W.group_size % avx512::kChunk == 0);
}

// Weight (r, k) of W, as MatrixView::dequant_row computes it (the columns past the kernels' last
// full chunk).
inline float element(const MatrixView& W, int64_t r, int64_t k) { return format_kernels(W.format).element(W, r, k); }

}  // namespace mla::cpu
