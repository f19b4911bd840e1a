#include "backend/cpu/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"

namespace mla::cpu {

void attention_absorb_sparse(const Context& ctx, const SparseAbsorbArgs& a, float* out_lat, float* lse) {
  const int64_t H = a.H, kvr = a.kv_lora;
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t n = a.sel.count[t];
    float* o = out_lat + t * H * kvr;
    if (n == 0) {
      std::fill(o, o + H * kvr, 0.0f);
      std::fill(lse + t * H, lse + (t + 1) * H, -std::numeric_limits<float>::infinity());
      continue;
    }
    // The dense absorbed kernel over the query's own rows: key j of it is the j-th listed
    // position, every one visible (the query sits at the last), gathered a block at a time on
    // the thread that scores it; long lists split over the threads and merge by log-sum-exp.
    const int32_t* pos = a.sel.pos + t * a.sel.ld;
    AbsorbArgs d{a.q_lat + t * H * kvr, a.q_pe + t * a.ld_qpe, a.ld_qpe, a.head_stride_qpe, nullptr, 1, n, H, kvr, a.rope,
                 n - 1, 0, a.scale};
    const auto* gather = &a.gather;  // one captured pointer: the std::function holds it without allocating
    d.gather = [gather, pos](int64_t s0, int64_t cnt, float* rows) { (*gather)(pos + s0, cnt, rows); };
    attention_absorb(ctx, d, o, lse + t * H);
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
