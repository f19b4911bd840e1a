// Engine: requests in, one step = schedule, forward, per-sequence sampling, events (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include "engine/logprobs.h"

namespace mla {

int64_t kv_cache_pages(const ModelConfig& c, double budget_bytes, int64_t page_size, KvDType dtype,
                       int64_t sequences) {
  if (page_size <= 0) throw std::invalid_argument("the KV cache's page size must be positive");
  if (budget_bytes < 0) throw std::invalid_argument("the KV cache budget must not be negative");
  if (budget_bytes > 0) {
    const int64_t pages = LatentPool::pages_for_budget(budget_bytes, c.num_hidden_layers, c.kv_lora_rank,
                                                       c.qk_rope_head_dim, page_size, dtype, c.index_cache_dim());
    if (pages < 1)
      throw std::invalid_argument(
          "a budget of " + std::to_string(int64_t(budget_bytes)) + " bytes is too small for one page of the KV cache (" +
          std::to_string(latent_bytes_per_page(CacheShape::of(c), dtype, page_size)) +
          " bytes)");
    return pages;
  }
  const int64_t context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  const int64_t cap = LatentPool::pages_for_budget(double(1ull << 30), c.num_hidden_layers, c.kv_lora_rank,
                                                   c.qk_rope_head_dim, page_size, dtype, c.index_cache_dim());
  return std::min(pages_for_tokens(context, page_size) * std::max<int64_t>(sequences, 1), std::max<int64_t>(cap, 1));
}

namespace {

LatentPool make_pool(const Model& model, const EngineOptions& opt) {
  const int64_t pages =
      opt.kv_pages > 0 ? opt.kv_pages : kv_cache_pages(model.config(), 0, opt.page_size, opt.kv_dtype, opt.max_running);
  return model.make_pool(pages, opt.page_size, opt.kv_dtype);
}

// The options as the engine runs them: max_running as the scheduler limits it.
EngineOptions effective(EngineOptions opt) {
  if (opt.leader && opt.speculative.enabled)
    throw std::invalid_argument(
        "the other ranks replay the forward passes and the prompt cache's pages: speculative decoding, whose MTP "
        "module keeps a cache of its own, does not run under mpirun yet");
  if (opt.leader)
    opt.prefix_tiers.on_page_in = [leader = opt.leader](int32_t page, std::span<const uint8_t> bytes) {
      leader->page_in(page, bytes);
    };
  opt.max_running = SchedulerOptions{opt.max_batch_tokens, opt.max_running, opt.chunk_depth}.running_limit();
  return opt;
}

}  // namespace

Engine::Engine(Model& model, const Tokenizer* tokenizer, const EngineOptions& opt)
    : model_(model),
      tokenizer_(tokenizer),
      opt_(effective(opt)),
      pool_(make_pool(model, opt_)),
      cache_(opt_.prefix_cache ? std::make_unique<PrefixCache>(pool_, opt_.prefix_tiers) : nullptr),
      scheduler_(pool_, cache_.get(), SchedulerOptions{opt_.max_batch_tokens, opt_.max_running, opt_.chunk_depth}) {
  if (opt_.speculative.enabled) spec_ = std::make_unique<Speculation>(model_, opt_.speculative, opt_.draft_source, pool_);
  if (tokenizer_) {
    const int64_t vocab = model_.config().vocab_size, tokens = int64_t(tokenizer_->vocab_size());
    for (int64_t id = 0; id < vocab; ++id) {
      bool present = id < tokens;
      if (present) {
        try {
          tokenizer_->token_bytes(int32_t(id));
        } catch (const std::out_of_range&) {
          present = false;
        }
      }
      if (!present) no_token_ids_.push_back(int32_t(id));
    }
  }
  update_stats();
}

Engine::~Engine() { stop(); }

int64_t Engine::max_sequence_tokens() const {
  const int64_t cap = capacity_tokens(), context = model_.config().max_position_embeddings;
  return context > 0 ? std::min(cap, context) : cap;
}

int64_t Engine::submit(Request req, Callback on_event) {
  if (req.prompt.empty()) throw RequestError("the prompt is empty: there is no token to condition on");
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t id : req.prompt)
    if (id < 0 || id >= vocab)
      throw RequestError("prompt token " + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(vocab));
  try {
    req.sampling.validate();
  } catch (const std::invalid_argument& e) {
    throw RequestError(e.what());
  }
  if (!tokenizer_ && !req.stop.empty()) throw RequestError("stop strings need a tokenizer");
  const int64_t n = int64_t(req.prompt.size()), limit = max_sequence_tokens();
  if (n > limit) {
    const int64_t context = model_.config().max_position_embeddings;
    std::string what = context > 0 && context <= capacity_tokens()
                           ? "the model's context of " + std::to_string(context) + " tokens"
                           : "the KV cache's " + std::to_string(capacity_tokens()) + " tokens";
    throw RequestError("the prompt's " + std::to_string(n) + " tokens exceed " + what);
  }

