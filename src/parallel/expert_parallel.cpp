#include "parallel/expert_parallel.h"

#include <stdexcept>

namespace mla::parallel {

ExpertRange expert_range(int64_t n_experts, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) throw std::invalid_argument("expert_range: rank outside [0, size)");
  if (size == 1) return {};
  return {n_experts * rank / size, n_experts * (rank + 1) / size};
}

}  // namespace mla::parallel
