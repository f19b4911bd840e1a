// The fast matrix products against the plain reference (MatrixView::dequant_row + dot) over
// many shapes, odd sizes and every weight format; INT4, INT8 and FP8 unpacking against
// hand-packed values; cpu::matmul on both of its paths and in both precisions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/formats/gemv.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/precision.h"
#include "backend/cpu/repack.h"
#include "backend/cpu/common/decode_avx512.h"
#include "backend/cpu/formats/group_view.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace {

using mla::MatrixView;
using mla::WeightFormat;

// A weight matrix with its own storage.
struct Owned {
  std::vector<uint8_t> data, scales;
  MatrixView view;
};

Owned random_matrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng, int64_t group = 32) {
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

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

// |y_i - ref_i| <= tol * sum_k |w_ik x_k| + 1e-30: a bound relative to the size of the terms,
// since the kernels sum in another order (and, in fast mode, round activations to bf16).
void expect_close(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
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
mla::cpu::Context fast_context(int64_t bf16_max_tokens) {
  mla::cpu::Context c;
  c.precision = mla::cpu::Precision::Fast;
  c.gemv_bf16_max_tokens = bf16_max_tokens;
  return c;
}
const mla::cpu::Context kPrecise;
const mla::cpu::Context kFast = fast_context(1);
const mla::cpu::Context kFastBf16 = fast_context(int64_t(1) << 40);

bool has_bf16_kernel(WeightFormat f) {
  return f == WeightFormat::BF16 || f == WeightFormat::FP8_BLOCK128 || f == WeightFormat::INT4_GROUP;
}

// y against W x in double on bf16-rounded activations (and, with round_weights, bf16-rounded
// weights, as the GEMM paths see them): |y - ref| <= tol * sum_k |w_k x_k| + slack per output.
// round_activations false: the kernel multiplies the float32 activations (the FMA GEMM).
void expect_close_bf16(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
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
void expect_close_fast(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
                       int64_t ldy, const std::string& what) {
  const bool amx_tiles = W.format == WeightFormat::FP8_BLOCK128 && T >= 2 && mla::cpu::host_features().amx;
  const double m = double(W.cols) / (amx_tiles ? 2 : 8) + 3.0 * double(W.cols % 64) + 12;
  expect_close_bf16(W, x, T, ldx, y, ldy, m * std::ldexp(1.0, -24), 1e-30, false, what);
}

const WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16, WeightFormat::FP8_BLOCK128,
                                 WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP};

TEST(Gemv, MatchesReferenceOverShapesAndFormats) {
  const mla::cpu::Context& ctx = kPrecise;
  std::mt19937 rng(7);
  const int64_t rows_list[] = {1, 3, 4, 7, 9, 130, 300};
  const int64_t cols_list[] = {1, 17, 31, 32, 33, 96, 129, 160, 256, 300};
  const int64_t tokens[] = {1, 2, 3, 4, 5, 9};
  for (WeightFormat f : kFormats)
    for (int64_t rows : rows_list)
      for (int64_t cols : cols_list) {
        if (mla::is_int_group(f) && cols % 32) continue;
        Owned m = random_matrix(f, rows, cols, rng);
        for (int64_t T : tokens) {
          const int64_t ldx = cols + 3, ldy = rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
          mla::cpu::gemv(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
          mla::cpu::gemv_reference(x.data(), T, ldx, m.view, ref.data(), ldy);
          expect_close(m.view, x.data(), T, ldx, y, ref, ldy, 1e-5,
                       std::string(mla::weight_format_name(f)) + " " + std::to_string(rows) + "x" +
                           std::to_string(cols) + " T=" + std::to_string(T));
          // Padding between rows of y is left alone.
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f);
        }
      }
}

TEST(Gemv, FastPrecisionMatchesBf16ReferenceOverShapesAndFormats) {
  const mla::cpu::Context& ctx = kFastBf16;
  std::mt19937 rng(17);
  const int64_t rows_list[] = {1, 3, 4, 7, 9, 130, 300};
  const int64_t cols_list[] = {1, 17, 31, 32, 33, 63, 64, 65, 96, 127, 129, 160, 256, 300};
  const int64_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (WeightFormat f : kFormats)
    for (int64_t rows : rows_list)
      for (int64_t cols : cols_list) {
        if (mla::is_int_group(f) && cols % 32) continue;
        Owned m = random_matrix(f, rows, cols, rng);
        for (int64_t T : tokens) {
          const int64_t ldx = cols + 3, ldy = rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
          mla::cpu::gemv(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
          const std::string what = std::string("fast ") + mla::weight_format_name(f) + " " + std::to_string(rows) +
                                   "x" + std::to_string(cols) + " T=" + std::to_string(T);
          if (has_bf16_kernel(f)) {
            expect_close_fast(m.view, x.data(), T, ldx, y, ldy, what);
          } else {
            mla::cpu::gemv_reference(x.data(), T, ldx, m.view, ref.data(), ldy);
            expect_close(m.view, x.data(), T, ldx, y, ref, ldy, 1e-5, what);
          }
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f);
        }
      }
}

TEST(Gemv, FastPrecisionRowSlicesAcrossBlocksAndThreads) {
  // As RowSlicesAcrossBlocksAndThreads, in the fast precision, plus a batch of jobs in one call.
  const mla::cpu::Context& ctx = kFastBf16;
  std::mt19937 rng(19);
  for (WeightFormat f : kFormats)
    for (int64_t group : {32, 64, 128}) {
      if (group != 32 && !mla::is_int_group(f)) continue;
      Owned m = random_matrix(f, 700, 576, rng, group);
      for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 700}, {77, 500}, {129, 300}, {200, 1}}) {
        MatrixView v = m.view.slice_rows(first, count);
        for (int64_t T : {1, 2, 4, 6}) {
          auto x = random_vec(size_t(T * 576), rng);
          std::vector<float> y(size_t(T * count)), ref(size_t(T * count));
          mla::cpu::gemv(ctx, x.data(), T, 576, v, y.data(), count);
          const std::string what = std::string("fast ") + mla::weight_format_name(f) + " slice " +
                                   std::to_string(first) + "+" + std::to_string(count) + " group " +
                                   std::to_string(group) + " T=" + std::to_string(T);
          if (has_bf16_kernel(f)) {
            expect_close_fast(v, x.data(), T, 576, y, count, what);
          } else {
            mla::cpu::gemv_reference(x.data(), T, 576, v, ref.data(), count);
            expect_close(v, x.data(), T, 576, y, ref, count, 1e-5, what);
          }
        }
      }
    }
  // Jobs of every format in one call, fast and float32 kernels side by side, one x shared.
  std::vector<Owned> mats;
  std::vector<std::vector<float>> ys;
  std::vector<mla::cpu::GemvJob> jobs;
  auto x = random_vec(size_t(3 * 640), rng);
  for (WeightFormat f : kFormats) {
    mats.push_back(random_matrix(f, 333, 640, rng));
    ys.emplace_back(size_t(3 * 333), -1.0f);
  }
  for (size_t i = 0; i < mats.size(); ++i) jobs.push_back({x.data(), 3, 640, mats[i].view, ys[i].data(), 333});
  mla::cpu::gemv_batch(ctx, jobs);
  for (size_t i = 0; i < mats.size(); ++i) {
    const std::string what = std::string("fast batch ") + mla::weight_format_name(kFormats[i]);
    if (has_bf16_kernel(kFormats[i])) {
      expect_close_fast(mats[i].view, x.data(), 3, 640, ys[i], 333, what);
    } else {
      std::vector<float> ref(size_t(3 * 333));
      mla::cpu::gemv_reference(x.data(), 3, 640, mats[i].view, ref.data(), 333);
      expect_close(mats[i].view, x.data(), 3, 640, ys[i], ref, 333, 1e-5, what);
    }
  }
}

