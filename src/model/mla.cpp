#include "model/mla.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "backend/cpu/attention.h"
#include "backend/cpu/attention/attention_reference.h"
#include "backend/cpu/parallel.h"

namespace mla {

MlaForm mla_form(AttnPath p) {
  switch (p) {
    case AttnPath::Expand: return MlaForm::Expand;
    case AttnPath::Chunked: return MlaForm::Chunked;
    case AttnPath::Absorb: return MlaForm::Absorb;
    case AttnPath::Auto: break;
  }
  throw std::invalid_argument("mla_form: the path is not chosen (auto)");
}

MlaAttention::MlaAttention(const ModelConfig& c)
    : H_(c.num_attention_heads),
      nope_(c.qk_nope_head_dim),
      rope_dim_(c.qk_rope_head_dim),
      v_(c.v_head_dim),
      kv_lora_(c.kv_lora_rank),
      q_lora_(c.q_lora_rank),
      hidden_(c.hidden_size),
      scale_(float(c.softmax_scale())),
      eps_(float(c.rms_norm_eps)),
      rope_(c) {}

void MlaAttention::project(const cpu::Context& ctx, const LayerWeights& W, const float* x, int64_t T, const int64_t* pos, float* q, float* kv) {
  const int64_t D = hidden_, qk = nope_ + rope_dim_, dim = kv_lora_ + rope_dim_, H = H_, kvr = kv_lora_,
                half = rope_dim_ / 2;
  // q (or q_a) and kv_a read the same x: one batch of products.
  if (q_lora_ > 0) {
    z_.q_a.resize(size_t(T * q_lora_));
    float* q_a = z_.q_a.data();
    const cpu::MatmulJob jobs[] = {{x, T, D, W.q_a, q_a, q_lora_}, {x, T, D, W.kv_a, kv, dim}};
    cpu::matmul_batch(ctx, jobs);
    cpu::rmsnorm(ctx, q_a, T, q_lora_, q_lora_, W.q_a_norm.data(), eps_, q_a, q_lora_);
    cpu::matmul(ctx, q_a, T, W.q_b, q);
  } else {
    const cpu::MatmulJob jobs[] = {{x, T, D, W.q, q, H * qk}, {x, T, D, W.kv_a, kv, dim}};
    cpu::matmul_batch(ctx, jobs);
  }
  // c_KV <- RMSNorm(c_KV); k_pe and every head's q_pe rotated to the token's position.
  rope_.for_each_position(ctx, T, pos, [&](int64_t t, const float* cos, const float* sin) {
    float* c_kv = kv + t * dim;
    cpu::rmsnorm(ctx, c_kv, 1, kvr, kvr, W.kv_a_norm.data(), eps_, c_kv, kvr);
    cpu::rope_interleaved(c_kv + kvr, cos, sin, half);
    for (int64_t h = 0; h < H; ++h) cpu::rope_interleaved(q + (t * H + h) * qk + nope_, cos, sin, half);
  });
}

void MlaAttention::write_cache(LatentPool& pool, int64_t layer, const PageTable& seq, int64_t pos0, int64_t n,
                               const float* kv) const {
  const int64_t dim = kv_lora_ + rope_dim_;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = kv + i * dim;
    pool.write(layer, seq, pos0 + i, row, row + kv_lora_);  // c_KV, k_pe
  }
}

void MlaAttention::write_cache(LatentPool& pool, int64_t layer, std::span<const SeqSlice> batch, const int64_t* first,
                               const float* kv) const {
  const int64_t dim = kv_lora_ + rope_dim_;
  for (size_t b = 0; b < batch.size(); ++b)
    write_cache(pool, layer, *batch[b].seq, batch[b].seq->length, int64_t(batch[b].ids.size()), kv + first[b] * dim);
}

