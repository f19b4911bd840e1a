// Sampler tests: greedy is the argmax, temperature toward 0 becomes greedy, top-k / top-p / min-p
// never draw outside their sets (many draws over constructed distributions) and draw inside them
// at the expected rates, a seed reproduces a run, and the penalties change logits as defined.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "engine/sampler.h"

namespace {

using mla::Sampler;
using mla::SamplingParams;

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> z;
  for (double v : p) z.push_back(float(std::log(v)));
  return z;
}

std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> z(n);
  for (auto& v : z) v = d(g);
  return z;
}

size_t argmax(const std::vector<float>& z) { return size_t(std::max_element(z.begin(), z.end()) - z.begin()); }

// Draws n tokens and counts them.
std::vector<int> draw_counts(Sampler& s, const std::vector<float>& z, int n) {
  std::vector<int> counts(z.size(), 0);
  for (int i = 0; i < n; ++i) {
    int32_t id = s.sample(z);
    EXPECT_GE(id, 0);
    EXPECT_LT(size_t(id), z.size());
    ++counts[size_t(id)];
  }
  return counts;
}

// Empirical rates within 5 standard deviations of the expected probabilities.
void expect_rates(const std::vector<int>& counts, const std::vector<double>& expected, int n) {
  for (size_t i = 0; i < counts.size(); ++i) {
    double p = expected[i], sd = std::sqrt(std::max(p * (1 - p), 1e-12) / n);
    EXPECT_NEAR(double(counts[i]) / n, p, 5 * sd + 1e-9) << "token " << i;
  }
}

TEST(Sampler, GreedyIsArgmax) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    auto z = random_logits(1000, seed);
    SamplingParams p;
    p.temperature = 0;
    Sampler s(p);
    EXPECT_EQ(size_t(s.sample(z)), argmax(z));
    auto probs = s.probabilities(z);
    EXPECT_EQ(probs[argmax(z)], 1.0f);
    EXPECT_EQ(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0);
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  std::vector<float> z = {0.f, 3.f, 1.f, 3.f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Sampler(p).sample(z), 1);
}

TEST(Sampler, TemperatureTowardZeroIsGreedy) {
  auto z = random_logits(200, 7);
  size_t best = argmax(z);
  double prev = 0;
  for (float t : {2.0f, 1.0f, 0.5f, 0.2f, 0.05f, 0.01f}) {
    SamplingParams p;
    p.temperature = t;
    double pb = Sampler(p).probabilities(z)[best];
    EXPECT_GT(pb, prev) << "temperature " << t;  // the argmax gains mass as t falls
    prev = pb;
  }
  // The gap to the runner-up over 0.001 is enormous: every draw is the argmax.
  auto sorted = z;
  std::sort(sorted.rbegin(), sorted.rend());
  ASSERT_GT(sorted[0] - sorted[1], 0.01f);  // the construction has a clear argmax
  SamplingParams p;
  p.temperature = 0.001f;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(size_t(s.sample(z)), best);
}

TEST(Sampler, TemperatureOneDrawsSoftmax) {
  std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  SamplingParams p;
  p.seed = 11;
  Sampler s(p);
  const int n = 20000;
  auto counts = draw_counts(s, log_probs(probs), n);
  expect_rates(counts, probs, n);
}

TEST(Sampler, TopKStaysInSet) {
  auto z = random_logits(300, 5, 1.0f);
  for (int64_t k : {1, 3, 10}) {
    SamplingParams p;
    p.top_k = k;
    p.seed = uint64_t(k);
    Sampler s(p);
    std::vector<size_t> order(z.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
    std::set<size_t> allowed(order.begin(), order.begin() + k);
    const int n = 5000;
    auto counts = draw_counts(s, z, n);
    std::set<size_t> drawn;
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i]) drawn.insert(i);
      if (!allowed.count(i)) {
        EXPECT_EQ(counts[i], 0) << "top_k " << k << " drew token " << i;
      }
    }
    EXPECT_EQ(drawn, allowed) << "every token of the top-k set is drawn";
    // Rates: softmax renormalised over the set.
    double sum = 0;
    for (size_t i : allowed) sum += std::exp(double(z[i]));
    std::vector<double> expected(z.size(), 0.0);
    for (size_t i : allowed) expected[i] = std::exp(double(z[i])) / sum;
    expect_rates(counts, expected, n);
  }
}

