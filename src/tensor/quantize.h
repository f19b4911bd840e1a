// Weight quantization kernels: float32 values into the quantized formats the engine runs
// (tensor/matrix.h), with a plain reference beside each fast path.
// - INT4 groups (compressed-tensors pack-quantized): per group of `group` values of a row one
//   bf16 scale s; q = clamp(round(x / s), -8, 7), stored as the nibble q + 8, element k of a row
//   in bits 4 (k % 8) of 32-bit word k / 8. Value = q x s.
// - INT8 groups (compressed-tensors int-quantized): the same with q = clamp(round(x / s), -128,
//   127) stored as one int8 per weight. bf16 scales as INT4's (the model's dtype, which
//   compressed-tensors stores its scales in): 8.5 bits per weight, as llama.cpp's Q8_0 with its
//   f16 scale; the codes are chosen against the scale as stored, so its rounding costs only
//   which candidate wins, not a systematic error.
// - Block FP8: e4m3 codes with one float32 scale per 128 x 128 block; value = fp8(code) x scale.
// Scales are chosen by round to nearest plus a search: a few candidate scales per group (or
// block), each scored by the squared error of the values it reproduces (with the scale rounded
// as stored), the best kept. The plain rule (absmax RTN) is always one of the candidates, so the
// search is never worse than it.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/matrix.h"

namespace mla::quant {

// ---- FP8 e4m3

// f32_to_fp8e4m3 (tensor/dtype.h: round to nearest even, saturating at +-448, NaN 0x7f) by bit
// arithmetic instead of a search over the code table; the same byte for every input.
uint8_t f32_to_fp8e4m3_fast(float f);

// DeepSeek's FP8 quantization of activations (act_quant in DeepSeek-V3.2's inference/kernel.py),
// per block of values: s = max(absmax, 1e-4) / 448, rounded up to a power of two where pow2
// (quantization_config scale_fmt "ue8m0"); codes e4m3(x / s), value = code x s.
float fp8_act_scale(const float* x, int64_t n, bool pow2);
// x replaced by its quantized value code x s, a block of `block` values at a time (n % block ==
// 0): what the official code's FP8 step leaves of an activation.
void fp8_act_round(float* x, int64_t n, int64_t block, bool pow2);

// ---- INT4 groups

// Packs n values q in [-8, 7] (n % 8 == 0) into n / 8 words as the format stores them, and back.
void pack_int4(const int8_t* q, int64_t n, uint32_t* words);
void unpack_int4(const uint32_t* words, int64_t n, int8_t* q);

enum class ScaleRule {
  Absmax,  // plain RTN: s = absmax / 7.5 (compressed-tensors' symmetric rule, (qmax - qmin) / 2)
  Search,  // the best of the candidates below, by squared error
};

// Quantizes one group of n values: writes q[0..n) and returns the bf16 scale; *err2 gets the
// squared error sum of (x - q s). Search candidates: absmax / d for d in 6 .. 8 in quarter
// steps, Q4_0's rule (the value of largest magnitude maps to -8: s = -m / 8) and its
// neighbours, and the least-squares rescale sum(x q) / sum(q q) of the best so far.
uint16_t quantize_int4_group(const float* x, int64_t n, ScaleRule rule, int8_t* q, double* err2);
// The same over [-128, 127]: plain rule absmax / 127.5, candidates absmax / d for d in 126 .. 128,
// -m / (128 +- 0.5) and the least-squares rescale.
uint16_t quantize_int8_group(const float* x, int64_t n, ScaleRule rule, int8_t* q, double* err2);
// A row of n values (n % group == 0, n % 8 == 0): words[n / 8], scales[n / group]; returns the
// squared error of the row.
double quantize_int4_row(const float* x, int64_t n, int64_t group, ScaleRule rule, uint32_t* words,
                         uint16_t* scales);
void dequantize_int4_row(const uint32_t* words, const uint16_t* scales, int64_t n, int64_t group, float* out);

// ---- INT8 groups

// A row of n values (n % group == 0): q[n], scales[n / group]; returns the squared error.
double quantize_int8_row(const float* x, int64_t n, int64_t group, ScaleRule rule, int8_t* q, uint16_t* scales);

// ---- block FP8

// Quantizes a band of up to 128 rows of a matrix (`rows` x `cols`, row-major floats, row stride
// cols) into codes (same layout) and one scale per 128-column block (scales[ceil(cols / 128)]).
// Absmax: s = absmax / 448. Search: s = absmax / 448 x f for a few f at and below 1, the best by
// squared error. Returns the band's squared error.
double quantize_fp8_band(const float* x, int64_t rows, int64_t cols, ScaleRule rule, uint8_t* codes, float* scales);

// ---- whole matrices

enum class QuantFormat { BF16, FP8, INT4, INT8 };
const char* quant_format_name(QuantFormat f);  // "bf16", "fp8", "int4", "int8"
WeightFormat weight_format(QuantFormat f);     // the WeightFormat it produces
// "bf16" | "fp8" | "int4" | "int8"; throws std::invalid_argument naming `what` otherwise.
QuantFormat parse_quant_format(const std::string& s, const std::string& what);

// A matrix in a quantized format, owning its bytes; err2 / ref2 are the squared error and the
// squared values of the source (relative RMS error = sqrt(err2 / ref2)).
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::BF16;
  int64_t rows = 0, cols = 0, group_size = 0;
  std::vector<uint8_t> data, scales;
  double err2 = 0, ref2 = 0;
  MatrixView view() const;
};

// Dequantizes src (any format) a row band at a time and quantizes it to `to` (INT4: group
// `group`, cols % group == 0 and cols % 8 == 0; INT8: cols % group == 0; else
// std::invalid_argument). Working memory: one
// band of 128 rows as float32 per thread. OpenMP over rows (INT4, INT8, BF16) or bands (FP8) on
// `threads` threads (0: OpenMP's default).
QuantizedMatrix quantize_matrix(const MatrixView& src, QuantFormat to, ScaleRule rule = ScaleRule::Search,
                                int64_t group = 32, int threads = 0);

}  // namespace mla::quant
