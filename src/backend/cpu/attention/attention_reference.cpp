#include "backend/cpu/attention/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mla::cpu::ref {

namespace {

// Keys visible from position qpos, of S keys starting at position k_pos0.
int64_t visible(int64_t qpos, int64_t k_pos0, int64_t S) { return std::clamp<int64_t>(qpos - k_pos0 + 1, 0, S); }

// Softmax of scores s[0, n) in place (n > 0); returns the log-sum-exp.
double softmax(std::vector<double>& s, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[size_t(j)]);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
  for (int64_t j = 0; j < n; ++j) s[size_t(j)] /= sum;
  return m + std::log(sum);
}

std::vector<double> latents(const LatentRows& keys, int64_t S) {
  const int64_t dim = keys.dim();
  std::vector<float> row(static_cast<size_t>(dim));
  std::vector<double> c(static_cast<size_t>(S * dim));
  for (int64_t j = 0; j < S; ++j) {
    keys.row(j, row.data());
    std::copy(row.begin(), row.end(), c.begin() + j * dim);
  }
  return c;
}

// One (query, head) row's attention over per-key keys k [S, dk] and values v [S, dv] (each with
// its own stride), given its query qd [dk]: out [dv], returns the lse.
template <class Out>
float attend_row(const double* qd, int64_t dk, const double* k, int64_t ldk, const double* v, int64_t ldv, int64_t dv,
                 int64_t n, double scale, std::vector<double>& s, Out* out) {
  if (n == 0) {
    std::fill(out, out + dv, Out(0));
    return -std::numeric_limits<float>::infinity();
  }
  s.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) {
    double d = 0;
    for (int64_t i = 0; i < dk; ++i) d += qd[i] * k[j * ldk + i];
    s[size_t(j)] = scale * d;
  }
  const double lse = softmax(s, n);
  for (int64_t i = 0; i < dv; ++i) {
    double o = 0;
    for (int64_t j = 0; j < n; ++j) o += s[size_t(j)] * v[j * ldv + i];
    out[i] = Out(o);
  }
  return float(lse);
}

// Head h of every query t in [0, T) over one head's expanded keys k [S, qk] and values v [S, dv]:
// queries q [T, H, qk], out [T, H, dv], lse [T, H].
void attend_head(int64_t h, int64_t T, int64_t H, const float* q, int64_t qk, const std::vector<double>& k,
                 const std::vector<double>& v, int64_t dv, int64_t q_pos0, int64_t k_pos0, int64_t S, double scale,
                 float* out, float* lse) {
  std::vector<double> qd(static_cast<size_t>(qk)), s;
  for (int64_t t = 0; t < T; ++t) {
    const float* qt = q + (t * H + h) * qk;
    for (int64_t i = 0; i < qk; ++i) qd[size_t(i)] = qt[i];
    lse[t * H + h] = attend_row(qd.data(), qk, k.data(), qk, v.data(), dv, dv, visible(q_pos0 + t, k_pos0, S), scale,
                                s, out + (t * H + h) * dv);
  }
}

}  // namespace

void LatentRows::row(int64_t j, float* out) const {
  if (pool_) {
    pool_->gather(layer_, *seq_, j, 1, out);
  } else {
    std::copy(rows_ + j * ld_, rows_ + j * ld_ + dim_, out);
  }
}

void attention_expand(const ExpandArgs& a, float* out, float* lse) {
  const int64_t qk = a.nope + a.rope, ldkv = a.H * (a.nope + a.v);
  std::vector<double> k(static_cast<size_t>(a.S * qk)), v(static_cast<size_t>(a.S * a.v));
  for (int64_t h = 0; h < a.H; ++h) {
    for (int64_t j = 0; j < a.S; ++j) {
      const float* kv = a.kv + j * ldkv + h * (a.nope + a.v);
      for (int64_t i = 0; i < a.nope; ++i) k[size_t(j * qk + i)] = kv[i];
      for (int64_t i = 0; i < a.rope; ++i) k[size_t(j * qk + a.nope + i)] = a.k_pe[j * a.ld_kpe + i];
      for (int64_t i = 0; i < a.v; ++i) v[size_t(j * a.v + i)] = kv[a.nope + i];
    }
    attend_head(h, a.T, a.H, a.q, qk, k, v, a.v, a.q_pos0, a.k_pos0, a.S, a.scale, out, lse);
  }
}

void attention_absorb(const AbsorbArgs& a, const LatentRows& keys, float* out_lat, float* lse) {
  const int64_t dim = a.kv_lora + a.rope;
  const std::vector<double> c = latents(keys, a.S);
  std::vector<double> qd(static_cast<size_t>(dim)), s;
  for (int64_t t = 0; t < a.T; ++t)
    for (int64_t h = 0; h < a.H; ++h) {
      const float* ql = a.q_lat + (t * a.H + h) * a.kv_lora;
      const float* qp = a.q_pe + t * a.ld_qpe + h * a.head_stride_qpe;
      for (int64_t i = 0; i < a.kv_lora; ++i) qd[size_t(i)] = ql[i];
      for (int64_t i = 0; i < a.rope; ++i) qd[size_t(a.kv_lora + i)] = qp[i];
      // One shared key (c_KV | k_pe) and one shared value (c_KV) per token, for every head.
      lse[t * a.H + h] = attend_row(qd.data(), dim, c.data(), dim, c.data(), dim, a.kv_lora,
                                    visible(a.q_pos0 + t, a.k_pos0, a.S), a.scale, s,
                                    out_lat + (t * a.H + h) * a.kv_lora);
    }
}

