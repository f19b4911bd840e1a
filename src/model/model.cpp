#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>

#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/weight_memory.h"

namespace mla {

using cpu::matmul;

namespace {

// Adds the wall time from construction to destruction to one part of a profile (no clock read
// when profiling is off).
class PartTimer {
 public:
  PartTimer(ForwardProfile* p, ForwardProfile::Part part) : p_(p), part_(part) {
    if (p_) t0_ = std::chrono::steady_clock::now();
  }
  ~PartTimer() {
    if (p_) p_->seconds[part_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  PartTimer(const PartTimer&) = delete;
  PartTimer& operator=(const PartTimer&) = delete;

 private:
  ForwardProfile* p_;
  ForwardProfile::Part part_;
  std::chrono::steady_clock::time_point t0_;
};

// Every weight view of the model, for copying the weights onto huge pages.
std::vector<MatrixView*> weight_views(ModelWeights& w) {
  std::vector<MatrixView*> v{&w.embed, &w.lm_head};
  auto mlp = [&](Mlp& m) { v.insert(v.end(), {&m.gate, &m.up, &m.down}); };
  for (auto& L : w.layers) {
    v.insert(v.end(), {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.kv_b, &L.o, &L.router});
    for (auto& m : L.w_uk_t) v.push_back(&m);
    for (auto& m : L.w_uv) v.push_back(&m);
    mlp(L.dense);
    mlp(L.shared);
    for (auto& e : L.experts) mlp(e);
  }
  return v;
}

// The products of gate and up of one MLP into gu [n, 2I] (a row's gate then its up): one job
// when up's rows follow gate's in memory, as a checkpoint stores them, else two.
void push_gate_up(std::vector<cpu::MatmulJob>& jobs, const Mlp& m, const float* x, int64_t n, int64_t ldx, float* gu) {
  const int64_t I = m.gate.rows;
  if (auto both = concat_rows(m.gate, m.up)) {
    jobs.push_back({x, n, ldx, *both, gu, 2 * I});
  } else {
    jobs.push_back({x, n, ldx, m.gate, gu, 2 * I});
    jobs.push_back({x, n, ldx, m.up, gu + I, 2 * I});
  }
}

double sum_parts(const ForwardProfile& p) {
  double s = 0;
  for (int i = 0; i < ForwardProfile::kParts; ++i) s += p.seconds[i];
  return s;
}

}  // namespace

const char* ForwardProfile::name(int part) {
  static const char* const names[kParts] = {"embedding", "attention projections", "attention", "o_proj", "dense mlp",
                                            "router",    "experts (shared and routed)", "lm_head", "other"};
  return part >= 0 && part < kParts ? names[part] : "?";
}

std::unique_ptr<Model> Model::load(const std::string& dir, const cpu::Context& ctx, bool show_progress) {
  std::unique_ptr<Model> m(new Model());
  m->ctx_ = ctx;
  m->cfg_ = ModelConfig::load(dir);
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  if (show_progress) {
    m->ckpt_->prefault([](size_t done, size_t total) {
      std::fprintf(stderr, "\rloading weights: %5.1f%% of %.2f GB", total ? 100.0 * double(done) / double(total) : 100.0,
                   double(total) / 1e9);
      if (done == total) std::fprintf(stderr, "\n");
    });
  }
  m->w_ = load_weights(*m->ckpt_, m->cfg_);
  if (cpu::should_copy_weights(ctx.weights, m->ckpt_->total_bytes())) {
    m->w_.arena = std::make_shared<cpu::WeightArena>();
    m->w_.arena->adopt(ctx, weight_views(m->w_));
    m->ckpt_->release_pages();  // the copies are what runs now: RSS counts the weights once
  }
  m->rope_ = std::make_unique<Rope>(m->cfg_);
  m->costs_ = MlaCosts::of(m->cfg_);
  return m;
}

LatentPool Model::make_pool(int64_t num_pages, int64_t page_size, KvDType dtype) const {
  return LatentPool(cfg_.num_hidden_layers, cfg_.kv_lora_rank, cfg_.qk_rope_head_dim, num_pages, page_size, dtype);
}

void Model::forward(std::span<SeqSlice> batch, LatentPool& pool, const ForwardOptions& opt, std::vector<float>& logits) {
  pass_ctx_ = opt.context ? opt.context : &ctx_;
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, qk = c.qk_head_dim(), kvr = c.kv_lora_rank,
                rope = c.qk_rope_head_dim, vd = c.v_head_dim, L = c.num_hidden_layers;
  if (pool.num_layers() != L || pool.row_dim() != c.latent_dim())
    throw std::invalid_argument("forward: the latent pool's geometry does not match the model");

  for (auto& s : batch)
    for (int32_t id : s.ids)
      if (id < 0 || id >= c.vocab_size)
        throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                    std::to_string(c.vocab_size) + ")");
  // Reserve every sequence's pages first, all or nothing.
  int64_t need = 0;
  for (auto& s : batch) need += pool.pages_needed(*s.seq, s.seq->length + int64_t(s.ids.size()));
  if (need > pool.free_pages())
    throw KvCacheExhausted("KV cache exhausted: the batch needs " + std::to_string(need) + " more pages, " +
                           std::to_string(pool.free_pages()) + " are free");
  for (auto& s : batch) pool.reserve(*s.seq, s.seq->length + int64_t(s.ids.size()));