TEST(Gemv, FastFp8OnAmxTilesUpToSixteenTokens) {
  // FP8 products of 2 to 16 tokens run on AMX tiles where the CPU has them (amx.h): views that
  // start inside a 128-row block and end inside another (tiles cut short at block edges), odd
  // numbers of 64-column steps (a scale block of one step), column tails; random codes include
  // the subnormals the tiles read as zero. Elsewhere the same calls check the other kernels.
  const mla::cpu::Context& ctx = kFastBf16;
  std::mt19937 rng(29);
  for (int64_t cols : {64, 129, 320, 1000}) {
    Owned m = random_matrix(WeightFormat::FP8_BLOCK128, 400, cols, rng);
    for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 400}, {77, 290}, {250, 5}})
      for (int64_t T : {2, 5, 11, 16, 17}) {
        MatrixView v = m.view.slice_rows(first, count);
        auto x = random_vec(size_t(T * cols), rng);
        std::vector<float> y(size_t(T * (count + 3)), -1.0f);
        mla::cpu::gemv(ctx, x.data(), T, cols, v, y.data(), count + 3);
        expect_close_fast(v, x.data(), T, cols, y, count + 3,
                          "fast fp8 " + std::to_string(first) + "+" + std::to_string(count) + "x" +
                              std::to_string(cols) + " T=" + std::to_string(T));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = count; n < count + 3; ++n) ASSERT_EQ(y[size_t(t * (count + 3) + n)], -1.0f);
      }
  }
}

TEST(Gemv, FastPrecisionMixedBatchAsAnMoeDecodeStep) {
  // One call as a batched decode step's experts make it, in the default dispatch: FP8 jobs of
  // 1 token (VDPBF16PS kernel) and of 2 to 16 (AMX tiles where the CPU has them) beside an INT4
  // job of 1 token and a bf16 job of 3 (float32 kernel), all sharing the threads' work units.
  const mla::cpu::Context& ctx = kFast;
  std::mt19937 rng(31);
  struct Case {
    WeightFormat f;
    int64_t T;
  };
  const Case cases[] = {{WeightFormat::FP8_BLOCK128, 1}, {WeightFormat::FP8_BLOCK128, 2},
                        {WeightFormat::FP8_BLOCK128, 7}, {WeightFormat::FP8_BLOCK128, 16},
                        {WeightFormat::INT4_GROUP, 1},   {WeightFormat::BF16, 3}};
  const int64_t rows = 384, cols = 1024;
  std::vector<Owned> mats;
  std::vector<std::vector<float>> xs, ys;
  std::vector<mla::cpu::GemvJob> jobs;
  for (const auto& c : cases) {
    mats.push_back(random_matrix(c.f, rows, cols, rng));
    xs.push_back(random_vec(size_t(c.T * cols), rng));
    ys.emplace_back(size_t(c.T * rows), -1.0f);
  }
  for (size_t i = 0; i < std::size(cases); ++i)
    jobs.push_back({xs[i].data(), cases[i].T, cols, mats[i].view, ys[i].data(), rows});
  mla::cpu::gemv_batch(ctx, jobs);
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    const std::string what = std::string("mixed batch ") + mla::weight_format_name(c.f) + " T=" + std::to_string(c.T);
    if (c.T == 1 || (c.f == WeightFormat::FP8_BLOCK128 && mla::cpu::host_features().amx)) {
      expect_close_fast(mats[i].view, xs[i].data(), c.T, cols, ys[i], rows, what);
    } else {
      std::vector<float> ref(size_t(c.T * rows));
      mla::cpu::gemv_reference(xs[i].data(), c.T, cols, mats[i].view, ref.data(), rows);
      expect_close(mats[i].view, xs[i].data(), c.T, cols, ys[i], ref, rows, 1e-5, what);
    }
  }
}

TEST(Gemv, FastPrecisionUsesBf16KernelsForSingleTokensByDefault) {
  // Default dispatch: 1 token on the bf16 kernels (activations rounded to bf16), more tokens on
  // the float32 kernels (float32 activations, as in precise mode), except FP8 on AMX tiles,
  // which round the activations to bf16 too. INT8 has no bf16 kernel: float32 for every T.
  const mla::cpu::Context& ctx = kFast;
  ASSERT_EQ(mla::cpu::Context().gemv_bf16_max_tokens, 1);
  std::mt19937 rng(23);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::FP8_BLOCK128, WeightFormat::INT4_GROUP,
                        WeightFormat::INT8_GROUP}) {
    Owned m = random_matrix(f, 150, 320, rng);
    for (int64_t T : {1, 3}) {
      auto x = random_vec(size_t(T * 320), rng);
      std::vector<float> y(size_t(T * 150)), ref(size_t(T * 150));
      mla::cpu::gemv(ctx, x.data(), T, 320, m.view, y.data(), 150);
      const std::string what = std::string("default fast ") + mla::weight_format_name(f) + " T=" + std::to_string(T);
      if ((T == 1 && has_bf16_kernel(f)) || (f == WeightFormat::FP8_BLOCK128 && mla::cpu::host_features().amx)) {
        expect_close_fast(m.view, x.data(), T, 320, y, 150, what);
      } else {
        mla::cpu::gemv_reference(x.data(), T, 320, m.view, ref.data(), 150);
        expect_close(m.view, x.data(), T, 320, y, ref, 150, 1e-5, what);
      }
    }
  }
}

TEST(Gemv, RowSlicesAcrossBlocksAndThreads) {
  const mla::cpu::Context& ctx = kPrecise;
  // Views that start inside an FP8 128-row block or deep in an INT4 tensor, large enough to run
  // on several threads, and INT4 groups of 64 and 128.
  std::mt19937 rng(11);
  for (WeightFormat f : kFormats)
    for (int64_t group : {32, 64, 128}) {
      if (group != 32 && !mla::is_int_group(f)) continue;
      Owned m = random_matrix(f, 700, 512, rng, group);
      for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 700}, {77, 500}, {129, 300}, {200, 1}}) {
        MatrixView v = m.view.slice_rows(first, count);
        for (int64_t T : {1, 4, 6}) {
          auto x = random_vec(size_t(T * 512), rng);
          std::vector<float> y(size_t(T * count)), ref(size_t(T * count));
          mla::cpu::gemv(ctx, x.data(), T, 512, v, y.data(), count);
          mla::cpu::gemv_reference(x.data(), T, 512, v, ref.data(), count);
          expect_close(v, x.data(), T, 512, y, ref, count, 1e-5,
                       std::string(mla::weight_format_name(f)) + " slice " + std::to_string(first) + "+" +
                           std::to_string(count) + " group " + std::to_string(group));
        }
      }
    }
}

// Reads W[n, k] through the fast kernel (x = the unit vector e_k).
float fast_element(const mla::cpu::Context& ctx, const MatrixView& W, int64_t n, int64_t k) {
  std::vector<float> x(static_cast<size_t>(W.cols), 0.0f), y(static_cast<size_t>(W.rows));
  x[size_t(k)] = 1.0f;
  mla::cpu::gemv(ctx, x.data(), 1, W.cols, W, y.data(), W.rows);
  return y[size_t(n)];
}

