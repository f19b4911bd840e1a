// Scheduler: queue, admission, ragged batches, preemption, prefix cache (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>
#include <future>

namespace mla {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::StopString: return "stop string";
    case FinishReason::MaxTokens: return "max tokens";
    case FinishReason::ContextLength: return "context length";
    case FinishReason::KvCacheFull: return "kv cache full";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::Eos:
    case FinishReason::StopString: return "stop";
    case FinishReason::MaxTokens:
    case FinishReason::ContextLength:
    case FinishReason::KvCacheFull: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "error";
}

struct Scheduler::Sequence {
  int64_t id = 0;
  ScheduledRequest req;
  Callback on_event;
  std::vector<int32_t> tokens;  // prompt, then the output so far
  int64_t prompt_len = 0;
  int64_t generated = 0;
  int64_t cached_tokens = 0;  // prompt tokens shared from the prefix cache at first admission
  bool admitted_once = false;
  bool prompt_cached = false;  // the read prompt went into the prefix cache
  bool done = false;
  PageTable table;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  StopStrings stops;

  int64_t pending() const { return int64_t(tokens.size()) - table.length; }
};

Scheduler::Scheduler(Model& model, LatentPool pool, const Tokenizer* tokenizer, const SchedulerOptions& opt)
    : model_(model), pool_(std::move(pool)), tokenizer_(tokenizer), opt_(opt) {
  const ModelConfig& c = model_.config();
  if (pool_.num_layers() != c.num_hidden_layers || pool_.row_dim() != c.latent_dim())
    throw std::invalid_argument("scheduler: the latent pool's geometry does not match the model");
  if (opt_.max_batch_tokens < 1) throw std::invalid_argument("scheduler: max_batch_tokens must be at least 1");
  if (opt_.max_running < 1) throw std::invalid_argument("scheduler: max_running must be at least 1");
  update_stats();
}

Scheduler::~Scheduler() {
  std::unique_lock lk(mu_);
  if (engine_.joinable()) {
    lk.unlock();
    stop();
  }
}

int64_t Scheduler::max_sequence_tokens() const {
  int64_t cap = capacity_tokens();
  int64_t context = model_.config().max_position_embeddings;
  return context > 0 ? std::min(cap, context) : cap;
}

