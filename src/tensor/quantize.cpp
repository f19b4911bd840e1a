#include "tensor/quantize.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mla::quant {

uint8_t f32_to_fp8e4m3_fast(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;              // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;      // >= 448 (1.75 x 2^8): saturate
  if (a < 0x3c800000u) {                         // below 2^-6: subnormal codes 0..8, step 2^-9
    float af;
    std::memcpy(&af, &a, 4);
    return sign | uint8_t(std::nearbyint(af * 512.0f));  // the default rounding: to nearest even
  }
  // Normal: keep 3 mantissa bits, rounding to nearest even, then rebias the exponent (127 -> 7).
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  return sign | uint8_t((r >> 20) - (120u << 3));
}

float fp8_act_scale(const float* x, int64_t n, bool pow2) {
  float amax = 1e-4f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax / 448.0f;
  return pow2 ? std::ldexp(1.0f, int(std::ceil(std::log2(s)))) : s;
}

void fp8_act_round(float* x, int64_t n, int64_t block, bool pow2) {
  for (int64_t b = 0; b < n; b += block) {
    const float s = fp8_act_scale(x + b, block, pow2);
    for (int64_t i = b; i < b + block; ++i) x[i] = fp8e4m3_to_f32(f32_to_fp8e4m3_fast(x[i] / s)) * s;
  }
}

void pack_int4(const int8_t* q, int64_t n, uint32_t* words) {
  for (int64_t w = 0; w < n / 8; ++w) {
    uint32_t v = 0;
    for (int k = 0; k < 8; ++k) v |= uint32_t(q[w * 8 + k] + 8) << (4 * k);
    words[w] = v;
  }
}

void unpack_int4(const uint32_t* words, int64_t n, int8_t* q) {
  for (int64_t k = 0; k < n; ++k) q[k] = int8_t(int((words[k / 8] >> (4 * (k % 8))) & 0xF) - 8);
}

namespace {

// q = clamp(round(x / s), qmin, qmax) for the scale as stored (bf16 bits h); the squared error.
double int_error(const float* x, int64_t n, uint16_t h, int qmin, int qmax, int8_t* q) {
  const float s = bf16_to_f32(h);
  double e = 0;
  if (s == 0.0f || !std::isfinite(s)) {
    for (int64_t i = 0; i < n; ++i) {
      q[i] = 0;
      e += double(x[i]) * x[i];
    }
    return e;
  }
  const float inv = 1.0f / s, lo = float(qmin), hi = float(qmax);
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::clamp(std::nearbyint(x[i] * inv), lo, hi);
    q[i] = int8_t(r);
    const float d = x[i] - r * s;
    e += double(d) * d;
  }
  return e;
}

// One group of signed integers in [qmin, qmax] = [-2^(b-1), 2^(b-1) - 1] with one bf16 scale:
// the plain rule absmax / ((qmax - qmin) / 2), and with Search the candidates absmax / d for d
// in qmax - 1 .. qmax + 1 in quarter steps, the rule of llama.cpp's Q4_0 (the value m of largest
// magnitude maps to qmin: s = -m / -qmin) and its neighbours, and the least-squares rescale
// sum(x q) / sum(q q) of the best so far.
uint16_t quantize_int_group(const float* x, int64_t n, ScaleRule rule, int qmin, int qmax, int8_t* q, double* err2) {
  float amax = 0, m = 0;  // largest magnitude, and the value that has it
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), m = x[i];
  uint16_t best = f32_to_bf16(amax / (0.5f * float(qmax - qmin)));
  double best_e = int_error(x, n, best, qmin, qmax, q);
  if (rule == ScaleRule::Search && amax > 0) {
    int8_t tq[256];
    std::vector<int8_t> heap;
    int8_t* t = tq;
    if (n > 256) heap.resize(size_t(n)), t = heap.data();
    auto consider = [&](float s) {
      const uint16_t h = f32_to_bf16(s);
      if (h == best) return;
      const double e = int_error(x, n, h, qmin, qmax, t);
      if (e < best_e) {
        best_e = e;
        best = h;
        std::memcpy(q, t, size_t(n));
      }
    };
    for (float d = float(qmax - 1); d <= float(qmax + 1); d += 0.25f) consider(amax / d);
    for (float d : {-0.5f, 0.0f, 0.5f}) consider(-m / (float(-qmin) + d));  // m maps to qmin (then less clipping)
    for (int it = 0; it < 2; ++it) {  // least squares for the codes of the best
      double xq = 0, qq = 0;
      for (int64_t i = 0; i < n; ++i) xq += double(x[i]) * q[i], qq += double(q[i]) * q[i];
      if (qq > 0) consider(float(xq / qq));
    }
  }
  if (err2) *err2 = best_e;
  return best;
}

}  // namespace