TEST(Int4, UnpacksHandPackedWords) {
  // One row of 64 values = 8 words; group 32, scales 0.5 and 2. Word w holds values 8w..8w+7,
  // low nibble first, each stored as q + 8.
  std::vector<int> q(64);
  for (int k = 0; k < 64; ++k) q[size_t(k)] = (k * 5) % 16 - 8;  // every code from -8 to 7
  q[7] = 7;    // highest nibble of word 0: the largest positive code
  q[15] = -8;  // highest nibble of word 1: the most negative code (stored 0)
  q[63] = -1;  // highest nibble of the last word
  std::vector<uint32_t> words(8, 0);
  for (int k = 0; k < 64; ++k) words[size_t(k / 8)] |= uint32_t(q[size_t(k)] + 8) << (4 * (k % 8));
  EXPECT_EQ(words[0] >> 28, 15u);
  EXPECT_EQ(words[1] >> 28, 0u);
  std::vector<uint16_t> scales = {mla::f32_to_bf16(0.5f), mla::f32_to_bf16(2.0f)};
  const MatrixView v = mla::test::group_view(WeightFormat::INT4_GROUP, words.data(), scales.data(), 1, 64, 32);
  std::vector<float> row(64);
  v.dequant_row(0, row.data());
  for (int k = 0; k < 64; ++k) {
    const float want = float(q[size_t(k)]) * (k < 32 ? 0.5f : 2.0f);
    EXPECT_EQ(row[size_t(k)], want) << "reference, value " << k;
    EXPECT_EQ(fast_element(kPrecise, v, 0, k), want) << "fast kernel, value " << k;
    EXPECT_EQ(fast_element(kFastBf16, v, 0, k), want) << "bf16 kernel, value " << k;
  }
  // Every code in every nibble position, in the bf16 kernel's steps of 64 columns and its
  // scalar tail (96 columns: one step, then 32): word w of row r holds codes (w + r + i) % 16.
  const mla::cpu::Context& ctx = kFastBf16;
  MatrixView m = v;
  m.rows = 4;
  m.cols = 96;
  m.scale_cols = 3;
  std::vector<uint32_t> packed(size_t(4 * 12));
  std::vector<uint16_t> sc(size_t(4 * 3));
  for (int r = 0; r < 4; ++r) {
    for (int w = 0; w < 12; ++w)
      for (int i = 0; i < 8; ++i) packed[size_t(r * 12 + w)] |= uint32_t((w + r + i) % 16) << (4 * i);
    for (int g = 0; g < 3; ++g) sc[size_t(r * 3 + g)] = mla::f32_to_bf16(std::ldexp(1.0f, g - r));
  }
  m.data = packed.data();
  m.scales = sc.data();
  for (int k = 0; k < 96; ++k) {
    std::vector<float> x(96, 0.0f), y(4);
    x[size_t(k)] = 1.0f;
    mla::cpu::gemv(ctx, x.data(), 1, 96, m, y.data(), 4);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(y[size_t(r)], float((k / 8 + r + k % 8) % 16 - 8) * std::ldexp(1.0f, k / 32 - r))
          << "bf16 kernel, row " << r << " column " << k;
  }
}

TEST(Int8, EveryCodeInEveryColumnOfEveryKernel) {
  // Rows of 160 int8 codes (five chunks of 32), group 32 with power-of-two scales, so every
  // product is exact: value i = r * 160 + k holds code 37 i % 256 - 128 (37 is odd: each run of
  // 256 values takes every code from -128 to 127, five times over at varying columns). Each
  // value is read back through a one-hot x by the GEMV of both precisions (INT8 has only the
  // float32 kernel: gemv_kernel) and the prompt path (the bf16 GEMM on dequantized rows: AMX
  // below 128 tokens where the CPU has it, oneDNN from 128), and must equal code * scale exactly.
  constexpr int R = 8, C = 160, G = 32;
  std::vector<int8_t> codes(size_t(R * C));
  std::vector<uint16_t> sc(size_t(R * (C / G)));
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < C; ++k) codes[size_t(r * C + k)] = int8_t((r * C + k) * 37 % 256 - 128);
    for (int g = 0; g < C / G; ++g) sc[size_t(r * (C / G) + g)] = mla::f32_to_bf16(std::ldexp(1.0f, g - r));
  }
  MatrixView v;
  v.format = WeightFormat::INT8_GROUP;
  v.rows = R;
  v.cols = C;
  v.data = codes.data();
  v.scales = sc.data();
  v.group_size = G;
  v.scale_cols = C / G;
  std::vector<float> row(C);
  for (int r = 0; r < R; ++r) {
    v.dequant_row(r, row.data());
    for (int k = 0; k < C; ++k)
      ASSERT_EQ(row[size_t(k)], float(codes[size_t(r * C + k)]) * std::ldexp(1.0f, k / G - r)) << "reference";
  }
  std::vector<float> x(size_t(C) * 130, 0.0f);  // up to 130 one-hot tokens (the prompt path)
  for (int k = 0; k < C; ++k) {
    std::fill(x.begin(), x.begin() + C, 0.0f);
    x[size_t(k)] = 1.0f;
    for (const mla::cpu::Context* ctx : {&kPrecise, &kFastBf16}) {
      std::vector<float> y(R);
      mla::cpu::gemv(*ctx, x.data(), 1, C, v, y.data(), R);
      for (int r = 0; r < R; ++r)
        EXPECT_EQ(y[size_t(r)], float(codes[size_t(r * C + k)]) * std::ldexp(1.0f, k / G - r))
            << (ctx == &kPrecise ? "precise" : "fast") << " GEMV, row " << r << " column " << k;
    }
  }
  // The prompt path: token t is one-hot at column t % C.
  for (int T : {100, 130}) {
    std::fill(x.begin(), x.end(), 0.0f);
    for (int t = 0; t < T; ++t) x[size_t(t) * C + size_t(t % C)] = 1.0f;
    std::vector<float> y(size_t(T * R));
    mla::cpu::matmul_bf16(kFastBf16, x.data(), T, C, v, y.data(), R);
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) {
        const int k = t % C;
        EXPECT_EQ(y[size_t(t * R + r)], float(codes[size_t(r * C + k)]) * std::ldexp(1.0f, k / G - r))
            << "prompt path, " << T << " tokens, token " << t << " row " << r;
      }
  }
}

TEST(Fp8, DecodesEveryCode) {
  // One row of 256 codes (all but the two NaNs mapped to 0), scale 1 then 3 per 128 columns.
  std::vector<uint8_t> codes(256);
  for (int k = 0; k < 256; ++k) codes[size_t(k)] = ((k & 0x7f) == 0x7f) ? 0 : uint8_t(k);
  std::vector<float> scales = {1.0f, 3.0f};
  MatrixView v;
  v.format = WeightFormat::FP8_BLOCK128;
  v.rows = 1;
  v.cols = 256;
  v.data = codes.data();
  v.scales = scales.data();
  v.scale_cols = 2;
  for (int k = 0; k < 256; ++k) {
    const float want = mla::fp8e4m3_to_f32(codes[size_t(k)]) * (k < 128 ? 1.0f : 3.0f);
    EXPECT_EQ(fast_element(kPrecise, v, 0, k), want) << "code " << int(codes[size_t(k)]);
    // The bf16 kernel: e4m3 bits as bf16 (exponent-0 codes, bf16 denormals that VDPBF16PS
    // reads as zero, through the subnormal fix-up), times 2^-120, the activation times 2^64.
    EXPECT_EQ(fast_element(kFastBf16, v, 0, k), want) << "bf16 kernel, code " << int(codes[size_t(k)]);
  }
  {
    // Every code against an activation of 1.5 (a bf16 with a mantissa bit) on 4 tokens and 4 rows
    // (a full tile), each row a rotation of the codes: y[t][r] sums code (k + r) % 256 * x.
    const mla::cpu::Context& ctx = kFastBf16;
    std::vector<uint8_t> rot(4 * 256);
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 256; ++k) rot[size_t(r * 256 + k)] = codes[size_t((k + r) % 256)];
    MatrixView m = v;
    m.rows = 4;
    m.data = rot.data();
    for (int k = 0; k < 256; k += 7) {
      std::vector<float> x(4 * 256, 0.0f), y(16);
      for (int t = 0; t < 4; ++t) x[size_t(t * 256 + k)] = 1.5f * float(t + 1);
      mla::cpu::gemv(ctx, x.data(), 4, 256, m, y.data(), 4);
      for (int t = 0; t < 4; ++t)
        for (int r = 0; r < 4; ++r)
          EXPECT_EQ(y[size_t(t * 4 + r)],
                    mla::fp8e4m3_to_f32(rot[size_t(r * 256 + k)]) * (k < 128 ? 1.0f : 3.0f) * 1.5f * float(t + 1))
              << "bf16 kernel, row " << r << " token " << t << " column " << k;
    }
  }
  EXPECT_EQ(mla::fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(mla::fp8e4m3_to_f32(0xfe), -448.0f);
}

