// Speculative decoding inside the one Engine (engine.h): a draft source proposes k tokens after
// a decoding sequence's tokens, the next forward pass verifies them as k + 1 new rows of that
// sequence (ragged batch, absorbed attention, every row computed as a one-token decode would:
// cpu::Context::one_token_kernels), and the engine keeps the longest agreeing prefix plus the
// target's own next token; the rejected rows leave the latent cache (LatentPool::truncate, pages
// past the end freed) and the draft source's state.
//
// Acceptance (Leviathan et al. 2023, Chen et al. 2023): row j's target distribution p (the
// sequence's logits processor, penalties, temperature and filters applied, exactly as plain
// sampling would) and the draft's q:
//   greedy  : accept d_j while it is the target's argmax; the first mismatch emits the argmax.
//   sampling: accept d_j with probability min(1, p(d_j) / q(d_j)); on rejection draw from
//             norm(max(0, p - q)) and stop; all accepted: draw the bonus token from the last
//             row's p. Deterministic drafts have q one-hot, so the residual is p without d_j.
// Either way the output has the target's distribution (greedy: the same tokens) whatever the
// drafts are; the drafts only decide how many tokens a pass yields.
//
// Draft sources: MtpDrafts (the checkpoint's MTP module, model/mtp.h, chained for k > 1, with
// its own one-layer latent cache per sequence) and InjectedDrafts (a function: tests and the
// benchmark drive verify, accept and rollback with drafts of known quality).
//
// SpecGate is the adaptive rule: speculation stays on only while it yields more tokens per
// second than plain decoding, both measured on the engine's own decode passes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/sequence.h"
#include "kv/latent_pool.h"
#include "model/model.h"

namespace mla {

struct SpeculativeOptions {
  bool enabled = false;
  int64_t draft_tokens = 1;  // k >= 1 per verify pass
  // Switch speculation off while plain decoding is faster (SpecGate).
  bool adaptive = true;
  // Speculate only while a decode pass holds at most this many rows (drafts included): past a
  // few dozen rows a pass is compute-bound and the one-token kernels lose to the batched ones.
  int64_t max_verify_rows = 32;
  // The format of the MTP drafts' output head (Model::set_mtp_draft_head): INT4 (groups of 32)
  // reads 3.6x fewer bytes than a bf16 head; BF16 drafts with the head as stored. Verification
  // always uses lm_head as stored, so this changes only how often drafts are right.
  quant::QuantFormat draft_head = quant::QuantFormat::INT4;
};

// "mtp" -> true; "none"/"" -> false; anything else throws std::invalid_argument.
bool parse_speculative_method(const std::string& s);

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Whether observe() reads the main model's final-norm hidden rows (the engine then captures
  // them in every pass).
  virtual bool wants_hidden() const { return false; }
  // After a pass that ran rows of s at positions pos0 .. pos0 + n - 1 and after its tokens were
  // taken: the first `kept` rows are now s's cache, the rest were rejected drafts. hidden:
  // [n, hidden_size] when wants_hidden(), else null.
  virtual void observe(const Sequence& s, int64_t pos0, int64_t n, int64_t kept, const float* hidden) {
    (void)s, (void)pos0, (void)n, (void)kept, (void)hidden;
  }
  // Up to k draft tokens after each sequence's tokens, into s->draft (and s->draft_probs, the
  // distribution each was drawn from, for a sampled draft; empty for deterministic ones). May
  // leave a sequence without drafts.
  virtual void propose(std::span<Sequence* const> seqs, int64_t k) = 0;
  // The sequence ended or lost its cache: whatever is kept for it goes.
  virtual void forget(const Sequence& s) { (void)s; }
};

// Drafts from a function of the sequence (its tokens so far) and k: deterministic (q one-hot).
// filling(): a function that writes s.draft and s.draft_probs itself (sampled drafts of a known
// distribution, for the statistical test of rejection sampling).
class InjectedDrafts : public DraftSource {
 public:
  using Fn = std::function<std::vector<int32_t>(const Sequence& s, int64_t k)>;
  using FillFn = std::function<void(Sequence& s, int64_t k)>;
  explicit InjectedDrafts(Fn fn);
  static std::shared_ptr<InjectedDrafts> filling(FillFn fill);
  void propose(std::span<Sequence* const> seqs, int64_t k) override;

 private:
  InjectedDrafts() = default;
  FillFn fill_;
};