namespace {
// Head h's expanded keys k [S, qk] = [W_UK[h] c_KV[j] | k_pe[j]] and values v [S, v] =
// W_UV[h] c_KV[j] from the latents c [S, kv_lora + rope].
void expand_head(const MlaProblem& p, const std::vector<double>& c, int64_t h, std::vector<double>& k,
                 std::vector<double>& v) {
  const int64_t qk = p.nope + p.rope, kvr = p.kv_lora, dim = kvr + p.rope, hd = p.nope + p.v;
  for (int64_t j = 0; j < p.S; ++j) {
    const double* cj = c.data() + j * dim;
    for (int64_t r = 0; r < hd; ++r) {
      const float* w = p.kv_b + (h * hd + r) * kvr;
      double d = 0;
      for (int64_t i = 0; i < kvr; ++i) d += double(w[i]) * cj[i];
      if (r < p.nope) k[size_t(j * qk + r)] = d;
      else v[size_t(j * p.v + r - p.nope)] = d;
    }
    for (int64_t i = 0; i < p.rope; ++i) k[size_t(j * qk + p.nope + i)] = cj[kvr + i];
  }
}
}  // namespace

void mla_naive(const MlaProblem& p, const LatentRows& keys, float* out, float* lse) {
  const int64_t qk = p.nope + p.rope;
  const std::vector<double> c = latents(keys, p.S);
  // k = [W_UK[h] c_KV[j] | k_pe[j]], v = W_UV[h] c_KV[j]: the expanded keys and values.
  std::vector<double> k(static_cast<size_t>(p.S * qk)), v(static_cast<size_t>(p.S * p.v));
  for (int64_t h = 0; h < p.H; ++h) {
    expand_head(p, c, h, k, v);
    attend_head(h, p.T, p.H, p.q, qk, k, v, p.v, p.q_pos0, p.k_pos0, p.S, p.scale, out, lse);
  }
}

void mla_absorb(const MlaProblem& p, const LatentRows& keys, float* out, float* lse) {
  const int64_t qk = p.nope + p.rope, kvr = p.kv_lora, dim = kvr + p.rope, hd = p.nope + p.v;
  const std::vector<double> c = latents(keys, p.S);
  std::vector<double> qd(static_cast<size_t>(dim)), s;
  std::vector<double> o_lat(static_cast<size_t>(kvr));
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      const float* q = p.q + (t * p.H + h) * qk;
      // q_nope~ = W_UK[h]^T q_nope: the query in latent space; q_pe unchanged.
      std::fill(qd.begin(), qd.end(), 0.0);
      for (int64_t r = 0; r < p.nope; ++r) {
        const float* w = p.kv_b + (h * hd + r) * kvr;
        for (int64_t i = 0; i < kvr; ++i) qd[size_t(i)] += double(q[r]) * w[i];
      }
      for (int64_t i = 0; i < p.rope; ++i) qd[size_t(kvr + i)] = q[p.nope + i];
      lse[t * p.H + h] = attend_row(qd.data(), dim, c.data(), dim, c.data(), dim, kvr,
                                    visible(p.q_pos0 + t, p.k_pos0, p.S), p.scale, s, o_lat.data());
      // out = W_UV[h] o_lat.
      for (int64_t r = 0; r < p.v; ++r) {
        const float* w = p.kv_b + (h * hd + p.nope + r) * kvr;
        double d = 0;
        for (int64_t i = 0; i < kvr; ++i) d += double(w[i]) * o_lat[size_t(i)];
        out[(t * p.H + h) * p.v + r] = float(d);
      }
    }
}

void mla_naive_sparse(const MlaProblem& p, const LatentRows& keys, const KeySelection& sel, float* out, float* lse) {
  const int64_t qk = p.nope + p.rope;
  const std::vector<double> c = latents(keys, p.S);
  std::vector<double> k(static_cast<size_t>(p.S * qk)), v(static_cast<size_t>(p.S * p.v)), qd(static_cast<size_t>(qk)), s;
  std::vector<double> ks, vs;
  for (int64_t h = 0; h < p.H; ++h) {
    expand_head(p, c, h, k, v);
    for (int64_t t = 0; t < p.T; ++t) {
      // The query's keys and values, in its list's order.
      ks.clear();
      vs.clear();
      for (int64_t j = 0; j < sel.count[t]; ++j) {
        const int64_t key = sel.pos[t * sel.ld + j] - p.k_pos0;
        if (key < 0 || key >= p.S) continue;
        ks.insert(ks.end(), k.begin() + key * qk, k.begin() + (key + 1) * qk);
        vs.insert(vs.end(), v.begin() + key * p.v, v.begin() + (key + 1) * p.v);
      }
      const float* q = p.q + (t * p.H + h) * qk;
      for (int64_t i = 0; i < qk; ++i) qd[size_t(i)] = q[i];
      lse[t * p.H + h] = attend_row(qd.data(), qk, ks.data(), qk, vs.data(), p.v, p.v, int64_t(ks.size()) / qk, p.scale, s,
                                    out + (t * p.H + h) * p.v);
    }
  }
}

}  // namespace mla::cpu::ref