TEST(Matmul, BothPathsBothPrecisions) {
  std::mt19937 rng(3);
  for (auto p : {mla::cpu::Precision::Precise, mla::cpu::Precision::Fast}) {
    mla::cpu::Context ctx;
    ctx.precision = p;
    // Fast mode rounds activations (and f32/f16 weights) to bf16: relative error 2^-8 each.
    const double tol = p == mla::cpu::Precision::Fast ? 1.6e-2 : 1e-5;
    for (WeightFormat f : kFormats)
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 64}, {130, 96}, {257, 160}, {64, 33}}) {
        if (mla::is_int_group(f) && cols % 32) continue;
        Owned m = random_matrix(f, rows, cols, rng);
        for (int64_t T : {1, 3, 8, 9, 17, 70}) {
          const int64_t ldx = cols + 1, ldy = rows + 2;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
          mla::cpu::matmul(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
          mla::cpu::gemv_reference(x.data(), T, ldx, m.view, ref.data(), ldy);
          expect_close(m.view, x.data(), T, ldx, y, ref, ldy, tol,
                       std::string(mla::cpu::precision_name(p)) + " " + mla::weight_format_name(f) + " " +
                           std::to_string(rows) + "x" + std::to_string(cols) + " T=" + std::to_string(T));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f);
        }
      }
  }
}

TEST(Matmul, BatchOfJobsEqualsEachAlone) {
  const mla::cpu::Context& ctx = kPrecise;
  // Mixed formats, shapes and token counts (few-token jobs share one parallel region; the others
  // run alone), two jobs reading the same x, large enough to be split across threads.
  std::mt19937 rng(5);
  struct Case {
    WeightFormat f;
    int64_t rows, cols, T;
  };
  const Case cases[] = {{WeightFormat::BF16, 700, 256, 1},         {WeightFormat::INT4_GROUP, 333, 512, 1},
                        {WeightFormat::FP8_BLOCK128, 300, 200, 3}, {WeightFormat::F32, 5, 64, 4},
                        {WeightFormat::BF16, 64, 96, 12},          {WeightFormat::F16, 1000, 130, 2},
                        {WeightFormat::INT8_GROUP, 500, 320, 1},   {WeightFormat::INT8_GROUP, 70, 96, 5}};
  std::vector<Owned> mats;
  std::vector<std::vector<float>> xs, ys, refs;
  std::vector<mla::cpu::MatmulJob> jobs;
  for (const auto& c : cases) {
    mats.push_back(random_matrix(c.f, c.rows, c.cols, rng));
    xs.push_back(random_vec(size_t(c.T * c.cols), rng));
  }
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    ys.emplace_back(size_t(c.T * c.rows), -1.0f);
    refs.emplace_back(size_t(c.T * c.rows), -1.0f);
    jobs.push_back({xs[i].data(), c.T, c.cols, mats[i].view, ys[i].data(), c.rows});
  }
  // One more job on job 0's activations: a shared x.
  std::vector<float> y_shared(size_t(700), -1.0f), ref_shared(size_t(700));
  Owned m2 = random_matrix(WeightFormat::BF16, 700, 256, rng);
  jobs.push_back({xs[0].data(), 1, 256, m2.view, y_shared.data(), 700});
  mla::cpu::matmul_batch(ctx, jobs);
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    mla::cpu::gemv_reference(xs[i].data(), c.T, c.cols, mats[i].view, refs[i].data(), c.rows);
    expect_close(mats[i].view, xs[i].data(), c.T, c.cols, ys[i], refs[i], c.rows, 1e-5,
                 "batch job " + std::to_string(i));
  }
  mla::cpu::gemv_reference(xs[0].data(), 1, 256, m2.view, ref_shared.data(), 700);
  expect_close(m2.view, xs[0].data(), 1, 256, y_shared, ref_shared, 700, 1e-5, "batch job sharing x");
}

// The fast precision's GEMM paths over token counts that exercise the kernels' token groups
// (AMX: 16 and 48; VDPBF16PS: up to 6, split evenly) and their passes of tokens (K = 7168: 48
// tokens a pass), with a short last block of rows and row counts off a multiple of 4 (VDPBF16PS's
// row group), against W x in double on bf16-rounded weights and activations.
// roundings_per_column: of the bf16 kernels (AMX, VDPBF16PS); the FMA kernel, where the context
// picks it, takes its float32 activations unrounded into one FMA chain per output (one rounding a
// column).
void check_prompt_sized_products(const mla::cpu::Context& ctx, double roundings_per_column) {
  std::mt19937 rng(11);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::FP8_BLOCK128, WeightFormat::INT4_GROUP,
                        WeightFormat::INT8_GROUP})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{77, 2048}, {40, 7168}, {64, 96}, {33, 32}, {1, 160}}) {
      Owned m = random_matrix(f, rows, cols, rng);
      for (int64_t T : {5, 7, 8, 13, 16, 17, 24, 33, 40, 47, 48, 49, 52, 56, 100, 127, 300, 600}) {
        if (cols == 7168 && T > 127) continue;
        if (T > 512 && cols > 160) continue;  // 600: two passes of 300 (passes stop at 512 tokens)
        const int64_t ldx = cols + 3, ldy = rows + 5;
        auto x = random_vec(size_t(T * ldx), rng);
        std::vector<float> y(size_t(T * ldy), -1.0f);
        mla::cpu::matmul_bf16(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
        const mla::cpu::Kernel k = mla::cpu::gemm_bf16_kernel(T, m.view, mla::cpu::features(ctx));
        const bool fma = k == mla::cpu::Kernel::FmaGemm;
        // The VDPBF16PS path's paired kernel (from kDpbf16PairsMinTokens; a product split into
        // passes has at least 24 tokens in each) keeps one chain per output, two roundings a
        // column pair, as the FMA kernel's one a column.
        const bool pairs = k == mla::cpu::Kernel::Dpbf16Gemm && T >= mla::cpu::kDpbf16PairsMinTokens;
        expect_close_bf16(m.view, x.data(), T, ldx, y, ldy,
                          (double(cols) * (fma || pairs ? 1.0 : roundings_per_column) + 16) * std::ldexp(1.0, -24), 0.0, true,
                          std::string(mla::weight_format_name(f)) + " " + std::to_string(rows) + "x" +
                              std::to_string(cols) + " T=" + std::to_string(T) + " on " +
                              mla::cpu::kernel_name(mla::cpu::gemm_bf16_kernel(T, m.view, mla::cpu::features(ctx))),
                          !fma);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
      }
    }
}