// Drafts from the model's MTP module (Model::mtp_forward). Per sequence: the MTP cache (rows
// from position `first` on, in its own pool) and the main model's hidden rows it has not read
// yet; propose() reads them in one batched pass (the catch-up), then chains the module k - 1
// times on its own output, and takes the chained rows out of the MTP cache again. A sequence
// whose rows do not continue where its MTP state ends (preempted and recomputed, a prefix-cache
// hit) starts a fresh MTP cache at the new position: its drafts then see only what follows.
class MtpDrafts : public DraftSource {
 public:
  // pages: of the MTP pool (one layer); ctx: the context of the MTP passes (null: the model's).
  MtpDrafts(Model& model, int64_t pages, int64_t page_size, KvDType dtype, const cpu::Context* ctx = nullptr);
  bool wants_hidden() const override { return true; }
  void observe(const Sequence& s, int64_t pos0, int64_t n, int64_t kept, const float* hidden) override;
  void propose(std::span<Sequence* const> seqs, int64_t k) override;
  void forget(const Sequence& s) override;

  const LatentPool& pool() const { return pool_; }
  // For tests: the MTP cache length and first position of a sequence (-1 when none).
  int64_t cached_rows(int64_t id) const;

 private:
  struct State {
    PageTable table;
    int64_t first = 0;         // absolute position of the MTP cache's row 0
    std::vector<float> hidden;  // main-model rows not read yet, positions first + table.length ..
  };
  int64_t pending_rows(const State& st) const { return int64_t(st.hidden.size()) / D_; }
  void reset(State& st, int64_t pos);
  // One draft token from the logits row, with the sequence's processor and sampler; false when
  // the sequence's processor refuses every token (no draft then).
  bool choose(Sequence& s, std::span<float> row);

  Model& model_;
  LatentPool pool_;
  const cpu::Context* ctx_;
  int64_t D_, V_;
  std::unordered_map<int64_t, State> states_;
  std::vector<float> logits_, hid_, hid2_;
  std::vector<int32_t> tokens_;
};

// Acceptance of one draft token (pure; the engine draws u): accept d when u < p(d) / q(d).
// q empty: a deterministic draft (q(d) = 1).
bool accept_draft(std::span<const float> p, std::span<const float> q, int32_t d, double u);
// The distribution to draw from after rejecting d: norm(max(0, p - q)); q empty: p without d.
// Falls back to p where that leaves no mass (p == q up to rounding).
std::vector<float> residual_distribution(std::span<const float> p, std::span<const float> q, int32_t d);

// The adaptive rule, engine-wide: a cost model from the engine's own decode passes. Three
// exponential moving averages: the seconds of a plain decode pass (t_plain), of a speculative
// step (its verify pass and the drafting for the next one: t_spec), and the tokens a speculative
// step yields per sequence (E, 1 to k + 1). Speculation pays while E / (t_spec / t_plain) >= 1,
// the tokens per second of speculative steps over those of plain ones; the next pass speculates
// then (a figure not measured yet counts as paying). Every kExplore passes one runs the other way
// (the first after kFirstExplore), so that the figures of the mode not in use stay current: E
// while speculation is off (it comes back on when the text turns predictable), t_plain while it
// is on. Passes of different batch sizes share the averages.
class SpecGate {
 public:
  static constexpr int64_t kFirstExplore = 4, kExplore = 16;
  explicit SpecGate(bool adaptive = true) : adaptive_(adaptive) {}
  bool speculate_next() const;
  // A decode-only pass: whether it verified drafts, how many sequences it decoded, the tokens it
  // produced and its seconds.
  void record(bool speculated, int64_t sequences, int64_t tokens, double seconds);
  // The model's figures (0 while not measured): E, t_spec / t_plain, and E over that.
  double expected_tokens() const { return have_[1] ? tokens_ : 0; }
  double cost_ratio() const { return have_[0] && have_[1] ? seconds_[1] / seconds_[0] : 0; }
  double gain() const { return cost_ratio() > 0 ? expected_tokens() / cost_ratio() : 0; }

 private:
  bool preferred() const;
  bool adaptive_;
  double seconds_[2] = {0, 0};  // t_plain, t_spec per pass
  double tokens_ = 0;           // E: tokens per sequence per speculative step
  bool have_[2] = {false, false};
  int64_t passes_ = 0, since_explore_ = 0;
};