  // Token-packed layout: sequence b's new tokens are rows [first[b], first[b+1]).
  std::vector<int64_t>& first = fwd_.first;
  first.assign(batch.size() + 1, 0);
  for (size_t b = 0; b < batch.size(); ++b) first[b + 1] = first[b] + int64_t(batch[b].ids.size());
  const int64_t T = first.back();
  std::vector<int64_t>& pos = fwd_.pos;
  pos.resize(size_t(T));
  std::vector<SeqShape>& shapes = fwd_.shapes;
  shapes.clear();
  for (size_t b = 0; b < batch.size(); ++b) {
    for (int64_t i = 0; i < int64_t(batch[b].ids.size()); ++i) pos[size_t(first[b] + i)] = batch[b].seq->length + i;
    shapes.push_back({int64_t(batch[b].ids.size()), batch[b].seq->length});
  }
  AttnPath path = opt.path == AttnPath::Auto ? choose_attn_path(costs_, shapes, opt.policy) : opt.path;
  last_path_ = path;
  static const bool debug = std::getenv("MLA_DEBUG") && std::string(std::getenv("MLA_DEBUG")) != "0";
  if (debug) {
    int64_t longest = 0;
    for (auto& sh : shapes) longest = std::max(longest, sh.cached_tokens);
    std::fprintf(stderr, "[mla] batch of %zu sequences, %lld new tokens, longest cached prefix %lld: %s%s\n",
                 batch.size(), (long long)T, (long long)longest, attn_path_name(path),
                 opt.path == AttnPath::Auto ? " (auto)" : "");
  }
  (path == AttnPath::Expand ? counters_.expand : path == AttnPath::Absorb ? counters_.absorb : counters_.chunked)++;

