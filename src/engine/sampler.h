// Next-token sampling from a row of logits: penalties (repetition, presence, frequency), then
// temperature, top-k, top-p, min-p, then a draw from the remaining distribution with the
// sampler's own seeded RNG, so a seed reproduces a run exactly on any machine.
//
// Definitions (the order is HuggingFace's logits-processor order; the penalty windows are vLLM's):
//  - repetition_penalty r (CTRL paper, HF RepetitionPenaltyLogitsProcessor, vLLM): every token
//    that occurs in the prompt or the output so far has its logit divided by r if positive,
//    multiplied by r if negative. 1 = off.
//  - presence_penalty p and frequency_penalty f (OpenAI API, vLLM): over the *output* tokens only,
//    logit -= p * [count > 0] + f * count. 0 = off.
//  - temperature t: logits / t. t <= 0 means greedy: the argmax after the penalties (ties to
//    the lowest id); the filters and the RNG are then not used.
//  - top_k k: keep the k largest logits (ties at the edge broken by lower id). 0 = off.
//  - top_p p (nucleus, HF TopPLogitsWarper): sort descending, keep the smallest prefix whose
//    probability mass reaches p (always at least one token). 1 = off.
//  - min_p m (HF MinPLogitsWarper, vLLM): keep tokens whose probability is at least m times the
//    largest probability, computed after temperature, top-k and top-p. 0 = off.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace mla {

struct SamplingParams {
  float temperature = 1.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
  // Throws std::invalid_argument naming the parameter for a value outside its range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  // Forgets the prompt and output tokens and reseeds the RNG with params().seed.
  void reset();
  // The token history the penalties read: tokens of the context (prompt) and of the output.
  void add_prompt_tokens(std::span<const int32_t> ids);
  void add_output_token(int32_t id);

  // Picks the next token from logits[vocab] (does not record it: call add_output_token).
  int32_t sample(std::span<const float> logits);

  // The distribution sample() draws from: probabilities over the vocabulary, zero outside the
  // kept set, summing to 1 (greedy: one-hot at the argmax). For tests and inspection.
  std::vector<float> probabilities(std::span<const float> logits) const;

  // A draw from a distribution over the vocabulary (probabilities summing to 1) with the
  // sampler's RNG; and one uniform number in [0, 1) from it. Speculative decoding's rejection
  // sampling draws through these, so a seed still reproduces a run.
  int32_t sample_from(std::span<const float> probs);
  double draw() { return uniform(); }

  // The logits after the penalties (the first step of sample()).
  std::vector<float> penalized(std::span<const float> logits) const;

 private:
  // Kept candidates (id, probability), probabilities normalised over the kept set.
  std::vector<std::pair<int32_t, float>> candidates(std::span<const float> logits) const;
  double uniform();  // [0, 1) from 53 random bits

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> in_prompt_;  // per id: occurs in the prompt
  std::vector<int32_t> out_count_;  // per id: occurrences in the output
  std::vector<int32_t> seen_;       // ids with in_prompt_ or out_count_ set, each once
};

}  // namespace mla