// The prompt GEMMs' token groups: threads pack the paired kernel's activations group by group
// (token_group), the kernels walk them with for_each_token_group; both must cover the tokens in
// order, each group at most Max and the sizes at most one apart, and agree group by group, and
// the packed layout must be the same either way.
TEST(Matmul, TokenGroupsCoverTheTokensAsTheKernelsWalkThem) {
  for (int64_t M = 1; M <= 200; ++M) {
    std::vector<mla::cpu::TokenGroup> walked;
    mla::cpu::for_each_token_group<12>(M, [&](auto n, int64_t t0) { walked.push_back({t0, decltype(n)::value}); });
    ASSERT_EQ(int64_t(walked.size()), mla::cpu::token_group_count(M, 12)) << M;
    int64_t next = 0, lo = M, hi = 0;
    for (int64_t g = 0; g < int64_t(walked.size()); ++g) {
      const mla::cpu::TokenGroup tg = mla::cpu::token_group(M, 12, g);
      ASSERT_EQ(tg.t0, walked[size_t(g)].t0) << M << " group " << g;
      ASSERT_EQ(tg.n, walked[size_t(g)].n) << M << " group " << g;
      ASSERT_EQ(tg.t0, next) << M;
      ASSERT_LE(tg.n, 12);
      next += tg.n;
      lo = std::min(lo, tg.n);
      hi = std::max(hi, tg.n);
    }
    ASSERT_EQ(next, M);
    ASSERT_LE(hi - lo, 1) << M;
  }
  std::mt19937 rng(5);
  for (int64_t M : {1, 13, 29, 52, 256}) {
    const int64_t K = 96, ldx = K + 6;
    std::vector<uint16_t> x(size_t(M * ldx));
    for (auto& v : x) v = uint16_t(rng());
    std::vector<uint32_t> whole(size_t(M * K / 2)), by_group(size_t(M * K / 2), 0);
    mla::cpu::pack_activation_pairs(x.data(), M, K, ldx, whole.data());
    for (int64_t g = mla::cpu::token_group_count(M, mla::cpu::kDpbf16PairsTokens) - 1; g >= 0; --g) {
      const mla::cpu::TokenGroup tg = mla::cpu::token_group(M, mla::cpu::kDpbf16PairsTokens, g);
      mla::cpu::pack_activation_pair_group(x.data() + tg.t0 * ldx, tg.n, K, ldx, by_group.data() + tg.t0 * (K / 2));
    }
    ASSERT_EQ(whole, by_group) << M;
    // Token t's column pair j sits at [j * n + i] of its group (t = t0 + i).
    const mla::cpu::TokenGroup last = mla::cpu::token_group(M, mla::cpu::kDpbf16PairsTokens,
                                                            mla::cpu::token_group_count(M, mla::cpu::kDpbf16PairsTokens) - 1);
    const int64_t t = M - 1, j = K / 2 - 1;
    uint32_t want;
    std::memcpy(&want, x.data() + t * ldx + 2 * j, 4);
    ASSERT_EQ(whole[size_t(last.t0 * (K / 2) + j * last.n + (t - last.t0))], want) << M;
  }
}

// The float32 group packer must give, bit for bit, what converting the tokens to bf16
// (activations_bf16: round to nearest even) and packing them does, for every group size up to 16
// (the lanes past n must not be written) and for values that round up, down, to even and overflow.
TEST(Matmul, Float32PairGroupsEqualConvertThenPack) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const int64_t K = 96, ldx = K + 5;
  for (int64_t n = 1; n <= 16; ++n) {
    std::vector<float> x(size_t(n * ldx));
    for (auto& v : x) v = u(rng);
    // Exact ties (the 17th mantissa bit set alone, so even and odd bf16 neighbours), huge values
    // that round to infinity, negative zero and a denormal.
    for (int64_t t = 0; t < n; ++t) {
      const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x80000000u, 0x00000001u};
      for (int i = 0; i < 5; ++i) std::memcpy(&x[size_t(t * ldx + 7 * i + t)], &bits[i], 4);
    }
    std::vector<uint16_t> rows(size_t(n * K));
    mla::cpu::activations_bf16(x.data(), n, ldx, K, mla::WeightFormat::BF16, false, rows.data(), K);
    std::vector<uint32_t> want(size_t(n * K / 2)), got(size_t(n * K / 2) + 16, 0xdeadbeefu);
    mla::cpu::pack_activation_pair_group(rows.data(), n, K, K, want.data());
    mla::cpu::pack_activation_pair_group(x.data(), n, K, ldx, got.data());
    for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xdeadbeefu) << n << " wrote past its group";
    got.resize(want.size());
    ASSERT_EQ(got, want) << n;
  }
}

TEST(Matmul, FastPrecisionPromptSizedProducts) {
  // AMX tiles where the CPU has them (up to 127 tokens; oneDNN above), VDPBF16PS without (the
  // context keeps the FMA kernel out: it has its own test below). The
  // sums run in float32 in another order: TDPBF16PS rounds once per pair of columns, so per
  // output at most cols / 2 roundings plus a few, (cols / 2 + 16) * 2^-24 of the sum of the
  // terms' magnitudes; VDPBF16PS adds the pair's two products one at a time (two roundings per
  // pair) into one of 16 chains per output (lane i takes the pairs i mod 16), summed at the end in
  // 4 more: (cols / 16 + 16) * 2^-24.
  mla::cpu::Context ctx = kFastBf16;
  ctx.vector_gemm = mla::cpu::Context::VectorGemm::Vdpbf16ps;
  const bool amx = mla::cpu::features(ctx).amx;
  check_prompt_sized_products(ctx, amx ? 0.5 : 1.0 / 16);
}

TEST(Matmul, FastPrecisionPromptSizedProductsOnVdpbf16ps) {
  // The path of a CPU with AVX-512 BF16 and no AMX, chosen by the context on any CPU: every
  // product past the GEMV's tokens on dpbf16_gemm_rows32, bounded as above for VDPBF16PS.
  mla::cpu::Context ctx = kFastBf16;
  ctx.amx = false;
  ctx.vector_gemm = mla::cpu::Context::VectorGemm::Vdpbf16ps;
  MatrixView w;  // the rule reads the format and the columns
  w.format = WeightFormat::BF16;
  w.rows = 1;
  w.cols = 64;
  ASSERT_EQ(mla::cpu::gemm_bf16_kernel(300, w, mla::cpu::features(ctx)), mla::cpu::Kernel::Dpbf16Gemm);
  check_prompt_sized_products(ctx, 1.0 / 16);
}

TEST(Matmul, FastPrecisionPromptSizedProductsOnFma) {
  // The float32 FMA kernel on bf16 weights (fma_gemm.h), chosen by the context on any CPU, from
  // 16 tokens on (5, 7, 8 and 13 stay on VDPBF16PS and are checked as such). The activations are
  // not rounded; per output one FMA chain, one rounding a column: (cols + 16) * 2^-24 of the sum
  // of the terms' magnitudes against W x in double on bf16-rounded weights and the float32
  // activations (INT4's in the decoded rows' column order, as the kernel needs them).
  mla::cpu::Context ctx = kFastBf16;
  ctx.amx = false;
  ctx.vector_gemm = mla::cpu::Context::VectorGemm::Fma;
  MatrixView w;
  w.format = WeightFormat::BF16;
  w.rows = 1;
  w.cols = 64;
  ASSERT_EQ(mla::cpu::gemm_bf16_kernel(300, w, mla::cpu::features(ctx)), mla::cpu::Kernel::FmaGemm);
  ASSERT_EQ(mla::cpu::gemm_bf16_kernel(16, w, mla::cpu::features(ctx)), mla::cpu::Kernel::FmaGemm);
  ASSERT_EQ(mla::cpu::gemm_bf16_kernel(15, w, mla::cpu::features(ctx)), mla::cpu::Kernel::Dpbf16Gemm);
  check_prompt_sized_products(ctx, 1.0 / 16);
}

