// A llama.cpp GGUF model file (format/gguf.h) read as the hub checkpoint folder it was converted
// from, so that one loader, one config and one forward pass serve both: the metadata becomes
// config.json's keys (gguf_config_json), the tensors take their hub names (gguf_checkpoint), in
// their stored block formats, nothing dequantized. Architectures: llama.cpp's `deepseek2`
// (DeepSeek-V2 / V3 / R1 / V3.1, Kimi K2, GLM-4.7-Flash) and the sparse-attention `deepseek32`
// and `glm-dsa` (DeepSeek-V3.2, GLM-5).
//
// Tensor names (L: layer, E: expert), GGUF -> hub:
//   token_embd / output_norm / output             -> model.embed_tokens / model.norm / lm_head
//   blk.L.attn_norm, ffn_norm                      -> model.layers.L.input_layernorm, post_attention_layernorm
//   blk.L.attn_q_a, attn_q_a_norm, attn_q_b, attn_q -> self_attn.q_a_proj, q_a_layernorm, q_b_proj, q_proj
//   blk.L.attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b -> self_attn.kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
//   blk.L.attn_k_b [H, kv_lora, nope], attn_v_b [H, v, kv_lora] (llama.cpp's MLA layout since 2025)
//                                                  -> self_attn.k_b_proj, v_b_proj (the loader's W_UK^T, W_UV)
//   blk.L.attn_output                              -> self_attn.o_proj
//   blk.L.ffn_gate / up / down                     -> mlp.gate_proj / up_proj / down_proj
//   blk.L.ffn_gate_inp, exp_probs_b.bias           -> mlp.gate, mlp.gate.e_score_correction_bias
//   blk.L.ffn_{gate,up,down}_exps [E, rows, cols]  -> mlp.experts.E.{gate,up,down}_proj (a view per expert)
//   blk.L.ffn_{gate,up,down}_shexp                 -> mlp.shared_experts.{gate,up,down}_proj
//   blk.L.nextn.{eh_proj,enorm,hnorm,shared_head_norm,shared_head_head} -> the MTP module's
//   blk.L.indexer.{attn_q_b,attn_k,proj,k_norm}    -> self_attn.indexer.{wq_b,wk,weights_proj,k_norm}
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "format/gguf.h"
#include "format/safetensors.h"

namespace mla {

// config.json's equivalent (the keys ModelConfig::from_json reads) from the file's metadata;
// FormatError naming the file and key for an architecture that is not MLA or a missing key.
nlohmann::json gguf_config_json(const GgufFile& f);

// The file's tensors under their hub names, as a Checkpoint (which keeps the file open).
// FormatError for a tensor of a type the engine does not compute on.
std::unique_ptr<Checkpoint> gguf_checkpoint(std::shared_ptr<const GgufFile> f);

// The checkpoint `path` names: a GGUF model (gguf_path: a .gguf file, the first part of a
// split set, or a folder holding one) or a hub checkpoint folder.
std::unique_ptr<Checkpoint> open_checkpoint(const std::string& path);

// The GGUF name of a hub tensor name, for messages ("" when it has none).
std::string gguf_tensor_name(const std::string& hub_name);

}  // namespace mla
