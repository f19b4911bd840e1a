// Which sequences run in the next forward pass, and where their latents go. The scheduler
// neither samples nor calls the model: schedule() returns one ragged batch — the next token of
// every decoding sequence (oldest first), then prefill chunks of sequences still reading their
// prompt, then newly admitted ones, up to max_batch_tokens new tokens — with the pages for
// all of it reserved.
//
//  - Admission is first come, first served and bounded by free pages: a sequence is admitted
//    when the pages for all its tokens so far fit (after the prefix cache's shared pages); its
//    prompt then runs in chunks. While other sequences decode, a chunk deep in a long prompt
//    is shortened to keep the pass's attention work bounded (SchedulerOptions::chunk_depth).
//  - When the running sequences' next tokens need pages and none are free, the prefix cache
//    gives pages back first, then the newest running sequence is preempted: its pages are
//    released and it goes back to the front of the queue to recompute its tokens (prompt and
//    output so far) when pages free up. Its sampler keeps its state (the engine's), so the
//    output is the same. A sequence alone that still cannot grow has filled the cache: it
//    leaves with the batch's out_of_pages.
//  - Prefix cache (optional): a sequence's full pages go into it when its prompt has been read
//    (postprocess) and when it leaves (remove); admission forks the longest cached prefix.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "engine/sequence.h"
#include "kv/latent_pool.h"
#include "kv/prefix_cache.h"

namespace mla {

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // new tokens per forward pass (decode tokens + prefill chunks)
  int64_t max_running = 64;        // sequences decoding or prefilling at once
  // A pass that carries decoding sequences' next tokens does at most the attention work of
  // max_batch_tokens tokens at this depth (max_batch_tokens x chunk_depth query-key pairs,
  // decode rows included): deep in a long prompt its chunks shrink, so that the decoding
  // sequences' tokens never wait for much more than such a pass. Prefill chunks keep at least
  // max_batch_tokens / 8 tokens each (progress at any depth). 0: no bound.
  int64_t chunk_depth = 16384;
  // What the scheduler runs: no more sequences than a pass has tokens, so that every running
  // sequence advances in every pass.
  int64_t running_limit() const { return std::min(max_running, max_batch_tokens); }
};

struct BatchPart {
  Sequence* seq = nullptr;
  // tokens from seq->tokens[seq->table.length]; for a decoding sequence with drafts, its last
  // token and then n - 1 of seq->draft (speculative verification)
  int64_t n = 0;
};

struct Batch {
  std::vector<BatchPart> parts;
  // Sequences that can never get the pages they need, already removed (pages released), with
  // what happened; the engine ends them with FinishReason::KvCacheFull.
  std::vector<std::pair<Sequence*, std::string>> out_of_pages;
  // Sequences preempted by this schedule (pages released, queued again to recompute): whatever
  // else is kept for them (the speculative draft state) can go now.
  std::vector<Sequence*> preempted;
};

class Scheduler {
 public:
  // The pool (and the cache, if given) must outlive the scheduler.
  Scheduler(LatentPool& pool, PrefixCache* cache, const SchedulerOptions& opt = {});

  void add(Sequence* s);     // queues at the back
  // Takes a sequence out (queued or running); a running one's full pages go to the prefix
  // cache, its pages back to the pool.
  void remove(Sequence* s);
  Batch schedule();
  // After the batch's forward pass: sequences that have read their whole prompt put it into
  // the prefix cache.
  void postprocess(const Batch& batch);

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t preemptions() const { return preemptions_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const SchedulerOptions& options() const { return opt_; }
  int64_t capacity_tokens() const { return pool_.num_pages() * pool_.page_size(); }

 private:
  bool free_pages_for(int64_t need);  // evicts cache entries until need pages are free
  void preempt_newest(Batch& batch);
  bool drop_drafts();  // clears every running sequence's drafts; true when there were any
  // True when s leaves the queue (admitted, or out of pages for good).
  bool admit(Sequence& s, int64_t keep_free, Batch& batch);
  void leave(Sequence& s);  // to the prefix cache, pages back

  LatentPool& pool_;
  PrefixCache* cache_;
  SchedulerOptions opt_;
  std::vector<Sequence*> running_;  // admission order, oldest first
  std::deque<Sequence*> waiting_;
  int64_t preemptions_ = 0, prefix_hit_tokens_ = 0;
};

}  // namespace mla