// The VNNI GEMM (vnni_gemm.h) on INT4 / INT8 weights, through matmul as dispatched without AMX:
// checked twice per output. First against W x-hat in double, x-hat the activations quantized as
// the kernel's specification says (per token and chunk of 32 columns, m its largest magnitude:
// code round(x * (127 / m)) in float32, value code * (m / 127)), recomputed here in scalar code:
// the integer sums are exact, so the only errors are float32 roundings, per chunk the scales'
// product and the FMA, at most (2 chunks + 8) * 2^-24 of the sum of the terms' magnitudes.
// Second against W x on the float32 activations: each moved by at most half a step, m / 254, so
// the distance is at most sum_k |w_k| m_k / 254 plus those roundings.
void check_vnni(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y,
                int64_t ldy, const std::string& what) {
  const int64_t K = W.cols, Kc = K / 32;
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<double> xq(size_t(T * K)), step(size_t(T * Kc));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < Kc; ++c) {
      const float* xc = x + t * ldx + c * 32;
      float m = 0;
      for (int k = 0; k < 32; ++k) m = std::max(m, std::fabs(xc[k]));
      const float inv = m > 0 ? 127.0f / m : 0.0f, s = m / 127.0f;
      for (int k = 0; k < 32; ++k) xq[size_t(t * K + c * 32 + k)] = double(std::nearbyint(xc[k] * inv)) * s;
      step[size_t(t * Kc + c)] = double(m) / 254;
    }
  const double u = std::ldexp(1.0, -24);
  int bad = 0;
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double ref = 0, mag = 0, exact = 0, moved = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = row[size_t(k)], p = w * xq[size_t(t * K + k)];
        ref += p;
        mag += std::fabs(p);
        exact += w * x[t * ldx + k];
        moved += std::fabs(w) * step[size_t(t * Kc + k / 32)];
      }
      const double a = y[size_t(t * ldy + n)], round = (2.0 * double(Kc) + 8) * u * mag + 1e-30;
      if (!(std::fabs(a - ref) <= round) && bad++ < 5)
        ADD_FAILURE() << what << " row " << n << " token " << t << ": " << a << " vs " << ref
                      << " on the quantized activations (terms " << mag << ", bound " << round << ")";
      if (!(std::fabs(a - exact) <= moved * (1 + 1e-4) + round) && bad++ < 5)
        ADD_FAILURE() << what << " row " << n << " token " << t << ": " << a << " vs " << exact
                      << " on the float32 activations (half steps " << moved << ")";
    }
  }
}

TEST(Matmul, FastPrecisionInt8ActivationsOnVnni) {
  // Without AMX every INT4 / INT8 product past the GEMV's 12 tokens runs on the VNNI GEMM: token
  // counts over its groups of up to 12 (split evenly) and its passes (K = 7168: 48 tokens), row
  // counts off a multiple of 16 (the block), K an odd number of 32-column chunks, INT4 groups of
  // 32, 64 and 128 (a scale per chunk all the same), a token whose first chunk is all zeros
  // (scale 0) and one of a single large value among small ones (codes 0 but one).
  mla::cpu::Context ctx = kFast;
  ctx.amx = false;
  std::mt19937 rng(17);
  struct Shape {
    WeightFormat f;
    int64_t rows, cols, group;
  };
  const Shape shapes[] = {{WeightFormat::INT4_GROUP, 77, 2048, 32}, {WeightFormat::INT8_GROUP, 77, 2048, 32},
                          {WeightFormat::INT4_GROUP, 40, 7168, 32}, {WeightFormat::INT8_GROUP, 40, 7168, 32},
                          {WeightFormat::INT4_GROUP, 33, 96, 32},   {WeightFormat::INT8_GROUP, 16, 96, 32},
                          {WeightFormat::INT4_GROUP, 1, 32, 32},    {WeightFormat::INT8_GROUP, 5, 160, 32},
                          {WeightFormat::INT4_GROUP, 48, 256, 64},  {WeightFormat::INT4_GROUP, 20, 384, 128},
                          {WeightFormat::INT8_GROUP, 31, 256, 64}};
  for (const Shape& sh : shapes) {
    Owned m = random_matrix(sh.f, sh.rows, sh.cols, rng, sh.group);
    ASSERT_EQ(mla::cpu::matmul_kernel(ctx, 13, m.view, mla::cpu::features(ctx)), mla::cpu::Kernel::VnniGemm);
    for (int64_t T : {13, 16, 17, 24, 33, 47, 48, 52, 100, 300}) {
      if (sh.cols == 7168 && T > 100) continue;
      const int64_t ldx = sh.cols + 3, ldy = sh.rows + 5;
      auto x = random_vec(size_t(T * ldx), rng);
      for (int k = 0; k < 32; ++k) x[size_t(k)] = 0.0f;
      for (int k = 0; k < 32; ++k) x[size_t(ldx + k)] = k == 7 ? 50.0f : 0.01f * x[size_t(ldx + k)];
      std::vector<float> y(size_t(T * ldy), -1.0f);
      mla::cpu::matmul(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
      check_vnni(m.view, x.data(), T, ldx, y, ldy,
                 std::string(mla::weight_format_name(sh.f)) + " g" + std::to_string(sh.group) + " " +
                     std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " T=" + std::to_string(T));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = sh.rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
    }
  }
}

// BF16_PAIRS32 (repack.h): a bf16 matrix repacked holds the same weights (dequant_row, element,
// row slices in whole blocks, gate and up concatenated), and every kernel matmul dispatches it
// to computes its products: the GEMV of a few tokens (float32 FMAs on the float32 activations,
// per output two chains of K / 2 columns), the VDPBF16PS and FMA GEMMs reading the blocks in
// place, which must equal, bit for bit, the same kernels on the row-major matrix (they pack
// each block into exactly this order first), and AMX / oneDNN, which unpack it again.
TEST(Repack, Pairs32HoldsTheSameWeights) {
  std::mt19937 rng(5);
  Owned m = random_matrix(WeightFormat::BF16, 96, 160, rng);
  std::vector<uint8_t> copy = m.data;
  MatrixView p = m.view;
  p.data = copy.data();
  mla::cpu::Context ctx = kFastBf16;
  ASSERT_TRUE(mla::cpu::pairs32_eligible(p));
  mla::cpu::repack_pairs32(ctx, p);
  ASSERT_EQ(p.format, WeightFormat::BF16_PAIRS32);
  ASSERT_NE(std::memcmp(copy.data(), m.data.data(), copy.size()), 0) << "nothing moved";
  std::vector<float> a(160), b(160);
  for (int64_t r = 0; r < 96; ++r) {
    m.view.dequant_row(r, a.data());
    p.dequant_row(r, b.data());
    ASSERT_EQ(a, b) << "row " << r;
    for (int64_t k : {0, 1, 31, 32, 159}) ASSERT_EQ(mla::cpu::avx512::element(p, r, k), a[size_t(k)]);
  }
  const MatrixView s = p.slice_rows(32, 64);
  for (int64_t r = 0; r < 64; ++r) {
    m.view.dequant_row(32 + r, a.data());
    s.dequant_row(r, b.data());
    ASSERT_EQ(a, b) << "sliced row " << r;
  }
  EXPECT_THROW((void)p.slice_rows(16, 32), std::out_of_range);
  const auto both = mla::concat_rows(p.slice_rows(0, 32), p.slice_rows(32, 64));
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->rows, 96);
  Owned odd = random_matrix(WeightFormat::BF16, 40, 64, rng);
  EXPECT_FALSE(mla::cpu::pairs32_eligible(odd.view));
  EXPECT_THROW(mla::cpu::repack_pairs32(ctx, odd.view), std::invalid_argument);
}

