// The absorb attention's two products per key block (backend/cpu/attention.cpp) on one thread,
// our small_gemm.h kernels against oneDNN's sgemm on the same operands, alternating in rounds:
// scores [M, n] = scale Q rows^T over dim = kv_lora + rope, acc [M, kv_lora] += P c_KV.
//
//   bench/absorb_gemm [--rounds R]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/attention/small_gemm.h"

namespace {
using Clock = std::chrono::steady_clock;

template <class F>
double seconds_per_call(F&& f) {
  f();
  int reps = 1;
  for (;;) {
    const auto t = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    const double s = std::chrono::duration<double>(Clock::now() - t).count();
    if (s > 0.05) return s / reps;
    reps *= 2;
  }
}
}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
  mla::cpu::Context ctx;
  ctx.threads = 1;
  const int64_t kvr = 512, rope = 64, dim = kvr + rope;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::printf("%5s %4s | %-26s | %-26s\n", "M", "n", "scores GFLOP/s ours / dnnl", "P c_KV GFLOP/s ours / dnnl");
  for (int64_t M : {16, 32, 64, 128})
    for (int64_t n : {256, 100}) {
      std::vector<float> Q(size_t(M * dim)), R(size_t(n * dim)), P(size_t(M * n)), acc(size_t(M * kvr));
      for (auto* v : {&Q, &R, &P, &acc})
        for (auto& x : *v) x = nd(rng);
      const double f1 = 2.0 * M * n * dim, f2 = 2.0 * M * n * kvr;
      double best[4] = {};
      for (int r = 0; r < rounds; ++r) {
        const double t[4] = {
            seconds_per_call([&] { mla::cpu::gemm_nt_f32(M, n, dim, 0.1f, Q.data(), dim, R.data(), dim, 0.0f, P.data(), n); }),
            seconds_per_call([&] { mla::cpu::sgemm(ctx, false, true, M, n, dim, 0.1f, Q.data(), dim, R.data(), dim, 0.0f, P.data(), n); }),
            seconds_per_call([&] { mla::cpu::gemm_nn_f32(M, kvr, n, 1e-3f, P.data(), n, R.data(), dim, 1.0f, acc.data(), kvr); }),
            seconds_per_call([&] { mla::cpu::sgemm(ctx, false, false, M, kvr, n, 1e-3f, P.data(), n, R.data(), dim, 1.0f, acc.data(), kvr); })};
        for (int i = 0; i < 4; ++i) best[i] = std::max(best[i], (i < 2 ? f1 : f2) / t[i] * 1e-9);
      }
      std::printf("%5lld %4lld | %10.1f / %-13.1f | %10.1f / %-13.1f\n", (long long)M, (long long)n, best[0], best[1],
                  best[2], best[3]);
    }
  return 0;
}
