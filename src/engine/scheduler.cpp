// Scheduler: queue, admission, preemption and the batch of each step (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace mla {

Scheduler::Scheduler(LatentPool& pool, PrefixCache* cache, const SchedulerOptions& opt)
    : pool_(pool), cache_(cache), opt_(opt) {
  if (opt_.max_batch_tokens < 1) throw std::invalid_argument("scheduler: max_batch_tokens must be at least 1");
  if (opt_.max_running < 1) throw std::invalid_argument("scheduler: max_running must be at least 1");
  if (opt_.chunk_depth < 0) throw std::invalid_argument("scheduler: chunk_depth must not be negative");
  opt_.max_running = opt_.running_limit();
}

void Scheduler::add(Sequence* s) { waiting_.push_back(s); }

void Scheduler::leave(Sequence& s) {
  if (cache_) cache_->insert(s.tokens, s.table);
  pool_.release(s.table);
}

void Scheduler::remove(Sequence* s) {
  if (auto it = std::find(running_.begin(), running_.end(), s); it != running_.end()) {
    leave(*s);
    running_.erase(it);
  } else if (auto w = std::find(waiting_.begin(), waiting_.end(), s); w != waiting_.end()) {
    pool_.release(s->table);  // holds none; kept for safety
    waiting_.erase(w);
  }
}

bool Scheduler::free_pages_for(int64_t need) {
  while (need > pool_.free_pages())
    if (!cache_ || !cache_->evict_one()) return false;
  return true;
}

bool Scheduler::drop_drafts() {
  bool any = false;
  for (Sequence* s : running_) {
    any = any || !s->draft.empty();
    s->draft.clear();
    s->draft_probs.clear();
  }
  return any;
}

void Scheduler::preempt_newest(Batch& batch) {
  Sequence* s = running_.back();
  running_.pop_back();
  s->draft.clear();
  s->draft_probs.clear();
  pool_.release(s->table);  // its tokens and sampler stay: it recomputes from the start
  ++preemptions_;
  waiting_.push_front(s);
  batch.preempted.push_back(s);
}

bool Scheduler::admit(Sequence& s, int64_t keep_free, Batch& batch) {
  const int64_t total = int64_t(s.tokens.size());
  // The longest page-aligned cached prefix, leaving at least one token to compute (for logits).
  // Pages read back from the cache's RAM or disk tiers leave the running sequences' pages free.
  const int64_t shared = cache_ ? cache_->match(s.tokens, total - 1, &s.table, keep_free) : 0;
  const int64_t need = pool_.pages_needed(s.table, total);
  // Leave the pages the running sequences' tokens of this step need (several sequences can
  // cross a page boundary in the same step).
  if (!free_pages_for(need + keep_free)) {
    const bool never = running_.empty() && pages_for_tokens(total, pool_.page_size()) > pool_.num_pages();
    pool_.release(s.table);
    if (!never) return false;
    batch.out_of_pages.push_back({&s, "the sequence's " + std::to_string(total) + " tokens exceed the KV cache's " +
                                          std::to_string(capacity_tokens())});
    return true;
  }
  pool_.reserve(s.table, total);
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.cached_tokens = shared;
    prefix_hit_tokens_ += shared;
  }
  return true;
}

namespace {

// Query-key pairs that n new tokens after p cached ones attend to (causal: p + 1 ... p + n keys).
double attention_pairs(int64_t p, int64_t n) { return double(n) * (double(p) + 0.5) + 0.5 * double(n) * double(n); }

// The longest chunk from position p whose attention_pairs fit in `pairs`.
int64_t chunk_within(int64_t p, double pairs) {
  if (pairs <= 0) return 0;
  const double q = double(p) + 0.5;
  return int64_t(std::floor(std::sqrt(q * q + 2 * pairs) - q));
}

}  // namespace

