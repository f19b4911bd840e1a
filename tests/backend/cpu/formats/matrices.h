// What the weight formats' kernel tests share: random matrices of every format with their own
// storage, and the bounds that hold the fast kernels to the reference (MatrixView::dequant_row
// and a dot product).
#pragma once
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/gemv.h"
#include "backend/cpu/ops.h"
#include "tensor/dtype.h"
#include "tensor/ggml_blocks.h"
#include "tensor/matrix.h"

namespace mla::test {

using mla::MatrixView;
using mla::WeightFormat;

// The byte offsets of a ggml block's f16 fields (d, and dmin or m; tensor/ggml_blocks.h).
inline std::vector<size_t> ggml_half_offsets(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_1:
    case WeightFormat::Q5_1:
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K: return {0, 2};
    case WeightFormat::Q2_K: return {80, 82};
    case WeightFormat::Q3_K: return {108};
    case WeightFormat::Q6_K: return {208};
    default: return {0};
  }
}

// A weight matrix with its own storage.
struct Owned {
  std::vector<uint8_t> data, scales;
  MatrixView view;
};

inline Owned random_matrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng, int64_t group = 32) {
  Owned m;
  MatrixView& v = m.view;
  v.format = f;
  v.rows = rows;
  v.cols = cols;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  m.data.resize(v.row_bytes() * size_t(rows));
  switch (f) {
    case WeightFormat::F32:
      for (size_t i = 0; i < m.data.size() / 4; ++i) {
        float x = nd(rng);
        std::memcpy(&m.data[4 * i], &x, 4);
      }
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
    case WeightFormat::BF16_PAIRS32:  // any bf16 words are a matrix in column pairs too
      for (size_t i = 0; i < m.data.size() / 2; ++i) {
        float x = nd(rng);
        uint16_t h = mla::f32_to_bf16(x);
        if (f == WeightFormat::F16) {  // a finite half: sign, exponent 5..25, any mantissa
          h = uint16_t((byte(rng) & 0x80) << 8 | (5 + byte(rng) % 21) << 10 | (byte(rng) << 2 & 0x3ff));
        }
        std::memcpy(&m.data[2 * i], &h, 2);
      }
      break;
    case WeightFormat::FP8_BLOCK128: {
      for (auto& b : m.data) {
        do b = uint8_t(byte(rng));
        while ((b & 0x7f) == 0x7f);  // NaN codes are not weights
      }
      v.scale_cols = (cols + 127) / 128;
      const int64_t srows = (rows + 127) / 128;
      m.scales.resize(size_t(srows * v.scale_cols) * 4);
      std::uniform_real_distribution<float> u(0.5f, 2.0f);
      for (int64_t i = 0; i < srows * v.scale_cols; ++i) {
        float s = u(rng) * 1e-3f;
        std::memcpy(&m.scales[size_t(4 * i)], &s, 4);
      }
      break;
    }
    case WeightFormat::Q4_0:
    case WeightFormat::Q4_1:
    case WeightFormat::Q5_0:
    case WeightFormat::Q5_1:
    case WeightFormat::Q8_0:
    case WeightFormat::Q2_K:
    case WeightFormat::Q3_K:
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K:
    case WeightFormat::Q6_K: {  // random codes and sub-block scales; the f16 scales N(0, 1) / 100
      for (auto& b : m.data) b = uint8_t(byte(rng));
      const size_t bytes = mla::ggml_block(f).bytes;
      for (size_t o = 0; o < m.data.size(); o += bytes)
        for (size_t h : ggml_half_offsets(f)) {
          const uint16_t v = _cvtss_sh(nd(rng) * 0.01f, 0);  // to nearest even
          std::memcpy(&m.data[o + h], &v, 2);
        }
      break;
    }
    case WeightFormat::INT4_GROUP:
    case WeightFormat::INT4_WORDS16:  // any words and scales are blocks of 16 rows too
    case WeightFormat::INT8_WORDS16:
    case WeightFormat::INT8_GROUP: {  // every byte is a valid code (INT8: -128..127)
      for (auto& b : m.data) b = uint8_t(byte(rng));
      v.group_size = group;
      v.scale_cols = cols / group;
      m.scales.resize(size_t(rows * v.scale_cols) * 2);
      for (int64_t i = 0; i < rows * v.scale_cols; ++i) {
        uint16_t h = mla::f32_to_bf16(nd(rng) * 0.01f);
        std::memcpy(&m.scales[size_t(2 * i)], &h, 2);
      }
      break;
    }
  }
  v.data = m.data.data();
  v.scales = m.scales.empty() ? nullptr : m.scales.data();
  return m;
}

inline std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

