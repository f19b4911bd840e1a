// The fast matrix products against the plain reference (MatrixView::dequant_row + dot) over
// many shapes, odd sizes and every weight format; cpu::matmul on both of its paths and in both
// precisions. Each format's own tests (unpacking hand-packed values, the repacked layouts) are in
// its folder beside this file.
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
#include "tensor/dtype.h"
#include "tensor/matrix.h"

#include "backend/cpu/formats/matrices.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

bool has_bf16_kernel(WeightFormat f) {
  return f == WeightFormat::BF16 || f == WeightFormat::FP8_BLOCK128 || f == WeightFormat::INT4_GROUP;
}

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

TEST(Precision, ParsesNames) {
  EXPECT_EQ(mla::cpu::parse_precision("fast"), mla::cpu::Precision::Fast);
  EXPECT_EQ(mla::cpu::parse_precision("precise"), mla::cpu::Precision::Precise);
  EXPECT_THROW(mla::cpu::parse_precision("bf16"), std::invalid_argument);
}

}  // namespace
