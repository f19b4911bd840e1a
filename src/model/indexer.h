// The lightning indexer of DeepSeek Sparse Attention (DSA), one layer: for each query it picks
// the index_topk cached positions that the layer's MLA attends (model/mla.h attends only those).
// Families: DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa).
//
// Semantics, from DeepSeek-V3.2-Exp inference/model.py (class Indexer) and kernel.py
// (act_quant, fp8_index), checked against transformers' glm_moe_dsa / deepseek_v32 and vLLM's
// deepseek_v2.py sparse indexer:
//   tensors     self_attn.indexer.wq_b [n_heads * head_dim, q_lora_rank], wk [head_dim, hidden]
//               (both block-FP8 in the releases, 128x128 scale_inv, ue8m0 power-of-two scales in
//               V3.2), k_norm.weight / k_norm.bias (float32 LayerNorm, eps 1e-6), weights_proj
//               [n_heads, hidden] (kept unquantized: bf16 in the checkpoints, float32 in
//               DeepSeek's code).
//   inputs      qr = q_a_layernorm(q_a_proj(x)), the MLA's own normed q LoRA, and x, the layer's
//               normed input.
//   q, k        q = wq_b(qr) per head, k = LayerNorm(wk(x)); each split [rope | rest]: RoPE on the
//               FIRST qk_rope_head_dim values (the MLA puts its rope values last), with the MLA's
//               frequencies (YaRN included) and positions. Pairing differs from the MLA's: the
//               indexer rotates halves (i, i + d/2; NeoX) unless indexer_rope_interleave (GLM-5.x
//               sets it; vLLM: is_neox_style = not indexer_rope_interleave). DeepSeek fixed its
//               demo code to halves on 2025-11-17; the MLA itself stays interleaved.
//   Hadamard    q and k times the Walsh-Hadamard matrix scaled head_dim^-0.5 (rotate_activation).
//               It is orthogonal, so exact scores do not change; it spreads outliers before the
//               FP8 quantization, so the cache stores rotated keys.
//   score       I[t, s] = sum_h w[t, h] relu(q[t, h] . k[s]), with w = weights_proj(x) *
//               n_heads^-0.5 * head_dim^-0.5 (softmax_scale); no softmax, no bias.
//   selection   top min(index_topk, end_pos) of I[t, :] over s <= t (prefill adds the causal
//               mask before the top-k); attention adds -inf outside the selected set on top of
//               the causal mask, so a query with t + 1 <= index_topk attends densely. Ties: the
//               lower position first here (torch's topk leaves their order unspecified).
//   FP8 (official code): q and k quantized to e4m3 with one scale per 128 values (act_quant,
//               ue8m0 scales when scale_fmt says so), the key cache stored as FP8 + float32
//               scale, the score computed by fp8_index in FP8 with the q scale folded into w.
//               This unit scores in float32 (in the fast precision on AMX tiles or VDPBF16PS:
//               q rounded to bf16, sums in float32; backend/cpu/index_score.h); the pool's fp8
//               format stores the key as e4m3 with one float32 scale per 128 values like
//               DeepSeek's k_cache / k_scale_cache, by the same act_quant rule. With
//               cpu::Context::fp8_indexer, project() rounds q and k as act_quant does, so that
//               the scores are the official FP8 ones (e4m3 x e4m3 products are exact in
//               float32; the scales are positive, so they pass through the ReLU) up to the
//               float32 summation order; the fp8 cache then stores the key unchanged (within a
//               float32 rounding of its scale where scales are not powers of two).
//   GLM-5.x     indexer_types per layer ("full" / "shared"; or index_topk_pattern, or
//               index_topk_freq with index_skip_topk_offset, transformers' schedule): a shared
//               layer runs no indexer and reuses the previous layer's selection.
//
// The keys live in the paged latent pool beside each latent row (LatentPool::write_index), so
// prefix sharing, forks and preemption carry them. Below index_topk tokens of context the
// selection is every position: the caller skips the pass (needed()) and attends densely.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/context.h"
#include "backend/cpu/index_score.h"
#include "kv/latent_pool.h"
#include "model/config.h"
#include "model/mla.h"
#include "model/rope.h"
#include "model/weights.h"

namespace mla {

class Indexer {
 public:
  explicit Indexer(const ModelConfig& c);

  int64_t n_heads() const { return Hi_; }
  int64_t head_dim() const { return D_; }
  int64_t topk() const { return topk_; }
  // Whether a sequence with `cached` tokens and n new ones needs a selection (its last query
  // sees more than index_topk positions).
  bool needed(int64_t cached, int64_t n) const { return cached + n > topk_; }

  // From the normed layer input x [T, hidden] and the normed q LoRA qr [T, q_lora] of tokens at
  // positions pos: q [T, n_heads, head_dim] and k [T, head_dim] (rotated by RoPE and the
  // Hadamard; rounded to FP8 values with ctx.fp8_indexer), w [T, n_heads] (the head weights
  // with both scales).
  void project(const cpu::Context& ctx, const IndexerWeights& W, const float* x, const float* qr, int64_t T,
               const int64_t* pos, float* q, float* w, float* k);
  // Every sequence's new keys at positions seq->length onwards (token-packed as in MlaAttention).
  void write_cache(LatentPool& pool, int64_t layer, std::span<const SeqSlice> batch, const int64_t* first,
                   const float* k) const;
  // The selection of one sequence's k.n queries (positions k.cached ..): sel [k.n, topk()]
  // ascending positions, count[i] = min(topk(), k.cached + i + 1) of them valid. Each query
  // scores its visible keys straight from the pool's pages on the kernel ctx dispatches
  // (cpu::index_kernel: in the fast precision AMX tiles or VDPBF16PS with q in bf16, else
  // float32) and keeps the top-k by a radix select (backend/cpu/index_score.h).
  void select(const cpu::Context& ctx, const SeqKeys& k, const float* q, const float* w, int32_t* sel, int64_t* count);
  // The same selection from the keys decoded to float32, sgemm and nth_element: the plain
  // reference select() is held to.
  void select_reference(const cpu::Context& ctx, const SeqKeys& k, const float* q, const float* w, int32_t* sel,
                        int64_t* count);
  // The kernel select() scores on in ctx (the reference's float32 where none fits head_dim).
  cpu::IndexKernel kernel(const cpu::Context& ctx) const;

 private:
  int64_t Hi_, D_, rope_dim_, topk_, hidden_, q_lora_;
  bool interleave_, pow2_scales_;
  Rope rope_;
  std::vector<float> keys_, scores_, qk_;  // a sequence's keys [S, D]; combined scores; per-head dots
  std::vector<int32_t> order_;
  cpu::IndexQuery query_;  // the query being scored, in its kernel's layout
};

// In-place Walsh-Hadamard transform of n values (n a power of two), scaled n^-0.5.
void hadamard_inplace(float* x, int64_t n);

}  // namespace mla