void MlaAttention::attend(const cpu::Context& ctx, const LayerWeights& W, const LatentPool& pool, int64_t layer, std::span<const SeqSlice> batch,
                          const int64_t* first, MlaForm form, int64_t prefix_chunk, const float* q, float* out) {
  const int64_t qk = nope_ + rope_dim_;
  for (size_t b = 0; b < batch.size(); ++b) {
    const int64_t n = first[b + 1] - first[b];
    if (n == 0) continue;
    const SeqKeys k{&pool, layer, batch[b].seq, batch[b].seq->length, n};
    const float* qb = q + first[b] * H_ * qk;
    float* ob = out + first[b] * H_ * v_;
    switch (form) {
      case MlaForm::Expand: expand(ctx, W, k, qb, ob); break;
      case MlaForm::Chunked: chunked(ctx, W, k, prefix_chunk, qb, ob); break;
      case MlaForm::Absorb: absorb(ctx, W, k, qb, ob); break;
      case MlaForm::Reference: reference(W, k, qb, ob); break;
    }
  }
}

// q_nope~[t, h] = W_UK[h]^T q_nope[t, h]: each head's queries into latent space (z_.q_lat); sizes
// z_.o_lat and z_.lse for the attention that follows.
float* MlaAttention::absorb_queries(const cpu::Context& ctx, const LayerWeights& W, const float* q, int64_t n) {
  const int64_t H = H_, qk = nope_ + rope_dim_, kvr = kv_lora_;
  z_.lse.resize(size_t(n * H));
  z_.q_lat.resize(size_t(n * H * kvr));
  z_.o_lat.resize(size_t(n * H * kvr));
  float* const q_lat = z_.q_lat.data();
  z_.jobs.clear();
  for (int64_t h = 0; h < H; ++h) z_.jobs.push_back({q + h * qk, n, H * qk, W.w_uk_t[size_t(h)], q_lat + h * kvr, H * kvr});
  cpu::matmul_batch(ctx, z_.jobs);
  return q_lat;
}

std::string MlaAttention::kernel_names(const cpu::Context& ctx, const ModelConfig& c, KvDType dtype) {
  cpu::ExpandArgs e{};
  e.nope = c.qk_nope_head_dim, e.rope = c.qk_rope_head_dim, e.v = c.v_head_dim;
  cpu::AbsorbArgs a{};
  a.kv_lora = c.kv_lora_rank, a.rope = c.qk_rope_head_dim;
  if (dtype == KvDType::BF16) a.gather_bf16 = [](int64_t, int64_t, uint16_t*) {};  // as absorb() sets it
  return std::string("expand ") + cpu::expand_kernel_name(cpu::expand_kernel(ctx, e)) + ", absorb " +
         cpu::absorb_kernel_name(cpu::absorb_kernel(ctx, a));
}

// out[t, h] = W_UV[h] o_lat[t, h] (z_.o_lat).
void MlaAttention::absorb_values(const cpu::Context& ctx, const LayerWeights& W, int64_t n, float* out) {
  const int64_t H = H_, kvr = kv_lora_, vd = v_;
  const float* const o_lat = z_.o_lat.data();
  z_.jobs.clear();
  for (int64_t h = 0; h < H; ++h) z_.jobs.push_back({o_lat + h * kvr, n, H * kvr, W.w_uv[size_t(h)], out + h * vd, H * vd});
  cpu::matmul_batch(ctx, z_.jobs);
}

