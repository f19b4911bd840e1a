// Continuous batching over one Model and one LatentPool. Requests join a waiting queue from any
// thread; each step() builds one ragged batch — the next token of every decoding sequence, then
// prefill chunks of sequences still reading their prompt, then newly admitted requests, up to a
// per-step token budget — runs Model::forward once (last logits only), samples each sequence
// with its own Sampler, streams the token and its text to the request's callback and retires
// finished sequences, returning their pages.
//
//  - Admission is first come, first served and bounded by free pages: a request is admitted
//    when the pages for all its tokens so far fit; its prompt then runs in chunks.
//  - When a decoding sequence needs a page and none is free, the prefix cache gives its pages
//    back first, then the newest running sequence is preempted: its pages are released and it
//    goes back to the front of the queue, to recompute its tokens (prompt and output so far)
//    when pages free up. Its sampler keeps its state, so the output is the same.
//  - Prefix cache: when a prompt has been read and when a sequence finishes, its full pages
//    are kept (by reference count, LatentPool::fork) under the tokens they hold. A new request
//    whose tokens start with such a page-aligned block shares those pages and computes only
//    the rest. Entries are dropped oldest first when pages run short.
//  - A request that can never fit (more tokens than the pool or the model's context holds) is
//    refused by submit() with RequestError.
//
// Each sequence's logits depend only on its own tokens (Model::forward over a ragged batch), so
// its greedy output does not depend on what else runs beside it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/generation_config.h"
#include "engine/sampler.h"
#include "kv/latent_pool.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace mla {

// A request the scheduler cannot take (empty prompt, bad token id, bad sampling parameter, more
// tokens than the cache or the context can hold). The message says which.
struct RequestError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // new tokens per forward pass (decode tokens + prefill chunks)
  int64_t max_running = 64;        // sequences decoding or prefilling at once
  bool prefix_cache = true;
  int64_t prefix_cache_entries = 64;
  AttnPath path = AttnPath::Auto;
  PathPolicy policy;
};

struct ScheduledRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 256;        // < 0: until another stop condition
  std::vector<int64_t> eos_token_ids;  // end the output (not emitted as text)
  std::vector<std::string> stop;       // stop strings (need a tokenizer; not emitted)
  bool skip_special_tokens = true;
};

enum class FinishReason { Eos, StopString, MaxTokens, ContextLength, KvCacheFull, Cancelled, Error };
const char* finish_reason_name(FinishReason r);
// OpenAI's finish_reason: "stop" for EOS and stop strings, "length" for the token, context and
// cache limits; "cancelled" / "error" otherwise.
const char* openai_finish_reason(FinishReason r);

// One update of a request, delivered on the engine thread at the end of the step that made it
// (after stats() counts it). Every sampled token gives one event
// (token >= 0, text now safe to emit, possibly empty); the last event has finished set.
struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;
  std::string text;
  bool finished = false;
  FinishReason reason = FinishReason::MaxTokens;  // when finished
  std::string message;                             // Error / KvCacheFull: what happened
  int64_t prompt_tokens = 0;                       // the prompt's length
  int64_t cached_tokens = 0;                       // prompt tokens taken from the prefix cache
  int64_t completion_tokens = 0;                   // tokens sampled so far
};

struct ScheduledResult {
  std::vector<int32_t> tokens;  // every sampled token (an EOS included)
  std::string text;
  FinishReason reason = FinishReason::MaxTokens;
  std::string message;
  int64_t prompt_tokens = 0, cached_tokens = 0;
};

struct SchedulerStats {
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t running = 0, waiting = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of finished and running requests
  int64_t prefix_hit_tokens = 0;  // prompt tokens taken from the prefix cache
  int64_t computed_tokens = 0;    // tokens run through the model (prefill, recompute, decode)
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t kv_pages_total = 0, kv_pages_free = 0, kv_pages_prefix_cache = 0;
  int64_t kv_page_size = 0, kv_bytes_per_token = 0;
  int64_t prefix_cache_entries = 0;
  PathCounters paths;
};

class Scheduler {
 public:
  using Callback = std::function<void(const TokenEvent&)>;

  // The model (and tokenizer, if given) must outlive the scheduler. Without a tokenizer events
  // carry no text and stop strings are refused.
  Scheduler(Model& model, LatentPool pool, const Tokenizer* tokenizer = nullptr, const SchedulerOptions& opt = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; the callback receives its events on the engine thread (keep it short; it
  // may call submit and cancel). Thread-safe. Throws RequestError for a request that cannot run.
  int64_t submit(ScheduledRequest req, Callback on_event);
  // Ends a request (its last event has reason Cancelled). Thread-safe; unknown ids are ignored.
  void cancel(int64_t id);
  void cancel_all();  // every queued and running request; thread-safe

  // One engine step; false when there was nothing to do. Only one thread may step: either call
  // step() / run_until_idle() yourself or start() the engine thread.
  bool step();
  void run_until_idle();
  void start();  // runs steps on an engine thread until stop()
  void stop();   // stops the engine thread; requests still queued or running are cancelled

  // Submits and waits for the end (needs the engine thread). Throws RequestError as submit.
  ScheduledResult generate(ScheduledRequest req);

  SchedulerStats stats() const;  // thread-safe snapshot, updated after every step
  const LatentPool& pool() const { return pool_; }
  const SchedulerOptions& options() const { return opt_; }
  int64_t capacity_tokens() const { return pool_.num_pages() * pool_.page_size(); }
  // The most tokens one request may hold (prompt and output): the cache's and the context's.
  int64_t max_sequence_tokens() const;
  // For tests, between steps: the pages of a running request (empty when it is not running).
  std::vector<int32_t> pages_of(int64_t id) const;

 private:
  struct Sequence;
  struct CacheEntry {
    std::vector<int32_t> tokens;  // page-aligned
    PageTable table;
    uint64_t last_used = 0;
  };

  bool step_inner();
  void publish();  // updates the stats, then delivers the step's events
  void drain_incoming();
  void finish(Sequence& s, FinishReason reason, std::string message = {}, int32_t token = -1, std::string text = {});
  void retire(size_t running_index);
  bool free_pages_for(int64_t need, const Sequence* keep);  // evicts cache entries, then false
  void preempt(size_t running_index);
  bool admit(Sequence& s, int64_t keep_free);
  void handle_token(Sequence& s, int32_t id);
  void cache_insert(const Sequence& s);
  bool evict_one_cache_entry();
  void update_stats();
  void engine_loop();

  Model& model_;
  LatentPool pool_;
  const Tokenizer* tokenizer_;
  SchedulerOptions opt_;

  // Engine-thread state.
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order, oldest first
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::list<CacheEntry> cache_;
  uint64_t clock_ = 0;
  std::vector<float> logits_;
  SchedulerStats counters_;  // cumulative counters kept by the engine
  std::vector<std::pair<Callback, TokenEvent>> events_;  // of the current step, delivered at its end

  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<int64_t> cancels_;
  bool cancel_all_ = false;
  int64_t next_id_ = 1;
  int64_t submitted_ = 0;
  bool stop_ = false;
  SchedulerStats snapshot_;
  std::thread engine_;
};

}  // namespace mla
