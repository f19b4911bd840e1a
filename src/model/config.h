// The model configuration of an MLA checkpoint, read from config.json for every family:
// deepseek_v2, deepseek_v3, kimi_k2, kimi_k25 (a wrapper whose language model is under
// text_config and whose weights carry the "language_model." prefix), glm4_moe_lite, and the
// DeepSeek Sparse Attention families deepseek_v32 and glm_moe_dsa (MLA plus a lightning indexer).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mla {

enum class ScoringFunc { Softmax, Sigmoid };
enum class TopkMethod { Greedy, GroupLimitedGreedy, NoauxTc };

struct RopeScaling {
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1, mscale_all_dim = 0;
};

// compressed-tensors pack-quantized INT4 (Kimi K2.5 / K2 Thinking routed experts).
struct Int4Quant {
  bool enabled = false;
  int group_size = 32;
  std::vector<std::string> ignore;  // plain names and "re:" regular expressions
  // The INT4 groups' targets: "Linear" (every layer not ignored) or names and "re:" patterns
  // (compressed-tensors' mixed-precision configs: INT4 experts beside an FP8 group). Empty: all.
  std::vector<std::string> targets;
};

struct ModelConfig {
  std::string model_type;     // as in config.json (the wrapper's, for kimi_k25)
  std::string weight_prefix;  // "" or "language_model."
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, moe_intermediate_size = 0;
  int64_t num_hidden_layers = 0, num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q LoRA (q_proj)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0;
  int64_t n_group = 1, topk_group = 1, first_k_dense_replace = 0, moe_layer_freq = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring_func = ScoringFunc::Sigmoid;
  TopkMethod topk_method = TopkMethod::NoauxTc;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  bool fp8_block_weights = false;  // quantization_config quant_method fp8, 128x128 blocks
  Int4Quant int4;
  // compressed-tensors int-quantized INT8 groups (num_bits 8, symmetric, strategy group): the
  // group size; 0 when the config has no such group. The loader tells those tensors by their
  // dtype (I8 weight, BF16 weight_scale).
  int int8_group_size = 0;
  bool ue8m0_scales = false;  // quantization_config scale_fmt "ue8m0": block scales are powers of two

  // DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa; model/indexer.h): the lightning
  // indexer's sizes. index_topk 0: dense MLA (every other family).
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  bool indexer_rope_interleave = false;  // (even, odd) RoPE pairs in the indexer; false: halves (NeoX)
  std::vector<bool> indexer_shared;      // per layer: runs no indexer, reuses the previous layer's top-k

  // Multi-token prediction modules after the decoder layers (DeepSeek-V3, GLM-4.7-Flash: 1),
  // layers num_hidden_layers .. + num_nextn_predict_layers - 1 of the checkpoint.
  int64_t num_nextn_predict_layers = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool dsa() const { return index_topk > 0; }
  // Indexer key values cached per token and layer beside the latent (0 for dense MLA).
  int64_t index_cache_dim() const { return dsa() ? index_head_dim : 0; }
  bool is_moe_layer(int64_t l) const {
    return n_routed_experts > 0 && l >= first_k_dense_replace && l % moe_layer_freq == 0;
  }
  // The softmax scale of attention: (qk_nope + qk_rope)^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN.
  double softmax_scale() const;

  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static ModelConfig load(const std::string& model_dir);  // model_dir/config.json
};

double yarn_mscale(double scale, double mscale);

}  // namespace mla
