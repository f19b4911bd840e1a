// Writes checkpoints in the HuggingFace hub layout: config.json, and the weights as one
// model.safetensors or as shards with model.safetensors.index.json. Tensors are produced one at
// a time by a callback, so a multi-gigabyte checkpoint is never held in memory.
// Used by the built-in demo and benchmark (random weights) and by tests (re-sharding,
// re-wrapping a checkpoint as another family).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "tensor/dtype.h"

namespace mla {

// TensorSpec (one tensor, produced by a callback) and the safetensors writer are in
// format/safetensors.h.
// Writes dir/config.json and the tensors (in name order) over `shards` files.
void write_checkpoint(const std::string& dir, const nlohmann::json& config, std::vector<TensorSpec> tensors,
                      int shards = 1);

class Progress;
// Wraps each tensor's fill so that `bar` shows the bytes and tensors produced so far of the
// whole list's.
void track_progress(std::vector<TensorSpec>& tensors, const std::shared_ptr<Progress>& bar);

enum class RandomWeights {
  BF16,
  FP8,        // DeepSeek-V3's release: decoder projections F8_E4M3 with 128x128 block scale_inv
  INT4_EXPERTS,  // Kimi K2.5's release: routed experts compressed-tensors INT4, group 32
  // `mla quantize --experts int4 --others fp8`: INT4 routed experts (group 32), the other
  // projections block-FP8 (scales named weight_scale), a compressed-tensors mixed-precision
  // config; DeepSeek's flat config (no wrapper, no prefix).
  INT4_FP8,
  // `mla quantize --experts int8 --others int8`: every decoder projection compressed-tensors
  // int-quantized INT8 (I8 weight, BF16 weight_scale per group of 32), embeddings and lm_head bf16.
  INT8,
};

struct RandomCheckpointOptions {
  uint64_t seed = 1;
  RandomWeights weights = RandomWeights::BF16;
  int shards = 1;
  double init_std = 0.02;
  bool progress = false;  // a progress line while writing, on a terminal
};

// Every tensor an MLA checkpoint of this config holds, with random values (normal-like, std
// init_std; norms 1). `config` is a flat config.json object of any supported family; with
// INT4_EXPERTS the checkpoint is wrapped as kimi_k25 (text_config, language_model. prefix).
std::vector<TensorSpec> random_tensors(const nlohmann::json& config, const RandomCheckpointOptions& opt);
void write_random_checkpoint(const std::string& dir, nlohmann::json config, const RandomCheckpointOptions& opt);

// A small model of the DeepSeek-V3 architecture (q LoRA, YaRN, sigmoid noaux_tc routing over
// expert groups, a dense first layer, shared experts) for the built-in demo.
nlohmann::json demo_config(int64_t vocab_size);
// The CPU benchmark's checkpoint config is the table's entry: mla::bench_checkpoint_config
// (model/presets.h).

}  // namespace mla