  PartTimer whole(profile_, ForwardProfile::Other);  // the rest is what the parts leave
  const double parts_before = profile_ ? sum_parts(*profile_) : 0;
  std::optional<PartTimer> part;
  part.emplace(profile_, ForwardProfile::Embed);
  // Sized to this batch (capacity kept); every element is written before it is read.
  ForwardScratch& f = fwd_;
  for (auto* v : {&f.h, &f.x, &f.delta}) v->resize(size_t(T * D));
  f.q.resize(size_t(T * H * qk));
  f.kv.resize(size_t(T * c.latent_dim()));
  f.attn.resize(size_t(T * H * vd));
  std::vector<float>&h = f.h, &x = f.x, &qa = f.qa, &q = f.q, &kv = f.kv, &attn = f.attn, &delta = f.delta;
  std::vector<int32_t>& all_ids = f.ids;
  all_ids.resize(size_t(T));
  for (size_t b = 0; b < batch.size(); ++b) std::copy(batch[b].ids.begin(), batch[b].ids.end(), all_ids.begin() + first[b]);
  // A prompt's rows lie scattered over the table, each a fresh page: on the development VM 512 of
  // them took 18-24 ms on one thread, 10-12 ms on two.
  cpu::parallel_for(ctx(), T, T >= 64, [&](int64_t t) { w_.embed.dequant_row(all_ids[size_t(t)], h.data() + t * D); });
  if (opt.hidden) opt.hidden->assign(1, h);
  if (opt.attn) opt.attn->clear();
  // h += delta over the batch's rows.
  auto add_residual = [&] {
    float* hp = h.data();
    const float* dp = delta.data();
    cpu::parallel_for(ctx(), T * D, T * D >= (int64_t(1) << 16), [&](int64_t i) { hp[i] += dp[i]; });
  };

  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& W = w_.layers[size_t(l)];
    part.emplace(profile_, ForwardProfile::AttnProj);
    cpu::rmsnorm(ctx(), h.data(), T, D, D, W.input_norm.data(), float(c.rms_norm_eps), x.data(), D);
    // q (or q_a) and kv_a read the same x: one batch of products.
    if (c.q_lora_rank > 0) {
      qa.resize(size_t(T * c.q_lora_rank));
      const cpu::MatmulJob jobs[] = {{x.data(), T, D, W.q_a, qa.data(), c.q_lora_rank},
                                     {x.data(), T, D, W.kv_a, kv.data(), c.latent_dim()}};
      cpu::matmul_batch(ctx(), jobs);
      cpu::rmsnorm(ctx(), qa.data(), T, c.q_lora_rank, c.q_lora_rank, W.q_a_norm.data(), float(c.rms_norm_eps), qa.data(),
                   c.q_lora_rank);
      matmul(ctx(), qa.data(), T, W.q_b, q.data());
    } else {
      const cpu::MatmulJob jobs[] = {{x.data(), T, D, W.q, q.data(), H * qk}, {x.data(), T, D, W.kv_a, kv.data(), c.latent_dim()}};
      cpu::matmul_batch(ctx(), jobs);
    }
    cpu::parallel_region(ctx(), T >= 16, [&] {
      thread_local std::vector<float> cosv, sinv;
      cosv.resize(size_t(rope / 2));
      sinv.resize(size_t(rope / 2));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        float* row = kv.data() + t * c.latent_dim();
        cpu::rmsnorm(ctx(), row, 1, kvr, kvr, W.kv_a_norm.data(), float(c.rms_norm_eps), row, kvr);
        rope_->angles(pos[size_t(t)], cosv.data(), sinv.data());
        cpu::rope_interleaved(row + kvr, cosv.data(), sinv.data(), rope / 2);
        for (int64_t hh = 0; hh < H; ++hh)
          cpu::rope_interleaved(q.data() + (t * H + hh) * qk + c.qk_nope_head_dim, cosv.data(), sinv.data(), rope / 2);
      }
    });
    for (size_t b = 0; b < batch.size(); ++b)
      for (int64_t i = 0; i < int64_t(batch[b].ids.size()); ++i) {
        const float* row = kv.data() + (first[b] + i) * c.latent_dim();
        pool.write(l, *batch[b].seq, batch[b].seq->length + i, row, row + kvr);
      }
    part.emplace(profile_, ForwardProfile::Attention);
    attention(l, batch, first, path, opt.policy.prefix_chunk, q.data(), pool, attn.data());
    part.emplace(profile_, ForwardProfile::OProj);
    matmul(ctx(), attn.data(), T, W.o, delta.data());
    if (opt.attn) opt.attn->push_back(delta);
    add_residual();

    cpu::rmsnorm(ctx(), h.data(), T, D, D, W.post_attention_norm.data(), float(c.rms_norm_eps), x.data(), D);
    part.reset();
    if (W.moe) {
      moe(W, x.data(), T, delta.data());
    } else {
      PartTimer t(profile_, ForwardProfile::DenseMlp);
      mlp(W.dense, x.data(), T, delta.data(), false);
    }
    add_residual();
    if (opt.hidden && l + 1 < L) opt.hidden->push_back(h);
  }
  for (auto& s : batch) s.seq->length += int64_t(s.ids.size());