Batch Scheduler::schedule() {
  Batch batch;
  if (cache_) cache_->poll();  // pages whose disk writes are done
  // Pages for every running sequence's pending tokens: give back cached prefixes, then preempt
  // the newest sequence; a sequence alone that still cannot grow has filled the cache.
  while (!running_.empty()) {
    int64_t need = 0;
    for (Sequence* s : running_) need += pool_.pages_needed(s->table, int64_t(s->tokens.size() + s->draft.size()));
    if (need <= pool_.free_pages()) break;
    if (drop_drafts()) continue;  // speculative drafts give way before anything else
    if (cache_ && cache_->evict_one()) continue;
    if (running_.size() > 1) {
      preempt_newest(batch);
      continue;
    }
    Sequence* s = running_[0];
    batch.out_of_pages.push_back({s, "the KV cache is full: the sequence holds " + std::to_string(s->table.length) +
                                         " of " + std::to_string(capacity_tokens()) + " tokens"});
    leave(*s);
    running_.clear();
  }

  // Decoding sequences, oldest first: one token each (at most max_running <= max_batch_tokens of
  // them, so none waits behind another's drafts), then their drafts (engine/speculative.h) as far
  // as the budget goes; then prefill chunks, oldest first; then new admissions.
  int64_t budget = opt_.max_batch_tokens;
  for (Sequence* s : running_)
    if (s->pending() == 1 && budget > 0) {
      batch.parts.push_back({s, 1});
      --budget;
    }
  for (BatchPart& p : batch.parts) {
    Sequence& s = *p.seq;
    p.n += std::min(int64_t(s.draft.size()), budget);
    budget -= p.n - 1;
    s.draft.resize(size_t(p.n - 1));
    if (s.draft_probs.size() > s.draft.size()) s.draft_probs.resize(s.draft.size());
  }
  // The attention left to this pass's prefill chunks: bounded while sequences decode in it.
  double attention = std::numeric_limits<double>::infinity();
  if (opt_.chunk_depth > 0 && !batch.parts.empty()) {
    attention = double(opt_.max_batch_tokens) * double(opt_.chunk_depth);
    for (const BatchPart& p : batch.parts) attention -= attention_pairs(p.seq->table.length, p.n);
  }
  const int64_t min_chunk = std::max<int64_t>(1, opt_.max_batch_tokens / 8);
  auto chunk = [&](const Sequence& s) {
    int64_t n = std::min(s.pending(), budget);
    if (std::isfinite(attention)) n = std::min(n, std::max(min_chunk, chunk_within(s.table.length, attention)));
    attention -= attention_pairs(s.table.length, n);
    budget -= n;
    return n;
  };
  for (Sequence* s : running_)
    if (s->pending() > 1 && budget > 0) batch.parts.push_back({s, chunk(*s)});
  // Pages admissions leave free: what the running sequences' pending tokens still need this step
  // (admitted sequences reserve all of theirs on admission, so this stays the same while
  // admitting), and at least one page in hand for their next tokens.
  int64_t pending_pages = 0;
  for (Sequence* s : running_) pending_pages += pool_.pages_needed(s->table, int64_t(s->tokens.size() + s->draft.size()));
  while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < opt_.max_running) {
    Sequence* s = waiting_.front();
    const size_t dropped = batch.out_of_pages.size();
    if (!admit(*s, std::max<int64_t>(pending_pages, running_.empty() ? 0 : 1), batch)) break;
    waiting_.pop_front();
    if (batch.out_of_pages.size() > dropped) continue;  // can never fit
    batch.parts.push_back({s, chunk(*s)});
    running_.push_back(s);
  }
  return batch;
}

void Scheduler::postprocess(const Batch& batch) {
  for (const BatchPart& p : batch.parts) {
    Sequence& s = *p.seq;
    if (s.pending() > 0 || s.prompt_cached) continue;
    s.prompt_cached = true;
    if (cache_) cache_->insert(s.tokens, s.table);
  }
}

}  // namespace mla