void MlaAttention::absorb(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, const float* q, float* out) {
  const int64_t H = H_, nope = nope_, qk = nope_ + rope_dim_, kvr = kv_lora_, n = k.n, S = k.cached + k.n;
  float* const q_lat = absorb_queries(ctx, W, q, n);
  float* const o_lat = z_.o_lat.data();
  // Scores against c_KV and k_pe, o_lat = sum p c_KV: the latent rows come straight from the
  // cache pages, a block of keys at a time.
  cpu::AbsorbArgs a{q_lat, q + nope, H * qk, qk, nullptr, n, S, H, kvr, rope_dim_, k.cached, 0, scale_};
  // One captured reference: the std::function holds it without allocating.
  const SeqKeys* from = &k;
  a.gather = [from](int64_t s0, int64_t cnt, float* rows) { from->pool->gather(from->layer, *from->seq, s0, cnt, rows); };
  // A bf16 cache's rows as stored, for the fast precision's bf16 kernel (cpu::absorb_kernel):
  // read where they lie when a page holds whole groups of 32 keys, else copied out.
  if (k.pool->dtype() == KvDType::BF16 && k.pool->page_size() % 32 == 0)
    a.bf16_rows = [from](int64_t s) { return from->pool->bf16_row(from->layer, *from->seq, s); };
  else if (k.pool->dtype() == KvDType::BF16)
    a.gather_bf16 = [from](int64_t s0, int64_t cnt, uint16_t* rows) {
      from->pool->gather_bf16(from->layer, *from->seq, s0, cnt, rows);
    };
  if (ctx.one_token_kernels && n > 1) {
    // Each query as a decode step would take it: its own keys, its own thread split.
    for (int64_t t = 0; t < n; ++t) {
      cpu::AbsorbArgs one = a;
      one.q_lat = q_lat + t * H * kvr;
      one.q_pe = q + t * H * qk + nope;
      one.T = 1;
      one.S = k.cached + t + 1;
      one.q_pos0 = k.cached + t;
      cpu::attention_absorb(ctx, one, o_lat + t * H * kvr, z_.lse.data() + t * H);
    }
  } else {
    cpu::attention_absorb(ctx, a, o_lat, z_.lse.data());
  }
  absorb_values(ctx, W, n, out);
}

void MlaAttention::expand_ranges(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, int64_t chunk, const float* q, float* out,
                                 const cpu::KeySelection* sel) {
  const int64_t H = H_, nope = nope_, vd = v_, kvr = kv_lora_, dim = kv_lora_ + rope_dim_, n = k.n, cached = k.cached,
                S = cached + n;
  z_.c_kv.resize(size_t(S * dim));
  float* const c_kv = z_.c_kv.data();
  k.pool->gather(k.layer, *k.seq, 0, S, c_kv);
  auto& ranges = z_.ranges;
  ranges.clear();
  if (chunk > 0) {
    for (int64_t s0 = 0; s0 < cached; s0 += chunk) ranges.push_back({s0, std::min(cached, s0 + chunk)});
    ranges.push_back({cached, S});
  } else {
    ranges.push_back({0, S});
  }
  z_.lse.resize(size_t(n * H));
  z_.part.resize(size_t(n * H * vd));
  z_.part_lse.resize(size_t(n * H));
  float* const lse = z_.lse.data();
  std::fill(lse, lse + n * H, -std::numeric_limits<float>::infinity());
  std::fill(out, out + n * H * vd, 0.0f);
  for (auto [k0, k1] : ranges) {
    const int64_t nk = k1 - k0;
    // kvx[j, h] = [W_UK[h] c_KV[j] | W_UV[h] c_KV[j]]: the range's keys and values expanded.
    z_.kvx.resize(size_t(nk * H * (nope + vd)));
    cpu::matmul(ctx, c_kv + k0 * dim, nk, dim, W.kv_b, z_.kvx.data(), H * (nope + vd));
    const cpu::ExpandArgs a{q, z_.kvx.data(), c_kv + k0 * dim + kvr, dim, n, nk, H, nope, rope_dim_, vd, cached, k0,
                            scale_};
    if (ranges.size() == 1) {
      if (sel) cpu::attention_expand_sparse(ctx, a, *sel, out, lse);
      else cpu::attention_expand(ctx, a, out, lse);
    } else {
      if (sel) cpu::attention_expand_sparse(ctx, a, *sel, z_.part.data(), z_.part_lse.data());
      else cpu::attention_expand(ctx, a, z_.part.data(), z_.part_lse.data());
      cpu::merge_partial(out, lse, z_.part.data(), z_.part_lse.data(), n * H, vd);
    }
  }
}