  // Final norm and lm_head, on every new token or on each sequence's last one.
  std::vector<int64_t>& rows = f.rows;
  rows.clear();
  if (opt.last_logits_only) {
    for (size_t b = 0; b < batch.size(); ++b)
      if (first[b + 1] > first[b]) rows.push_back(first[b + 1] - 1);
  } else {
    rows.resize(size_t(T));
    std::iota(rows.begin(), rows.end(), 0);
  }
  part.emplace(profile_, ForwardProfile::LmHead);
  std::vector<float>& xn = f.xn;
  xn.resize(rows.size() * size_t(D));
  for (size_t r = 0; r < rows.size(); ++r)
    cpu::rmsnorm(ctx(), h.data() + rows[r] * D, 1, D, D, w_.final_norm.data(), float(c.rms_norm_eps), xn.data() + r * size_t(D), D);
  if (opt.hidden) opt.hidden->push_back(xn);
  logits.resize(rows.size() * size_t(c.vocab_size));
  matmul(ctx(), xn.data(), int64_t(rows.size()), w_.lm_head, logits.data());
  part.reset();
  if (profile_) {
    // `whole` adds the pass's full time to Other at scope end: take the parts' share back out.
    profile_->seconds[ForwardProfile::Other] -= sum_parts(*profile_) - parts_before;
    profile_->passes++;
  }
}

// Attention of every sequence in the batch; q: [T, H, qk] (rope applied); out: [T, H, v].
void Model::attention(int64_t layer, std::span<SeqSlice> batch, const std::vector<int64_t>& first, AttnPath path,
                      int64_t prefix_chunk, const float* q, LatentPool& pool, float* out) {
  const ModelConfig& c = cfg_;
  const LayerWeights& W = w_.layers[size_t(layer)];
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim,
                kvr = c.kv_lora_rank, qk = nope + rope, dim = c.latent_dim();
  const float scale = float(c.softmax_scale());
  AttentionScratch& z = attn_;
  auto& [latent, kvx, part, part_lse, lse, q_lat, o_lat, jobs, ranges] = z;
  for (size_t b = 0; b < batch.size(); ++b) {
    const int64_t n = first[b + 1] - first[b];
    if (n == 0) continue;
    const int64_t S = batch[b].seq->length + n, cached = batch[b].seq->length;
    const float* qb = q + first[b] * H * qk;
    float* ob = out + first[b] * H * vd;
    lse.resize(size_t(n * H));

    if (path == AttnPath::Absorb) {
      // q_lat[t, h] = W_UK[h]^T q_nope[t, h]; attention in latent space; then W_UV[h].
      q_lat.resize(size_t(n * H * kvr));
      o_lat.resize(size_t(n * H * kvr));
      jobs.clear();
      for (int64_t h = 0; h < H; ++h)
        jobs.push_back({qb + h * qk, n, H * qk, W.w_uk_t[size_t(h)], q_lat.data() + h * kvr, H * kvr});
      cpu::matmul_batch(ctx(), jobs);
      // The latent rows come straight from the cache pages, a block of keys at a time.
      const PageTable& seq = *batch[b].seq;
      cpu::AbsorbArgs a{q_lat.data(), qb + nope, H * qk, qk, nullptr, n, S, H, kvr, rope, cached, 0, scale};
      // One captured reference: the std::function holds it without allocating.
      const struct {
        LatentPool& pool;
        const PageTable& seq;
        int64_t layer;
      } from{pool, seq, layer};
      a.gather = [&from](int64_t s0, int64_t cnt, float* out) { from.pool.gather(from.layer, from.seq, s0, cnt, out); };
      cpu::attention_absorb(ctx(), a, o_lat.data(), lse.data());
      jobs.clear();
      for (int64_t h = 0; h < H; ++h)
        jobs.push_back({o_lat.data() + h * kvr, n, H * kvr, W.w_uv[size_t(h)], ob + h * vd, H * vd});
      cpu::matmul_batch(ctx(), jobs);
      continue;
    }

    // Expand: key ranges expanded through kv_b_proj, merged by log-sum-exp. Plain expand is one
    // range over every key; chunked runs the cached prefix `prefix_chunk` tokens at a time, then
    // the new tokens' own causal part.
    latent.resize(size_t(S * dim));
    pool.gather(layer, *batch[b].seq, 0, S, latent.data());
    ranges.clear();
    if (path == AttnPath::Chunked) {
      const int64_t C = std::max<int64_t>(1, prefix_chunk);
      for (int64_t s0 = 0; s0 < cached; s0 += C) ranges.push_back({s0, std::min(cached, s0 + C)});
      ranges.push_back({cached, S});
    } else {
      ranges.push_back({0, S});
    }
    part.resize(size_t(n * H * vd));
    part_lse.resize(size_t(n * H));
    std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
    std::fill(ob, ob + n * H * vd, 0.0f);
    for (auto [k0, k1] : ranges) {
      const int64_t nk = k1 - k0;
      kvx.resize(size_t(nk * H * (nope + vd)));
      matmul(ctx(), latent.data() + k0 * dim, nk, dim, W.kv_b, kvx.data(), H * (nope + vd));
      cpu::ExpandArgs a{qb, kvx.data(), latent.data() + k0 * dim + kvr, dim, n, nk, H, nope, rope, vd, cached, k0, scale};
      if (ranges.size() == 1) {
        cpu::attention_expand(ctx(), a, ob, lse.data());
      } else {
        cpu::attention_expand(ctx(), a, part.data(), part_lse.data());
        cpu::merge_partial(ob, lse.data(), part.data(), part_lse.data(), n * H, vd);
      }
    }
  }
}

