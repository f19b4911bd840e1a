#include "model/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"
#include "tensor/quantize.h"

namespace mla {

void hadamard_inplace(float* x, int64_t n) {
  for (int64_t len = 1; len < n; len <<= 1)
    for (int64_t i = 0; i < n; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float s = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

namespace {

// RoPE of the first 2 * half values in halves pairing (i, i + half): NeoX / rotate_half.
void rope_halves(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

// LayerNorm over n values with weight and bias, eps 1e-6 (the indexer's k_norm), in place.
void layer_norm(float* x, int64_t n, const float* w, const float* b) {
  double mu = 0, var = 0;
  for (int64_t i = 0; i < n; ++i) mu += x[i];
  mu /= double(n);
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mu) * (x[i] - mu);
  var /= double(n);
  const double inv = 1.0 / std::sqrt(var + 1e-6);
  for (int64_t i = 0; i < n; ++i) x[i] = float((x[i] - mu) * inv) * w[i] + b[i];
}

// A query's count of selected positions (at most K); with no more than K visible, all of them
// are written (true) and no selection is needed.
bool every_position(int64_t visible, int64_t K, int32_t* out, int64_t& count) {
  count = std::min(K, visible);
  if (visible > K) return false;
  std::iota(out, out + visible, 0);
  return true;
}

}  // namespace

Indexer::Indexer(const ModelConfig& c)
    : Hi_(c.index_n_heads),
      D_(c.index_head_dim),
      rope_dim_(c.qk_rope_head_dim),
      topk_(c.index_topk),
      hidden_(c.hidden_size),
      q_lora_(c.q_lora_rank),
      interleave_(c.indexer_rope_interleave),
      pow2_scales_(c.ue8m0_scales),
      rope_(c) {}

void Indexer::project(const cpu::Context& ctx, const IndexerWeights& W, const float* x, const float* qr, int64_t T,
                      const int64_t* pos, float* q, float* w, float* k) {
  const int64_t Hi = Hi_, D = D_, half = rope_dim_ / 2;
  const cpu::MatmulJob jobs[] = {{x, T, hidden_, W.wk, k, D}, {x, T, hidden_, W.weights_proj, w, Hi}};
  cpu::matmul_batch(ctx, jobs);
  cpu::matmul(ctx, qr, T, q_lora_, W.wq_b, q, Hi * D);
  const float wscale = float(1.0 / std::sqrt(double(Hi)) / std::sqrt(double(D)));
  rope_.for_each_position(ctx, T, pos, [&](int64_t t, const float* cos, const float* sin) {
    auto rotate = [&](float* v) {
      if (interleave_) cpu::rope_interleaved(v, cos, sin, half);
      else rope_halves(v, cos, sin, half);
      hadamard_inplace(v, D);
    };
    float* kt = k + t * D;
    layer_norm(kt, D, W.k_norm.data(), W.k_norm_bias.data());
    rotate(kt);
    for (int64_t h = 0; h < Hi; ++h) rotate(q + (t * Hi + h) * D);
    if (ctx.fp8_indexer) {  // act_quant of q and k: blocks of 128, a head (D = 128) each in the releases
      const int64_t block = std::min<int64_t>(D, 128);
      quant::fp8_act_round(kt, D, block, pow2_scales_);
      quant::fp8_act_round(q + t * Hi * D, Hi * D, block, pow2_scales_);
    }
    for (int64_t h = 0; h < Hi; ++h) w[t * Hi + h] *= wscale;
  });
}

void Indexer::write_cache(LatentPool& pool, int64_t layer, std::span<const SeqSlice> batch, const int64_t* first,
                          const float* k) const {
  for (size_t b = 0; b < batch.size(); ++b) {
    const int64_t n = int64_t(batch[b].ids.size()), p0 = batch[b].seq->length;
    for (int64_t i = 0; i < n; ++i) pool.write_index(layer, *batch[b].seq, p0 + i, k + (first[b] + i) * D_);
  }
}

cpu::IndexKernel Indexer::kernel(const cpu::Context& ctx) const { return cpu::index_kernel(ctx, D_, cpu::features(ctx)); }

void Indexer::select(const cpu::Context& ctx, const SeqKeys& kk, const float* q, const float* w, int32_t* sel,
                     int64_t* count) {
  const int64_t Hi = Hi_, D = D_, K = topk_;
  const cpu::IndexKernel kern = kernel(ctx);
  if (!cpu::index_kernel_supported(kern, D)) {
    select_reference(ctx, kk, q, w, sel, count);
    return;
  }
  const LatentPool& pool = *kk.pool;
  const cpu::IndexKeyPages keys{pool.index_data(kk.layer), kk.seq->pages.data(), pool.page_size(),
                                pool.index_bytes_per_row(), D, pool.dtype()};
  scores_.resize(size_t(kk.cached + kk.n));
  for (int64_t i = 0; i < kk.n; ++i) {
    const int64_t visible = kk.cached + i + 1;
    int32_t* out = sel + i * K;
    if (every_position(visible, K, out, count[i])) continue;
    query_.prepare(kern, q + i * Hi * D, w + i * Hi, Hi, D);
    cpu::index_scores(ctx, query_, keys, visible, scores_.data());
    cpu::topk_positions(ctx, scores_.data(), visible, K, out);
  }
}

void Indexer::select_reference(const cpu::Context& ctx, const SeqKeys& kk, const float* q, const float* w, int32_t* sel,
                               int64_t* count) {
  const int64_t Hi = Hi_, D = D_, S = kk.cached + kk.n, K = topk_;
  keys_.resize(size_t(S * D));
  // The keys decoded to float32 a block of pages at a time across the threads (the pool's reads
  // are safe from several threads).
  const int64_t gblock = 1024;
  float* const kd = keys_.data();
  cpu::parallel_for(ctx, (S + gblock - 1) / gblock, S >= 2 * gblock, [&](int64_t g) {
    const int64_t s0 = g * gblock;
    kk.pool->gather_index(kk.layer, *kk.seq, s0, std::min(gblock, S - s0), kd + s0 * D);
  });
  // Queries in blocks whose per-head dots [block * Hi, S] stay within ~16 MB.
  const int64_t block = std::clamp<int64_t>((int64_t(1) << 22) / std::max<int64_t>(1, Hi * S), 1, 16);
  scores_.resize(size_t(S));
  order_.resize(size_t(S));
  for (int64_t i0 = 0; i0 < kk.n; i0 += block) {
    const int64_t nb = std::min(block, kk.n - i0);
    qk_.resize(size_t(nb * Hi * S));
    cpu::sgemm(ctx, false, true, nb * Hi, S, D, 1.0f, q + i0 * Hi * D, D, keys_.data(), D, 0.0f, qk_.data(), S);
    for (int64_t i = i0; i < i0 + nb; ++i) {
      const int64_t visible = kk.cached + i + 1;
      int32_t* out = sel + i * K;
      if (every_position(visible, K, out, count[i])) continue;
      // I[s] = sum_h w[h] relu(q[h] . k[s]) over the visible keys.
      float* sc = scores_.data();
      const float* wi = w + i * Hi;
      const float* dots = qk_.data() + (i - i0) * Hi * S;
      const int64_t sblock = 4096;
      cpu::parallel_for(ctx, (visible + sblock - 1) / sblock, visible >= 2 * sblock, [&](int64_t g) {
        const int64_t s0 = g * sblock, s1 = std::min(visible, s0 + sblock);
        std::fill(sc + s0, sc + s1, 0.0f);
        for (int64_t h = 0; h < Hi; ++h) {
          const float wh = wi[h];
          const float* d = dots + h * S;
          for (int64_t s = s0; s < s1; ++s) sc[s] += wh * std::max(d[s], 0.0f);
        }
      });
      int32_t* ord = order_.data();
      std::iota(ord, ord + visible, 0);
      std::nth_element(ord, ord + K, ord + visible, [sc](int32_t a, int32_t b) {
        return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
      });
      std::copy(ord, ord + K, out);
      std::sort(out, out + K);
    }
  }
}

}  // namespace mla
