// The one generation engine, for every front end (mla run, chat, demo and serve). It owns the
// latent page pool, the prefix cache and the scheduler over a Model (and, optionally, a
// Tokenizer for text and stop strings). Requests arrive from any thread (submit); one thread
// steps. One step (step_inner) is schedule -> run -> postprocess:
//   schedule     scheduler.schedule(): a ragged batch (decode tokens, prefill chunks,
//                admissions); sequences that can never get their pages end
//   shape        each part's slice of new tokens and the pass's options (Speculation reshapes
//                a decoding sequence's part into its pending token and drafts)
//   run          Model::forward, or under mpirun the PassLeader's forward (it reserves the
//                pages, sends the pass to the other ranks, runs it): the logits rows
//   postprocess  per sequence: sample(sequence, row): its logprobs when asked (of the row as
//                the model gave it), its logits processor (logit_bias, a grammar's mask), the
//                vocabulary mask, its Sampler; then its OutputStream (text, stop strings) and
//                the stop conditions; an error here ends that sequence alone (Error). With
//                speculation on, Speculation::accept verifies the drafts instead
//   events       delivered to each request's callback at the end of the step
// With speculative decoding off no speculation code runs in a step (spec_ is null).
//
// Continuous batching with chunked prefill under max_batch_tokens, admission by free pages,
// preemption of the newest sequence with exact recompute and prefix sharing are the
// scheduler's (scheduler.h) and the prefix cache's (kv/prefix_cache.h). Each sequence's logits
// depend only on its own tokens, so its greedy output does not depend on what runs beside it.
//
// Ids the tokenizer has no token for (DeepSeek-V3 has 129,280 logit rows and 128,815 tokens)
// are never sampled when a tokenizer is given.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/logprobs.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculative.h"
#include "kv/latent_pool.h"
#include "kv/prefix_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace mla {

// The one KV-budget -> pages rule. budget_bytes > 0: the pages that fit in it (all layers);
// 0: room for `sequences` full contexts of the model (4096 tokens when it names none), at most
// 1 GiB. Throws std::invalid_argument for a negative budget, a non-positive page size or a
// budget smaller than one page.
int64_t kv_cache_pages(const ModelConfig& config, double budget_bytes, int64_t page_size, KvDType dtype,
                       int64_t sequences = 1);

// The job can run no more forward passes (under mpirun: a collective with the other ranks
// failed). The engine ends every request, queued or running, Cancelled with what().
struct JobFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Rank 0 of an mpirun job (engine/lockstep.h): it runs each of the engine's forward passes with
// the other ranks, who replay them, and hears of the engine's idle time. Each call throws
// JobFailed when the job cannot go on.
class PassLeader {
 public:
  virtual ~PassLeader() = default;
  // Runs the pass on every rank: reserves its pages, sends it, and runs Model::forward here.
  virtual void forward(Model& model, std::span<SeqSlice> batch, LatentPool& pool, const ForwardOptions& opt,
                       std::vector<float>& logits) = 0;
  // A page of the prompt cache's RAM or disk tier was copied into the pool (between passes).
  virtual void page_in(int32_t page, std::span<const uint8_t> bytes) = 0;
  // Called about every idle_seconds() (when > 0) while the engine waits for work.
  virtual void idle() = 0;
  virtual double idle_seconds() const = 0;
  // After JobFailed: the engine ran no more passes and ended every request. Called once, on
  // the engine thread.
  virtual void failed(const std::string& why) = 0;
};

