#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"

namespace mla::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Score buffer budget (floats) per block of query rows, so long prefills stay in memory.
constexpr int64_t kScoreBudget = int64_t(1) << 22;
// Query rows per block of the expand path's causal attention.
constexpr int64_t kExpandRows = 64;

// Masks row r (query position qpos) of scores [*, S] and normalises it; returns its lse.
float causal_softmax(float* s, int64_t S, int64_t qpos, int64_t k_pos0) {
  int64_t visible = std::clamp<int64_t>(qpos - k_pos0 + 1, 0, S);
  for (int64_t j = visible; j < S; ++j) s[j] = kNegInf;
  return softmax_inplace(s, S);
}

}  // namespace

void attention_expand(const ExpandArgs& a, float* out, float* lse) {
  const int64_t qk = a.nope + a.rope, ldkv = a.H * (a.nope + a.v);
  // Query rows in blocks; each block sees the keys up to its last row's position only, so a
  // causal prompt computes the lower triangle of the scores (and a few blocks' diagonal).
  const int64_t tb = std::max<int64_t>(
      1, std::min({a.T, kExpandRows, kScoreBudget / std::max<int64_t>(1, a.S)}));
#pragma omp parallel
  {
    std::vector<float> K(static_cast<size_t>(a.S * qk)), Q(static_cast<size_t>(tb * qk)), P(static_cast<size_t>(tb * a.S));
#pragma omp for schedule(dynamic)
    for (int64_t h = 0; h < a.H; ++h) {
      for (int64_t j = 0; j < a.S; ++j) {
        const float* src = a.kv + j * ldkv + h * (a.nope + a.v);
        std::copy(src, src + a.nope, K.data() + j * qk);
        std::copy(a.k_pe + j * a.ld_kpe, a.k_pe + j * a.ld_kpe + a.rope, K.data() + j * qk + a.nope);
      }
      for (int64_t t0 = 0; t0 < a.T; t0 += tb) {
        int64_t nt = std::min(tb, a.T - t0);
        for (int64_t t = 0; t < nt; ++t) {
          const float* src = a.q + ((t0 + t) * a.H + h) * qk;
          std::copy(src, src + qk, Q.data() + t * qk);
        }
        const int64_t S = std::clamp<int64_t>(a.q_pos0 + t0 + nt - a.k_pos0, 0, a.S);  // keys this block sees
        sgemm(false, true, nt, S, qk, a.scale, Q.data(), qk, K.data(), qk, 0.0f, P.data(), S);
        for (int64_t t = 0; t < nt; ++t)
          lse[(t0 + t) * a.H + h] = causal_softmax(P.data() + t * S, S, a.q_pos0 + t0 + t, a.k_pos0);
        // out[t, h, :] = P V_h, V_h = kv[:, h, nope:] with row stride ldkv.
        sgemm(false, false, nt, a.v, S, 1.0f, P.data(), S, a.kv + h * (a.nope + a.v) + a.nope, ldkv, 0.0f,
              out + (t0 * a.H + h) * a.v, a.H * a.v);
      }
    }
  }
}

void attention_absorb(const AbsorbArgs& a, float* out_lat, float* lse) {
  const int64_t dim = a.kv_lora + a.rope, ldl = dim;
  const int64_t rows_per_token = a.H;
  const int64_t tb = std::max<int64_t>(1, std::min<int64_t>(a.T, kScoreBudget / std::max<int64_t>(1, a.S * a.H)));
  std::vector<float> Q(static_cast<size_t>(tb * a.H * dim)), P(static_cast<size_t>(tb * a.H * a.S));
  for (int64_t t0 = 0; t0 < a.T; t0 += tb) {
    int64_t nt = std::min(tb, a.T - t0), M = nt * rows_per_token;
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t h = 0; h < a.H; ++h) {
        float* dst = Q.data() + (t * a.H + h) * dim;
        const float* ql = a.q_lat + ((t0 + t) * a.H + h) * a.kv_lora;
        std::copy(ql, ql + a.kv_lora, dst);
        const float* qp = a.q_pe + (t0 + t) * a.ld_qpe + h * a.head_stride_qpe;
        std::copy(qp, qp + a.rope, dst + a.kv_lora);
      }
    // One shared key per cached token for all heads: scores [M, S] = Q latent^T.
    sgemm(false, true, M, a.S, dim, a.scale, Q.data(), dim, a.latent, ldl, 0.0f, P.data(), a.S);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < M; ++r)
      lse[t0 * a.H + r] = causal_softmax(P.data() + r * a.S, a.S, a.q_pos0 + t0 + r / a.H, a.k_pos0);
    // One shared value: out_lat [M, kv_lora] = P c_KV.
    sgemm(false, false, M, a.kv_lora, a.S, 1.0f, P.data(), a.S, a.latent, ldl, 0.0f, out_lat + t0 * a.H * a.kv_lora,
          a.kv_lora);
  }
}

void merge_partial(float* acc, float* acc_lse, const float* part, const float* part_lse, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    float la = acc_lse[r], lb = part_lse[r];
    if (lb == kNegInf) continue;
    if (la == kNegInf) {
      std::copy(part + r * d, part + (r + 1) * d, acc + r * d);
      acc_lse[r] = lb;
      continue;
    }
    float m = std::max(la, lb), ea = std::exp(la - m), eb = std::exp(lb - m), sum = ea + eb;
    float wa = ea / sum, wb = eb / sum;
    for (int64_t i = 0; i < d; ++i) acc[r * d + i] = wa * acc[r * d + i] + wb * part[r * d + i];
    acc_lse[r] = m + std::log(sum);
  }
}

}  // namespace mla::cpu