uint16_t quantize_int4_group(const float* x, int64_t n, ScaleRule rule, int8_t* q, double* err2) {
  return quantize_int_group(x, n, rule, -8, 7, q, err2);
}

uint16_t quantize_int8_group(const float* x, int64_t n, ScaleRule rule, int8_t* q, double* err2) {
  return quantize_int_group(x, n, rule, -128, 127, q, err2);
}

double quantize_int4_row(const float* x, int64_t n, int64_t group, ScaleRule rule, uint32_t* words,
                         uint16_t* scales) {
  if (group <= 0 || n % group || n % 8) throw std::invalid_argument("quantize_int4_row: bad row length or group");
  std::vector<int8_t> q(static_cast<size_t>(n));
  double e = 0;
  for (int64_t g = 0; g < n / group; ++g) {
    double ge = 0;
    scales[g] = quantize_int4_group(x + g * group, group, rule, q.data() + g * group, &ge);
    e += ge;
  }
  pack_int4(q.data(), n, words);
  return e;
}

void dequantize_int4_row(const uint32_t* words, const uint16_t* scales, int64_t n, int64_t group, float* out) {
  for (int64_t k = 0; k < n; ++k)
    out[k] = float(int((words[k / 8] >> (4 * (k % 8))) & 0xF) - 8) * bf16_to_f32(scales[k / group]);
}

double quantize_int8_row(const float* x, int64_t n, int64_t group, ScaleRule rule, int8_t* q, uint16_t* scales) {
  if (group <= 0 || n % group) throw std::invalid_argument("quantize_int8_row: bad row length or group");
  double e = 0;
  for (int64_t g = 0; g < n / group; ++g) {
    double ge = 0;
    scales[g] = quantize_int8_group(x + g * group, group, rule, q + g * group, &ge);
    e += ge;
  }
  return e;
}

double quantize_fp8_band(const float* x, int64_t rows, int64_t cols, ScaleRule rule, uint8_t* codes, float* scales) {
  double total = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += 128) {
    const int64_t w = std::min<int64_t>(128, cols - c0);
    float amax = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < w; ++k) amax = std::max(amax, std::fabs(x[r * cols + c0 + k]));
    auto error = [&](float s, bool write) {
      double e = 0;
      const float inv = 1.0f / s;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < w; ++k) {
          const float v = x[r * cols + c0 + k];
          const uint8_t b = f32_to_fp8e4m3_fast(v * inv);
          if (write) codes[r * cols + c0 + k] = b;
          const float d = v - fp8e4m3_to_f32(b) * s;
          e += double(d) * d;
        }
      return e;
    };
    float best = amax > 0 ? amax / 448.0f : 1.0f;
    if (rule == ScaleRule::Search && amax > 0) {
      double best_e = error(best, false);
      for (float f : {0.9375f, 1.0625f, 1.125f}) {  // f < 1 clips the largest values a little
        const float s = amax / 448.0f * f;
        const double e = error(s, false);
        if (e < best_e) best_e = e, best = s;
      }
    }
    scales[c0 / 128] = best;
    total += error(best, true);
  }
  return total;
}

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::BF16: return "bf16";
    case QuantFormat::FP8: return "fp8";
    case QuantFormat::INT4: return "int4";
    case QuantFormat::INT8: return "int8";
  }
  return "?";
}

WeightFormat weight_format(QuantFormat f) {
  switch (f) {
    case QuantFormat::INT4: return WeightFormat::INT4_GROUP;
    case QuantFormat::INT8: return WeightFormat::INT8_GROUP;
    case QuantFormat::FP8: return WeightFormat::FP8_BLOCK128;
    case QuantFormat::BF16: return WeightFormat::BF16;
  }
  return WeightFormat::BF16;
}

QuantFormat parse_quant_format(const std::string& s, const std::string& what) {
  if (s == "bf16") return QuantFormat::BF16;
  if (s == "fp8") return QuantFormat::FP8;
  if (s == "int4") return QuantFormat::INT4;
  if (s == "int8") return QuantFormat::INT8;
  throw std::invalid_argument(what + ": unknown format '" + s + "' (bf16, fp8, int4, int8)");
}

