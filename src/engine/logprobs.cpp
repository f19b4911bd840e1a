// Log-softmax of a logits row and its top entries (see logprobs.h).
#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mla {

RowLogprobs row_logprobs(std::span<const float> logits) {
  RowLogprobs r;
  r.max = -INFINITY;
  for (float x : logits)
    if (x > r.max) r.max = x;
  if (!std::isfinite(r.max)) throw std::invalid_argument("logprobs: the logits row has no finite entry");
  double sum = 0;
  for (float x : logits)
    if (x > -INFINITY) sum += std::exp(double(x) - double(r.max));
  r.log_sum = std::log(sum);
  return r;
}

std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, const RowLogprobs& row, int k) {
  std::vector<std::pair<int32_t, float>> out;
  if (k <= 0) return out;
  auto better = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  // A bounded heap of the best k logits seen so far (its front is the worst of them).
  std::vector<std::pair<int32_t, float>> heap;
  heap.reserve(size_t(k) + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (!(x > -INFINITY)) continue;
    std::pair<int32_t, float> c{int32_t(i), x};
    if (int(heap.size()) < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  out.reserve(heap.size());
  for (auto& [id, x] : heap) out.push_back({id, row.of(x)});
  return out;
}

}  // namespace mla