struct EngineOptions {
  int64_t kv_pages = 0;  // 0: kv_cache_pages(config, 0, page_size, kv_dtype, max_running)
  int64_t page_size = 64;
  KvDType kv_dtype = KvDType::BF16;
  int64_t max_batch_tokens = 512;  // new tokens per forward pass (decode tokens + prefill chunks)
  int64_t max_running = 64;        // sequences decoding or prefilling at once (the engine lowers it to max_batch_tokens)
  int64_t chunk_depth = 16384;     // bounds a pass's attention while sequences decode (SchedulerOptions)
  bool prefix_cache = true;
  // The prompt cache's RAM and disk tiers (kv/prefix_cache.h); both off by default.
  PrefixCacheOptions prefix_tiers;
  AttnPath path = AttnPath::Auto;
  PathPolicy policy;
  // Speculative decoding (engine/speculative.h). With speculation on, every pass of decoding
  // sequences only (drafts included, at most max_verify_rows rows) runs each row as a one-token
  // decode step would (cpu::Context::one_token_kernels, absorbed attention), so greedy output is
  // the same with and without it. draft_source: where drafts come from; null: the model's MTP
  // module (MtpDrafts; the model must be loaded with it).
  SpeculativeOptions speculative;
  std::shared_ptr<DraftSource> draft_source;
  // Under mpirun, rank 0's engine: the leader that runs its passes with the ranks replaying
  // them (engine/lockstep.h) and sends them the pages the prompt cache copies into the pool.
  // Not with speculation, whose MTP module keeps a pool of its own (the constructor throws
  // std::invalid_argument).
  std::shared_ptr<PassLeader> leader;
};

struct EngineStats {
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t running = 0, waiting = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of finished and running requests
  int64_t prefix_hit_tokens = 0;  // prompt tokens taken from the prefix cache
  int64_t computed_tokens = 0;    // tokens run through the model (prefill, recompute, decode)
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t preemptions = 0;
  int64_t steps = 0;
  // Seconds in forward passes, and the longest pass that carried a decoding sequence's next
  // token: how long a decoding sequence waited at most for a token.
  double step_seconds = 0, decode_step_seconds_max = 0;
  int64_t kv_pages_total = 0, kv_pages_free = 0, kv_pages_prefix_cache = 0;
  int64_t kv_page_size = 0, kv_bytes_per_token = 0;
  int64_t prefix_cache_entries = 0;  // pages in the prompt cache's pool tier
  PrefixCacheStats prefix;           // the prompt cache's tiers: hits, sizes, disk writes
  PathCounters paths;
  // Speculative decoding: sequence-steps that verified drafts, their draft tokens, the drafts
  // accepted, the tokens those steps produced (accepted drafts plus the target's own token),
  // and the seconds spent drafting.
  int64_t spec_steps = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_emitted_tokens = 0;
  double spec_draft_seconds = 0;
  // Passes whose verify rows shared the pass with prefill rows: those rows ran on the batch's
  // kernels, as plain decode rows in such a pass do, not on the one-token kernels.
  int64_t spec_passes_with_prefill = 0;
  double spec_acceptance_rate() const { return spec_draft_tokens ? double(spec_accepted_tokens) / double(spec_draft_tokens) : 0; }
  double spec_tokens_per_step() const { return spec_steps ? double(spec_emitted_tokens) / double(spec_steps) : 0; }
};

class Engine : private RowSampler {
 public:
  using Callback = std::function<void(const RequestEvent&)>;

