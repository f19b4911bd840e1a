// The timed unit of the matrix-product benchmarks (matmul, int4_expert): one pass of y = W x
// over every matrix of a set, so that each product reads its weights from DRAM.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "tensor/matrix.h"

// Best of `reps` passes of y = W x (T tokens of constant activations) over every matrix of
// `views`; seconds per pass.
inline double best_pass_seconds(const mla::cpu::Context& ctx, const std::vector<mla::MatrixView>& views, int64_t T,
                                int reps) {
  const int64_t K = views[0].cols, N = views[0].rows;
  std::vector<float> x(size_t(T * K), 0.01f), y(size_t(T * N));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    for (const auto& v : views) mla::cpu::matmul(ctx, x.data(), T, v, y.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}
