// What the engine tests submit: random prompts, greedy requests and a pool of a given geometry.
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace mla::test {

// n token ids in [2, 502), from the seed.
inline std::vector<int32_t> prompt_ids(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t(2 + rng() % 500));
  return ids;
}

inline Request greedy(std::vector<int32_t> prompt, int64_t max_new) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_new_tokens = max_new;
  return r;
}

// An engine over a pool of `pages` pages of page_size tokens, stored as dtype.
inline EngineOptions pool_of(int64_t pages, int64_t page_size, KvDType dtype = KvDType::F32) {
  EngineOptions o;
  o.kv_pages = pages;
  o.page_size = page_size;
  o.kv_dtype = dtype;
  return o;
}

}  // namespace mla::test
