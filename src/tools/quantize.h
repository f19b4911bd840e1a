// `mla quantize`: rewrites a checkpoint with its weights quantized by class (routed experts to
// INT4, INT8 or FP8, the other projections to INT8 or FP8, optionally the embeddings and lm_head
// to INT8 or FP8), in
// the hub layout `mla` and compressed-tensors read: sharded safetensors with
// model.safetensors.index.json, config.json whose quantization_config says exactly which layers
// are in which format, the tokenizer and generation files copied. Tensors are produced one at a
// time from the memory-mapped input (never the whole model in memory). Also the measures of
// what quantization cost: relative RMS error per weight class, and the distance of the
// quantized model's logits to the original's over teacher-forced positions.
//
// The input may be a llama.cpp GGUF file (model/gguf_model.h) instead of a hub folder: its
// tensors in ggml block formats (Q4_K ...) become their class's target, else bf16 (a hub folder
// cannot hold a block format); llama.cpp's split MLA layout (k_b_proj / v_b_proj) becomes the
// hub's kv_b_proj, an attention weight; config.json and generation_config.json come from the
// metadata. Its tokenizer is not converted yet (a note in the report says so).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/weights.h"

namespace mla {

struct QuantizeOptions {
  std::string in, out;  // in: a hub checkpoint folder or a GGUF file (gguf_path)
  LoadQuantization formats;  // experts, others, embed_head; unset classes stay as stored (GGUF block formats: bf16)
  size_t shard_bytes = size_t(4) << 30;  // shards of at most about this size
  int threads = 0;                       // 0: all
  bool progress = true;                  // a progress line on a terminal
};

struct ClassStats {
  double err2 = 0, ref2 = 0;  // squared error and squared values of the weights converted
  int64_t tensors = 0, converted = 0;
  size_t bytes_in = 0, bytes_out = 0;
  double rel_rms() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0; }
};

struct QuantizeReport {
  std::map<std::string, ClassStats> classes;  // by weight_class_name
  size_t bytes_in = 0, bytes_out = 0;
  int shards = 0;
  double seconds = 0;
  nlohmann::json quantization_config;  // null when nothing is quantized
  std::vector<std::string> notes;      // what the copy lacks and why (a GGUF input's tokenizer)
};

// compressed-tensors' quantization_config for these formats (the INT4 group over the routed
// experts, a block-FP8 group over the classes given fp8, an int-quantized INT8 group over those
// given int8; "mixed-precision" when more than one); null when every class is bf16.
nlohmann::json quantization_config(const LoadQuantization& formats);

QuantizeReport quantize_checkpoint(const QuantizeOptions& opt);
std::string quantize_report_text(const QuantizeReport& r);
nlohmann::json quantize_report_json(const QuantizeReport& r);

// The distance between two models' logits over teacher-forced positions (every position of
// each sequence, one prefill pass each, float32 latent cache): the mean over positions of
// KL(p_ref || p_q), mean and max |logit difference| over all logits, and how many positions
// have the same argmax.
struct LogitsDistance {
  int64_t positions = 0, argmax_agree = 0;
  double mean_kl = 0, max_kl = 0, mean_abs = 0, max_abs = 0;
};
LogitsDistance logits_distance(Model& ref, Model& q, const std::vector<std::vector<int32_t>>& sequences);
// The sequences of a fixture's golden.safetensors (seq{j}_ids) when the folder has one, else
// `count` random sequences of `length` tokens (seeded).
std::vector<std::vector<int32_t>> comparison_sequences(const std::string& model_dir, int64_t vocab, int count = 4,
                                                       int64_t length = 64);
std::string logits_distance_text(const LogitsDistance& d);

}  // namespace mla