int64_t Scheduler::submit(ScheduledRequest req, Callback on_event) {
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

  auto s = std::make_unique<Sequence>();
  s->tokens = req.prompt;
  s->prompt_len = n;
  s->sampler = std::make_unique<Sampler>(req.sampling);
  s->sampler->add_prompt_tokens(req.prompt);
  if (tokenizer_) s->decoder = std::make_unique<StreamDecoder>(*tokenizer_, req.skip_special_tokens);
  s->stops = StopStrings(req.stop);
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

void Scheduler::cancel(int64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void Scheduler::cancel_all() {
  {
    std::lock_guard lk(mu_);
    cancel_all_ = true;
  }
  cv_.notify_all();
}

void Scheduler::drain_incoming() {
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<int64_t> cancels;
  bool all = false;
  {
    std::lock_guard lk(mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
    std::swap(all, cancel_all_);
  }
  for (auto& s : incoming) {
    if (s->req.max_new_tokens == 0) {
      finish(*s, FinishReason::MaxTokens);
      continue;
    }
    counters_.prompt_tokens += s->prompt_len;
    waiting_.push_back(std::move(s));
  }
  for (int64_t id : cancels) {
    for (auto& s : running_)
      if (s->id == id && !s->done) finish(*s, FinishReason::Cancelled);
    for (auto& s : waiting_)
      if (s->id == id && !s->done) finish(*s, FinishReason::Cancelled);
  }
  if (all) {
    for (auto& s : running_)
      if (!s->done) finish(*s, FinishReason::Cancelled, "all requests were cancelled");
    for (auto& s : waiting_)
      if (!s->done) finish(*s, FinishReason::Cancelled, "all requests were cancelled");
  }
  std::erase_if(waiting_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
}

void Scheduler::finish(Sequence& s, FinishReason reason, std::string message, int32_t token, std::string text) {
  s.done = true;
  ++counters_.requests_finished;
  if (reason == FinishReason::Cancelled) ++counters_.requests_cancelled;
  if (s.on_event) {
    TokenEvent e;
    e.request_id = s.id;
    e.token = token;
    e.text = std::move(text);
    e.finished = true;
    e.reason = reason;
    e.message = std::move(message);
    e.prompt_tokens = s.prompt_len;
    e.cached_tokens = s.cached_tokens;
    e.completion_tokens = s.generated;
    events_.push_back({s.on_event, std::move(e)});
  }
}

void Scheduler::retire(size_t i) {
  Sequence& s = *running_[i];
  if (opt_.prefix_cache) cache_insert(s);
  pool_.release(s.table);
  running_.erase(running_.begin() + ptrdiff_t(i));
}

// ---- prefix cache ----

void Scheduler::cache_insert(const Sequence& s) {
  const int64_t ps = pool_.page_size();
  const int64_t aligned = s.table.length / ps * ps;
  if (aligned == 0) return;
  auto begin = s.tokens.begin(), end = s.tokens.begin() + aligned;
  for (auto& e : cache_)
    if (int64_t(e.tokens.size()) >= aligned && std::equal(begin, end, e.tokens.begin())) {
      e.last_used = ++clock_;  // an entry already holds these pages' tokens
      return;
    }
  CacheEntry entry;
  entry.tokens.assign(begin, end);
  if (!pool_.fork(s.table, aligned, &entry.table)) return;  // full pages only: never fails
  entry.last_used = ++clock_;
  // Entries whose tokens the new one extends are superseded.
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (int64_t(it->tokens.size()) <= aligned && std::equal(it->tokens.begin(), it->tokens.end(), begin)) {
      pool_.release(it->table);
      it = cache_.erase(it);
    } else {
      ++it;
    }
  }
  cache_.push_back(std::move(entry));
  while (int64_t(cache_.size()) > opt_.prefix_cache_entries) evict_one_cache_entry();
}

bool Scheduler::evict_one_cache_entry() {
  if (cache_.empty()) return false;
  auto oldest = std::min_element(cache_.begin(), cache_.end(),
                                 [](const CacheEntry& a, const CacheEntry& b) { return a.last_used < b.last_used; });
  pool_.release(oldest->table);
  cache_.erase(oldest);
  return true;
}

bool Scheduler::free_pages_for(int64_t need, const Sequence*) {
  while (need > pool_.free_pages())
    if (!evict_one_cache_entry()) return false;
  return true;
}

// ---- admission and preemption ----

bool Scheduler::admit(Sequence& s, int64_t keep_free) {
  const int64_t ps = pool_.page_size();
  const int64_t total = int64_t(s.tokens.size());
  // The longest page-aligned cached prefix, leaving at least one token to compute (for logits).
  CacheEntry* best = nullptr;
  int64_t best_len = 0;
  if (opt_.prefix_cache) {
    for (auto& e : cache_) {
      int64_t n = std::min<int64_t>(int64_t(e.tokens.size()), total - 1), common = 0;
      while (common < n && e.tokens[size_t(common)] == s.tokens[size_t(common)]) ++common;
      common = common / ps * ps;
      if (common > best_len) best = &e, best_len = common;
    }
  }
  if (best) {
    best->last_used = ++clock_;
    pool_.fork(best->table, best_len, &s.table);  // full pages: shares, never copies
  }
  const int64_t need = pool_.pages_needed(s.table, total);
  // Leave the pages the running sequences' tokens of this step need (several sequences can
  // cross a page boundary in the same step).
  if (!free_pages_for(need + keep_free, &s)) {
    if (running_.empty() && cache_.empty() && need > pool_.free_pages()) {
      pool_.release(s.table);
      finish(s, FinishReason::KvCacheFull,
             "the sequence's " + std::to_string(total) + " tokens exceed the KV cache's " +
                 std::to_string(capacity_tokens()));
      return true;  // handled: leaves the queue
    }
    pool_.release(s.table);
    return false;
  }
  pool_.reserve(s.table, total);
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.cached_tokens = best_len;
    counters_.prefix_hit_tokens += best_len;
  }
  return true;
}

void Scheduler::preempt(size_t i) {
  auto s = std::move(running_[i]);
  running_.erase(running_.begin() + ptrdiff_t(i));
  pool_.release(s->table);  // its tokens and sampler stay: it recomputes from the start
  ++counters_.preemptions;
  waiting_.push_front(std::move(s));
}

// ---- the step ----

void Scheduler::handle_token(Sequence& s, int32_t id) {
  s.sampler->add_output_token(id);
  s.tokens.push_back(id);
  ++s.generated;
  ++counters_.generation_tokens;
  auto tail = [&]() {
    std::string t;
    if (s.decoder && !s.stops.stopped()) {
      t = s.stops.push(s.decoder->flush());
      if (!s.stops.stopped()) t += s.stops.flush();
    }
    return t;
  };
  const auto& eos = s.req.eos_token_ids;
  if (std::find(eos.begin(), eos.end(), int64_t(id)) != eos.end()) {
    finish(s, FinishReason::Eos, {}, id, tail());
    return;
  }
  std::string text = s.decoder ? s.stops.push(s.decoder->push(id)) : std::string();
  if (s.stops.stopped()) {
    finish(s, FinishReason::StopString, {}, id, std::move(text));
    return;
  }
  if (s.req.max_new_tokens >= 0 && s.generated >= s.req.max_new_tokens) {
    finish(s, FinishReason::MaxTokens, {}, id, text + tail());
    return;
  }
  const int64_t context = model_.config().max_position_embeddings;
  if (context > 0 && int64_t(s.tokens.size()) > context) {  // the next pass would put id at position context
    finish(s, FinishReason::ContextLength, "reached the model's context of " + std::to_string(context) + " tokens", id,
           text + tail());
    return;
  }
  if (s.on_event) {
    TokenEvent e;
    e.request_id = s.id;
    e.token = id;
    e.text = std::move(text);
    e.prompt_tokens = s.prompt_len;
    e.cached_tokens = s.cached_tokens;
    e.completion_tokens = s.generated;
    events_.push_back({s.on_event, std::move(e)});
  }
}

bool Scheduler::step_inner() {
  drain_incoming();
  bool worked = false;
  auto sweep = [&]() {
    for (size_t i = running_.size(); i-- > 0;)
      if (running_[i]->done) retire(i), worked = true;
  };
  sweep();
  if (running_.empty() && waiting_.empty()) {
    return worked;
  }

  // Pages for every running sequence's pending tokens: give back cached prefixes, then preempt
  // the newest sequence; a sequence alone that still cannot grow has filled the cache.
  while (!running_.empty()) {
    int64_t need = 0;
    for (auto& s : running_) need += pool_.pages_needed(s->table, int64_t(s->tokens.size()));
    if (need <= pool_.free_pages()) break;
    if (evict_one_cache_entry()) continue;
    if (running_.size() > 1) {
      preempt(running_.size() - 1);
      continue;
    }
    Sequence& s = *running_[0];
    std::string text;
    if (s.decoder && !s.stops.stopped()) {
      text = s.stops.push(s.decoder->flush());
      if (!s.stops.stopped()) text += s.stops.flush();
    }
    finish(s, FinishReason::KvCacheFull,
           "the KV cache is full: the sequence holds " + std::to_string(s.table.length) + " of " +
               std::to_string(capacity_tokens()) + " tokens",
           -1, std::move(text));
    retire(0);
    worked = true;
  }

  // The batch: decode tokens (oldest first), prefill chunks, then new admissions.
  int64_t budget = opt_.max_batch_tokens;
  std::vector<std::pair<Sequence*, int64_t>> parts;
  for (auto& s : running_)
    if (s->pending() == 1 && budget > 0) parts.push_back({s.get(), 1}), --budget;
  for (auto& s : running_)
    if (s->pending() > 1 && budget > 0) {
      int64_t n = std::min(s->pending(), budget);
      parts.push_back({s.get(), n});
      budget -= n;
    }
  // Pages admissions leave free: what the running sequences' pending tokens still need this step
  // (admitted sequences reserve all of theirs on admission, so this stays the same while
  // admitting), and at least one page in hand for their next tokens.
  int64_t pending_pages = 0;
  for (auto& s : running_) pending_pages += pool_.pages_needed(s->table, int64_t(s->tokens.size()));
  while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < opt_.max_running) {
    Sequence& s = *waiting_.front();
    if (!admit(s, std::max<int64_t>(pending_pages, running_.empty() ? 0 : 1))) break;
    auto owned = std::move(waiting_.front());
    waiting_.pop_front();
    if (owned->done) {
      worked = true;
      continue;
    }
    int64_t n = std::min(owned->pending(), budget);
    parts.push_back({owned.get(), n});
    budget -= n;
    running_.push_back(std::move(owned));
  }
  if (parts.empty()) {
    return worked;
  }

  std::vector<SeqSlice> batch;
  batch.reserve(parts.size());
  for (auto& [s, n] : parts)
    batch.push_back({&s->table, std::span<const int32_t>(s->tokens.data() + s->table.length, size_t(n))});
  ForwardOptions fo;
  fo.path = opt_.path;
  fo.policy = opt_.policy;
  fo.last_logits_only = true;
  try {
    model_.forward(batch, pool_, fo, logits_);
  } catch (const std::exception& e) {
    // Nothing was written (pages were checked first); the batch's requests end with the error.
    for (auto& [s, n] : parts) finish(*s, FinishReason::Error, std::string("forward pass failed: ") + e.what());
    sweep();
    return true;
  }
  ++counters_.steps;
  const int64_t vocab = model_.config().vocab_size;
  for (size_t b = 0; b < parts.size(); ++b) {
    Sequence& s = *parts[b].first;
    counters_.computed_tokens += parts[b].second;
    if (s.pending() > 0) continue;  // a prefill chunk short of the end: no token yet
    if (opt_.prefix_cache && !s.prompt_cached) {
      s.prompt_cached = true;
      cache_insert(s);
    }
    if (s.done) continue;  // cancelled meanwhile (cannot happen within a step, kept for safety)
    int32_t id = s.sampler->sample(std::span<const float>(logits_.data() + int64_t(b) * vocab, size_t(vocab)));
    handle_token(s, id);
  }
  sweep();
  return true;
}

bool Scheduler::step() {
  bool worked = step_inner();
  publish();
  return worked;
}

void Scheduler::publish() {
  update_stats();  // first, so that whoever hears of a token sees it counted
  std::vector<std::pair<Callback, TokenEvent>> events;
  events.swap(events_);
  for (auto& [cb, e] : events) cb(e);
}

void Scheduler::run_until_idle() {
  while (step()) {
  }
}

void Scheduler::update_stats() {
  SchedulerStats st = counters_;
  st.running = int64_t(running_.size());
  st.waiting = int64_t(waiting_.size());
  st.kv_pages_total = pool_.num_pages();
  st.kv_pages_free = pool_.free_pages();
  st.kv_page_size = pool_.page_size();
  st.kv_bytes_per_token = pool_.bytes_per_token();
  st.prefix_cache_entries = int64_t(cache_.size());
  // Pages only the prefix cache holds (they come back when it gives them up).
  int64_t only_cache = 0;
  for (auto& e : cache_)
    for (int32_t p : e.table.pages) only_cache += pool_.refcount(p) == 1;
  st.kv_pages_prefix_cache = only_cache;
  st.paths = model_.path_counters();
  std::lock_guard lk(mu_);
  st.requests_submitted = submitted_;
  st.waiting += int64_t(incoming_.size());
  snapshot_ = st;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  SchedulerStats st = snapshot_;
  st.requests_submitted = submitted_;
  return st;
}

std::vector<int32_t> Scheduler::pages_of(int64_t id) const {
  for (auto& s : running_)
    if (s->id == id) return s->table.pages;
  return {};
}

// ---- the engine thread ----

void Scheduler::engine_loop() {
  while (true) {
    {
      std::lock_guard lk(mu_);
      if (stop_) break;
    }
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      // A bug, not a bad request: end what is running rather than the process.
      for (auto& s : running_)
        if (!s->done) finish(*s, FinishReason::Error, std::string("scheduler step failed: ") + e.what());
      for (size_t i = running_.size(); i-- > 0;) retire(i);
      publish();
      worked = true;
    }
    if (!worked) {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || cancel_all_ || !incoming_.empty() || !cancels_.empty(); });
    }
  }
  // Whatever is left is cancelled, so that nobody waits for it.
  drain_incoming();
  for (auto& s : running_)
    if (!s->done) finish(*s, FinishReason::Cancelled, "the server is shutting down");
  for (auto& s : waiting_)
    if (!s->done) finish(*s, FinishReason::Cancelled, "the server is shutting down");
  for (size_t i = running_.size(); i-- > 0;) retire(i);
  waiting_.clear();
  publish();
}

void Scheduler::start() {
  std::lock_guard lk(mu_);
  if (engine_.joinable()) return;
  stop_ = false;
  engine_ = std::thread([this] { engine_loop(); });
}

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    if (!engine_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  engine_.join();
  std::lock_guard lk(mu_);
  engine_ = std::thread();
}

ScheduledResult Scheduler::generate(ScheduledRequest req) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    ScheduledResult r;
    bool done = false;
  };
  auto st = std::make_shared<State>();
  submit(std::move(req), [st](const TokenEvent& e) {
    std::lock_guard lk(st->mu);
    if (e.token >= 0) st->r.tokens.push_back(e.token);
    st->r.text += e.text;
    st->r.prompt_tokens = e.prompt_tokens;
    st->r.cached_tokens = e.cached_tokens;
    if (e.finished) {
      st->r.reason = e.reason;
      st->r.message = e.message;
      st->done = true;
      st->cv.notify_all();
    }
  });
  std::unique_lock lk(st->mu);
  st->cv.wait(lk, [&] { return st->done; });
  return st->r;
}

}  // namespace mla
