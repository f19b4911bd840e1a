#include "backend/cpu/ops.h"

#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/formats/gemv.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/common/onednn_threads.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/common/vec_math.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <oneapi/dnnl/dnnl.h>
#include <stdexcept>
#include <string>
#include <vector>

namespace mla::cpu {

void sgemm(const Context& ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0 ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  const OneDnnThreads threads(ctx);
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success) throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(int(st)));
}

namespace {

// Rows per dequantized block in the GEMM path: 64 rows of up to 18K floats stay in L2.
constexpr int64_t kBlockRows = 64;
}  // namespace

void matmul(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  const int64_t N = W.rows, K = W.cols;
  if (T <= 0 || N <= 0) return;
  const Kernel kernel = matmul_kernel(ctx, T, W, features(ctx));
  if (is_gemv(kernel)) {
    gemv(ctx, x, T, ldx, W, y, ldy);
    return;
  }
  if (kernel == Kernel::VnniGemm) {
    format_kernels(W.format).gemm_int8(ctx, x, T, ldx, W, y, ldy);
    return;
  }
  if (kernel == Kernel::AmxGemm || kernel == Kernel::Dpbf16Gemm || kernel == Kernel::FmaGemm ||
      kernel == Kernel::OnednnBf16) {
    matmul_bf16(ctx, x, T, ldx, W, y, ldy);
    return;
  }
  if (kernel == Kernel::Sgemm) {
    sgemm(ctx, false, true, T, N, K, 1.0f, x, ldx, static_cast<const float*>(W.data), K, 0.0f, y, ldy);
    return;
  }
  const int64_t nblocks = (N + kBlockRows - 1) / kBlockRows;
  auto run = [&](int64_t b) {
    thread_local std::vector<float> block;  // each thread's, kept between calls
    if (block.size() < size_t(kBlockRows * K)) block.resize(size_t(kBlockRows * K));
    int64_t r0 = b * kBlockRows, nr = std::min(kBlockRows, N - r0);
    for (int64_t r = 0; r < nr; ++r) W.dequant_row(r0 + r, block.data() + r * K);
    sgemm(ctx, false, true, T, nr, K, 1.0f, x, ldx, block.data(), K, 0.0f, y + r0, ldy);
  };
  const int threads = region_threads(ctx, nblocks > 1);
  if (threads == 1) {  // no region of one thread (parallel.h)
    for (int64_t b = 0; b < nblocks; ++b) run(b);
    return;
  }
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int64_t b = 0; b < nblocks; ++b) run(b);
}

void matmul_batch(const Context& ctx, std::span<const MatmulJob> jobs) {
  thread_local std::vector<GemvJob> small;
  small.clear();
  const CpuFeatures feats = features(ctx);
  for (const auto& j : jobs) {
    if (j.T <= 0 || j.W.rows <= 0) continue;
    if (j.T <= gemv_max_tokens(ctx, j.W, feats)) small.push_back(j);
    else matmul(ctx, j.x, j.T, j.ldx, j.W, j.y, j.ldy);
  }
  gemv_batch(ctx, small);
}

void rmsnorm(const Context& ctx, const float* x, int64_t T, int64_t n, int64_t ldx, const float* w, float eps,
             float* out, int64_t ldo) {
  parallel_for(ctx, T, T * n >= (int64_t(1) << 16), [&](int64_t t) {
    const float* xr = x + t * ldx;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
    float* o = out + t * ldo;
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * inv * w[i];
  });
}

void silu_mul(const Context& ctx, const float* gate_up, int64_t T, int64_t n, float* out) {
  parallel_for(ctx, T, T * n >= (int64_t(1) << 16), [&](int64_t t) {
    const float* g = gate_up + t * 2 * n;
    const float* u = g + n;
    float* o = out + t * n;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 gv = _mm512_loadu_ps(g + i);
      const __m512 e = vec::exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
      _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  });
}

void rope_interleaved(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos[i] - b * sin[i];
    x[2 * i + 1] = a * sin[i] + b * cos[i];
  }
}

float softmax_inplace(float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t k = 0;
  if (n >= 16) {
    __m512 mv = _mm512_set1_ps(m);
    for (; k + 16 <= n; k += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + k));
    m = _mm512_reduce_max_ps(mv);
  }
  for (; k < n; ++k) m = std::max(m, x[k]);
  if (m == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0;
    return m;
  }
  const double s = vec::exp_shifted(x, n, m);
  int64_t i = 0;
  const __m512 inv = _mm512_set1_ps(float(1.0 / s));
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= float(1.0 / s);
  return m + float(std::log(s));
}

}  // namespace mla::cpu
