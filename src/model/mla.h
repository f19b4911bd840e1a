// Multi-head latent attention of one layer (DeepSeek-V2 §2.1; DeepSeek-V3 inference/model.py,
// class MLA), in the paper's and that code's names:
//
//   q          = W_UQ RMSNorm(W_DQ x)  (q_a, q_a_norm, q_b; or q_proj alone)  [H, nope + rope]
//   q_nope     = q_C: the first qk_nope_head_dim values of a head;  q_pe = q_R = RoPE(the rest)
//   [c_KV|k_pe] = W_DKV x (kv_a_proj_with_mqa);  c_KV <- RMSNorm(c_KV);  k_pe = k_R = RoPE(k_pe)
//   cache      : one latent row per token, c_KV (kv_lora_rank) then k_pe (rope), in the pool
//   W_UK[h], W_UV[h]: the two halves of kv_b_proj's rows of head h
//
// and attention over the cached latents in either exact form:
//   expand  (model.py "naive", MHA): k_nope = W_UK c_KV, v = W_UV c_KV for every key (kvx, the
//            expanded K|V), then ordinary multi-head attention of q = [q_nope|q_pe] against
//            [k_nope|k_pe]. Fixed cost per cached token: prefill.
//   chunked : expand over the cached prefix `prefix_chunk` keys at a time, then over the new
//            tokens, the partial results merged by log-sum-exp (the expanded K|V never exceeds
//            one chunk).
//   absorb  (model.py "absorb", MQA): q_nope~ = W_UK^T q_nope, score = q_nope~ . c_KV +
//            q_pe . k_pe, o_lat = sum p c_KV read straight from the cache pages, out = W_UV o_lat.
//            Fixed cost per new token: decode and short extends.
//   reference: the naive form in double over the pool's decoded rows
//            (backend/cpu/attention_reference.h); for `mla verify`, never fast.
//
// The unit keeps its working buffers between calls, so a decode step allocates nothing.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention/attention_reference.h"
#include "backend/cpu/context.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/sparse_attention.h"
#include "kv/latent_pool.h"
#include "model/config.h"
#include "model/path_policy.h"
#include "model/rope.h"
#include "model/weights.h"

namespace mla {

struct SeqSlice {
  PageTable* seq;                 // cached tokens: [0, seq->length); grows by ids.size()
  std::span<const int32_t> ids;   // new tokens
};

// One sequence's keys in the pool: rows [0, cached + n) of `seq` in `layer`, the last n those of
// its new tokens (already written), the queries at positions cached .. cached + n - 1.
struct SeqKeys {
  const LatentPool* pool;
  int64_t layer;
  const PageTable* seq;
  int64_t cached, n;
};

enum class MlaForm { Expand, Chunked, Absorb, Reference };
MlaForm mla_form(AttnPath p);  // Expand, Chunked or Absorb (Auto is not a form: throws)

class MlaAttention {
 public:
  explicit MlaAttention(const ModelConfig& c);

  const Rope& rope() const { return rope_; }
  // The normed q LoRA of the last project() call, [T, q_lora] (empty without q LoRA): the
  // DeepSeek Sparse Attention indexer's query input (model/indexer.h).
  const float* q_a() const { return z_.q_a.data(); }

  // Every product runs in ctx (precision, threads). The layer's queries and latents from its normed input x [T, hidden], token t at position
  // pos[t]: q [T, H, nope + rope] (q_nope, then q_pe rotated) and kv [T, kv_lora + rope] (c_KV
  // normed, then k_pe rotated): the row the cache stores.
  void project(const cpu::Context& ctx, const LayerWeights& W, const float* x, int64_t T, const int64_t* pos, float* q, float* kv);
  // Writes n latent rows kv [n, kv_lora + rope] at positions pos0 .. pos0 + n - 1 of seq.
  void write_cache(LatentPool& pool, int64_t layer, const PageTable& seq, int64_t pos0, int64_t n,
                   const float* kv) const;
  // Every sequence of a batch (token-packed: sequence b's rows are [first[b], first[b+1])) at
  // positions seq->length onwards.
  void write_cache(LatentPool& pool, int64_t layer, std::span<const SeqSlice> batch, const int64_t* first,
                   const float* kv) const;