// |y_i - ref_i| <= tol * sum_k |w_ik x_k| + 1e-30: a bound relative to the size of the terms,
// since the kernels sum in another order (and, in fast mode, round activations to bf16).
inline void expect_close(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
                  const std::vector<float>& ref, int64_t ldy, double tol, const std::string& what) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  int bad = 0;
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double mag = 0;
      for (int64_t k = 0; k < W.cols; ++k) mag += std::fabs(double(row[size_t(k)]) * x[t * ldx + k]);
      const float a = y[size_t(t * ldy + n)], b = ref[size_t(t * ldy + n)];
      if (!(std::fabs(double(a) - b) <= tol * mag + 1e-30) && bad++ < 5)
        ADD_FAILURE() << what << " row " << n << " token " << t << ": " << a << " vs reference " << b
                      << " (terms " << mag << ")";
    }
  }
}


// The contexts the kernels run in here: the default (precise); fast as dispatched by default;
// fast with the bf16 kernels serving every token count (by default only single tokens).
inline mla::cpu::Context fast_context(int64_t bf16_max_tokens) {
  mla::cpu::Context c;
  c.precision = mla::cpu::Precision::Fast;
  c.gemv_bf16_max_tokens = bf16_max_tokens;
  return c;
}
inline const mla::cpu::Context kPrecise;
inline const mla::cpu::Context kFast = fast_context(1);
inline const mla::cpu::Context kFastBf16 = fast_context(int64_t(1) << 40);

// y against W x in double on bf16-rounded activations (and, with round_weights, bf16-rounded
// weights, as the GEMM paths see them): |y - ref| <= tol * sum_k |w_k x_k| + slack per output.
// round_activations false: the kernel multiplies the float32 activations (the FMA GEMM).
inline void expect_close_bf16(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
                       int64_t ldy, double tol, double slack, bool round_weights, const std::string& what,
                       bool round_activations = true) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  int bad = 0;
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    if (round_weights)
      for (auto& w : row) w = mla::bf16_to_f32(mla::f32_to_bf16(w));
    for (int64_t t = 0; t < T; ++t) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < W.cols; ++k) {
        const float xv = x[t * ldx + k];
        const double p = double(row[size_t(k)]) * (round_activations ? mla::bf16_to_f32(mla::f32_to_bf16(xv)) : xv);
        ref += p;
        mag += std::fabs(p);
      }
      const float a = y[size_t(t * ldy + n)];
      if (!(std::fabs(double(a) - ref) <= tol * mag + slack) && bad++ < 5)
        ADD_FAILURE() << what << " row " << n << " token " << t << ": " << a << " vs reference " << ref << " (terms "
                      << mag << ", error " << std::fabs(double(a) - ref) / mag << " of them, bound " << tol << ")";
    }
  }
}

// The fast precision's bf16 kernels (bf16, FP8, INT4 weights) against W x computed in double
// on the activations rounded to bf16, as those kernels see them. Each product of a bf16 activation
// and a decoded weight (exact in bf16; INT4's group scale and FP8's block scale multiply partial
// sums) is exact in float32, so the only errors are float32 roundings along a summation chain
// of the kernel: per lane 2 additions per 32 columns (VDPBF16PS), a scale multiply and add per
// group, 4 in the horizontal sum, the FP8 subnormal codes' products (up to 3 roundings, summed
// apart, at most one per 16 columns in random bytes) and up to 3 per column of the scalar tail
// (cols % 64: the weight's float value, the product, the sum). With u = 2^-24, the error is at
// most m u sum_k |w_k x_k| with m = cols / 8 + 3 (cols % 64) + 12 (the reference's float32
// weights, FP8's rounded value * scale, add one more): about 2e-6 for 256 columns. FP8 products
// of 2 to 16 tokens on AMX tiles (amx.h) sum in a longer chain: TDPBF16PS rounds once per column
// pair, 32 per 64 columns, so there m = cols / 2 + 3 (cols % 64) + 12. Other formats keep the
// float32 kernels and are checked as in precise mode.
inline void expect_close_fast(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
                       int64_t ldy, const std::string& what) {
  const bool amx_tiles = W.format == WeightFormat::FP8_BLOCK128 && T >= 2 && mla::cpu::host_features().amx;
  const double m = double(W.cols) / (amx_tiles ? 2 : 8) + 3.0 * double(W.cols % 64) + 12;
  expect_close_bf16(W, x, T, ldx, y, ldy, m * std::ldexp(1.0, -24), 1e-30, false, what);
}

inline const WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16, WeightFormat::FP8_BLOCK128,
                                 WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP};


// Reads W[n, k] through the fast kernel (x = the unit vector e_k).
inline float fast_element(const mla::cpu::Context& ctx, const MatrixView& W, int64_t n, int64_t k) {
  std::vector<float> x(static_cast<size_t>(W.cols), 0.0f), y(static_cast<size_t>(W.rows));
  x[size_t(k)] = 1.0f;
  mla::cpu::gemv(ctx, x.data(), 1, W.cols, W, y.data(), W.rows);
  return y[size_t(n)];
}

}  // namespace mla::test
