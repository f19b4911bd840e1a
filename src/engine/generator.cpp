// Generator: prefill, decode loop, stop conditions and timing (see generator.h).
#include "engine/generator.h"

#include <algorithm>
#include <stdexcept>

namespace mla {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::StopString: return "stop string";
    case StopReason::MaxTokens: return "max tokens";
    case StopReason::ContextLength: return "context length";
    case StopReason::KvCacheFull: return "kv cache full";
  }
  return "?";
}

namespace {

LatentPool make_generator_pool(const Model& model, const GeneratorOptions& opt) {
  const ModelConfig& c = model.config();
  if (opt.page_size <= 0) throw std::invalid_argument("generator: page size must be positive");
  if (opt.kv_cache_bytes < 0) throw std::invalid_argument("generator: negative KV cache budget");
  int64_t pages;
  if (opt.kv_cache_bytes > 0) {
    pages = LatentPool::pages_for_budget(opt.kv_cache_bytes, c.num_hidden_layers, c.kv_lora_rank, c.qk_rope_head_dim,
                                         opt.page_size, opt.kv_dtype);
  } else {
    const int64_t context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
    const int64_t cap = LatentPool::pages_for_budget(double(1ull << 30), c.num_hidden_layers, c.kv_lora_rank,
                                                     c.qk_rope_head_dim, opt.page_size, opt.kv_dtype);
    pages = std::min((context + opt.page_size - 1) / opt.page_size, std::max<int64_t>(cap, 1));
  }
  return model.make_pool(pages, opt.page_size, opt.kv_dtype);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

Generator::Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& opt)
    : model_(model), tokenizer_(tokenizer), opt_(opt), pool_(make_generator_pool(model, opt)) {}

void Generator::clear() {
  pool_.release(seq_);
  tokens_.clear();
  logits_.clear();
}

void Generator::feed(std::span<const int32_t> ids) {
  ForwardOptions fo;
  fo.path = AttnPath::Auto;
  fo.policy = opt_.policy;
  fo.last_logits_only = true;
  SeqSlice s{&seq_, ids};
  model_.forward(std::span<SeqSlice>(&s, 1), pool_, fo, logits_);  // throws before writing anything
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                                     const TextCallback& on_text) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt (no tokens to condition on)");
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab)
      throw std::invalid_argument("generate: prompt token " + std::to_string(id) + " is outside the vocabulary of " +
                                  std::to_string(vocab));
  Sampler sampler(params.sampling);  // validates before any work
  GenerationResult r;
  const int64_t context = model_.config().max_position_embeddings;
  if (context > 0 && int64_t(prompt.size()) > context) {
    r.reason = StopReason::ContextLength;
    r.message = "the prompt's " + std::to_string(prompt.size()) + " tokens exceed the model's context of " +
                std::to_string(context);
    return r;
  }

  // Reuse the cached common prefix; at least one token is fed so that there are logits.
  size_t common = 0;
  while (common < tokens_.size() && common < prompt.size() && tokens_[common] == prompt[common]) ++common;
  common = std::min(common, prompt.size() - 1);
  pool_.truncate(seq_, int64_t(common));
  tokens_.resize(common);
  r.reused_tokens = int64_t(common);
  std::span<const int32_t> fresh(prompt.data() + common, prompt.size() - common);
  r.prompt_tokens = int64_t(fresh.size());

  auto t0 = Clock::now();
  try {
    feed(fresh);
  } catch (const KvCacheExhausted& e) {
    r.reason = StopReason::KvCacheFull;
    r.message = std::string(e.what()) + " (the prompt needs " + std::to_string(prompt.size()) +
                " tokens; the cache holds " + std::to_string(capacity_tokens()) + ")";
    return r;
  }
  r.prompt_seconds = seconds_since(t0);

  auto t1 = Clock::now();
  sampler.add_prompt_tokens(prompt);
  StreamDecoder decoder(tokenizer_, params.skip_special_tokens);
  StopStrings stops(params.stop);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    if (on_text) on_text(s);
  };
  auto is_eos = [&](int32_t id) {
    return std::find(params.eos_token_ids.begin(), params.eos_token_ids.end(), int64_t(id)) !=
           params.eos_token_ids.end();
  };
  const auto limit = params.max_new_tokens;
  while (true) {
    if (limit >= 0 && int64_t(r.tokens.size()) >= limit) {
      r.reason = StopReason::MaxTokens;
      break;
    }
    int32_t id = sampler.sample(std::span<const float>(logits_.data(), size_t(vocab)));
    sampler.add_output_token(id);
    r.tokens.push_back(id);
    if (is_eos(id)) {
      r.reason = StopReason::Eos;
      break;
    }
    emit(stops.push(decoder.push(id)));
    if (stops.stopped()) {
      r.reason = StopReason::StopString;
      break;
    }
    if (limit >= 0 && int64_t(r.tokens.size()) >= limit) {
      r.reason = StopReason::MaxTokens;
      break;
    }
    // The next pass puts `id` at position tokens_.size().
    if (context > 0 && int64_t(tokens_.size()) + 1 > context) {
      r.reason = StopReason::ContextLength;
      r.message = "reached the model's context of " + std::to_string(context) + " tokens";
      break;
    }
    try {
      feed(std::span<const int32_t>(&id, 1));
    } catch (const KvCacheExhausted& e) {
      r.reason = StopReason::KvCacheFull;
      r.message = std::string(e.what()) + " (the cache holds " + std::to_string(capacity_tokens()) + " tokens)";
      break;
    }
    ++r.decode_steps;
  }
  if (!stops.stopped()) {
    emit(stops.push(decoder.flush()));
    if (!stops.stopped()) emit(stops.flush());
  }
  r.decode_seconds = seconds_since(t1);
  return r;
}

}  // namespace mla
