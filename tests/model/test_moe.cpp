// The MoE unit (model/moe.h): routing as a pure function of the router logits, for each scoring
// and top-k method the configs use, checked on hand-worked cases; and the two expert schedules
// forced on a fixture, which must give the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "tools/run_modes.h"
#include "model/model.h"
#include "model/moe.h"
#include "test_util.h"

namespace mla {
namespace {

std::vector<ExpertChoice> route(const RouterConfig& rc, const std::vector<float>& logits,
                                const std::vector<float>& bias = {}, const cpu::Context& ctx = {}) {
  const int64_t T = int64_t(logits.size()) / rc.n_experts;
  std::vector<ExpertChoice> out(size_t(T * rc.top_k));
  route_tokens(ctx, rc, logits.data(), T, bias.empty() ? nullptr : bias.data(), out.data());
  return out;
}

std::vector<int64_t> experts_of(const std::vector<ExpertChoice>& c) {
  std::vector<int64_t> e;
  for (auto& x : c) e.push_back(x.expert);
  return e;
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// DeepSeek-V2-Lite: softmax scores, greedy top-k, weights the scores themselves.
TEST(MoeRouting, SoftmaxGreedy) {
  RouterConfig rc;
  rc.n_experts = 4;
  rc.top_k = 2;
  rc.scoring = ScoringFunc::Softmax;
  rc.method = TopkMethod::Greedy;
  const std::vector<float> logits = {1, 3, 2, 0};
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0);
  auto c = route(rc, logits);
  ASSERT_EQ(experts_of(c), (std::vector<int64_t>{1, 2}));  // ascending expert order
  EXPECT_NEAR(c[0].weight, std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(c[1].weight, std::exp(2.0) / z, 1e-6);
  // norm_topk_prob renormalises the chosen ones, routed_scaling_factor scales them.
  rc.norm_topk_prob = true;
  rc.routed_scaling_factor = 16;
  c = route(rc, logits);
  EXPECT_NEAR(c[0].weight, 16 * std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-5);
  EXPECT_NEAR(c[1].weight, 16 * std::exp(2.0) / (std::exp(3.0) + std::exp(2.0)), 1e-5);
  // Softmax with one expert is not renormalised (its score stays a probability over all).
  rc.top_k = 1;
  rc.routed_scaling_factor = 1;
  c = route(rc, logits);
  ASSERT_EQ(experts_of(c), (std::vector<int64_t>{1}));
  EXPECT_NEAR(c[0].weight, std::exp(3.0) / z, 1e-6);
}

// DeepSeek-V2: softmax, the groups ranked by their best score, topk_group of them kept.
TEST(MoeRouting, GroupLimitedGreedy) {
  RouterConfig rc;
  rc.n_experts = 6;
  rc.top_k = 2;
  rc.n_group = 3;
  rc.topk_group = 1;
  rc.scoring = ScoringFunc::Softmax;
  rc.method = TopkMethod::GroupLimitedGreedy;
  // Group maxima 5, 4.9, 1: only group 0 stays, so experts 0 and 1 though 2 and 3 score higher
  // than 1.
  auto c = route(rc, {5, 0, 4.9f, 4.8f, 1, 1});
  EXPECT_EQ(experts_of(c), (std::vector<int64_t>{0, 1}));
  rc.method = TopkMethod::Greedy;
  EXPECT_EQ(experts_of(route(rc, {5, 0, 4.9f, 4.8f, 1, 1})), (std::vector<int64_t>{0, 2}));
}

// DeepSeek-V3 / Kimi K2: sigmoid scores, the choice on score + bias, groups ranked by the sum of
// their two best biased scores; weights from the unbiased scores, normalised, scaled.
TEST(MoeRouting, SigmoidNoauxTcWithBias) {
  RouterConfig rc;
  rc.n_experts = 8;
  rc.top_k = 3;
  rc.n_group = 4;
  rc.topk_group = 2;
  rc.scoring = ScoringFunc::Sigmoid;
  rc.method = TopkMethod::NoauxTc;
  rc.norm_topk_prob = true;
  rc.routed_scaling_factor = 2.5;
  const std::vector<float> logits = {2, -1, 0.5f, 0.4f, -2, 3, 1, 1}, bias = {0, 0, 0, 0, 0, 0, -0.9f, 0.5f};
  // Biased scores 0.881 0.269 | 0.623 0.599 | 0.119 0.953 | -0.169 1.231: group sums 1.150,
  // 1.221, 1.072, 1.062 keep groups 1 and 0, whose best three are experts 0, 2, 3 (greedy over
  // all would take 0, 5, 7).
  auto c = route(rc, logits, bias);
  ASSERT_EQ(experts_of(c), (std::vector<int64_t>{0, 2, 3}));
  const double s0 = sigmoid(2), s2 = sigmoid(0.5), s3 = sigmoid(0.4), sum = s0 + s2 + s3;
  EXPECT_NEAR(c[0].weight, 2.5 * s0 / sum, 1e-5);
  EXPECT_NEAR(c[1].weight, 2.5 * s2 / sum, 1e-5);
  EXPECT_NEAR(c[2].weight, 2.5 * s3 / sum, 1e-5);
  rc.n_group = 1;  // no groups: the plain biased top-k
  EXPECT_EQ(experts_of(route(rc, logits, bias)), (std::vector<int64_t>{0, 5, 7}));
  // The bias steers the choice only: without it expert 5 (score 0.953) is chosen, not 7.
  EXPECT_EQ(experts_of(route(rc, logits)), (std::vector<int64_t>{0, 5, 6}));
}

TEST(MoeRouting, TiesGoToTheLowerExpertAndNanRanksLast) {
  RouterConfig rc;
  rc.n_experts = 3;
  rc.top_k = 1;
  rc.scoring = ScoringFunc::Sigmoid;
  rc.method = TopkMethod::Greedy;
  EXPECT_EQ(experts_of(route(rc, {1, 1, 0})), (std::vector<int64_t>{0}));
  EXPECT_EQ(experts_of(route(rc, {0, 1, 1})), (std::vector<int64_t>{1}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(experts_of(route(rc, {nan, -1, -3})), (std::vector<int64_t>{1}));
}

// Tokens route independently: a batch of 40 (split across the threads) gives each token the
// choice it gets alone.
TEST(MoeRouting, TokensAreIndependent) {
  RouterConfig rc;
  rc.n_experts = 16;
  rc.top_k = 4;
  rc.n_group = 4;
  rc.topk_group = 2;
  rc.scoring = ScoringFunc::Sigmoid;
  rc.method = TopkMethod::NoauxTc;
  rc.norm_topk_prob = true;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> logits(40 * 16), bias(16);
  for (auto& x : logits) x = nd(rng);
  for (auto& x : bias) x = 0.1f * nd(rng);
  cpu::Context two;
  two.threads = 2;
  auto all = route(rc, logits, bias, two);
  for (int64_t t = 0; t < 40; ++t) {
    auto one = route(rc, std::vector<float>(logits.begin() + t * 16, logits.begin() + (t + 1) * 16), bias);
    for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(all[size_t(t * 4 + k)], one[size_t(k)]) << "token " << t;
  }
}

// The schedules differ in where each expert's products run (one thread each, or split across the
// threads with the other experts'), not in what they compute: the same rows of the same
// products, so the logits agree to float32 summation-order noise (here: exactly or within 1e-5).
TEST(MoeSchedule, ExpertPerThreadAndBatchedGiveTheSameLogits) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  std::vector<int32_t> ids;
  for (int i = 0; i < 60; ++i) ids.push_back((i * 37 + 11) % 500);
  RunOptions opt;
  model->set_expert_schedule(ExpertSchedule::Batched);
  const auto batched = run_logits(*model, ids, opt);
  const MoeCounters before = model->moe_counters();
  EXPECT_GT(before.batched, 0);
  EXPECT_EQ(before.expert_per_thread, 0);
  model->set_expert_schedule(ExpertSchedule::ExpertPerThread);
  const auto per_thread = run_logits(*model, ids, opt);
  EXPECT_GT(model->moe_counters().expert_per_thread, 0);
  EXPECT_EQ(model->moe_counters().batched, before.batched);
  EXPECT_LE(test::max_abs_diff(batched, per_thread), 1e-5f);
}

}  // namespace
}  // namespace mla