TEST(Sampler, TopPStaysInNucleus) {
  // Sorted probabilities 0.4, 0.3, 0.2, 0.05, 0.05, shuffled over ids. At 0.92 the mass before
  // the fifth token is 0.95, so one of the two 0.05 tokens goes: the tie keeps the lower id, 0.
  std::vector<double> probs = {0.05, 0.3, 0.05, 0.4, 0.2};
  auto z = log_probs(probs);
  struct Case {
    float top_p;
    std::set<size_t> nucleus;
  };
  for (const Case& c : {Case{0.35f, {3}}, Case{0.65f, {3, 1}}, Case{0.75f, {3, 1, 4}}, Case{0.92f, {3, 1, 4, 0}},
                         Case{0.99f, {3, 1, 4, 0, 2}}}) {
    SamplingParams p;
    p.top_p = c.top_p;
    p.seed = 99;
    Sampler s(p);
    const int n = 8000;
    auto counts = draw_counts(s, z, n);
    double mass = 0;
    for (size_t i : c.nucleus) mass += probs[i];
    std::vector<double> expected(probs.size(), 0.0);
    for (size_t i : c.nucleus) expected[i] = probs[i] / mass;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (!c.nucleus.count(i)) {
        EXPECT_EQ(counts[i], 0) << "top_p " << c.top_p << " drew token " << i;
      }
    }
    expect_rates(counts, expected, n);
    auto pr = s.probabilities(z);
    for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(pr[i], expected[i], 1e-6);
  }
}

TEST(Sampler, TopPOnALargeVocabularyEqualsTheSortedDefinition) {
  // Vocabularies over 1024 take a bucketed shortcut; the kept set must be the same.
  for (uint64_t seed : {1, 2, 3}) {
    for (float scale : {0.5f, 2.0f, 6.0f}) {
      auto z = random_logits(20000, seed, scale);
      for (float top_p : {0.1f, 0.5f, 0.9f, 0.99f}) {
        SamplingParams p;
        p.top_p = top_p;
        auto pr = Sampler(p).probabilities(z);
        // Reference: softmax, sort descending, keep while the mass before is below top_p.
        std::vector<size_t> order(z.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
        double sum = 0;
        for (float v : z) sum += std::exp(double(v - z[order[0]]));
        double mass = 0;
        size_t keep = 0;
        while (keep < order.size() && mass < top_p) mass += std::exp(double(z[order[keep++]] - z[order[0]])) / sum;
        size_t kept = size_t(std::count_if(pr.begin(), pr.end(), [](float v) { return v > 0; }));
        EXPECT_EQ(kept, keep) << "seed " << seed << " scale " << scale << " top_p " << top_p;
        for (size_t i = 0; i < keep; ++i) EXPECT_GT(pr[order[i]], 0.0f);
      }
    }
  }
}

TEST(Sampler, MinPKeepsTokensNearTheTop) {
  std::vector<double> probs = {0.06, 0.5, 0.1, 0.3, 0.04};
  auto z = log_probs(probs);
  SamplingParams p;
  p.min_p = 0.15f;  // threshold 0.075: keeps 0.5, 0.3, 0.1
  p.seed = 4;
  Sampler s(p);
  const int n = 8000;
  auto counts = draw_counts(s, z, n);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[4], 0);
  std::vector<double> expected = {0, 0.5 / 0.9, 0.1 / 0.9, 0.3 / 0.9, 0};
  expect_rates(counts, expected, n);
}

