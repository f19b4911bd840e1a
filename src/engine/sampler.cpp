// Sampler: penalties, temperature, top-k, top-p, min-p and a seeded draw (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace mla {

void SamplingParams::validate() const {
  auto bad = [](const std::string& what) { throw std::invalid_argument("sampling: " + what); };
  if (!std::isfinite(temperature)) bad("temperature must be a finite number");
  if (top_k < 0) bad("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p must be in [0, 1], got " + std::to_string(min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    bad("repetition_penalty must be positive (1 = off), got " + std::to_string(repetition_penalty));
  if (!std::isfinite(presence_penalty)) bad("presence_penalty must be a finite number");
  if (!std::isfinite(frequency_penalty)) bad("frequency_penalty must be a finite number");
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  params_.validate();
  reset();
}

void Sampler::reset() {
  rng_.seed(params_.seed);
  in_prompt_.clear();
  out_count_.clear();
  seen_.clear();
}

void Sampler::add_prompt_tokens(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id < 0) throw std::invalid_argument("sampler: negative token id " + std::to_string(id));
    if (size_t(id) >= in_prompt_.size()) {
      in_prompt_.resize(size_t(id) + 1, 0);
      out_count_.resize(size_t(id) + 1, 0);
    }
    if (!in_prompt_[size_t(id)] && !out_count_[size_t(id)]) seen_.push_back(id);
    in_prompt_[size_t(id)] = 1;
  }
}

void Sampler::add_output_token(int32_t id) {
  if (id < 0) throw std::invalid_argument("sampler: negative token id " + std::to_string(id));
  if (size_t(id) >= out_count_.size()) {
    in_prompt_.resize(size_t(id) + 1, 0);
    out_count_.resize(size_t(id) + 1, 0);
  }
  if (!in_prompt_[size_t(id)] && !out_count_[size_t(id)]) seen_.push_back(id);
  ++out_count_[size_t(id)];
}

std::vector<float> Sampler::penalized(std::span<const float> logits) const {
  std::vector<float> z(logits.begin(), logits.end());
  const float r = params_.repetition_penalty;
  for (int32_t id : seen_) {
    if (size_t(id) >= z.size()) continue;
    float& v = z[size_t(id)];
    if (r != 1.0f) v = v > 0 ? v / r : v * r;
    int32_t n = out_count_[size_t(id)];
    if (n > 0) v -= params_.presence_penalty + params_.frequency_penalty * float(n);
  }
  return z;
}

namespace {

// Higher logit first; equal logits: lower id first.
bool before(const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
  return a.second > b.second || (a.second == b.second && a.first < b.first);
}

int32_t argmax(const std::vector<float>& z) {
  int32_t best = -1;
  for (size_t i = 0; i < z.size(); ++i)
    if (!std::isnan(z[i]) && (best < 0 || z[i] > z[size_t(best)])) best = int32_t(i);
  return best;
}

}  // namespace

std::vector<std::pair<int32_t, float>> Sampler::candidates(std::span<const float> logits) const {
  if (logits.empty()) throw std::invalid_argument("sampler: empty logits");
  std::vector<float> z = penalized(logits);
  int32_t best = argmax(z);
  if (best < 0 || !std::isfinite(z[size_t(best)]))
    throw std::runtime_error("sampler: the logits hold no finite maximum (NaN or infinite values)");
  if (params_.greedy()) return {{best, 1.0f}};

  // (id, logit / temperature) of every token with a finite logit.
  std::vector<std::pair<int32_t, float>> c;
  c.reserve(z.size());
  const float inv_t = 1.0f / params_.temperature;
  for (size_t i = 0; i < z.size(); ++i)
    if (std::isfinite(z[i])) c.emplace_back(int32_t(i), z[i] * inv_t);

  bool sorted = false;
  if (params_.top_k > 0 && size_t(params_.top_k) < c.size()) {
    std::partial_sort(c.begin(), c.begin() + params_.top_k, c.end(), before);
    c.resize(size_t(params_.top_k));
    sorted = true;
  }
  // Softmax over the kept set (the same probabilities as over the vocabulary, renormalised).
  float zmax = -std::numeric_limits<float>::infinity();
  for (auto& [id, v] : c) zmax = std::max(zmax, v);
  double sum = 0;
  for (auto& [id, v] : c) {
    v = std::exp(v - zmax);
    sum += v;
  }
  for (auto& [id, v] : c) v = float(v / sum);

  if (params_.top_p < 1.0f) {
    if (!sorted && c.size() > 1024) {
      // Sorting a whole vocabulary (129k for DeepSeek-V3) per token is slow. Bucket tokens by
      // the power of two of pmax / p: the nucleus lies within the first buckets whose mass
      // reaches top_p (every token outside them is less likely than every token inside).
      float pmax = 0;
      for (auto& [id, p] : c) pmax = std::max(pmax, p);
      constexpr int kBuckets = 64;
      auto bucket = [&](float p) { return p > 0 ? std::min(kBuckets - 1, -std::ilogb(p / pmax)) : kBuckets - 1; };
      double mass[kBuckets] = {};
      for (auto& [id, p] : c) mass[bucket(p)] += p;
      int last = 0;
      // A little past top_p, so rounding in the exact pass below cannot need a dropped token.
      for (double acc = mass[0]; acc < double(params_.top_p) + 1e-5 && last < kBuckets - 1;) acc += mass[++last];
      std::erase_if(c, [&](const std::pair<int32_t, float>& e) { return bucket(e.second) > last; });
    }
    if (!sorted) std::sort(c.begin(), c.end(), before);
    sorted = true;
    // Keep token i while the mass before it is below top_p.
    double mass = 0;
    size_t keep = 0;
    while (keep < c.size() && mass < double(params_.top_p)) mass += c[keep++].second;
    c.resize(std::max<size_t>(keep, 1));
  }
  if (params_.min_p > 0.0f) {
    float pmax = 0;
    for (auto& [id, p] : c) pmax = std::max(pmax, p);
    const float threshold = params_.min_p * pmax;
    std::erase_if(c, [&](const std::pair<int32_t, float>& e) { return e.second < threshold; });
  }
  sum = 0;
  for (auto& [id, p] : c) sum += p;
  for (auto& [id, p] : c) p = float(p / sum);
  return c;
}

std::vector<float> Sampler::probabilities(std::span<const float> logits) const {
  std::vector<float> p(logits.size(), 0.0f);
  for (auto& [id, q] : candidates(logits)) p[size_t(id)] = q;
  return p;
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<const float> logits) {
  auto c = candidates(logits);
  if (c.size() == 1) return c[0].first;
  double u = uniform(), acc = 0;
  for (auto& [id, p] : c) {
    acc += p;
    if (u < acc) return id;
  }
  return c.back().first;  // u within rounding of 1
}

int32_t Sampler::sample_from(std::span<const float> probs) {
  if (probs.empty()) throw std::invalid_argument("sampler: empty distribution");
  double u = uniform(), acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0)) continue;
    acc += probs[i];
    last = int32_t(i);
    if (u < acc) return last;
  }
  if (last < 0) throw std::runtime_error("sampler: the distribution has no mass");
  return last;  // u within rounding of the total
}

}  // namespace mla