  // The model (and tokenizer, if given) must outlive the engine. Without a tokenizer events
  // carry no text and stop strings are refused.
  Engine(Model& model, const Tokenizer* tokenizer, const EngineOptions& opt = {});  // the destructor stops the engine thread
  Engine(const Engine&) = delete;
  ~Engine() override;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; the callback receives its events on the stepping thread (keep it short;
  // it may call submit and cancel). Thread-safe. Throws RequestError for a request that can
  // never run. Where the prompt cache has a disk tier, the prompt's pages that only the disk
  // holds are read into RAM first, on the calling thread.
  int64_t submit(Request req, Callback on_event);
  // Ends a request at the next step (its last event has reason Cancelled) and frees its pages.
  // Thread-safe; unknown or finished ids are ignored.
  void cancel(int64_t id);
  void cancel_all();  // every queued and running request; thread-safe

  // One step; false when there was nothing to do. Only one thread may step: either call step()
  // / run_until_idle() / generate() yourself or start() the engine thread.
  bool step();
  void run_until_idle();
  void start();  // runs steps on an engine thread until stop()
  void stop();   // stops the engine thread; requests still queued or running are cancelled

  // Submits and waits for the end: on the engine thread if started, else stepping on the
  // calling thread. Throws RequestError as submit.
  RequestResult generate(Request req, Callback on_event = {});

  EngineStats stats() const;  // thread-safe snapshot, updated after every step
  const LatentPool& pool() const { return pool_; }
  const EngineOptions& options() const { return opt_; }
  int64_t capacity_tokens() const { return pool_.num_pages() * pool_.page_size(); }
  // The most tokens one request may hold (prompt and output): the cache's and the context's.
  int64_t max_sequence_tokens() const;
  // For tests, between steps on the stepping thread: the pages of a running request.
  std::vector<int32_t> pages_of(int64_t id) const;
  // Waits for the prompt cache's disk writes (tests; shutdown does it too).
  void flush_prompt_cache();

 private:
  // One step: schedule, run, postprocess.
  bool step_inner();
  // The batch's sequences that can never run end; preempted ones lose their drafts.
  void end_unscheduled(Batch& batch);
  // The pass of the batch: each part's slice of new tokens and the forward options.
  void shape(const Batch& batch);
  // Runs the pass; false when it failed (its requests, or the whole job, ended).
  bool run(const Batch& batch);
  // Each part's logits rows: sampled (or verified), events.
  void postprocess(Batch& batch);
  // Drops finished sequences; whether there were any.
  bool drop_finished();
  void publish();  // updates the stats, then delivers the step's events
  void drain_incoming();
  // Ends a sequence: the output stream's end flush, the last event, out of the scheduler.
  void finish(Sequence& s, FinishReason reason, std::string message = {}, int32_t token = -1, std::string text = {});
  // Every request, queued or running, ends Cancelled with `why`; whether there were any.
  bool cancel_running(const std::string& why);
  // RowSampler: a sequence's row and token (sampling, logprobs, stop conditions, events).
  void process_row(Sequence& s, std::span<float> logits) override;
  void note_logprob(Sequence& s, std::span<const float> logits, int32_t id) override;
  void sample(Sequence& s, std::span<float> logits) override;
  bool take(Sequence& s, int32_t id) override;
  void emit(Sequence& s, RequestEvent e);
  // The leader's pass failed (JobFailed): no more passes; every request ends.
  void fail_job(const std::string& why);
  void update_stats();
  void engine_loop();

  Model& model_;
  const Tokenizer* tokenizer_;
  EngineOptions opt_;
  LatentPool pool_;
  std::unique_ptr<PrefixCache> cache_;
  Scheduler scheduler_;
  std::vector<int32_t> no_token_ids_;  // logit rows the tokenizer has no token for

  // Stepping-thread state.
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> sequences_;
  std::vector<float> logits_;
  std::vector<float> raw_logits_;  // a row before its logits processor, for logprobs
  std::optional<RowLogprobs> row_lp_;  // process_row's figures for note_logprob
  std::vector<std::pair<int32_t, float>> row_top_;
  std::unique_ptr<Speculation> spec_;  // null: speculative decoding off
  // The pass of the step: its slices and options, whether it carries a decoding sequence's next
  // token.
  std::vector<SeqSlice> slices_;
  ForwardOptions pass_;
  bool decode_rows_ = false;
  double pass_seconds_ = 0;
  EngineStats counters_;  // cumulative counters kept by the engine
  std::string broken_;    // why the job failed (fail_job); empty while it runs
  std::vector<std::pair<Callback, RequestEvent>> events_;  // of the current step, delivered at its end

  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<int64_t> cancels_;
  bool cancel_all_ = false;
  int64_t next_id_ = 1;
  int64_t submitted_ = 0;
  bool stop_ = false;
  bool running_thread_ = false;
  EngineStats snapshot_;
  std::thread engine_;
};

}  // namespace mla
