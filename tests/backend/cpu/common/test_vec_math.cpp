// The vectorized exp (backend/cpu/vec_math.h) and the element-wise ops built on it, against the
// C library in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/common/vec_math.h"

namespace {

std::vector<float> vexp(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 16) {
    alignas(64) float in[16] = {}, out[16];
    for (size_t j = 0; j < 16 && i + j < x.size(); ++j) in[j] = x[i + j];
    _mm512_store_ps(out, mla::cpu::vec::exp(_mm512_load_ps(in)));
    for (size_t j = 0; j < 16 && i + j < x.size(); ++j) y[i + j] = out[j];
  }
  return y;
}

TEST(VecMath, ExpWithinTwoUlpOverTheNormalRange) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f * float(M_LN2), -0.5f * float(M_LN2), 88.5f, -86.9f}) x.push_back(v);
  const auto y = vexp(x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    const double ulp = std::nextafter(float(want), std::numeric_limits<float>::infinity()) - float(want);
    ASSERT_LE(std::fabs(double(y[i]) - want), 2 * ulp) << "exp(" << x[i] << ") = " << y[i] << ", want " << want;
  }
}

TEST(VecMath, ExpLimits) {
  const float inf = std::numeric_limits<float>::infinity();
  const auto y = vexp({-inf, -200.0f, -110.0f, 89.0f, 500.0f, inf});
  EXPECT_EQ(y[0], 0.0f);  // masked attention scores must vanish exactly
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], inf);
  EXPECT_EQ(y[4], inf);
  EXPECT_EQ(y[5], inf);
  // Subnormal results keep their value to the precision a subnormal has.
  const auto s = vexp({-100.0f});
  EXPECT_NEAR(double(s[0]), std::exp(-100.0), 2e-45);
}

TEST(VecMath, SiluMulAndSoftmaxMatchDouble) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int64_t T = 3, n = 37;  // a tail past the last 16 lanes
  std::vector<float> gu(size_t(T * 2 * n)), out(size_t(T * n));
  for (auto& v : gu) v = nd(rng);
  mla::cpu::silu_mul(mla::cpu::Context{}, gu.data(), T, n, out.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) {
      const double g = gu[size_t(t * 2 * n + i)], u = gu[size_t(t * 2 * n + n + i)];
      const double want = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(out[size_t(t * n + i)], want, 1e-6 * std::fabs(want) + 1e-30) << t << "," << i;
    }

  std::vector<float> s(53);
  for (auto& v : s) v = nd(rng);
  s[5] = s[40] = -std::numeric_limits<float>::infinity();  // masked
  std::vector<double> want(s.size());
  double m = -INFINITY, sum = 0;
  for (float v : s) m = std::max(m, double(v));
  for (size_t i = 0; i < s.size(); ++i) sum += (want[i] = std::exp(double(s[i]) - m));
  const float lse = mla::cpu::softmax_inplace(s.data(), int64_t(s.size()));
  EXPECT_NEAR(lse, m + std::log(sum), 1e-5);
  for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(s[i], want[i] / sum, 1e-6 * want[i] / sum + 1e-12) << i;
  EXPECT_EQ(s[5], 0.0f);
  EXPECT_EQ(s[40], 0.0f);
}

// The attention's softmax runs with subnormals flushed; the flag is the calling thread's and
// only while the guard lives.
TEST(VecMath, MaxOfEveryLengthAndPlace) {
  // Every length up to 70 (whole vectors and each tail), the largest value at every position,
  // all other values below it; the elements past n are larger still and must not be read as max.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-50.0f, 50.0f);
  std::vector<float> x(80);
  for (int64_t n = 1; n <= 70; ++n)
    for (int64_t at = 0; at < n; ++at) {
      for (auto& v : x) v = u(rng);
      for (int64_t i = n; i < int64_t(x.size()); ++i) x[size_t(i)] = 1e30f;
      x[size_t(at)] = 60.0f;
      EXPECT_EQ(mla::cpu::vec::max_of(x.data(), n), 60.0f) << "n " << n << " at " << at;
    }
  const float neg[3] = {-std::numeric_limits<float>::infinity(), -3.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(mla::cpu::vec::max_of(neg, 3), -3.0f);
}

TEST(VecMath, FlushDenormalsHoldsOnlyInItsScope) {
  const unsigned before = _mm_getcsr();
  volatile float tiny = 1e-30f, factor = 1e-10f;  // their product, 1e-40, is subnormal
  {
    const mla::cpu::vec::FlushDenormals flush;
    const float flushed = tiny * factor;
    EXPECT_EQ(flushed, 0.0f);
  }
  EXPECT_EQ(_mm_getcsr(), before);
  const float kept = tiny * factor;
  EXPECT_GT(kept, 0.0f);
  EXPECT_LT(kept, std::numeric_limits<float>::min());
}

}  // namespace