void Model::mlp(const Mlp& m, const float* x, int64_t T, float* out, bool accumulate, const float* row_weights) {
  const int64_t I = m.gate.rows, D = cfg_.hidden_size;
  const size_t scratch = size_t(T * (3 * I + D));
  if (mlp_scratch_.size() < scratch) mlp_scratch_.resize(scratch);
  float* const gu = mlp_scratch_.data();
  float* const act = gu + T * 2 * I;
  float* const y = act + T * I;
  std::vector<cpu::MatmulJob>& jobs = mlp_jobs_;
  jobs.clear();
  push_gate_up(jobs, m, x, T, D, gu);
  cpu::matmul_batch(ctx(), jobs);
  cpu::silu_mul(ctx(), gu, T, I, act);
  matmul(ctx(), act, T, m.down, y);
  for (int64_t t = 0; t < T; ++t) {
    float w = row_weights ? row_weights[t] : 1.0f;
    for (int64_t i = 0; i < D; ++i) {
      float v = w * y[t * D + i];
      out[t * D + i] = accumulate ? out[t * D + i] + v : v;
    }
  }
}

// Routed experts (DeepSeek's gate: softmax or sigmoid scores, optional group-limited choice,
// bias for the choice only, weights from the unbiased scores) plus the shared experts.
void Model::moe(const LayerWeights& W, const float* x, int64_t T, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, D = c.hidden_size, G = c.n_group;
  std::optional<PartTimer> part;
  part.emplace(profile_, ForwardProfile::Router);
  MoeScratch& z = moe_;
  auto& [logits, chosen, picks, tokens_in, row0, active, jobs] = z;
  logits.resize(size_t(T * E));
  matmul(ctx(), x, T, W.router, logits.data());
  // Each token's choice (independent of the others: split across the threads) as (expert,
  // weight) pairs in ascending expert order, then each pick's row among its expert's tokens.
  chosen.resize(size_t(T * K));
  const float ninf = -std::numeric_limits<float>::infinity();
  // The k largest, descending by value, ties to the lower index (as a stable sort of -value).
  // A NaN counts as -inf (an order, where comparisons with NaN would give none).
  auto top = [ninf](const std::vector<float>& v, int64_t k, std::vector<int64_t>& order) {
    auto val = [&](int64_t i) { return std::isnan(v[size_t(i)]) ? ninf : v[size_t(i)]; };
    order.resize(v.size());
    std::iota(order.begin(), order.end(), 0);
    const auto mid = order.begin() + std::min<int64_t>(k, int64_t(order.size()));
    std::partial_sort(order.begin(), mid, order.end(),
                      [&](int64_t a, int64_t b) { return val(a) > val(b) || (val(a) == val(b) && a < b); });
    order.erase(mid, order.end());
  };
  cpu::parallel_region(ctx(), T >= 16, [&] {
    // Each thread's working lists, kept between calls.
    thread_local std::vector<float> scores, choice, group_score, members;
    thread_local std::vector<int64_t> idx, keep;
    thread_local std::vector<char> kept;
    scores.resize(size_t(E));
    choice.resize(size_t(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* lg = logits.data() + t * E;
      if (c.scoring_func == ScoringFunc::Sigmoid) {
        for (int64_t e = 0; e < E; ++e) scores[size_t(e)] = 1.0f / (1.0f + std::exp(-lg[e]));
      } else {
        float m = *std::max_element(lg, lg + E);
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += (scores[size_t(e)] = std::exp(lg[e] - m));
        for (int64_t e = 0; e < E; ++e) scores[size_t(e)] = float(scores[size_t(e)] / s);
      }
      for (int64_t e = 0; e < E; ++e)
        choice[size_t(e)] = scores[size_t(e)] + (W.router_bias.empty() ? 0.0f : W.router_bias[size_t(e)]);
      if (c.topk_method != TopkMethod::Greedy && G > 1) {
        const int64_t per = E / G;
        group_score.resize(size_t(G));
        for (int64_t g = 0; g < G; ++g) {
          members.assign(choice.begin() + g * per, choice.begin() + (g + 1) * per);
          std::sort(members.begin(), members.end(), std::greater<float>());
          group_score[size_t(g)] =
              c.topk_method == TopkMethod::NoauxTc ? members[0] + (per > 1 ? members[1] : 0.0f) : members[0];
        }
        top(group_score, c.topk_group, keep);
        kept.assign(size_t(G), 0);
        for (auto g : keep) kept[size_t(g)] = 1;
        for (int64_t e = 0; e < E; ++e)
          if (!kept[size_t(e / per)]) choice[size_t(e)] = ninf;  // DeepSeek's fill for the other groups
      }
      top(choice, K, idx);
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += scores[size_t(idx[size_t(k)])];
      const bool normalise = c.norm_topk_prob && (c.scoring_func == ScoringFunc::Sigmoid || K > 1);
      auto* mine = chosen.data() + t * K;
      for (int64_t k = 0; k < K; ++k) {
        const double w = normalise ? scores[size_t(idx[size_t(k)])] / (sum + 1e-20) : scores[size_t(idx[size_t(k)])];
        mine[k] = {idx[size_t(k)], float(w * c.routed_scaling_factor)};
      }
      // Each token's outputs are summed in expert order.
      std::sort(mine, mine + K, [](const auto& a, const auto& b) { return a.first < b.first; });
    }
  });
  // picks[t * K + k]: the k-th expert of token t (ascending) and the token's place among that
  // expert's tokens (in token order); tokens_in[e]: how many tokens chose expert e.
  tokens_in.assign(size_t(E), 0);
  picks.resize(size_t(T * K));
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = chosen[size_t(i)].first;
    picks[size_t(i)] = {e, tokens_in[size_t(e)]++};
  }
  part.emplace(profile_, ForwardProfile::Experts);
  // Tokens grouped by expert: each selected expert's weights are read once for the batch. The
  // shared experts (every token, weight 1) and the routed ones run as two batches of products
  // (every gate/up, then every down), so a decode step forks the thread pool twice per layer.
  const int64_t I = c.moe_intermediate_size, Is = W.has_shared ? W.shared.gate.rows : 0;
  row0.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) row0[size_t(e + 1)] = row0[size_t(e)] + tokens_in[size_t(e)];
  const int64_t R = row0[size_t(E)];
  const size_t scratch = size_t(R * (2 * D + 3 * I) + T * 3 * Is);
  if (mlp_scratch_.size() < scratch) mlp_scratch_.resize(scratch);
  float* const xe = mlp_scratch_.data();  // every part below is written before it is read
  float* const gu = xe + R * D;
  float* const act = gu + R * 2 * I;
  float* const ye = act + R * I;
  float* const gus = ye + R * D;
  float* const acts = gus + T * 2 * Is;
  jobs.clear();
  active.clear();
  for (int64_t e = 0; e < E; ++e)
    if (tokens_in[size_t(e)] > 0) active.push_back(e);
  cpu::parallel_for(ctx(), T * K, R >= 64, [&](int64_t i) {
    const auto [e, j] = picks[size_t(i)];
    std::copy(x + (i / K) * D, x + (i / K + 1) * D, xe + (row0[size_t(e)] + j) * D);
  });
  // A prompt gives each routed expert a few dozen tokens: products too small to split well
  // across threads. Then each expert runs whole (gate/up, SiLU, down) on one thread, the
  // experts handed out to the threads; the shared experts (every token) run split as usual.
  const int threads = ctx().num_threads();
  const bool expert_per_thread = threads > 1 && int64_t(active.size()) >= 4 * threads && R >= 8 * int64_t(active.size());
  if (expert_per_thread) {
    if (W.has_shared) {
      push_gate_up(jobs, W.shared, x, T, D, gus);
      cpu::matmul_batch(ctx(), jobs);
      cpu::silu_mul(ctx(), gus, T, Is, acts);
      cpu::matmul(ctx(), acts, T, Is, W.shared.down, out, D);
    } else {
      std::fill(out, out + T * D, 0.0f);
    }
    const int64_t na = int64_t(active.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx().num_threads())
    for (int64_t i = 0; i < na; ++i) {
      const int64_t e = active[size_t(i)], r0 = row0[size_t(e)], n = row0[size_t(e + 1)] - r0;
      thread_local std::vector<cpu::MatmulJob> mine;
      mine.clear();
      push_gate_up(mine, W.experts[size_t(e)], xe + r0 * D, n, D, gu + r0 * 2 * I);
      cpu::matmul_batch(ctx(), mine);
      cpu::silu_mul(ctx(), gu + r0 * 2 * I, n, I, act + r0 * I);
      cpu::matmul(ctx(), act + r0 * I, n, I, W.experts[size_t(e)].down, ye + r0 * D, D);
    }
  } else {
    if (W.has_shared) push_gate_up(jobs, W.shared, x, T, D, gus);
    for (int64_t e : active) {
      const int64_t r0 = row0[size_t(e)], n = row0[size_t(e + 1)] - r0;
      push_gate_up(jobs, W.experts[size_t(e)], xe + r0 * D, n, D, gu + r0 * 2 * I);
    }
    cpu::matmul_batch(ctx(), jobs);
    if (W.has_shared) cpu::silu_mul(ctx(), gus, T, Is, acts);
    cpu::silu_mul(ctx(), gu, R, I, act);
    jobs.clear();
    // The shared experts' output is the sum's first term: written straight into out.
    if (W.has_shared) jobs.push_back({acts, T, Is, W.shared.down, out, D});
    else std::fill(out, out + T * D, 0.0f);
    for (int64_t e : active) {
      const int64_t r0 = row0[size_t(e)], n = row0[size_t(e + 1)] - r0;
      jobs.push_back({act + r0 * I, n, I, W.experts[size_t(e)].down, ye + r0 * D, D});
    }
    cpu::matmul_batch(ctx(), jobs);
  }
  cpu::parallel_for(ctx(), T, T >= 16, [&](int64_t t) {
    for (int64_t k = 0; k < K; ++k) {
      const auto [e, j] = picks[size_t(t * K + k)];
      const float w = chosen[size_t(t * K + k)].second;
      const float* y = ye + (row0[size_t(e)] + j) * D;
      for (int64_t d = 0; d < D; ++d) out[t * D + d] += w * y[d];
    }
  });
}

}  // namespace mla