  if (cache_) cache_->prefetch(req.prompt);
  auto s = std::make_unique<Sequence>();
  s->tokens = req.prompt;
  s->prompt_len = n;
  s->sampler.emplace(req.sampling);
  s->sampler->add_prompt_tokens(req.prompt);
  s->output = OutputStream(tokenizer_, req.skip_special_tokens, req.stop, req.keep_special_token_ids);
  s->req = std::move(req);
  s->on_event = std::move(on_event);
  int64_t id;
  {
    std::lock_guard lk(mu_);
    id = s->id = next_id_++;
    ++submitted_;
    incoming_.push_back(std::move(s));
  }
  cv_.notify_all();
  return id;
}

void Engine::cancel(int64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void Engine::cancel_all() {
  {
    std::lock_guard lk(mu_);
    cancel_all_ = true;
  }
  cv_.notify_all();
}

void Engine::drain_incoming() {
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<int64_t> cancels;
  bool all = false;
  {
    std::lock_guard lk(mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
    std::swap(all, cancel_all_);
  }
  for (auto& owned : incoming) {
    Sequence& s = *owned;
    sequences_[s.id] = std::move(owned);
    counters_.prompt_tokens += s.prompt_len;
    if (s.req.max_new_tokens == 0) {
      finish(s, FinishReason::MaxTokens);
      continue;
    }
    scheduler_.add(&s);
  }
  for (int64_t id : cancels)
    if (auto it = sequences_.find(id); it != sequences_.end() && !it->second->done)
      finish(*it->second, FinishReason::Cancelled);
  if (all)
    for (auto& [id, s] : sequences_)
      if (!s->done) finish(*s, FinishReason::Cancelled, "all requests were cancelled");
}

void Engine::emit(Sequence& s, RequestEvent e) {
  if (!s.on_event) return;
  e.request_id = s.id;
  e.prompt_tokens = s.prompt_len;
  e.cached_tokens = s.cached_tokens;
  e.completion_tokens = s.generated;
  if (s.req.logprobs >= 0 && e.token >= 0) e.logprob = s.logprob, e.top_logprobs = std::move(s.top_logprobs);
  events_.push_back({s.on_event, std::move(e)});
}

void Engine::finish(Sequence& s, FinishReason reason, std::string message, int32_t token, std::string text) {
  if (s.done) return;
  s.done = true;
  if (reason != FinishReason::Error) {
    try {
      text += s.output.finish();  // what the decoder and the stop strings still hold
    } catch (const std::exception& e) {
      reason = FinishReason::Error;
      message = std::string("detokenising the output failed: ") + e.what();
    }
  }
  ++counters_.requests_finished;
  if (reason == FinishReason::Cancelled) ++counters_.requests_cancelled;
  if (spec_) spec_->forget(s);
  scheduler_.remove(&s);  // its pages back (full ones to the prefix cache)
  RequestEvent e;
  e.token = token;
  e.text = std::move(text);
  e.finished = true;
  e.reason = reason;
  e.message = std::move(message);
  if (reason == FinishReason::StopString) e.stop_string = s.output.matched_stop();
  emit(s, std::move(e));
}

// ---- sampling: one sequence, its logits row ----

void Engine::process_row(Sequence& s, std::span<float> logits) {
  const auto mask_gap = [&] {
    for (int32_t id : no_token_ids_) logits[size_t(id)] = -std::numeric_limits<float>::infinity();
  };
  // Log-probabilities of the model's own distribution over its tokens, before the processor
  // (the raw row is kept when a processor may change it).
  row_lp_.reset();
  row_top_.clear();
  if (s.req.logprobs >= 0) {
    mask_gap();
    row_lp_ = row_logprobs(logits);
    row_top_ = top_logprobs(logits, *row_lp_, s.req.logprobs);
    if (s.req.logits_processor) raw_logits_.assign(logits.begin(), logits.end());
  }
  if (s.req.logits_processor) s.req.logits_processor(logits, s.tokens);
  mask_gap();  // after the processor too: whatever it did, no id without a token is sampled
}

void Engine::note_logprob(Sequence& s, std::span<const float> logits, int32_t id) {
  if (!row_lp_) return;
  s.logprob = row_lp_->of(s.req.logits_processor ? raw_logits_[size_t(id)] : logits[size_t(id)]);
  s.top_logprobs = std::move(row_top_);
}

void Engine::sample(Sequence& s, std::span<float> logits) {
  process_row(s, logits);
  const int32_t id = s.sampler->sample(logits);
  note_logprob(s, logits, id);
  take(s, id);
}

bool Engine::take(Sequence& s, int32_t id) {
  s.sampler->add_output_token(id);
  s.tokens.push_back(id);
  ++s.generated;
  ++counters_.generation_tokens;
  const auto& eos = s.req.eos_token_ids;
  if (std::find(eos.begin(), eos.end(), int64_t(id)) != eos.end()) {
    finish(s, FinishReason::Eos, {}, id);
    return false;
  }
  std::string text = s.output.push(id);
  if (s.output.stopped()) {
    finish(s, FinishReason::StopString, {}, id, std::move(text));
    return false;
  }
  if (s.req.max_new_tokens >= 0 && s.generated >= s.req.max_new_tokens) {
    finish(s, FinishReason::MaxTokens, {}, id, std::move(text));
    return false;
  }
  const int64_t context = model_.config().max_position_embeddings;
  if (context > 0 && int64_t(s.tokens.size()) > context) {  // the next pass would put id at position context
    finish(s, FinishReason::ContextLength, "reached the model's context of " + std::to_string(context) + " tokens",
           id, std::move(text));
    return false;
  }
  RequestEvent e;
  e.token = id;
  e.text = std::move(text);
  emit(s, std::move(e));
  return true;
}

// ---- the step: schedule, run, postprocess ----

bool Engine::step_inner() {
  drain_incoming();
  if (!broken_.empty()) return cancel_running(broken_);
  Batch batch = scheduler_.schedule();
  end_unscheduled(batch);
  if (!batch.parts.empty()) {
    shape(batch);
    if (run(batch)) postprocess(batch);
  }
  const bool ended = drop_finished();
  return ended || !batch.parts.empty() || !batch.out_of_pages.empty();
}

void Engine::end_unscheduled(Batch& batch) {
  // A preempted sequence recomputes from its start: its drafts and MTP cache go now.
  if (spec_)
    for (Sequence* s : batch.preempted) spec_->forget(*s);
  for (auto& [s, message] : batch.out_of_pages) finish(*s, FinishReason::KvCacheFull, std::move(message));
}

void Engine::shape(const Batch& batch) {
  slices_.clear();
  decode_rows_ = false;
  for (const BatchPart& p : batch.parts) {
    Sequence& s = *p.seq;
    decode_rows_ = decode_rows_ || s.pending() == 1;
    slices_.push_back({&s.table, std::span<const int32_t>(s.tokens.data() + s.table.length, size_t(p.n))});
  }
  pass_ = ForwardOptions{};
  pass_.path = opt_.path;
  pass_.policy = opt_.policy;
  pass_.last_logits_only = true;
  if (spec_) spec_->shape(batch, slices_, pass_);
}

bool Engine::run(const Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (opt_.leader) opt_.leader->forward(model_, slices_, pool_, pass_, logits_);
    else model_.forward(slices_, pool_, pass_, logits_);
  } catch (const JobFailed& e) {
    fail_job(e.what());
    return false;
  } catch (const std::exception& e) {
    // Nothing was written (pages were checked first); the batch's requests end with the error.
    for (const BatchPart& p : batch.parts) finish(*p.seq, FinishReason::Error, std::string("forward pass failed: ") + e.what());
    return false;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pass_seconds_ = seconds;
  ++counters_.steps;
  counters_.step_seconds += seconds;
  if (decode_rows_) counters_.decode_step_seconds_max = std::max(counters_.decode_step_seconds_max, seconds);
  return true;
}

void Engine::postprocess(Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  scheduler_.postprocess(batch);
  const size_t vocab = size_t(model_.config().vocab_size);
  const int64_t tokens_before = counters_.generation_tokens;
  for (size_t b = 0; b < batch.parts.size(); ++b) {
    Sequence& s = *batch.parts[b].seq;
    counters_.computed_tokens += batch.parts[b].n;
    if (s.done) continue;
    float* rows = logits_.data() + size_t(spec_ ? spec_->first_row(b) : int64_t(b)) * vocab;
    try {
      if (spec_) spec_->accept(s, b, rows, *this);
      else if (s.pending() == 0) sample(s, std::span<float>(rows, vocab));
      // else: a prefill chunk short of the end, no token yet
    } catch (const std::exception& e) {
      finish(s, FinishReason::Error, std::string("sampling failed: ") + e.what());
    }
  }
  if (spec_) {
    const double sampling = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spec_->end_pass(scheduler_.running(), int64_t(batch.parts.size()), counters_.generation_tokens - tokens_before,
                    pass_seconds_ + sampling);
  }
}

bool Engine::drop_finished() {
  return std::erase_if(sequences_, [](const auto& kv) { return kv.second->done; }) > 0;
}

bool Engine::cancel_running(const std::string& why) {
  bool any = false;
  for (auto& [id, s] : sequences_)
    if (!s->done) finish(*s, FinishReason::Cancelled, why), any = true;
  sequences_.clear();
  return any;
}

bool Engine::step() {
  bool worked = step_inner();
  publish();
  return worked;
}

void Engine::publish() {
  update_stats();  // first, so that whoever hears of a token sees it counted
  std::vector<std::pair<Callback, RequestEvent>> events;
  events.swap(events_);
  for (auto& [cb, e] : events) cb(e);
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::update_stats() {
  EngineStats st = counters_;
  if (spec_) {
    const SpecCounters& sc = spec_->counters();
    st.spec_steps = sc.steps;
    st.spec_draft_tokens = sc.draft_tokens;
    st.spec_accepted_tokens = sc.accepted_tokens;
    st.spec_emitted_tokens = sc.emitted_tokens;
    st.spec_draft_seconds = sc.draft_seconds;
    st.spec_passes_with_prefill = sc.passes_with_prefill;
  }
  st.running = scheduler_.num_running();
  st.waiting = scheduler_.num_waiting();
  st.preemptions = scheduler_.preemptions();
  st.prefix_hit_tokens = scheduler_.prefix_hit_tokens();
  st.kv_pages_total = pool_.num_pages();
  st.kv_pages_free = pool_.free_pages();
  st.kv_page_size = pool_.page_size();
  st.kv_bytes_per_token = pool_.bytes_per_token();
  st.prefix_cache_entries = cache_ ? cache_->entries() : 0;
  st.kv_pages_prefix_cache = cache_ ? cache_->pages_held_alone() : 0;
  if (cache_) st.prefix = cache_->stats();
  st.paths = model_.path_counters();
  std::lock_guard lk(mu_);
  st.requests_submitted = submitted_;
  st.waiting += int64_t(incoming_.size());
  snapshot_ = st;
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  EngineStats st = snapshot_;
  st.requests_submitted = submitted_;
  return st;
}

std::vector<int32_t> Engine::pages_of(int64_t id) const {
  for (const Sequence* s : scheduler_.running())
    if (s->id == id) return s->table.pages;
  return {};
}

void Engine::flush_prompt_cache() {
  if (cache_) cache_->wait_for_writes();
}

// ---- the engine thread ----

void Engine::engine_loop() {
  while (true) {
    {
      std::lock_guard lk(mu_);
      if (stop_) break;
    }
    bool worked = false;
    try {
      worked = step();
    } catch (const JobFailed& e) {
      // A page sent to the other ranks between passes (the prompt cache's) did not arrive.
      fail_job(e.what());
      publish();
      worked = true;
    } catch (const std::exception& e) {
      // A bug, not a bad request: end what is running rather than the process.
      for (auto& [id, s] : sequences_)
        if (!s->done) finish(*s, FinishReason::Error, std::string("engine step failed: ") + e.what());
      sequences_.clear();
      publish();
      worked = true;
    }
    if (!worked) {
      auto has_work = [&] { return stop_ || cancel_all_ || !incoming_.empty() || !cancels_.empty(); };
      PassLeader* leader = broken_.empty() ? opt_.leader.get() : nullptr;
      std::unique_lock lk(mu_);
      if (!leader || leader->idle_seconds() <= 0) {
        cv_.wait(lk, has_work);
      } else if (!cv_.wait_for(lk, std::chrono::duration<double>(leader->idle_seconds()), has_work)) {
        lk.unlock();
        try {
          leader->idle();
        } catch (const JobFailed& e) {
          fail_job(e.what());
        }
      }
    }
  }
  // Whatever is left is cancelled, so that nobody waits for it.
  drain_incoming();
  cancel_running("the engine is shutting down");
  publish();
}

void Engine::fail_job(const std::string& why) {
  if (!broken_.empty()) return;
  broken_ = "the expert-parallel job failed: " + why;
  opt_.leader->failed(broken_);
}

void Engine::start() {
  std::lock_guard lk(mu_);
  if (engine_.joinable()) return;
  stop_ = false;
  running_thread_ = true;
  engine_ = std::thread([this] { engine_loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lk(mu_);
    if (!engine_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  engine_.join();
  std::lock_guard lk(mu_);
  engine_ = std::thread();
  running_thread_ = false;
}

RequestResult Engine::generate(Request req, Callback on_event) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    RequestResult r;
    bool done = false;
  };
  auto st = std::make_shared<State>();
  submit(std::move(req), [st, on_event](const RequestEvent& e) {
    if (on_event) on_event(e);
    std::lock_guard lk(st->mu);
    st->r.add(e);
    if (e.finished) {
      st->done = true;
      st->cv.notify_all();
    }
  });
  bool threaded;
  {
    std::lock_guard lk(mu_);
    threaded = running_thread_;
  }
  if (!threaded) {
    while (true) {
      {
        std::lock_guard lk(st->mu);
        if (st->done) break;
      }
      if (!step()) throw std::logic_error("engine: idle before the request finished");
    }
  }
  std::unique_lock lk(st->mu);
  st->cv.wait(lk, [&] { return st->done; });
  return st->r;
}

}  // namespace mla
