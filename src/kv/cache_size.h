// The one place for KV-cache size arithmetic: the latent row of MLA in each cache format, the
// expanded K/V of the same attention written as plain MHA, and the DeepSeek-V2 paper's MHA /
// GQA / MQA accounting. The pool, `mla analyze`, `mla verify`, `mla bench` and the demo take
// their figures from here.
#pragma once
#include <cstdint>

namespace mla {

enum class KvDType {
  F32,   // reference
  BF16,  // default
  FP8,   // latent as e4m3 with one float32 scale per 128 values, then k_pe in bf16 (FlashMLA layout)
};

// The sizes of attention that the cache depends on (ModelConfig's fields of the same names).
struct CacheShape {
  int64_t layers = 0, heads = 0;
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;

  template <class Config>  // ModelConfig, or anything with its field names
  static constexpr CacheShape of(const Config& c) {
    return {c.num_hidden_layers, c.num_attention_heads, c.kv_lora_rank,
            c.qk_nope_head_dim,  c.qk_rope_head_dim,    c.v_head_dim};
  }
};

// ---- the latent cache (one row per token and layer: c_KV then k_pe)

constexpr int64_t latent_row_elems(int64_t kv_lora_rank, int64_t rope_dim) { return kv_lora_rank + rope_dim; }

// Bytes of one latent row: 4 or 2 bytes a value in f32 / bf16; in fp8 one e4m3 byte per c_KV
// value, one float32 scale per 128 of them, and k_pe in bf16 (512 + 64 -> 656 bytes).
constexpr int64_t latent_row_bytes(int64_t kv_lora_rank, int64_t rope_dim, KvDType dtype) {
  switch (dtype) {
    case KvDType::F32: return latent_row_elems(kv_lora_rank, rope_dim) * 4;
    case KvDType::BF16: return latent_row_elems(kv_lora_rank, rope_dim) * 2;
    case KvDType::FP8: return kv_lora_rank + (kv_lora_rank + 127) / 128 * 4 + rope_dim * 2;
  }
  return 0;
}

constexpr int64_t latent_bytes_per_token(const CacheShape& s, KvDType dtype) {  // all layers
  return latent_row_bytes(s.kv_lora_rank, s.qk_rope_head_dim, dtype) * s.layers;
}
constexpr int64_t latent_bytes_per_page(const CacheShape& s, KvDType dtype, int64_t page_size) {  // all layers
  return latent_bytes_per_token(s, dtype) * page_size;
}

// ---- the indexer keys of DeepSeek Sparse Attention (index_head_dim values per token and layer,
// beside the latent row under the same page table): 4 or 2 bytes a value in f32 / bf16; in fp8
// one e4m3 byte a value and one float32 scale per 128 of them (DeepSeek-V3.2's k_cache and
// k_scale_cache: 128 -> 132 bytes).

constexpr int64_t index_row_bytes(int64_t index_dim, KvDType dtype) {
  if (index_dim <= 0) return 0;
  switch (dtype) {
    case KvDType::F32: return index_dim * 4;
    case KvDType::BF16: return index_dim * 2;
    case KvDType::FP8: return index_dim + (index_dim + 127) / 128 * 4;
  }
  return 0;
}

// Pages of page_size tokens that hold `tokens` tokens.
constexpr int64_t pages_for_tokens(int64_t tokens, int64_t page_size) { return (tokens + page_size - 1) / page_size; }

// ---- the expanded cache (MHA form: per head a key of qk_nope + qk_rope and a value of v_head_dim)

constexpr int64_t expanded_elems_per_layer(const CacheShape& s) {
  return s.heads * (s.qk_nope_head_dim + s.qk_rope_head_dim) + s.heads * s.v_head_dim;
}
// The element width an expanded cache would have beside a latent cache of this format: f32 for
// an f32 cache, 2 bytes (bf16) otherwise.
constexpr int64_t expanded_elem_bytes(KvDType dtype) { return dtype == KvDType::F32 ? 4 : 2; }
constexpr int64_t expanded_bytes_per_token(const CacheShape& s, int64_t elem_bytes) {  // all layers
  return expanded_elems_per_layer(s) * elem_bytes * s.layers;
}

// ---- the DeepSeek-V2 paper's Table 1: elements per token and layer, keys and values of head
// size d_h = qk_nope_head_dim (MLA itself is latent_row_elems: d_c + d_h^R)

constexpr int64_t mha_elems_per_layer(const CacheShape& s) { return 2 * s.heads * s.qk_nope_head_dim; }
constexpr int64_t gqa_elems_per_layer(const CacheShape& s, int64_t groups) { return 2 * groups * s.qk_nope_head_dim; }
constexpr int64_t mqa_elems_per_layer(const CacheShape& s) { return 2 * s.qk_nope_head_dim; }

}  // namespace mla
