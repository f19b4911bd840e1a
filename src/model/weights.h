// The weights of an MLA model as views into the memory-mapped checkpoint, checked against the
// config at load. Each projection is a MatrixView in its stored format (BF16, F16, F32, block
// FP8 with its scale_inv, or compressed-tensors INT4); norms and biases are float32 copies.
// Weight absorption happens here: kv_b_proj is split per head into W_UK and W_UV.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/config.h"
#include "parallel/expert_parallel.h"
#include "tensor/matrix.h"
#include "tensor/quantize.h"

namespace mla {

namespace cpu {
class WeightArena;
}

struct Mlp {  // SiLU-gated: down(silu(gate x) * up x)
  MatrixView gate, up, down;
};

// DeepSeek Sparse Attention's lightning indexer of one layer (self_attn.indexer.*; model/indexer.h).
struct IndexerWeights {
  bool present = false;          // false: dense MLA, or a layer that shares the previous layer's top-k
  MatrixView wq_b;               // [index_n_heads * index_head_dim, q_lora_rank]
  MatrixView wk;                 // [index_head_dim, hidden]
  MatrixView weights_proj;       // [index_n_heads, hidden]
  std::vector<float> k_norm, k_norm_bias;  // LayerNorm [index_head_dim]
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;
  // attention
  MatrixView q_a, q_b, q;  // q LoRA (q_a, q_b) or plain q_proj (q)
  std::vector<float> q_a_norm;
  MatrixView kv_a;  // [kv_lora + rope, hidden]
  std::vector<float> kv_a_norm;
  MatrixView kv_b;  // [H * (nope + v), kv_lora]: expand path
  // absorb path: per head h, w_uk_t[h] is W_UK^T [kv_lora, nope] (so q_lat = w_uk_t q_nope) and
  // w_uv[h] is W_UV [v, kv_lora] (rows of kv_b, no copy).
  std::vector<MatrixView> w_uk_t, w_uv;
  MatrixView o;
  IndexerWeights indexer;
  // feed-forward
  bool moe = false;
  Mlp dense;                 // dense layers
  MatrixView router;         // [n_routed, hidden]
  std::vector<float> router_bias;  // e_score_correction_bias, empty when absent
  std::vector<Mlp> experts;  // routed
  Mlp shared;                // n_shared experts fused (rows n_shared * moe_intermediate); empty if none
  bool has_shared = false;
};

// The multi-token prediction module of DeepSeek-V3 §2.2 (the checkpoint's layer
// num_hidden_layers): h' = eh_proj([enorm(Emb(t_{i+1})); hnorm(h_i)]), one decoder layer (MLA
// attention with its own latent cache, MoE), then shared_head: norm and the output head (the
// main lm_head when the checkpoint has no shared_head.head). Embeddings are the main model's.
struct MtpWeights {
  std::vector<float> enorm, hnorm, head_norm;
  MatrixView eh_proj;  // [hidden, 2 hidden]: columns [0, hidden) read the embedding
  MatrixView head;     // [vocab, hidden]
  LayerWeights layer;
};

struct ModelWeights {
  MatrixView embed, lm_head;
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;  // loaded only when asked (load_weights' with_mtp) and present
  // Resident bytes by storage format (weights in memory, scales included).
  std::map<std::string, size_t> bytes_by_format;
  // Storage of the weights the loader derives (W_UK^T); the views above point into it.
  std::vector<std::unique_ptr<std::vector<uint8_t>>> owned;
  // Set when Model::load copied the weights onto huge pages (backend/cpu/weight_memory.h): the
  // views then point into it, not into the memory-mapped checkpoint.
  std::shared_ptr<cpu::WeightArena> arena;
  // Quantized at load (LoadQuantization): per weight class (weight_class_name), the squared
  // error and the squared values of the weights converted, and how many tensors.
  struct QuantError {
    double err2 = 0, ref2 = 0;
    int64_t tensors = 0;
  };
  std::map<std::string, QuantError> quantized;
};

// The parts of the model a quantization treats alike, told from a weight's name (without
// ".weight"): routed experts, attention projections, shared experts, dense MLPs, and the token
// embeddings with lm_head. Anything else (the MoE router, norms) is None and never quantized.
enum class WeightClass { None, RoutedExperts, Attention, SharedExperts, DenseMlp, EmbedHead };
WeightClass weight_class(const std::string& base);
const char* weight_class_name(WeightClass c);  // "routed experts", "attention", ...

// Target formats by class for `mla quantize` and quantize-at-load: experts for the routed
// experts; others for attention, shared experts and dense MLPs; embed_head for the embeddings
// and lm_head. Unset: the weights stay as stored.
struct LoadQuantization {
  std::optional<quant::QuantFormat> experts, others, embed_head;
  quant::ScaleRule rule = quant::ScaleRule::Search;
  int64_t group_size = 32;  // INT4 and INT8
  bool any() const { return experts || others || embed_head; }
  std::optional<quant::QuantFormat> target(WeightClass c) const;
  // "experts=int4,others=fp8[,embed=fp8]" (int8 for any class): throws std::invalid_argument naming the bad part.
  static LoadQuantization parse(const std::string& spec);
  std::string str() const;  // the same form
};

// "<total> GB resident: <format> <GB>, ..." from bytes_by_format, largest first.
std::string weight_bytes_summary(const ModelWeights& w);

// Loads and checks every weight the config calls for; throws FormatError naming the tensor.
// with_mtp: also the first MTP module, where the checkpoint has one (config
// num_nextn_predict_layers > 0 and layer num_hidden_layers' eh_proj present).
// experts: the routed experts this process holds (parallel/expert_parallel.h); the others stay
// empty views (rows 0, no data), their tensors neither checked nor read, nor counted in
// bytes_by_format.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, bool with_mtp = false,
                          parallel::ExpertRange experts = {});
// Whether the checkpoint holds the first MTP module (model.layers.<num_hidden_layers>.eh_proj).
bool has_mtp_module(const Checkpoint& ckpt, const ModelConfig& cfg);

// llama.cpp's MLA layout (model/gguf_model.h) as the hub's kv_b [H (nope + v), kv_lora], in
// float32: per head h, W_UK (the rows h kv_lora .. of uk_t [H kv_lora, nope], W_UK^T, transposed
// back) then W_UV's rows (rows h v .. of uv [H v, kv_lora]). The loader derives the expanded
// path's kv_b from it, `mla quantize` the folder's kv_b_proj.
std::vector<float> kv_b_from_heads(const MatrixView& uk_t, const MatrixView& uv, int64_t heads);
// The same, converting each weight of a class `quantize` gives a format to it as it is loaded,
// one tensor at a time (tensor/quantize.h: dequantized a band of rows at a time, quantized with
// the scale search); the mapped pages of the tensor read are released after it, so resident
// memory grows by the quantized bytes, not by the checkpoint's. `progress`, when set, is
// called after each tensor with the checkpoint bytes read so far and in all.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const LoadQuantization& quantize,
                          const std::function<void(size_t done, size_t total)>& progress = {}, bool with_mtp = false,
                          parallel::ExpertRange experts = {});

}  // namespace mla
