// One request inside the engine: its tokens (prompt, then output), its pages, and the state
// its sampling and text need. The scheduler reads the tokens and the page table; the engine
// owns the object and its sampler and output stream.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "engine/output_stream.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "kv/latent_pool.h"

namespace mla {

struct Sequence {
  int64_t id = 0;
  Request req;
  std::function<void(const RequestEvent&)> on_event;
  std::vector<int32_t> tokens;  // prompt, then the output so far
  int64_t prompt_len = 0;
  int64_t generated = 0;
  int64_t cached_tokens = 0;   // prompt tokens shared from the prefix cache at first admission
  bool admitted_once = false;
  bool prompt_cached = false;  // the read prompt went into the prefix cache
  bool done = false;
  PageTable table;             // tokens[0, table.length) have latents in the pool
  std::optional<Sampler> sampler;
  OutputStream output;
  // The last sampled token's log-probability and top entries (Request::logprobs >= 0).
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // Speculative decoding (engine/speculative.h): draft tokens after `tokens` that the next pass
  // verifies, and the distribution each was drawn from (empty: deterministic drafts).
  std::vector<int32_t> draft;
  std::vector<std::vector<float>> draft_probs;

  // Tokens still to run through the model.
  int64_t pending() const { return int64_t(tokens.size()) - table.length; }
};

}  // namespace mla