TEST(Repack, Pairs32ProductsOnEveryKernel) {
  std::mt19937 rng(17);
  mla::cpu::Context dp = kFast, fma = kFast, host = kFast, precise = kPrecise;
  dp.amx = fma.amx = false;
  dp.vector_gemm = mla::cpu::Context::VectorGemm::Vdpbf16ps;
  fma.vector_gemm = mla::cpu::Context::VectorGemm::Fma;
  EXPECT_TRUE(mla::cpu::reads_pairs32(dp));
  EXPECT_FALSE(mla::cpu::reads_pairs32(precise));
  mla::cpu::Context off = dp;
  off.repack_weights = false;
  EXPECT_FALSE(mla::cpu::reads_pairs32(off));
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 2048}, {96, 160}, {32, 32}}) {
    Owned m = random_matrix(WeightFormat::BF16, rows, cols, rng);
    std::vector<uint8_t> copy = m.data;
    MatrixView p = m.view;
    p.data = copy.data();
    mla::cpu::repack_pairs32(dp, p);
    for (const auto& [ctx, name] : {std::pair{&dp, "vdpbf16ps"}, {&fma, "fma"}, {&host, "host"}, {&precise, "precise"}})
      for (int64_t T : {1, 2, 3, 4, 5, 7, 12, 13, 16, 17, 33, 48, 100}) {
        const int64_t ldx = cols + 3, ldy = rows + 5;
        auto x = random_vec(size_t(T * ldx), rng);
        std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
        mla::cpu::matmul(*ctx, x.data(), T, ldx, p, y.data(), ldy);
        mla::cpu::matmul(*ctx, x.data(), T, ldx, m.view, ref.data(), ldy);
        const mla::cpu::Kernel k = mla::cpu::matmul_kernel(*ctx, T, p, mla::cpu::features(*ctx));
        const std::string what = std::string(name) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                 " T=" + std::to_string(T) + " on " + mla::cpu::kernel_name(k);
        // The bf16 GEMMs and GEMV round the activations to bf16 (the FMA GEMM, the float32
        // GEMV and sgemm do not); per output at most one rounding a column in float32.
        const bool rounded = k == mla::cpu::Kernel::Dpbf16Gemm || k == mla::cpu::Kernel::AmxGemm ||
                             k == mla::cpu::Kernel::OnednnBf16 || k == mla::cpu::Kernel::GemvBf16;
        expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, (double(cols) + 16) * std::ldexp(1.0, -24), 1e-30, false,
                          what, rounded);
        const bool same_kernel = k == mla::cpu::matmul_kernel(*ctx, T, m.view, mla::cpu::features(*ctx));
        if (same_kernel && (k == mla::cpu::Kernel::FmaGemm ||
                            (k == mla::cpu::Kernel::Dpbf16Gemm && T >= mla::cpu::kDpbf16PairsMinTokens))) {
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < rows; ++n)
              ASSERT_EQ(y[size_t(t * ldy + n)], ref[size_t(t * ldy + n)]) << what << " row " << n << " token " << t;
        }
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << what << ": wrote past the rows";
      }
  }
}

// INT4_WORDS16 and INT8_WORDS16 (repack.h): INT4 and INT8 groups repacked in blocks of 16 rows
// hold the same weights (dequant_row, element, row slices in whole blocks, a view that starts
// inside its tensor's scales), and every kernel matmul dispatches them to computes their
// products: the VNNI GEMM reading the blocks in place must equal, bit for bit, the same GEMM on
// the row-major matrix (which packs each block into the order it then computes in); the GEMVs
// (float32 FMAs, and VDPBF16PS on bf16 activations) and the bf16 GEMMs (each row unpacked first)
// within the float32 bound of their summation (below).
TEST(Repack, Words16HoldsTheSameWeights) {
  std::mt19937 rng(23);
  const mla::cpu::Context ctx = kFast;
  for (const WeightFormat f : {WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP}) {
    const WeightFormat to = f == WeightFormat::INT8_GROUP ? WeightFormat::INT8_WORDS16 : WeightFormat::INT4_WORDS16;
    const std::string what = mla::weight_format_name(to);
    Owned m = random_matrix(f, 96, 160, rng);
    std::vector<uint8_t> copy = m.data, scopy = m.scales;
    MatrixView p = m.view;
    p.data = copy.data();
    p.scales = scopy.data();
    ASSERT_TRUE(mla::cpu::words16_eligible(p)) << what;
    mla::cpu::repack_words16(ctx, p);
    ASSERT_EQ(p.format, to);
    ASSERT_NE(std::memcmp(copy.data(), m.data.data(), copy.size()), 0) << what << ": nothing moved";
    ASSERT_NE(std::memcmp(scopy.data(), m.scales.data(), scopy.size()), 0) << what << ": no scale moved";
    std::vector<float> a(160), b(160);
    for (int64_t r = 0; r < 96; ++r) {
      m.view.dequant_row(r, a.data());
      p.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r;
      for (int64_t k : {0, 1, 3, 4, 7, 8, 31, 32, 159})
        ASSERT_EQ(mla::cpu::avx512::element(p, r, k), a[size_t(k)]) << what << " row " << r << " column " << k;
    }
    const MatrixView s = p.slice_rows(32, 48);
    for (int64_t r = 0; r < 48; ++r) {
      m.view.dequant_row(32 + r, a.data());
      s.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " sliced row " << r;
    }
    EXPECT_THROW((void)p.slice_rows(8, 16), std::out_of_range);
    // A view of rows 16.. of its tensor (row0 16: its scales begin inside the tensor's) repacks
    // its own rows and scales and leaves the others.
    std::vector<uint8_t> copy2 = m.data, scopy2 = m.scales;
    MatrixView whole = m.view;
    whole.data = copy2.data();
    whole.scales = scopy2.data();
    MatrixView part = whole.slice_rows(16, 32);
    mla::cpu::repack_words16(ctx, part);
    for (int64_t r = 0; r < 32; ++r) {
      m.view.dequant_row(16 + r, a.data());
      part.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r << " of the slice";
    }
    for (int64_t r : {0, 15, 48, 95}) {
      m.view.dequant_row(r, a.data());
      whole.dequant_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r << " outside the slice";
    }
    Owned odd = random_matrix(f, 40, 64, rng);
    EXPECT_FALSE(mla::cpu::words16_eligible(odd.view));
    EXPECT_THROW(mla::cpu::repack_words16(ctx, odd.view), std::invalid_argument);
    EXPECT_FALSE(mla::cpu::words16_eligible(m.view.slice_rows(8, 16)));  // starts inside a block
    Owned g48 = random_matrix(f, 32, 96, rng, 48);
    EXPECT_FALSE(mla::cpu::words16_eligible(g48.view));
  }
  Owned fp8 = random_matrix(WeightFormat::FP8_BLOCK128, 32, 64, rng);
  EXPECT_FALSE(mla::cpu::words16_eligible(fp8.view));
}

