// The activations of a product converted once per call into the column order the weights'
// decoders leave a row in (formats/registry.h: a format's layout, per chunk of 32 columns), for
// the prompt's GEMMs (formats/gemm.h, formats/int_group/vnni_gemm.h), the VNNI GEMV and the
// attention's bf16 products. Single-threaded.
#pragma once
#include <cstdint>

#include "tensor/matrix.h"

namespace mla::cpu {

// Activations x [T, K] as bf16 into dst (row stride ld) in the same column order as
// dequant_rows_bf16 uses for `format` (natural when `permute` is false).
void activations_bf16(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, bool permute,
                      uint16_t* dst, int64_t ld);

// Activations x [T, K] as float32 into dst (row stride ld), permuted within each chunk of 32
// into the column order dequant_rows_bf16 uses for `format` (the FMA kernel's decoded rows).
void activations_f32_permuted(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, float* dst,
                              int64_t ld);

// Activations x [T, K] (K % 32 == 0) as int8 codes for the VNNI GEMM: per token and chunk c of 32
// columns, m the chunk's largest magnitude, q = round(x * (127 / m)) (to nearest even, float32
// arithmetic) into q[t * ldq + c * 32 ...] in the column order dequant_rows_bf16 uses for `format`,
// qs[t * lds + c] = m / 127, and qc[t * lds + c] = -bias * the sum of the chunk's codes
// (vnni_weight_bias). A chunk of zeros: codes and scale 0.
void activations_int8(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, int bias, int8_t* q,
                      int64_t ldq, float* qs, int32_t* qc, int64_t lds);

}  // namespace mla::cpu