MatrixView QuantizedMatrix::view() const {
  MatrixView v;
  v.format = format;
  v.rows = rows;
  v.cols = cols;
  v.data = data.data();
  v.scales = scales.empty() ? nullptr : scales.data();
  if (format == WeightFormat::FP8_BLOCK128) v.scale_cols = (cols + 127) / 128;
  if (is_int_group(format)) v.scale_cols = cols / group_size, v.group_size = group_size;
  return v;
}

namespace {

// Quantizes src row by row across nt threads: quantize(r, row, err2) gets row r dequantized to
// float32 and adds its squared error to err2; ref2 gets the sum of the rows' squares.
template <class Quantize>
void for_each_row(const MatrixView& src, int nt, double& err2_out, double& ref2_out, Quantize&& quantize) {
  const int64_t C = src.cols;
  double err2 = 0, ref2 = 0;
#pragma omp parallel num_threads(nt) reduction(+ : err2, ref2)
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < src.rows; ++r) {
      src.dequant_row(r, row.data());
      quantize(r, row.data(), err2);
      for (float v : row) ref2 += double(v) * v;
    }
  }
  err2_out += err2;
  ref2_out += ref2;
}

}  // namespace

QuantizedMatrix quantize_matrix(const MatrixView& src, QuantFormat to, ScaleRule rule, int64_t group, int threads) {
  QuantizedMatrix out;
  out.rows = src.rows;
  out.cols = src.cols;
  const int64_t R = src.rows, C = src.cols;
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  double err2 = 0, ref2 = 0;
  switch (to) {
    case QuantFormat::BF16: {
      out.format = WeightFormat::BF16;
      out.data.resize(size_t(R * C) * 2);
      uint16_t* d = reinterpret_cast<uint16_t*>(out.data.data());
      for_each_row(src, nt, err2, ref2, [&](int64_t r, const float* row, double& e2) {
        for (int64_t k = 0; k < C; ++k) {
          const uint16_t h = f32_to_bf16(row[k]);
          d[r * C + k] = h;
          const double e = double(row[k]) - bf16_to_f32(h);
          e2 += e * e;
        }
      });
      break;
    }
    case QuantFormat::INT4:
    case QuantFormat::INT8: {
      const bool int4 = to == QuantFormat::INT4;
      if (group <= 0 || C % group || (int4 && C % 8))
        throw std::invalid_argument(std::string(int4 ? "INT4" : "INT8") + ": in-features " + std::to_string(C) +
                                    (int4 ? " not a multiple of 8 and of the group size " : " not a multiple of the group size ") +
                                    std::to_string(group));
      out.format = weight_format(to);
      out.group_size = group;
      const int64_t row_bytes = int4 ? C / 2 : C;
      out.data.resize(size_t(R * row_bytes));
      out.scales.resize(size_t(R * (C / group)) * 2);
      uint8_t* d = out.data.data();
      uint16_t* sc = reinterpret_cast<uint16_t*>(out.scales.data());
      for_each_row(src, nt, err2, ref2, [&](int64_t r, const float* row, double& e2) {
        uint8_t* out_row = d + r * row_bytes;
        e2 += int4 ? quantize_int4_row(row, C, group, rule, reinterpret_cast<uint32_t*>(out_row), sc + r * (C / group))
                   : quantize_int8_row(row, C, group, rule, reinterpret_cast<int8_t*>(out_row), sc + r * (C / group));
      });
      break;
    }
    case QuantFormat::FP8: {
      out.format = WeightFormat::FP8_BLOCK128;
      const int64_t bands = (R + 127) / 128, sc_cols = (C + 127) / 128;
      out.data.resize(size_t(R * C));
      out.scales.resize(size_t(bands * sc_cols) * 4);
      float* sc = reinterpret_cast<float*>(out.scales.data());
#pragma omp parallel num_threads(nt) reduction(+ : err2, ref2)
      {
        std::vector<float> band;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < bands; ++b) {
          const int64_t r0 = b * 128, n = std::min<int64_t>(128, R - r0);
          band.resize(size_t(n * C));
          for (int64_t r = 0; r < n; ++r) src.dequant_row(r0 + r, band.data() + r * C);
          err2 += quantize_fp8_band(band.data(), n, C, rule, out.data.data() + r0 * C, sc + b * sc_cols);
          for (float v : band) ref2 += double(v) * v;
        }
      }
      break;
    }
  }
  out.err2 = err2;
  out.ref2 = ref2;
  return out;
}

}  // namespace mla::quant