TEST(Sampler, FiltersCompose) {
  // Over a large random vocabulary: every draw lies in top-k ∩ nucleus ∩ min-p set.
  auto z = random_logits(4000, 21, 2.0f);
  SamplingParams p;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.temperature = 0.8f;
  p.seed = 5;
  Sampler s(p);
  auto pr = s.probabilities(z);
  std::vector<size_t> order(z.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  std::set<size_t> topk(order.begin(), order.begin() + 50);
  size_t kept = 0;
  for (size_t i = 0; i < pr.size(); ++i)
    if (pr[i] > 0) {
      ++kept;
      EXPECT_TRUE(topk.count(i)) << i;
    }
  EXPECT_GT(kept, 0u);
  EXPECT_LE(kept, 50u);
  for (int i = 0; i < 3000; ++i) {
    int32_t id = s.sample(z);
    ASSERT_GT(pr[size_t(id)], 0.0f) << "drew token " << id << " outside the kept set";
  }
}

TEST(Sampler, SeedReproduces) {
  auto z = random_logits(100, 8, 0.5f);
  SamplingParams p;
  p.seed = 1234;
  Sampler a(p), b(p);
  std::vector<int32_t> ra, rb;
  for (int i = 0; i < 200; ++i) {
    ra.push_back(a.sample(z));
    rb.push_back(b.sample(z));
  }
  EXPECT_EQ(ra, rb);
  a.reset();
  std::vector<int32_t> again;
  for (int i = 0; i < 200; ++i) again.push_back(a.sample(z));
  EXPECT_EQ(ra, again) << "reset() reseeds";
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> rc;
  for (int i = 0; i < 200; ++i) rc.push_back(c.sample(z));
  EXPECT_NE(ra, rc) << "another seed, another run";
}

TEST(Sampler, RepetitionPenaltyScalesSeenLogits) {
  std::vector<float> z = {2.0f, -2.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<int32_t> prompt = {0, 1};
  s.add_prompt_tokens(prompt);
  s.add_output_token(2);
  auto y = s.penalized(z);
  EXPECT_FLOAT_EQ(y[0], 1.0f);   // positive: divided
  EXPECT_FLOAT_EQ(y[1], -4.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(y[2], 0.5f);   // output tokens count too
  EXPECT_FLOAT_EQ(y[3], 0.5f);   // unseen: unchanged
  // And the distribution moves off the repeated tokens.
  SamplingParams q;
  Sampler plain(q);
  EXPECT_LT(s.probabilities(z)[0], plain.probabilities(z)[0]);
  EXPECT_GT(s.probabilities(z)[3], plain.probabilities(z)[3]);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesReadTheOutputOnly) {
  std::vector<float> z = {1.0f, 1.0f, 1.0f, 1.0f};
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<int32_t> prompt = {3};
  s.add_prompt_tokens(prompt);
  s.add_output_token(1);
  s.add_output_token(2);
  s.add_output_token(2);
  s.add_output_token(2);
  auto y = s.penalized(z);
  EXPECT_FLOAT_EQ(y[0], 1.0f);
  EXPECT_FLOAT_EQ(y[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(y[2], 1.0f - 0.5f - 0.75f);
  EXPECT_FLOAT_EQ(y[3], 1.0f);  // prompt-only token: not penalised
  auto pr = s.probabilities(z);
  EXPECT_GT(pr[0], pr[1]);
  EXPECT_GT(pr[1], pr[2]);
  // A penalty can change the greedy choice.
  SamplingParams g = p;
  g.temperature = 0;
  Sampler gs(g);
  std::vector<float> z2 = {1.0f, 1.2f};
  EXPECT_EQ(gs.sample(z2), 1);
  gs.add_output_token(1);
  EXPECT_EQ(gs.sample(z2), 0);
}

TEST(Sampler, RejectsBadParameters) {
  auto make = [](auto edit) {
    SamplingParams p;
    edit(p);
    return Sampler(p);
  };
  EXPECT_THROW(make([](SamplingParams& p) { p.top_p = 0.0f; }), std::invalid_argument);
  EXPECT_THROW(make([](SamplingParams& p) { p.top_p = 1.5f; }), std::invalid_argument);
  EXPECT_THROW(make([](SamplingParams& p) { p.min_p = -0.1f; }), std::invalid_argument);
  EXPECT_THROW(make([](SamplingParams& p) { p.top_k = -1; }), std::invalid_argument);
  EXPECT_THROW(make([](SamplingParams& p) { p.repetition_penalty = 0.0f; }), std::invalid_argument);
  EXPECT_THROW(make([](SamplingParams& p) { p.temperature = NAN; }), std::invalid_argument);
  SamplingParams ok;
  Sampler s(ok);
  std::vector<float> nan_logits = {NAN, NAN};
  EXPECT_THROW(s.sample(nan_logits), std::runtime_error);
}

}  // namespace
