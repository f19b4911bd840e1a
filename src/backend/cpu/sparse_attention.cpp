#include "backend/cpu/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"

namespace mla::cpu {

void attention_absorb_sparse(const Context& ctx, const SparseAbsorbArgs& a, float* out_lat, float* lse) {
  const int64_t H = a.H, kvr = a.kv_lora, dim = a.kv_lora + a.rope;
  thread_local std::vector<float> rows, qcat, scores;
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t n = a.sel.count[t];
    float* o = out_lat + t * H * kvr;
    if (n == 0) {
      std::fill(o, o + H * kvr, 0.0f);
      std::fill(lse + t * H, lse + (t + 1) * H, -std::numeric_limits<float>::infinity());
      continue;
    }
    // The query's rows once for every head, then two products: scores [H, n] = [q_lat | q_pe]
    // [H, dim] x rows^T, and out_lat [H, kv_lora] = softmax(scores) x c_KV.
    rows.resize(size_t(n * dim));
    a.gather(a.sel.pos + t * a.sel.ld, n, rows.data());
    qcat.resize(size_t(H * dim));
    for (int64_t h = 0; h < H; ++h) {
      std::copy(a.q_lat + (t * H + h) * kvr, a.q_lat + (t * H + h + 1) * kvr, qcat.data() + h * dim);
      const float* qp = a.q_pe + t * a.ld_qpe + h * a.head_stride_qpe;
      std::copy(qp, qp + a.rope, qcat.data() + h * dim + kvr);
    }
    scores.resize(size_t(H * n));
    sgemm(ctx, false, true, H, n, dim, a.scale, qcat.data(), dim, rows.data(), dim, 0.0f, scores.data(), n);
    for (int64_t h = 0; h < H; ++h) lse[t * H + h] = softmax_inplace(scores.data() + h * n, n);
    sgemm(ctx, false, false, H, kvr, n, 1.0f, scores.data(), n, rows.data(), dim, 0.0f, o, kvr);
  }
}

void attention_expand_sparse(const Context& ctx, const ExpandArgs& a, const KeySelection& sel, float* out, float* lse) {
  const int64_t qk = a.nope + a.rope, ldkv = a.H * (a.nope + a.v), H = a.H;
  parallel_region(ctx, a.T * H >= 16, [&] {
    std::vector<float> s;
    std::vector<int32_t> keys;
#pragma omp for schedule(static)
    for (int64_t th = 0; th < a.T * H; ++th) {
      const int64_t t = th / H, h = th % H;
      const int32_t* p = sel.pos + t * sel.ld;
      const int32_t* lo = std::lower_bound(p, p + sel.count[t], int32_t(a.k_pos0));
      const int32_t* hi = std::lower_bound(lo, p + sel.count[t], int32_t(a.k_pos0 + a.S));
      float* o = out + th * a.v;
      const int64_t n = hi - lo;
      if (n == 0) {
        std::fill(o, o + a.v, 0.0f);
        lse[th] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float* q = a.q + th * qk;
      s.resize(size_t(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t key = lo[j] - a.k_pos0;
        const float* kn = a.kv + key * ldkv + h * (a.nope + a.v);
        const float* kp = a.k_pe + key * a.ld_kpe;
        float d = 0;
        for (int64_t i = 0; i < a.nope; ++i) d += q[i] * kn[i];
        for (int64_t i = 0; i < a.rope; ++i) d += q[a.nope + i] * kp[i];
        s[size_t(j)] = a.scale * d;
      }
      lse[th] = softmax_inplace(s.data(), n);
      std::fill(o, o + a.v, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* v = a.kv + (lo[j] - a.k_pos0) * ldkv + h * (a.nope + a.v) + a.nope;
        const float pj = s[size_t(j)];
        for (int64_t i = 0; i < a.v; ++i) o[i] += pj * v[i];
      }
    }
  });
}

}  // namespace mla::cpu
