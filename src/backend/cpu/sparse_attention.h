// MLA attention over each query's own list of key positions (DeepSeek Sparse Attention: the
// lightning indexer's top-k, model/indexer.h), both exact algorithms, float32:
//  absorb: every head of query t attends the latent rows (c_KV | k_pe) at t's positions,
//          gathered from the cache pages; score = scale (q_lat . c_KV + q_pe . k_pe),
//          out_lat = sum p c_KV (the MQA form of attention.h's attention_absorb);
//  expand: the MHA form over a range of expanded keys (attention.h's ExpandArgs), each query
//          seeing only its listed positions that fall in the range, so a chunked prefix merges
//          by log-sum-exp exactly as dense chunks do.
// A query's positions are ascending and at most its own position (the indexer's selection is
// causal). The plain references are attention_reference.h's mla_naive_sparse.
#pragma once
#include <cstdint>
#include <functional>

#include "backend/cpu/attention.h"
#include "backend/cpu/context.h"

namespace mla::cpu {

// Query t's keys: positions pos[t * ld + j] for j < count[t], ascending.
struct KeySelection {
  const int32_t* pos;
  int64_t ld;
  const int64_t* count;
};

struct SparseAbsorbArgs {
  const float* q_lat;  // [T, H, kv_lora]
  const float* q_pe;   // [T, H, rope], row stride ld_qpe between tokens, head_stride_qpe between heads
  int64_t ld_qpe, head_stride_qpe;
  int64_t T, H, kv_lora, rope;
  float scale;
  KeySelection sel;
  // Writes the latent rows at n positions as float32 rows of kv_lora + rope (LatentPool::gather_at);
  // called from several threads at once on disjoint lists.
  std::function<void(const int32_t* pos, int64_t n, float* rows)> gather;
};
// out_lat [T, H, kv_lora]; lse [T, H] (-inf and a zero row for a query with no position).
// Each query runs attention_absorb (the dense absorbed kernel: blocks of rows, online softmax,
// long lists split over ctx's threads) over its listed rows.
void attention_absorb_sparse(const Context& ctx, const SparseAbsorbArgs& a, float* out_lat, float* lse);

// a's keys are positions a.k_pos0 .. a.k_pos0 + a.S - 1; query t sees those of sel's list.
// out [T, H, v]; lse [T, H] (-inf and a zero row where none of a query's positions is in range).
void attention_expand_sparse(const Context& ctx, const ExpandArgs& a, const KeySelection& sel, float* out, float* lse);

}  // namespace mla::cpu
