// Plain references beside the CPU attention kernels (attention.h): one (query, head) row at a
// time, sums in double, the causal mask and the log-sum-exp written out; nothing blocked, split
// across threads, streamed or rounded. tests/backend/test_attention.cpp holds every fast path
// to these; `mla verify` runs the model with mla_naive as its reference attention.
//
// Notation (DeepSeek-V2 §2.1, DeepSeek-V3 inference/model.py): per key j the cache holds c_KV[j]
// (kv_lora values) and the rotated shared key k_pe[j] (rope values); per head h, W_UK[h]
// [nope, kv_lora] and W_UV[h] [v, kv_lora] are the two halves of kv_b_proj's rows. Query t of
// head h is q_nope[t, h] (nope values) then the rotated q_pe[t, h] (rope values). Query t sits
// at position q_pos0 + t, key j at k_pos0 + j; a key is visible when its position is <= the
// query's.
#pragma once
#include <cstdint>

#include "backend/cpu/attention.h"
#include "backend/cpu/sparse_attention.h"
#include "kv/latent_pool.h"

namespace mla::cpu::ref {

// Where a reference reads key j's latent row (c_KV then k_pe, kv_lora + rope floats): float32
// rows in memory, or a sequence's rows in the pool's pages, found through its page table and
// decoded by the pool itself (LatentPool::gather: f32, bf16, or fp8 e4m3 with one float32 scale
// per 128 values and k_pe in bf16).
class LatentRows {
 public:
  LatentRows(const float* rows, int64_t dim, int64_t ld) : rows_(rows), dim_(dim), ld_(ld) {}
  LatentRows(const LatentPool& pool, int64_t layer, const PageTable& seq)
      : pool_(&pool), layer_(layer), seq_(&seq), dim_(pool.row_dim()) {}
  int64_t dim() const { return dim_; }
  void row(int64_t j, float* out) const;

 private:
  const float* rows_ = nullptr;
  const LatentPool* pool_ = nullptr;
  int64_t layer_ = 0;
  const PageTable* seq_ = nullptr;
  int64_t dim_ = 0, ld_ = 0;
};

// cpu::attention_expand's contract: a.q against the expanded keys [a.kv's K_nope | a.k_pe] and
// values a.kv's V. out [T, H, v], lse [T, H] (-inf and a zero row where no key is visible).
void attention_expand(const ExpandArgs& a, float* out, float* lse);

// cpu::attention_absorb's contract over the latent rows `keys` (a.latent and a.gather are not
// read): score = scale (q_lat . c_KV + q_pe . k_pe), out_lat [T, H, kv_lora] = sum p c_KV.
void attention_absorb(const AbsorbArgs& a, const LatentRows& keys, float* out_lat, float* lse);

// The whole attention of one sequence from its latents, as DeepSeek's MLA computes it either way.
struct MlaProblem {
  const float* q;     // [T, H, nope + rope]: q_nope then q_pe (rotated)
  const float* kv_b;  // [H (nope + v), kv_lora]: per head W_UK[h]'s rows, then W_UV[h]'s
  int64_t T, S, H, nope, rope, v, kv_lora;
  int64_t q_pos0, k_pos0;
  float scale;
};
// model.py's "naive" form (MHA): k_nope[j, h] = W_UK[h] c_KV[j], v[j, h] = W_UV[h] c_KV[j];
// score = scale (q_nope . k_nope + q_pe . k_pe); out[t, h] = sum_j p v[j, h]. out [T, H, v].
void mla_naive(const MlaProblem& p, const LatentRows& keys, float* out, float* lse);
// model.py's "absorb" form (MQA): q_nope~[t, h] = W_UK[h]^T q_nope[t, h]; score = scale
// (q_nope~ . c_KV + q_pe . k_pe); out[t, h] = W_UV[h] sum_j p c_KV[j]. Equal to mla_naive up to
// double rounding.
void mla_absorb(const MlaProblem& p, const LatentRows& keys, float* out, float* lse);
// mla_naive over each query's listed positions only (DeepSeek Sparse Attention's top-k:
// sparse_attention.h's KeySelection, positions in [k_pos0, k_pos0 + S)); the causal rule is the
// selection's.
void mla_naive_sparse(const MlaProblem& p, const LatentRows& keys, const KeySelection& sel, float* out, float* lse);

}  // namespace mla::cpu::ref
