// small_gemm.h's two products held to their double references over many shapes: M, N, K with
// tails of every tile (rows of 4 and 6, columns of 4 and 64, K in lanes of 16 and chunks of 64),
// strides wider than the rows, alpha, beta 0 (C holding NaN, which must not spread) and 1.
//
// Tolerances, exact (not probabilistic), u = 2^-24, gamma_n = n u / (1 - n u) (Higham, Thm 3.4),
// S = |alpha| sum_k |a_k b_k| + |beta c|:
//  gemm_nt_f32: each product enters one of 16 lanes, a chain of ceil(K/16) FMAs, then 4 levels of
//    the lanes' tree of adds, the multiply by alpha and the add of beta c: at most ceil(K/16) + 6
//    roundings on any term, |error| <= gamma_{ceil(K/16)+6} S.
//  gemm_nn_f32: a chain of FMAs over k in chunks of 64, each chunk's sum times alpha and added to
//    C: at most K + 2 + ceil(K/64) roundings, |error| <= gamma_{K+2+ceil(K/64)} S.
// The references sum in double (relative error K 2^-53 of S, added).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention/small_gemm.h"

namespace mla {
namespace {

double gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

struct Shape {
  int64_t M, N, K;
};

void check(bool nt, const Shape& s, float alpha, float beta, int64_t pad, uint32_t seed) {
  SCOPED_TRACE(std::string(nt ? "nt" : "nn") + " M" + std::to_string(s.M) + " N" + std::to_string(s.N) + " K" +
               std::to_string(s.K) + " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta) + " pad " +
               std::to_string(pad));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t lda = s.K + pad, ldb = (nt ? s.K : s.N) + pad, ldc = s.N + pad;
  std::vector<float> A(size_t(s.M * lda)), B(size_t((nt ? s.N : s.K) * ldb)), C0(size_t(s.M * ldc));
  for (auto* v : {&A, &B, &C0})
    for (auto& x : *v) x = nd(rng);
  if (beta == 0.0f)
    for (auto& x : C0) x = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> got = C0, want = C0;
  (nt ? cpu::gemm_nt_f32 : cpu::gemm_nn_f32)(s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
  (nt ? cpu::ref::gemm_nt_f32 : cpu::ref::gemm_nn_f32)(s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta,
                                                      want.data(), ldc);
  const int64_t n = nt ? (s.K + 15) / 16 + 6 : s.K + 2 + (s.K + 63) / 64;
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < s.M; ++i) {
    for (int64_t j = 0; j < s.N; ++j) {
      double S = 0;
      for (int64_t k = 0; k < s.K; ++k)
        S += std::fabs(double(A[size_t(i * lda + k)]) * B[size_t(nt ? j * ldb + k : k * ldb + j)]);
      S = std::fabs(alpha) * S + (beta == 0.0f ? 0.0 : std::fabs(double(beta) * C0[size_t(i * ldc + j)]));
      const double tol = (gamma(n) + s.K * std::ldexp(1.0, -53)) * S;
      const double e = std::fabs(double(got[size_t(i * ldc + j)]) - double(want[size_t(i * ldc + j)]));
      worst = std::max(worst, tol > 0 ? e / tol : e);
      if (!(e <= tol)) ++bad;  // NaN counts as bad
    }
    // The padding between rows is not written.
    for (int64_t j = s.N; j < ldc; ++j)
      if (!(std::isnan(C0[size_t(i * ldc + j)]) ? std::isnan(got[size_t(i * ldc + j)])
                                                 : got[size_t(i * ldc + j)] == C0[size_t(i * ldc + j)]))
        ++bad;
  }
  EXPECT_EQ(bad, 0) << "worst error / tolerance " << worst;
}

const std::vector<Shape> kShapes = {
    {1, 1, 1},    {1, 1, 16},   {3, 5, 7},     {4, 4, 16},   {5, 3, 17},    {7, 9, 33},    {16, 256, 576},
    {16, 100, 576}, {17, 13, 192}, {32, 37, 208}, {8, 65, 15}, {6, 64, 64},  {13, 130, 65}, {128, 64, 576},
    {2, 300, 1},  {9, 1, 129},  {16, 512, 256}, {16, 512, 100}, {24, 80, 3}, {11, 200, 257},
};

TEST(SmallGemm, NtMatchesTheReference) {
  uint32_t seed = 1;
  for (const auto& s : kShapes)
    for (float beta : {0.0f, 1.0f})
      for (int64_t pad : {0, 5}) check(true, s, beta == 0.0f ? 0.07f : 1.0f, beta, pad, seed++);
  check(true, {20, 21, 50}, -0.5f, 0.25f, 3, seed);
}

TEST(SmallGemm, NnMatchesTheReference) {
  uint32_t seed = 100;
  for (const auto& s : kShapes)
    for (float beta : {0.0f, 1.0f})
      for (int64_t pad : {0, 5}) check(false, s, beta == 0.0f ? 0.07f : 1.0f, beta, pad, seed++);
  check(false, {20, 21, 150}, -0.5f, 0.25f, 3, seed);
}

// K == 0: C = beta C; M or N == 0 writes nothing.
TEST(SmallGemm, EmptyProducts) {
  std::vector<float> C = {1, 2, 3, 4};
  cpu::gemm_nt_f32(2, 2, 0, 1.0f, nullptr, 0, nullptr, 0, 0.5f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  cpu::gemm_nn_f32(2, 2, 0, 1.0f, nullptr, 0, nullptr, 0, 0.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0, 0, 0, 0}));
  C = {7, 7};
  cpu::gemm_nn_f32(0, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, C.data(), 2);
  cpu::gemm_nt_f32(1, 0, 3, 1.0f, nullptr, 3, nullptr, 3, 0.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{7, 7}));
}

}  // namespace
}  // namespace mla
