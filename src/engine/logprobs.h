// Log-probabilities of a logits row: log-softmax over the row (entries at -infinity have
// probability 0), the most likely k ids, and one id's value. The engine computes them from the
// model's logits before any logits processor, penalty or temperature (vLLM's "raw" logprobs).
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace mla {

struct RowLogprobs {
  float max = 0;        // the largest logit
  double log_sum = 0;   // log(sum(exp(logit - max)))
  float of(float logit) const { return float(double(logit) - double(max) - log_sum); }
};

// Throws std::invalid_argument for a row with no finite entry.
RowLogprobs row_logprobs(std::span<const float> logits);

// The k largest entries (id, log-probability), largest first, ties to the lower id; k is capped
// at the row's length and entries at -infinity are left out.
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, const RowLogprobs& row, int k);

}  // namespace mla
