// What the engine is asked and what it answers, for every front end (run, chat, demo, serve):
//  - Request: prompt ids, sampling, the stop conditions (token limit, EOS ids, stop strings) and
//    how the text is decoded; an optional logits processor, called on the sequence's logits row
//    before sampling (where grammar masks, logit_bias and the like plug in).
//  - FinishReason: why a sequence ended. Front ends map it to their own names (OpenAI's
//    "stop"/"length" live in server/).
//  - RequestEvent: one per sequence per engine step that sampled a token or ended it: the token,
//    the text now safe to emit, and on the last event the reason and the token counts.
//  - RequestResult: the events of one request gathered (text, tokens, reason, timing).
//  - RequestError: a request that can never run (empty prompt, a token outside the vocabulary,
//    a bad sampling parameter, more tokens than the cache or the context hold).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"

namespace mla {

// Edits a sequence's logits row in place before sampling; `tokens` are the prompt and the
// output so far. May throw: the sequence then ends with FinishReason::Error, the others go on.
using LogitsProcessor = std::function<void(std::span<float> logits, std::span<const int32_t> tokens)>;

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 256;        // < 0: until another stop condition
  std::vector<int64_t> eos_token_ids;  // end the output (not emitted as text)
  std::vector<std::string> stop;       // stop strings (need a tokenizer; not emitted)
  bool skip_special_tokens = true;     // leave special tokens out of the text
  // Special tokens kept in the text even with skip_special_tokens (a tool-call or reasoning
  // parser's markers that are special tokens of the vocabulary, as Kimi's and GLM's are).
  std::vector<int32_t> keep_special_token_ids;
  LogitsProcessor logits_processor;    // optional
  // < 0: none. k >= 0: each sampled token's event carries its log-probability and the k most
  // likely tokens', from the log-softmax of the model's logits before the logits processor,
  // the penalties and the temperature (vLLM's raw logprobs); ids without a token excluded.
  int32_t logprobs = -1;
};

enum class FinishReason { Eos, StopString, MaxTokens, ContextLength, KvCacheFull, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

struct RequestError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Delivered on the engine's stepping thread at the end of the step that made it (after stats()
// counts it). A sampled token gives one event (token >= 0, text possibly empty); the last event
// has finished set (its token is -1 when the sequence ended without sampling, e.g. cancelled).
struct RequestEvent {
  int64_t request_id = 0;
  int32_t token = -1;
  std::string text;
  bool finished = false;
  FinishReason reason = FinishReason::MaxTokens;  // when finished
  std::string message;                             // Error / KvCacheFull / ContextLength: what happened
  std::string stop_string;                         // StopString: the stop string that matched
  int64_t prompt_tokens = 0;                       // the prompt's length
  int64_t cached_tokens = 0;                       // prompt tokens taken from the prefix cache
  int64_t completion_tokens = 0;                   // tokens sampled so far
  // With Request::logprobs >= 0 and token >= 0: the token's log-probability and the most
  // likely tokens (id, log-probability), most likely first.
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// A request's events gathered, timed from the result's construction (just before submit).
struct RequestResult {
  std::vector<int32_t> tokens;  // every sampled token (an EOS included)
  std::string text;
  FinishReason reason = FinishReason::MaxTokens;
  std::string message;
  bool finished = false;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  // prompt_seconds: construction to the first token (the prompt's forward passes and its
  // sampling); decode_seconds: the first token to the end. Each token after the first costs one
  // forward pass, so generated tokens/s = (tokens - 1) / decode_seconds.
  double prompt_seconds = 0, decode_seconds = 0;

  RequestResult() : start_(Clock::now()) {}
  void add(const RequestEvent& e);
  int64_t computed_prompt_tokens() const { return prompt_tokens - cached_tokens; }
  int64_t decode_steps() const { return tokens.empty() ? 0 : int64_t(tokens.size()) - 1; }
  double prompt_tokens_per_second() const {
    return prompt_seconds > 0 ? double(computed_prompt_tokens()) / prompt_seconds : 0;
  }
  double generated_tokens_per_second() const {
    return decode_seconds > 0 ? double(decode_steps()) / decode_seconds : 0;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_, first_{};
  bool have_first_ = false;
};

}  // namespace mla
