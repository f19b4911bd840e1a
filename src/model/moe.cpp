#include "model/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/parallel.h"

namespace mla {

RouterConfig RouterConfig::of(const ModelConfig& c) {
  return {.n_experts = c.n_routed_experts, .top_k = c.num_experts_per_tok, .n_group = c.n_group,
          .topk_group = c.topk_group, .scoring = c.scoring_func, .method = c.topk_method,
          .norm_topk_prob = c.norm_topk_prob, .routed_scaling_factor = c.routed_scaling_factor};
}

void push_gate_up(std::vector<cpu::MatmulJob>& jobs, const Mlp& m, const float* x, int64_t n, int64_t ldx, float* gu) {
  const int64_t I = m.gate.rows;
  if (auto both = concat_rows(m.gate, m.up)) {
    jobs.push_back({x, n, ldx, *both, gu, 2 * I});
  } else {
    jobs.push_back({x, n, ldx, m.gate, gu, 2 * I});
    jobs.push_back({x, n, ldx, m.up, gu + I, 2 * I});
  }
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The k largest of v, descending by value, ties to the lower index (as a stable sort of -value).
// A NaN counts as -inf (an order, where comparisons with NaN would give none).
void top(const std::vector<float>& v, int64_t k, std::vector<int64_t>& order) {
  auto val = [&](int64_t i) { return std::isnan(v[size_t(i)]) ? kNegInf : v[size_t(i)]; };
  order.resize(v.size());
  std::iota(order.begin(), order.end(), 0);
  const auto mid = order.begin() + std::min<int64_t>(k, int64_t(order.size()));
  std::partial_sort(order.begin(), mid, order.end(),
                    [&](int64_t a, int64_t b) { return val(a) > val(b) || (val(a) == val(b) && a < b); });
  order.erase(mid, order.end());
}

}  // namespace

void route_tokens(const cpu::Context& ctx, const RouterConfig& rc, const float* logits, int64_t T, const float* bias, ExpertChoice* out) {
  const int64_t E = rc.n_experts, K = rc.top_k, G = rc.n_group;
  cpu::parallel_region(ctx, T >= 16, [&] {
    // Each thread's working lists, kept between calls.
    thread_local std::vector<float> scores, choice, group_score, members;
    thread_local std::vector<int64_t> idx, keep;
    thread_local std::vector<char> kept;
    scores.resize(size_t(E));
    choice.resize(size_t(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* lg = logits + t * E;
      if (rc.scoring == ScoringFunc::Sigmoid) {
        for (int64_t e = 0; e < E; ++e) scores[size_t(e)] = 1.0f / (1.0f + std::exp(-lg[e]));
      } else {
        float m = *std::max_element(lg, lg + E);
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += (scores[size_t(e)] = std::exp(lg[e] - m));
        for (int64_t e = 0; e < E; ++e) scores[size_t(e)] = float(scores[size_t(e)] / s);
      }
      // The bias steers the choice only; the weights come from the unbiased scores.
      for (int64_t e = 0; e < E; ++e) choice[size_t(e)] = scores[size_t(e)] + (bias ? bias[e] : 0.0f);
      if (rc.method != TopkMethod::Greedy && G > 1) {
        const int64_t per = E / G;
        group_score.resize(size_t(G));
        for (int64_t g = 0; g < G; ++g) {
          members.assign(choice.begin() + g * per, choice.begin() + (g + 1) * per);
          std::sort(members.begin(), members.end(), std::greater<float>());
          group_score[size_t(g)] =
              rc.method == TopkMethod::NoauxTc ? members[0] + (per > 1 ? members[1] : 0.0f) : members[0];
        }
        top(group_score, rc.topk_group, keep);
        kept.assign(size_t(G), 0);
        for (auto g : keep) kept[size_t(g)] = 1;
        for (int64_t e = 0; e < E; ++e)
          if (!kept[size_t(e / per)]) choice[size_t(e)] = kNegInf;  // DeepSeek's fill for the other groups
      }
      top(choice, K, idx);
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += scores[size_t(idx[size_t(k)])];
      const bool normalise = rc.norm_topk_prob && (rc.scoring == ScoringFunc::Sigmoid || K > 1);
      ExpertChoice* mine = out + t * K;
      for (int64_t k = 0; k < K; ++k) {
        const double w = normalise ? scores[size_t(idx[size_t(k)])] / (sum + 1e-20) : scores[size_t(idx[size_t(k)])];
        mine[k] = {idx[size_t(k)], float(w * rc.routed_scaling_factor)};
      }
      // Each token's outputs are summed in expert order.
      std::sort(mine, mine + K, [](const ExpertChoice& a, const ExpertChoice& b) { return a.expert < b.expert; });
    }
  });
}

MoeLayer::MoeLayer(const ModelConfig& c, parallel::Comm* comm)
    : rc_(RouterConfig::of(c)),
      comm_(comm && comm->size() > 1 ? comm : nullptr),
      local_(comm_ ? parallel::expert_range(c.n_routed_experts, comm_->rank(), comm_->size()) : parallel::ExpertRange{}),
      hidden_(c.hidden_size),
      inter_(c.moe_intermediate_size) {}

void MoeLayer::route(const cpu::Context& ctx, const LayerWeights& W, const float* x, int64_t T) {
  const int64_t E = rc_.n_experts, K = rc_.top_k;
  logits_.resize(size_t(T * E));
  cpu::matmul(ctx, x, T, W.router, logits_.data());
  chosen_.resize(size_t(T * K));
  route_tokens(ctx, rc_, logits_.data(), T, W.router_bias.empty() ? nullptr : W.router_bias.data(), chosen_.data());
  // picks[t * K + k]: the k-th expert of token t (ascending) and the token's place among that
  // expert's tokens (in token order); tokens_in[e]: how many tokens chose expert e.
  tokens_in_.assign(size_t(E), 0);
  picks_.resize(size_t(T * K));
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = chosen_[size_t(i)].expert;
    picks_[size_t(i)] = {e, tokens_in_[size_t(e)]++};
  }
}

void MoeLayer::experts(const cpu::Context& ctx, const LayerWeights& W, const float* x, int64_t T, float* out, std::vector<float>& scratch) {
  const int64_t E = rc_.n_experts, K = rc_.top_k, D = hidden_;
  // Tokens grouped by expert: each selected expert's weights are read once for the batch. The
  // shared experts (every token, weight 1) and the routed ones run as two batches of products
  // (every gate/up, then every down), so a decode step forks the thread pool twice per layer.
  // Expert-parallel, this rank runs its own experts' rows only, and rank 0 the shared experts.
  const parallel::ExpertRange mine = local_;
  const bool shared = W.has_shared && (!comm_ || comm_->rank() == 0);
  const int64_t I = inter_, Is = shared ? W.shared.gate.rows : 0;
  auto &row0 = row0_, &active = active_;
  auto& jobs = jobs_;
  row0.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) row0[size_t(e + 1)] = row0[size_t(e)] + (mine.has(e) ? tokens_in_[size_t(e)] : 0);
  const int64_t R = row0[size_t(E)];
  const size_t need = size_t(R * (2 * D + 3 * I) + T * 3 * Is);
  if (scratch.size() < need) scratch.resize(need);
  float* const xe = scratch.data();  // every part below is written before it is read
  float* const gu = xe + R * D;
  float* const act = gu + R * 2 * I;
  float* const ye = act + R * I;
  float* const gus = ye + R * D;
  float* const acts = gus + T * 2 * Is;
  jobs.clear();
  active.clear();
  for (int64_t e = 0; e < E; ++e)
    if (mine.has(e) && tokens_in_[size_t(e)] > 0) active.push_back(e);
  const auto* picks = picks_.data();
  const int64_t* r0s = row0.data();
  cpu::parallel_for(ctx, T * K, R >= 64, [&](int64_t i) {
    const auto [e, j] = picks[i];
    if (mine.has(e)) std::copy(x + (i / K) * D, x + (i / K + 1) * D, xe + (r0s[e] + j) * D);
  });
  const int threads = ctx.num_threads();
  const bool expert_per_thread =
      schedule_ == ExpertSchedule::Auto
          ? threads > 1 && int64_t(active.size()) >= 4 * threads && R >= 8 * int64_t(active.size())
          : schedule_ == ExpertSchedule::ExpertPerThread;
  (expert_per_thread ? counters_.expert_per_thread : counters_.batched)++;
  if (expert_per_thread) {
    // The shared experts (every token) run split as usual, then each routed expert whole on one
    // thread.
    if (shared) {
      push_gate_up(jobs, W.shared, x, T, D, gus);
      cpu::matmul_batch(ctx, jobs);
      cpu::silu_mul(ctx, gus, T, Is, acts);
      cpu::matmul(ctx, acts, T, Is, W.shared.down, out, D);
    } else {
      std::fill(out, out + T * D, 0.0f);
    }
    const int64_t na = int64_t(active.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < na; ++i) {
      const int64_t e = active[size_t(i)], r0 = row0[size_t(e)], n = row0[size_t(e + 1)] - r0;
      thread_local std::vector<cpu::MatmulJob> mine;
      mine.clear();
      push_gate_up(mine, W.experts[size_t(e)], xe + r0 * D, n, D, gu + r0 * 2 * I);
      cpu::matmul_batch(ctx, mine);
      cpu::silu_mul(ctx, gu + r0 * 2 * I, n, I, act + r0 * I);
      cpu::matmul(ctx, act + r0 * I, n, I, W.experts[size_t(e)].down, ye + r0 * D, D);
    }
  } else {
    if (shared) push_gate_up(jobs, W.shared, x, T, D, gus);
    for (int64_t e : active) {
      const int64_t r0 = row0[size_t(e)], n = row0[size_t(e + 1)] - r0;
      push_gate_up(jobs, W.experts[size_t(e)], xe + r0 * D, n, D, gu + r0 * 2 * I);
    }
    cpu::matmul_batch(ctx, jobs);
    if (shared) cpu::silu_mul(ctx, gus, T, Is, acts);
    cpu::silu_mul(ctx, gu, R, I, act);
    jobs.clear();
    // The shared experts' output is the sum's first term: written straight into out.
    if (shared) jobs.push_back({acts, T, Is, W.shared.down, out, D});
    else std::fill(out, out + T * D, 0.0f);
    for (int64_t e : active) {
      const int64_t r0 = row0[size_t(e)], n = row0[size_t(e + 1)] - r0;
      jobs.push_back({act + r0 * I, n, I, W.experts[size_t(e)].down, ye + r0 * D, D});
    }
    cpu::matmul_batch(ctx, jobs);
  }
  const ExpertChoice* chosen = chosen_.data();
  cpu::parallel_for(ctx, T, T >= 16, [&](int64_t t) {
    for (int64_t k = 0; k < K; ++k) {
      const auto [e, j] = picks[t * K + k];
      if (!mine.has(e)) continue;
      const float w = chosen[t * K + k].weight;
      const float* y = ye + (r0s[e] + j) * D;
      for (int64_t d = 0; d < D; ++d) out[t * D + d] += w * y[d];
    }
  });
  if (comm_) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel::sum_in_rank_order(*comm_, out, T * D, gathered_);
    combine_.calls++;
    combine_.bytes_received += double(comm_->size() - 1) * double(T * D) * sizeof(float);
    combine_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

}  // namespace mla