  // Attention of each sequence of the batch over its cached and new tokens (their rows written,
  // seq->length not yet advanced), in one form. q [T, H, nope + rope]; out [T, H, v].
  void attend(const cpu::Context& ctx, const LayerWeights& W, const LatentPool& pool, int64_t layer, std::span<const SeqSlice> batch,
              const int64_t* first, MlaForm form, int64_t prefix_chunk, const float* q, float* out);
  // One sequence: q [k.n, H, nope + rope] -> out [k.n, H, v].
  void expand(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, const float* q, float* out) { expand_ranges(ctx, W, k, 0, q, out); }
  void chunked(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, int64_t prefix_chunk, const float* q, float* out) {
    expand_ranges(ctx, W, k, std::max<int64_t>(1, prefix_chunk), q, out);
  }
  void absorb(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, const float* q, float* out);
  // The absorbed form's two ends, shared by absorb and absorb_sparse: the queries into latent
  // space (returns z_.q_lat), and the latent outputs through W_UV.
  float* absorb_queries(const cpu::Context& ctx, const LayerWeights& W, const float* q, int64_t n);
  void absorb_values(const cpu::Context& ctx, const LayerWeights& W, int64_t n, float* out);
  cpu::ref::MlaProblem reference_problem(const LayerWeights& W, const SeqKeys& k, const float* q);
  void reference(const LayerWeights& W, const SeqKeys& k, const float* q, float* out);

  // DeepSeek Sparse Attention: attend() with sequence b's queries seeing only the positions of
  // sel[b] (the indexer's top-k; sel[b].pos null: every position, attend()'s dense forms), on
  // the same form: absorb gathers each query's rows, expand and chunked mask the expanded keys.
  void attend_sparse(const cpu::Context& ctx, const LayerWeights& W, const LatentPool& pool, int64_t layer,
                     std::span<const SeqSlice> batch, const int64_t* first, MlaForm form, int64_t prefix_chunk,
                     std::span<const cpu::KeySelection> sel, const float* q, float* out);
  void absorb_sparse(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, const cpu::KeySelection& sel,
                     const float* q, float* out);
  void reference_sparse(const LayerWeights& W, const SeqKeys& k, const cpu::KeySelection& sel, const float* q, float* out);

  // The kernels the expand and absorb forms run on in ctx over a cache of `dtype`
  // (cpu::expand_kernel, cpu::absorb_kernel), e.g. "expand dpbf16, absorb dpbf16": what
  // benchmarks print beside their figures.
  static std::string kernel_names(const cpu::Context& ctx, const ModelConfig& c, KvDType dtype);

  // out [T, hidden] = W_O attn, attn [T, H, v].
  void o_proj(const cpu::Context& ctx, const LayerWeights& W, const float* attn, int64_t T, float* out) const;

 private:
  // Expand over the key ranges: one range of every key (chunk 0), or the cached prefix chunk
  // keys at a time and then the new tokens; the partial results merged by log-sum-exp.
  // With sel, each query sees only its listed positions within each range.
  void expand_ranges(const cpu::Context& ctx, const LayerWeights& W, const SeqKeys& k, int64_t chunk, const float* q, float* out,
                     const cpu::KeySelection* sel = nullptr);

  int64_t H_, nope_, rope_dim_, v_, kv_lora_, q_lora_, hidden_;
  float scale_, eps_;
  Rope rope_;
  struct Scratch {
    std::vector<float> q_a;                          // [T, q_lora]
    std::vector<float> c_kv;                         // [S, kv_lora + rope]: a sequence's latents
    std::vector<float> kvx;                          // [keys, H, nope + v]: expanded K_nope|V
    std::vector<float> part, part_lse, lse;          // a key range's partial result, merged ones
    std::vector<float> q_lat, o_lat;                 // [n, H, kv_lora]: q_nope~ and sum p c_KV
    std::vector<float> kv_b;                         // reference: kv_b_proj in float32
    std::vector<cpu::MatmulJob> jobs;
    std::vector<std::pair<int64_t, int64_t>> ranges;
  } z_;
};

}  // namespace mla