// y = W x of INT4 or INT8 groups on int8 activations as integers: per token and chunk of 32 columns,
// the exact sum of the weights' codes times the activations' codes (activations_int8), times
// both scales, summed in double: what the VNNI kernels compute before their float32 roundings.
// Each output's value and the sum of its chunks' magnitudes.
std::vector<std::pair<double, double>> vnni_exact(const MatrixView& W, const float* x, int64_t T, int64_t ldx) {
  const int64_t K = W.cols, Kc = K / 32;
  std::vector<int8_t> q(size_t(T * K));
  std::vector<float> qs(size_t(T * Kc));
  std::vector<int32_t> qc(size_t(T * Kc));
  mla::cpu::activations_int8(x, T, ldx, K, WeightFormat::INT8_GROUP, 128, q.data(), K, qs.data(), qc.data(), Kc);
  // The weight's code: INT8 a signed byte, INT4 nibble k % 8 of the row's word k / 8, less 8.
  auto code = [&](int64_t n, int64_t k) -> int64_t {
    const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
    if (W.format == WeightFormat::INT8_GROUP) return int8_t(row[k]);
    return int64_t((row[k / 2] >> (4 * (k % 2))) & 0xf) - 8;
  };
  const uint16_t* scales = static_cast<const uint16_t*>(W.scales);
  std::vector<std::pair<double, double>> y(size_t(T * W.rows));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < W.rows; ++n) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < Kc; ++c) {
        int64_t dot = 0;
        for (int64_t k = c * 32; k < c * 32 + 32; ++k) dot += code(n, k) * q[size_t(t * K + k)];
        const double s = mla::bf16_to_f32(scales[(W.row0 + n) * W.scale_cols + c * 32 / W.group_size]);
        const double term = double(dot) * s * double(qs[size_t(t * Kc + c)]);
        sum += term;
        mag += std::fabs(term);
      }
      y[size_t(t * W.rows + n)] = {sum, mag};
    }
  return y;
}

// The float32 bound of the GEMVs and bf16 GEMMs on the WORDS16 formats: per output and chunk of
// 32 columns, 4 chains of 8 products (float32 FMAs, or VDPBF16PS's exact products added in
// pairs), 3 additions, the group scale's product and the FMA into the total (a chain of
// cols / 32); the reference's float32 weights one more. m = cols / 8 + 16 roundings of u = 2^-24
// bound it. The WORDS16 formats' decode GEMV (VNNI, int8 activations) computes the VNNI GEMM's
// operations in the same order: the same results bit for bit, and within (cols / 32 + 2) u of
// the exact integer arithmetic (vnni_exact).
TEST(Repack, Words16ProductsOnEveryKernel) {
  std::mt19937 rng(29);
  mla::cpu::Context vnni = kFast, dp = kFast, bf16 = kFastBf16, host = kFast, precise = kPrecise;
  vnni.amx = dp.amx = bf16.amx = false;
  dp.int8_activations = false;
  dp.vector_gemm = mla::cpu::Context::VectorGemm::Vdpbf16ps;
  EXPECT_TRUE(mla::cpu::reads_words16(vnni));
  EXPECT_FALSE(mla::cpu::reads_words16(dp));
  EXPECT_FALSE(mla::cpu::reads_words16(precise));
  mla::cpu::Context off = vnni;
  off.repack_weights = false;
  EXPECT_FALSE(mla::cpu::reads_words16(off));
  struct Shape {
    int64_t rows, cols, group;
  };
  for (const WeightFormat f : {WeightFormat::INT4_GROUP, WeightFormat::INT8_GROUP})
    for (const Shape sh : {Shape{64, 2048, 32}, {48, 256, 64}, {32, 384, 128}, {16, 96, 32}}) {
      Owned m = random_matrix(f, sh.rows, sh.cols, rng, sh.group);
      std::vector<uint8_t> copy = m.data, scopy = m.scales;
      MatrixView p = m.view;
      p.data = copy.data();
      p.scales = scopy.data();
      mla::cpu::repack_words16(vnni, p);
      // The host context may use AMX, which never sees the WORDS16 formats in a model (repack.h:
      // reads_words16); its products of them are still defined, as above.
      for (const auto& [ctx, name] :
           {std::pair{&vnni, "vnni"}, {&dp, "vdpbf16ps"}, {&bf16, "bf16 gemv"}, {&host, "host"}, {&precise, "precise"}})
        for (int64_t T : {1, 2, 3, 4, 5, 7, 12, 13, 16, 17, 33, 48}) {
          const int64_t ldx = sh.cols + 3, ldy = sh.rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f), ref(size_t(T * ldy), -1.0f);
          mla::cpu::matmul(*ctx, x.data(), T, ldx, p, y.data(), ldy);
          mla::cpu::matmul(*ctx, x.data(), T, ldx, m.view, ref.data(), ldy);
          const mla::cpu::Kernel k = mla::cpu::matmul_kernel(*ctx, T, p, mla::cpu::features(*ctx));
          const std::string what = std::string(mla::weight_format_name(p.format)) + " " + name + " " +
                                   std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " g" +
                                   std::to_string(sh.group) + " T=" + std::to_string(T) + " on " +
                                   mla::cpu::kernel_name(k);
          if (k == mla::cpu::Kernel::VnniGemm || k == mla::cpu::Kernel::GemvVnni) {
            // The row-major matrix through the VNNI GEMM itself (matmul would take its GEMV).
            if (k == mla::cpu::Kernel::GemvVnni) {
              std::fill(ref.begin(), ref.end(), -1.0f);
              mla::cpu::matmul_vnni(*ctx, x.data(), T, ldx, m.view, ref.data(), ldy);
              const auto exact = vnni_exact(m.view, x.data(), T, ldx);
              const double u = std::ldexp(1.0, -24) * double(sh.cols / 32 + 2);
              for (int64_t t = 0; t < T; ++t)
                for (int64_t n = 0; n < sh.rows; ++n) {
                  const auto [want, mag] = exact[size_t(t * sh.rows + n)];
                  ASSERT_LE(std::fabs(double(y[size_t(t * ldy + n)]) - want), u * mag + 1e-30)
                      << what << " row " << n << " token " << t;
                }
            } else {
              ASSERT_EQ(k, mla::cpu::matmul_kernel(*ctx, T, m.view, mla::cpu::features(*ctx))) << what;
            }
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = 0; n < sh.rows; ++n)
                ASSERT_EQ(y[size_t(t * ldy + n)], ref[size_t(t * ldy + n)]) << what << " row " << n << " token " << t;
          } else {
            // The bf16 GEMMs and GEMV round the activations to bf16 (the float32 GEMV and sgemm do
            // not); the GEMMs decode the weights to bf16 first ((q - 8) x scale rounded: the
            // reference rounds them too) and sum in their own order (oneDNN's, sgemm's): the bound of
            // the bf16 GEMMs' test, (cols + 16) u, for them.
            const bool gemv = k == mla::cpu::Kernel::GemvF32 || k == mla::cpu::Kernel::GemvBf16;
            const bool rounded = k == mla::cpu::Kernel::Dpbf16Gemm || k == mla::cpu::Kernel::AmxGemm ||
                                 k == mla::cpu::Kernel::OnednnBf16 || k == mla::cpu::Kernel::GemvBf16;
            const bool bf16_weights = !gemv && k != mla::cpu::Kernel::DequantSgemm && k != mla::cpu::Kernel::GemvReference;
            const double m_ = gemv ? double(sh.cols) / 8 + 16 : double(sh.cols) + 16;
            expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, m_ * std::ldexp(1.0, -24), 1e-30, bf16_weights, what,
                              rounded);
          }
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = sh.rows; n < ldy; ++n)
              ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << what << ": wrote past the rows";
        }
    }
}

TEST(Precision, ParsesNames) {
  EXPECT_EQ(mla::cpu::parse_precision("fast"), mla::cpu::Precision::Fast);
  EXPECT_EQ(mla::cpu::parse_precision("precise"), mla::cpu::Precision::Precise);
  EXPECT_THROW(mla::cpu::parse_precision("bf16"), std::invalid_argument);
}

}  // namespace
