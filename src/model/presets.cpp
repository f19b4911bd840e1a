// The one table of model shapes (see presets.h). The released entries are the config.json
// files as published, written down with the fields ModelConfig::from_json reads (architecture
// sizes, routing, RoPE); quantization configs are left out: they do not change the shapes.
#include "model/presets.h"

#include <stdexcept>

namespace mla {

using nlohmann::json;

namespace {

// The YaRN rope_scaling of the releases (original context 4096, beta_slow 1); the
// numbers keep the type the release writes them in.
json yarn(json factor, json beta_fast, json mscale) {
  return json{{"type", "yarn"},
              {"factor", factor},
              {"original_max_position_embeddings", 4096},
              {"beta_fast", beta_fast},
              {"beta_slow", 1},
              {"mscale", mscale},
              {"mscale_all_dim", mscale}};
}

// DeepSeek-V3's config.json: the shape the other releases are written against.
json deepseek_v3() {
  return json{{"model_type", "deepseek_v3"},
              {"vocab_size", 129280},
              {"hidden_size", 7168},
              {"intermediate_size", 18432},
              {"moe_intermediate_size", 2048},
              {"num_hidden_layers", 61},
              {"num_attention_heads", 128},
              {"n_shared_experts", 1},
              {"n_routed_experts", 256},
              {"num_experts_per_tok", 8},
              {"routed_scaling_factor", 2.5},
              {"kv_lora_rank", 512},
              {"q_lora_rank", 1536},
              {"qk_rope_head_dim", 64},
              {"qk_nope_head_dim", 128},
              {"v_head_dim", 128},
              {"topk_method", "noaux_tc"},
              {"scoring_func", "sigmoid"},
              {"n_group", 8},
              {"topk_group", 4},
              {"first_k_dense_replace", 3},
              {"norm_topk_prob", true},
              {"max_position_embeddings", 163840},
              {"rope_theta", 10000},
              {"rope_scaling", yarn(40, 32, 1.0)}};
}

// `base` with the top-level fields of `changes` set (replaced whole, nulls kept).
json with(json base, const json& changes) {
  base.update(changes);
  return base;
}

// DeepSeek-V2: V3's attention, smaller MoE with softmax routing and YaRN mscale 0.707.
json deepseek_v2() {
  return with(deepseek_v3(), {{"model_type", "deepseek_v2"},
                              {"vocab_size", 102400},
                              {"hidden_size", 5120},
                              {"intermediate_size", 12288},
                              {"moe_intermediate_size", 1536},
                              {"num_hidden_layers", 60},
                              {"n_shared_experts", 2},
                              {"n_routed_experts", 160},
                              {"num_experts_per_tok", 6},
                              {"routed_scaling_factor", 16.0},
                              {"topk_method", "group_limited_greedy"},
                              {"scoring_func", "softmax"},
                              {"topk_group", 3},
                              {"first_k_dense_replace", 1},
                              {"norm_topk_prob", false},
                              {"rope_scaling", yarn(40, 32, 0.707)}});
}

// Kimi K2's language model (K2 and K2.5 differ in their context length and YaRN factor).
json kimi_k2_text(int64_t max_positions, double yarn_factor) {
  return with(deepseek_v3(), {{"model_type", "kimi_k2"},
                              {"vocab_size", 163840},
                              {"num_attention_heads", 64},
                              {"n_routed_experts", 384},
                              {"routed_scaling_factor", 2.827},
                              {"n_group", 1},
                              {"topk_group", 1},
                              {"first_k_dense_replace", 1},
                              {"max_position_embeddings", max_positions},
                              {"rope_theta", 50000},
                              {"rope_scaling", yarn(yarn_factor, 1, 1.0)}});
}

// GLM-4.7-Flash: 20 heads whose q/k are 192 + 64 wide and v 256 wide (qk_nope != v); no YaRN.
json glm_47_flash() {
  json c = with(deepseek_v3(), {{"model_type", "glm4_moe_lite"},
                                {"vocab_size", 154880},
                                {"hidden_size", 2048},
                                {"intermediate_size", 10240},
                                {"moe_intermediate_size", 1536},
                                {"num_hidden_layers", 47},
                                {"num_attention_heads", 20},
                                {"n_routed_experts", 64},
                                {"num_experts_per_tok", 4},
                                {"routed_scaling_factor", 1.8},
                                {"q_lora_rank", 768},
                                {"qk_nope_head_dim", 192},
                                {"v_head_dim", 256},
                                {"n_group", 1},
                                {"topk_group", 1},
                                {"first_k_dense_replace", 1},
                                {"rms_norm_eps", 1e-5},
                                {"max_position_embeddings", 202752},
                                {"rope_theta", 1000000}});
  c.erase("rope_scaling");
  return c;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"deepseek-v3", "deepseek-ai/DeepSeek-V3 config.json (V3-0324 and R1 share it)", true, deepseek_v3()},
      {"deepseek-v2", "deepseek-ai/DeepSeek-V2 config.json (V2-Chat and V2.5 share the attention)", true,
       deepseek_v2()},
      {"deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite config.json (q_lora_rank null: plain q_proj)", true,
       with(deepseek_v2(), {{"hidden_size", 2048},
                            {"intermediate_size", 10944},
                            {"moe_intermediate_size", 1408},
                            {"num_hidden_layers", 27},
                            {"num_attention_heads", 16},
                            {"n_routed_experts", 64},
                            {"routed_scaling_factor", 1.0},
                            {"q_lora_rank", nullptr},
                            {"topk_method", "greedy"},
                            {"n_group", 1},
                            {"topk_group", 1}})},
      {"kimi-k2", "moonshotai/Kimi-K2-Instruct config.json (model_type kimi_k2, DeepSeek-V3 architecture, 64 heads)", true,
       kimi_k2_text(131072, 32)},
      // K2.5 wraps the K2 language model under text_config (model_type kimi_k25); its attention
      // is K2's. The RoPE fields follow the 256K-context K2 releases; they do not enter the
      // arithmetic here. The INT4 quantization_config of its experts is left out.
      {"kimi-k2.5",
       "moonshotai/Kimi-K2.5 config.json (model_type kimi_k25, the K2 language model under text_config)", true,
       json{{"model_type", "kimi_k25"}, {"text_config", kimi_k2_text(262144, 64)}}},
      {"glm-4.7-flash", "zai-org/GLM-4.7-Flash config.json (model_type glm4_moe_lite)", true, glm_47_flash()},
      // The CPU benchmark's checkpoint (`mla bench`): DeepSeek-V2-Lite's layer shapes (16 heads,
      // hidden 2048, no q LoRA, 64 routed experts of 1408, 2 shared, top-6 greedy softmax
      // routing) with DeepSeek-V3's vocabulary of 129,280 and no YaRN. Not the release (whose
      // vocabulary is 102,400 with YaRN factor 40, entry deepseek-v2-lite): the peers' GGUFs
      // and every figure recorded for the benchmark were made of exactly this config, so it
      // stays as it is, byte for byte, with num_hidden_layers set per run.
      {kBenchPreset, "mla bench's random checkpoint (V2-Lite layers, V3 vocabulary, no YaRN)", false,
       json{{"architectures", {"DeepseekV2ForCausalLM"}},
            {"model_type", "deepseek_v2"},
            {"vocab_size", 129280},
            {"hidden_size", 2048},
            {"intermediate_size", 10944},
            {"moe_intermediate_size", 1408},
            {"num_hidden_layers", 27},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 16},
            {"n_shared_experts", 2},
            {"n_routed_experts", 64},
            {"routed_scaling_factor", 1.0},
            {"kv_lora_rank", 512},
            {"q_lora_rank", nullptr},
            {"qk_rope_head_dim", 64},
            {"v_head_dim", 128},
            {"qk_nope_head_dim", 128},
            {"topk_method", "greedy"},
            {"scoring_func", "softmax"},
            {"n_group", 1},
            {"topk_group", 1},
            {"num_experts_per_tok", 6},
            {"first_k_dense_replace", 1},
            {"moe_layer_freq", 1},
            {"norm_topk_prob", false},
            {"hidden_act", "silu"},
            {"max_position_embeddings", 163840},
            {"rms_norm_eps", 1e-6},
            {"bos_token_id", 0},
            {"eos_token_id", 1},
            {"tie_word_embeddings", false},
            {"rope_theta", 10000.0},
            {"rope_scaling", nullptr},
            {"torch_dtype", "bfloat16"}}},
  };
  return all;
}


const Preset& find_preset(const std::string& name) {
  for (auto& p : presets())
    if (name == p.name) return p;
  std::string known;
  for (auto& p : presets()) known += std::string(known.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown preset '" + name + "' (" + known + ")");
}

ModelConfig preset_config(const std::string& name) {
  const Preset& p = find_preset(name);
  return ModelConfig::from_json(p.config, std::string("preset ") + p.name);
}

json bench_checkpoint_config(int64_t layers) {
  json config = find_preset(kBenchPreset).config;
  config["num_hidden_layers"] = layers;
  return config;
}

}  // namespace mla
