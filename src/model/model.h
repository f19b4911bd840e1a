// An MLA model loaded from a hub checkpoint folder, and its forward pass over a ragged batch:
// several sequences, each with its cached tokens (in the latent page pool) and its new tokens,
// packed into one pass. Attention runs on the path the batch calls for (model/path_policy.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/context.h"
#include "backend/cpu/ops.h"
#include "format/safetensors.h"
#include "kv/latent_pool.h"
#include "model/config.h"
#include "model/indexer.h"
#include "model/mla.h"
#include "model/moe.h"
#include "model/path_policy.h"
#include "model/rope.h"
#include "model/weights.h"

namespace mla {

// The pool has too few free pages for a batch; nothing was written or reserved.
struct KvCacheExhausted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ForwardOptions {
  AttnPath path = AttnPath::Auto;
  PathPolicy policy;              // for Auto, and the chunk size of Chunked
  bool last_logits_only = false;  // one row per sequence instead of one per new token
  // Optional captures, for verification: hidden[0] the embeddings, hidden[l] the output of
  // layer l-1, hidden[L] the final norm; attn[l] layer l's attention output (after o_proj).
  std::vector<std::vector<float>>* hidden = nullptr;
  std::vector<std::vector<float>>* attn = nullptr;
  // Every layer's attention through the plain reference (MlaForm::Reference: the naive form in
  // double over the pool's decoded rows) instead of the path's kernels: `mla verify`'s
  // reference. The path is still chosen and counted as for a normal pass.
  bool reference_attention = false;
  // The CPU context of this pass instead of the model's (precision, threads, thresholds: e.g.
  // `mla verify` runs one model in both precisions); null: the model's. Its weight placement
  // is not used (the weights were placed at load).
  const cpu::Context* context = nullptr;
  // Every new token's final-norm output [T, hidden] (the input of lm_head): the h_i the MTP
  // module reads (model/mtp.h).
  std::vector<float>* final_hidden = nullptr;
  // Per sequence of the batch: how many of its last new tokens get a logits row (at most its
  // new tokens; speculative verification asks for all k + 1). Empty: by last_logits_only.
  std::span<const int64_t> logits_last;
  // DeepSeek Sparse Attention models: every layer attends every position and runs no indexer
  // (its keys are not cached either), as the same weights would without DSA: the dense side
  // of `mla bench --dsa`. A sequence passed this way has no indexer keys for these tokens.
  bool dense_attention = false;
};

// Wall time of each part of the forward pass, summed over passes while a Model has one set
// (mla bench prints it: where a decode step or a prompt spends its time).
struct ForwardProfile {
  enum Part { Embed, AttnProj, Attention, OProj, DenseMlp, Router, Experts, LmHead, Other, kParts };
  double seconds[kParts] = {};
  int64_t passes = 0;
  // Routed experts read, summed over the MoE layers of the passes (an expert that several rows
  // of a pass chose counts once: its weights are read once), and those MoE layer passes.
  // Expert-parallel (mpirun), local_routed_experts: those of them this rank holds and ran (all
  // of them in one process).
  int64_t routed_experts = 0, local_routed_experts = 0, moe_layers = 0;
  static const char* name(int part);
};

// Adds the wall time from construction to destruction to one part of a profile (no clock read
// when profiling is off).
class PartTimer {
 public:
  PartTimer(ForwardProfile* p, ForwardProfile::Part part) : p_(p), part_(part) {
    if (p_) t0_ = std::chrono::steady_clock::now();
  }
  ~PartTimer() {
    if (p_) p_->seconds[part_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  PartTimer(const PartTimer&) = delete;
  PartTimer& operator=(const PartTimer&) = delete;

 private:
  ForwardProfile* p_;
  ForwardProfile::Part part_;
  std::chrono::steady_clock::time_point t0_;
};

// One sequence's rows of an MTP pass (Model::mtp_forward): row t pairs token ids[t] = t_{i+1}
// with hidden[t] = h_i, at position pos0 + t; the MTP's latent rows go to `seq` in the MTP pool.
struct MtpSlice {
  PageTable* seq;
  std::span<const int32_t> ids;
  const float* hidden;  // [ids.size(), hidden_size]
  int64_t pos0;
};

struct PathCounters {
  int64_t expand = 0, absorb = 0, chunked = 0;
};

// DeepSeek Sparse Attention's work, summed over passes: indexer layer passes per sequence that
// selected a top-k, and those skipped because the context was at most index_topk (dense).
struct DsaCounters {
  int64_t selections = 0, dense_skips = 0;
};

class Model {
 public:
  // Loads a checkpoint folder. The model keeps ctx and runs every kernel of its forward passes
  // in it (precision, threads, dispatch thresholds; backend/cpu/context.h); ctx.weights decides
  // whether the weights are copied onto huge pages. With show_progress, reads the weights in
  // once up front and draws a progress line on standard error (for terminals; multi-gigabyte
  // checkpoints).
  // with_mtp: also loads the checkpoint's MTP module where it has one (has_mtp()).
  static std::unique_ptr<Model> load(const std::string& dir, const cpu::Context& ctx = {}, bool show_progress = false,
                                     bool with_mtp = false);
  // The same, quantizing weights as they are loaded (LoadQuantization, model/weights.h): the
  // weights are read tensor by tensor from the mapping (no read-in of the whole checkpoint up
  // front), and with show_progress a progress line shows the conversion.
  static std::unique_ptr<Model> load(const std::string& dir, const cpu::Context& ctx, bool show_progress,
                                     const LoadQuantization& quantize, bool with_mtp = false);

  const ModelConfig& config() const { return cfg_; }
  const cpu::Context& context() const { return ctx_; }
  // Whether load rewrote weights into the kernels' order (repack.h: bf16 as column pairs, INT4 in
  // blocks of 16 rows): context().repack_weights, which load sets to what happened.
  bool weights_repacked() const { return ctx_.repack_weights; }
  const ModelWeights& weights() const { return w_; }
  const PathCounters& path_counters() const { return counters_; }
  const DsaCounters& dsa_counters() const { return dsa_counters_; }
  // The positions each query of the last pass's sequences attended in `layer` (DeepSeek Sparse
  // Attention models; set by set_capture_selection): per sequence, [n, index_topk] rows with
  // their counts; empty rows where the context was dense.
  struct Selection {
    std::vector<int32_t> pos;
    std::vector<int64_t> count;
  };
  void set_capture_selection(std::vector<std::vector<Selection>>* out) { capture_sel_ = out; }
  AttnPath last_path() const { return last_path_; }
  // Which schedule the MoE layers' experts ran on (layer calls, summed over passes).
  const MoeCounters& moe_counters() const { return moe_->counters(); }
  void set_expert_schedule(ExpertSchedule s) { moe_->set_schedule(s); }
  // Expert-parallel runs (mpirun -np N): the routed experts this rank holds (all() in one
  // process) and the MoE layers' combine across the ranks, summed over passes.
  parallel::ExpertRange local_experts() const { return moe_->local_experts(); }
  const parallel::CombineCounters& combine_counters() const { return moe_->combine_counters(); }
  // Times each part of later forward passes into *p (nullptr: off, the default).
  void set_profile(ForwardProfile* p) { profile_ = p; }
  LatentPool make_pool(int64_t num_pages, int64_t page_size = 64, KvDType dtype = KvDType::BF16) const;

  // Runs the batch, appending each sequence's latents to the pool. logits: [rows, vocab].
  // Throws KvCacheExhausted when the pool cannot hold the new tokens, std::invalid_argument
  // for a token id outside the vocabulary.
  void forward(std::span<SeqSlice> batch, LatentPool& pool, const ForwardOptions& opt, std::vector<float>& logits);

  // ---- the MTP module (model/mtp.cpp; DeepSeek-V3 §2.2) ----
  bool has_mtp() const { return !w_.mtp.empty(); }
  // The MTP module's own latent cache: one layer of the model's latent geometry.
  LatentPool make_mtp_pool(int64_t num_pages, int64_t page_size = 64, KvDType dtype = KvDType::BF16) const;
  // Runs the MTP module over a ragged batch: per row h' = eh_proj([enorm(Emb(t_{i+1}));
  // hnorm(h_i)]), its decoder layer (absorbed attention over the sequence's MTP cache, MoE),
  // then shared_head's norm (into *out_hidden when given: [T, hidden], the h of a chained next
  // draft) and its head: logits [rows, vocab], every row's or each sequence's last
  // (last_only). Throws KvCacheExhausted when the MTP pool cannot hold the rows.
  void mtp_forward(std::span<const MtpSlice> batch, LatentPool& pool, bool last_only, std::vector<float>& logits,
                   std::vector<float>* out_hidden = nullptr, const cpu::Context* ctx = nullptr);
  // The head mtp_forward's logits come from. Drafts may be approximate (the verify pass decides
  // with lm_head as stored), so the module may read a copy of its shared head in a cheaper format
  // (tensor/quantize.h, made once here, the search rule, INT4 in groups of 32): BF16 means the
  // head as stored (never widened); a format the head already has, likewise (and INT4 for a
  // hidden size that is not a multiple of 32). Returns the copy's
  // relative RMS error (0 for the head itself).
  double set_mtp_draft_head(quant::QuantFormat f);
  const MatrixView& mtp_draft_head() const;

 private:
  Model() = default;
  // The context of the pass running now (ForwardOptions::context, else the model's).
  const cpu::Context& ctx() const { return *pass_ctx_; }
  // A batch entering the pool: checks every id against the vocabulary, reserves every sequence's
  // pages for its new tokens, all or nothing (KvCacheExhausted naming `cache` when short), and
  // sets the token-packed layout: sequence b's new tokens are rows [first[b], first[b+1]).
  void admit(std::span<const SeqSlice> batch, LatentPool& pool, const char* cache, std::vector<int64_t>& first) const;
  void mlp(const Mlp& m, const float* x, int64_t T, float* out, bool accumulate, const float* row_weights = nullptr);
  // DeepSeek Sparse Attention: the layer's indexer keys cached and each sequence's selection
  // computed into dsa_ (a shared layer keeps the previous layer's).
  void index_layer(const LayerWeights& W, LatentPool& pool, int64_t layer, std::span<SeqSlice> batch, const int64_t* first,
                   const float* x, int64_t T, const int64_t* pos);

  ModelConfig cfg_;
  cpu::Context ctx_;
  const cpu::Context* pass_ctx_ = &ctx_;
  // The weights in the arena that only matmul reads, rewritten where ctx_ reads them in place
  // (Context::repack_weights): bf16 as BF16_PAIRS32, INT4 and INT8 groups as INT4_WORDS16 and
  // INT8_WORDS16; whether any was.
  bool repack_weights();
  std::unique_ptr<Checkpoint> ckpt_;
  ModelWeights w_;
  std::unique_ptr<MlaAttention> mla_;  // the attention of every layer, with its working buffers
  std::unique_ptr<MoeLayer> moe_;      // the MoE of every MoE layer, likewise
  std::unique_ptr<Indexer> indexer_;   // DeepSeek Sparse Attention models: the lightning indexer
  DsaCounters dsa_counters_;
  std::vector<std::vector<Selection>>* capture_sel_ = nullptr;
  // The indexer's activations and each sequence's selection (kept for a following shared layer).
  struct DsaScratch {
    std::vector<float> q, w, k;
    std::vector<Selection> sel;
    std::vector<cpu::KeySelection> views;
  } dsa_;
  MlaCosts costs_{};
  PathCounters counters_;
  AttnPath last_path_ = AttnPath::Auto;
  ForwardProfile* profile_ = nullptr;
  // The MLP and MoE layers' activations (gathered inputs, gate/up, SiLU, outputs): kept between
  // layers and passes, so a prompt does not allocate and zero ~100 MB of fresh pages per layer.
  // Grows to the largest batch seen.
  std::vector<float> mlp_scratch_;
  // The forward pass's own activations (residual stream, normed input, q, latents, attention
  // output, layer output), reused the same way: fresh vectors cost a prompt ~20 ms of page faults.
  // With the attention unit's and the MoE unit's working lists (mla_, moe_), a decode step of a batch no larger
  // than one before it allocates nothing (test Model.DecodeStepsAllocateNothing).
  struct ForwardScratch {
    std::vector<float> h, x, q, kv, attn, delta, xn;
    std::vector<int32_t> ids;
    std::vector<int64_t> rows, first, pos;
    std::vector<SeqShape> shapes;
  } fwd_;
  std::vector<cpu::MatmulJob> mlp_jobs_;
  ForwardScratch mtp_fwd_;  // the MTP pass's activations (model/mtp.cpp)
  // set_mtp_draft_head's copy of the shared head (null: the head as stored).
  std::unique_ptr<quant::QuantizedMatrix> mtp_head_copy_;
  MatrixView mtp_head_view_;
  // Adds the distinct routed experts of the last route() to the profile (when one is set).
  void count_routed_experts(int64_t T);
  std::vector<SeqSlice> mtp_slices_;
};

}  // namespace mla
