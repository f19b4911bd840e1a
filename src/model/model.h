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
#include "model/forward_observer.h"
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

struct LoadOptions {
  cpu::Context ctx;
  bool show_progress = false;
  LoadQuantization quantize;
  bool with_mtp = false;
  // The job's ranks (parallel/comm.h): with more than one, every rank must load the same
  // checkpoint, holds its block of the routed experts (parallel/expert_parallel.h) and the MoE
  // layers combine across the ranks. Null: one process.
  parallel::Comm* comm = nullptr;
};

class Model {
 public:
  // Loads a checkpoint folder. The model keeps ctx and runs every kernel of its forward passes
  // in it (precision, threads, dispatch thresholds; backend/cpu/context.h); ctx.weights decides
  // whether the weights are copied onto huge pages. With show_progress, reads the weights in
  // once up front and draws a progress line on standard error (for terminals; multi-gigabyte
  // checkpoints).
  // with_mtp: also loads the checkpoint's MTP module where it has one (has_mtp()).
  // In one process; under mpirun the job's ranks are handed in LoadOptions::comm.
  static std::unique_ptr<Model> load(const std::string& dir, const cpu::Context& ctx = {}, bool show_progress = false,
                                     bool with_mtp = false);
  // The same, quantizing weights as they are loaded (LoadQuantization, model/weights.h): the
  // weights are read tensor by tensor from the mapping (no read-in of the whole checkpoint up
  // front), and with show_progress a progress line shows the conversion.
  static std::unique_ptr<Model> load(const std::string& dir, const cpu::Context& ctx, bool show_progress,
                                     const LoadQuantization& quantize, bool with_mtp = false);
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& opt);

  const ModelConfig& config() const { return cfg_; }
  const cpu::Context& context() const { return ctx_; }
  // Whether load rewrote weights into the kernels' order (repack.h: bf16 as column pairs, INT4 in
  // blocks of 16 rows): context().repack_weights, which load sets to what happened.
  bool weights_repacked() const { return ctx_.repack_weights; }
  const ModelWeights& weights() const { return w_; }
  const PathCounters& path_counters() const { return counters_; }
  const DsaCounters& dsa_counters() const { return dsa_counters_; }
  AttnPath last_path() const { return last_path_; }
  // Which schedule the MoE layers' experts ran on (layer calls, summed over passes).
  const MoeCounters& moe_counters() const { return moe_->counters(); }
  void set_expert_schedule(ExpertSchedule s) { moe_->set_schedule(s); }
  // Expert-parallel runs (mpirun -np N): the routed experts this rank holds (all() in one
  // process) and the MoE layers' combine across the ranks, summed over passes.
  parallel::ExpertRange local_experts() const { return moe_->local_experts(); }
  const parallel::CombineCounters& combine_counters() const { return moe_->combine_counters(); }
  // Shows later forward passes (and MTP passes) to *o (model/forward_observer.h: profiles,
  // captures, the pass log); nullptr: none, the default. One observer at a time.
  void set_observer(ForwardObserver* o) { observer_ = o; }
  ForwardObserver* observer() const { return observer_; }
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
  // One pass as its decoder layers see it: the batch, the token-packed rows and their positions
  // (in the scratch f), the attention's form, and whether it attends sparsely (DSA).
  struct ForwardScratch;
  struct Pass {
    std::span<SeqSlice> batch;
    LatentPool& pool;
    ForwardScratch& f;
    int64_t T;
    MlaForm form;
    int64_t prefix_chunk;
    bool sparse;
  };
  // h += o_proj(attention(norm(h))) of one decoder layer, its latents in `cache_layer` of the
  // pool; f.delta keeps the attention's output.
  void attention_block(const Pass& p, const LayerWeights& W, int64_t cache_layer);
  // h += ffn(norm(h)): the routed and shared experts where the layer is MoE, else its dense MLP.
  void ffn_block(const Pass& p, const LayerWeights& W);
  // h += delta over the pass's rows.
  void add_residual(const Pass& p);
  static PassShape pass_shape(std::span<const SeqShape> shapes, AttnPath path, bool chosen);
  // The token embeddings of the pass's ids into f.h (and the scratch sized to the pass).
  void embed(const Pass& p);
  // The rows that get logits (f.rows): opt.logits_last, else each sequence's last or every row.
  void logits_rows(const Pass& p, const ForwardOptions& opt);
  // The final norm of those rows (f.xn) and lm_head: logits [rows, vocab].
  void head(const Pass& p, std::vector<float>& logits);
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
  // The indexer's activations and each sequence's selection (kept for a following shared layer).
  struct DsaScratch {
    std::vector<float> q, w, k;
    std::vector<TokenSelection> sel;
    std::vector<cpu::KeySelection> views;
  } dsa_;
  MlaCosts costs_{};
  PathCounters counters_;
  AttnPath last_path_ = AttnPath::Auto;
  ForwardObserver* observer_ = nullptr;
  void enter(ForwardProfile::Part part) const {
    if (observer_) observer_->enter(part);
  }
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
  std::vector<SeqSlice> mtp_slices_;
};

// Installs an observer on a model for the scope's life, then puts back the one before.
class ScopedObserver {
 public:
  ScopedObserver(Model& model, ForwardObserver* o) : model_(model), before_(model.observer()) { model.set_observer(o); }
  ~ScopedObserver() { model_.set_observer(before_); }
  ScopedObserver(const ScopedObserver&) = delete;
  ScopedObserver& operator=(const ScopedObserver&) = delete;

 private:
  Model& model_;
  ForwardObserver* before_;
};

}  // namespace mla
