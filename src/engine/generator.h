// The text generation loop of one sequence over mla::Model and a LatentPool: prefill the new
// prompt tokens in one forward pass (last logits only, the path policy's choice), then decode one
// token per pass on the cache, streaming text through the tokenizer's StreamDecoder and the stop
// strings to a callback. The cache outlives a call: the next call's prompt is matched against
// the tokens already cached and only the tokens after the common prefix are fed, so a chat turn
// costs only its new tokens.
//
// A generation ends on an EOS id, a stop string, the token limit, the model's context length or
// a full KV cache (reported as StopReason::KvCacheFull with the pool's message, not thrown).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation_config.h"
#include "engine/sampler.h"
#include "kv/latent_pool.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace mla {

struct GeneratorOptions {
  KvDType kv_dtype = KvDType::BF16;
  // Cache budget in bytes (all layers); 0: room for the model's context length, at most 1 GiB.
  double kv_cache_bytes = 0;
  int64_t page_size = 64;
  PathPolicy policy;
};

struct GenerateParams {
  SamplingParams sampling;
  int64_t max_new_tokens = 256;        // < 0: until another stop condition
  std::vector<int64_t> eos_token_ids;  // the ids that end the output (not emitted)
  std::vector<std::string> stop;       // stop strings (not emitted)
  bool skip_special_tokens = true;     // leave special tokens out of the text
};

enum class StopReason { Eos, StopString, MaxTokens, ContextLength, KvCacheFull };
const char* stop_reason_name(StopReason r);

struct GenerationResult {
  std::string text;              // what the callback received, concatenated
  std::vector<int32_t> tokens;   // sampled tokens, including an EOS or those past a stop string
  StopReason reason = StopReason::MaxTokens;
  std::string message;           // KvCacheFull: the pool's message
  int64_t prompt_tokens = 0;     // prompt tokens fed (after the reused cached prefix)
  int64_t reused_tokens = 0;     // prompt tokens found in the cache
  double prompt_seconds = 0;     // the prompt's forward pass
  // The first token comes from the prompt pass; each later one costs one forward pass of one
  // token. Generated tokens/s = those passes / the time from the end of the prompt pass to the
  // end (forward passes, sampling and detokenising together).
  int64_t decode_steps = 0;
  double decode_seconds = 0;
  double prompt_tokens_per_second() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  double generated_tokens_per_second() const { return decode_seconds > 0 ? decode_steps / decode_seconds : 0; }
};

class Generator {
 public:
  using TextCallback = std::function<void(std::string_view)>;

  // The model and tokenizer must outlive the generator.
  Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& opt = {});

  // Generates after `prompt`, the whole token sequence the model should see (including what is
  // already cached: only the part after the longest common prefix with tokens() is fed).
  GenerationResult generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                            const TextCallback& on_text = {});

  // The tokens whose latents are in the cache, in order.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  void clear();  // empties the cache
  const LatentPool& pool() const { return pool_; }
  int64_t kv_bytes_per_token() const { return pool_.bytes_per_token(); }
  int64_t capacity_tokens() const { return pool_.num_pages() * pool_.page_size(); }

 private:
  // Feeds ids after the cache; logits_ gets the last row. Throws KvCacheExhausted.
  void feed(std::span<const int32_t> ids);

  Model& model_;
  const Tokenizer& tokenizer_;
  GeneratorOptions opt_;
  LatentPool pool_;
  PageTable seq_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
};

}  // namespace mla
