// The mixture-of-experts layer of DeepSeek-V2/V3 (model.py's Gate and MoE): a router scores
// every routed expert for each token, the top k are chosen, and the token's output is the sum of
// the chosen experts' SiLU-gated MLPs weighted by their routing weights, plus the shared experts.
//
// Routing is a pure function (route_tokens) of the router logits, covering every method the
// configs use:
//   scoring  softmax (DeepSeek-V2) or sigmoid (V3, Kimi K2, GLM-4.7-Flash);
//   choice   greedy top-k; group_limited_greedy (the n_group groups ranked by their best score,
//            the topk_group best kept); noaux_tc (groups ranked by the sum of their two best
//            scores, the choice made on score + e_score_correction_bias);
//   weights  the unbiased scores of the chosen experts, normalised to sum 1 when norm_topk_prob
//            (softmax with k = 1 is already normalised), times routed_scaling_factor.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cpu/context.h"
#include "backend/cpu/ops.h"
#include "model/config.h"
#include "model/weights.h"
#include "parallel/comm.h"
#include "parallel/expert_parallel.h"

namespace mla {

struct RouterConfig {
  int64_t n_experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  ScoringFunc scoring = ScoringFunc::Softmax;
  TopkMethod method = TopkMethod::Greedy;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  static RouterConfig of(const ModelConfig& c);
};

struct ExpertChoice {
  int64_t expert;
  float weight;
  bool operator==(const ExpertChoice&) const = default;
};

// Each token's top_k choices from its router logits [T, n_experts]: out[t * top_k, (t+1) * top_k)
// in ascending expert order (the order its expert outputs are summed in). bias: the
// e_score_correction_bias (n_experts values) or null. Ties go to the lower expert index; a NaN
// score ranks as -inf. Tokens are independent (split across the threads for T >= 16).
void route_tokens(const cpu::Context& ctx, const RouterConfig& rc, const float* logits, int64_t T, const float* bias, ExpertChoice* out);

// How the routed experts' products run:
//  Batched: every selected expert's gate/up, then every down, each a batch of products split
//           across the threads (decode, small batches);
//  ExpertPerThread: each expert whole (gate/up, SiLU, down) on one thread, the experts handed out
//           to the threads (a prompt: a few dozen tokens per expert, too few to split well).
//  Auto picks ExpertPerThread with more than one thread, at least 4 active experts per thread and
//  at least 8 tokens per active expert on average; else Batched.
enum class ExpertSchedule { Auto, Batched, ExpertPerThread };

struct MoeCounters {
  int64_t batched = 0, expert_per_thread = 0;  // layer calls that ran each schedule
};

class MoeLayer {
 public:
  // comm: the ranks of an expert-parallel job (parallel/expert_parallel.h), null or one rank
  // for one process; this rank's routed experts are expert_range(n_routed_experts, rank, size).
  explicit MoeLayer(const ModelConfig& c, parallel::Comm* comm = nullptr);

  // Router logits and each token's choices for x [T, hidden] (the layer's normed input).
  void route(const cpu::Context& ctx, const LayerWeights& W, const float* x, int64_t T);
  const std::vector<ExpertChoice>& choices() const { return chosen_; }  // [T, top_k], from route
  // The experts of the last route: out [T, hidden] = shared(x) + sum of weight * expert(x).
  // scratch: activations, grown as needed and kept by the caller (the model shares it with the
  // dense MLP). Expert-parallel: this rank's experts only (and the shared experts on rank 0),
  // then the ranks' partial sums added in rank order, so every rank gets the whole out. Every
  // rank must call it for the same layers and tokens.
  void experts(const cpu::Context& ctx, const LayerWeights& W, const float* x, int64_t T, float* out, std::vector<float>& scratch);

  void set_schedule(ExpertSchedule s) { schedule_ = s; }
  const MoeCounters& counters() const { return counters_; }
  const parallel::CombineCounters& combine_counters() const { return combine_; }
  parallel::ExpertRange local_experts() const { return local_; }

 private:
  RouterConfig rc_;
  parallel::Comm* comm_ = nullptr;  // null: one process
  parallel::ExpertRange local_;
  parallel::CombineCounters combine_;
  std::vector<float> gathered_;  // the ranks' partial sums
  int64_t hidden_, inter_;
  ExpertSchedule schedule_ = ExpertSchedule::Auto;
  MoeCounters counters_;
  std::vector<float> logits_;
  std::vector<ExpertChoice> chosen_;
  std::vector<std::pair<int64_t, int64_t>> picks_;  // per choice: (expert, row among its tokens)
  std::vector<int64_t> tokens_in_, row0_, active_;
  std::vector<cpu::MatmulJob> jobs_;
};

// The products of gate and up of one MLP into gu [n, 2I] (a row's gate then its up): one job
// when up's rows follow gate's in memory, as a checkpoint stores them, else two.
void push_gate_up(std::vector<cpu::MatmulJob>& jobs, const Mlp& m, const float* x, int64_t n, int64_t ldx, float* gu);

}  // namespace mla