// The plain reference's problem: kv_b dequantized to float32 (z_.kv_b), z_.lse sized.
cpu::ref::MlaProblem MlaAttention::reference_problem(const LayerWeights& W, const SeqKeys& k, const float* q) {
  const int64_t rows = H_ * (nope_ + v_), n = k.n;
  z_.kv_b.resize(size_t(rows * kv_lora_));
  for (int64_t r = 0; r < rows; ++r) W.kv_b.dequant_row(r, z_.kv_b.data() + r * kv_lora_);
  z_.lse.resize(size_t(n * H_));
  return {q, z_.kv_b.data(), n, k.cached + n, H_, nope_, rope_dim_, v_, kv_lora_, k.cached, 0, scale_};
}

void MlaAttention::reference(const LayerWeights& W, const SeqKeys& k, const float* q, float* out) {
  const cpu::ref::MlaProblem p = reference_problem(W, k, q);
  cpu::ref::mla_naive(p, cpu::ref::LatentRows(*k.pool, k.layer, *k.seq), out, z_.lse.data());
}

void MlaAttention::o_proj(const cpu::Context& ctx, const LayerWeights& W, const float* attn, int64_t T, float* out) const {
  cpu::matmul(ctx, attn, T, W.o, out);
}

void MlaAttention::attend_sparse(const cpu::Context& ctx, const LayerWeights& W, const LatentPool& pool, int64_t layer,
                                 std::span<const SeqSlice> batch, const int64_t* first, MlaForm form, int64_t prefix_chunk,
                                 std::span<const cpu::KeySelection> sel, const float* q, float* out) {
  const int64_t qk = nope_ + rope_dim_;
  for (size_t b = 0; b < batch.size(); ++b) {
    const int64_t n = first[b + 1] - first[b];
    if (n == 0) continue;
    if (!sel[b].pos) {
      attend(ctx, W, pool, layer, batch.subspan(b, 1), first + b, form, prefix_chunk, q, out);
      continue;
    }
    const SeqKeys k{&pool, layer, batch[b].seq, batch[b].seq->length, n};
    const float* qb = q + first[b] * H_ * qk;
    float* ob = out + first[b] * H_ * v_;
    switch (form) {
      case MlaForm::Expand: expand_ranges(ctx, W, k, 0, qb, ob, &sel[b]); break;
      case MlaForm::Chunked: expand_ranges(ctx, W, k, std::max<int64_t>(1, prefix_chunk), qb, ob, &sel[b]); break;
      case MlaForm::Absorb: absorb_sparse(ctx, W, k, sel[b], qb, ob); break;
      case MlaForm::Reference: reference_sparse(W, k, sel[b], qb, ob); break;
    }
  }
}

void MlaAttention::absorb_sparse(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k,
                                 const cpu::KeySelection& sel, const float* q, float* out) {
  const int64_t H = H_, nope = nope_, qk = nope_ + rope_dim_, kvr = kv_lora_, n = k.n;
  float* const q_lat = absorb_queries(ctx, W, q, n);
  float* const o_lat = z_.o_lat.data();
  cpu::SparseAbsorbArgs a{q_lat, q + nope, H * qk, qk, n, H, kvr, rope_dim_, scale_, sel, nullptr};
  const SeqKeys* from = &k;
  a.gather = [from](const int32_t* pos, int64_t cnt, float* rows) { from->pool->gather_at(from->layer, *from->seq, pos, cnt, rows); };
  cpu::attention_absorb_sparse(ctx, a, o_lat, z_.lse.data());
  absorb_values(ctx, W, n, out);
}

void MlaAttention::reference_sparse(const LayerWeights& W, const SeqKeys& k, const cpu::KeySelection& sel, const float* q,
                                    float* out) {
  const cpu::ref::MlaProblem p = reference_problem(W, k, q);
  cpu::ref::mla_naive_sparse(p, cpu::ref::LatentRows(*k.pool, k.layer, *k.seq), sel, out, z_.lse.data());
}

}  // namespace mla