// What the engine does with a logits row and a token: Speculation's verify samples through it,
// exactly as plain decoding does.
class RowSampler {
 public:
  virtual ~RowSampler() = default;
  // The row as s's sampler sees it: its logprobs kept when asked, its logits processor, the
  // vocabulary mask.
  virtual void process_row(Sequence& s, std::span<float> row) = 0;
  // Plain sampling of s's next token from its row: process_row, the sampler, note_logprob, take.
  virtual void sample(Sequence& s, std::span<float> row) = 0;
  // The kept logprobs of `id` (when asked) for the event that carries it.
  virtual void note_logprob(Sequence& s, std::span<const float> row, int32_t id) = 0;
  // id is s's next token (text, stop conditions, event); false when s ended with it.
  virtual bool take(Sequence& s, int32_t id) = 0;
};

// Speculative decoding's counters, summed over the engine's steps: sequence-steps that verified
// drafts, their draft tokens, the drafts accepted, the tokens those steps produced (accepted
// drafts plus the target's own token), the seconds spent drafting, and the passes whose verify
// rows shared the pass with prefill rows (those ran on the batch's kernels, not the one-token ones).
struct SpecCounters {
  int64_t steps = 0, draft_tokens = 0, accepted_tokens = 0, emitted_tokens = 0;
  double draft_seconds = 0;
  int64_t passes_with_prefill = 0;
};

struct Batch;

// Speculative decoding as the engine's step asks for it. It owns the draft source, the adaptive
// gate and what a pass of drafts needs (the verify rows' ids, the one-token context, the
// hidden rows the MTP module reads). Per step the engine asks it to
//   shape(batch)         -> the pass's slices: a decoding sequence's pending token and its
//                           drafts as k + 1 rows; the options that make every row of a
//                           decode-only pass what a one-token decode step computes
//   logits_rows(part)    -> where each part's logits rows lie
//   accept(s, part, rows)-> s's drafts verified (Leviathan et al.) through the engine's sampler,
//                           the rejected rows out of the cache; or its one row sampled
//   end_pass(...)        -> the gate's figures, and the drafts of the next pass
class Speculation {
 public:
  // source null: the model's MTP module (the model must have it loaded). Throws
  // std::invalid_argument for fewer than one draft token or a model without MTP.
  // The pool is the engine's: rejected draft rows leave it.
  Speculation(Model& model, const SpeculativeOptions& opt, std::shared_ptr<DraftSource> source, LatentPool& pool);

  // The slices of the batch's parts (slices[b] for part b) and the pass's options.
  void shape(const Batch& batch, std::vector<SeqSlice>& slices, ForwardOptions& fo);
  // The first logits row of part b (shape's pass); rows are [parts' rows, vocab].
  int64_t first_row(size_t part) const { return first_row_[part]; }
  // Part b's rows after the pass (s not done): its drafts verified, or its last row sampled when
  // it has none and its prompt is read. Then the draft source sees the rows the cache keeps.
  // Throws what sampling throws (the engine ends s alone).
  void accept(Sequence& s, size_t part, float* rows, RowSampler& sampler);
  // After the pass's rows were accepted: the gate's record of a decode-only pass (its sequences,
  // the tokens it produced, its seconds) and the drafts of the running sequences' next pass.
  void end_pass(std::span<Sequence* const> running, int64_t sequences, int64_t tokens, double seconds);
  // s ended or lost its cache (preempted): its drafts and the source's state for it go.
  void forget(Sequence& s);

  const SpecCounters& counters() const { return counters_; }
  const SpecGate& gate() const { return gate_; }

 private:
  // s's k drafts from its k + 1 rows: the accepted prefix and the target's own token taken.
  // Returns the rows the cache keeps.
  int64_t verify(Sequence& s, float* rows, int64_t k, RowSampler& sampler);
  void draft_next(std::span<Sequence* const> running);

  Model& model_;
  LatentPool& pool_;
  SpeculativeOptions opt_;
  std::shared_ptr<DraftSource> source_;
  SpecGate gate_;
  cpu::Context one_token_ctx_;
  SpecCounters counters_;
  double draft_seconds_ = 0;  // the drafting for the coming pass, for the gate
  // The pass shape() made.
  std::vector<std::vector<int32_t>> verify_ids_;
  std::vector<int64_t> drafts_, new_tokens_, logits_last_, first_row_, pos0_, first_token_;
  std::vector<float> hidden_;
  bool prefill_rows_ = false, any_drafts_ = false;
};

}  // namespace mla
