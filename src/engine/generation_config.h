// What ends and shapes a generation, from the checkpoint's files and the user:
//  - GenerationConfig: the sampling defaults of generation_config.json (temperature, top_p, top_k,
//    min_p, repetition_penalty, max_new_tokens, do_sample) and the EOS ids of config.json
//    (ModelConfig::eos_token_ids) joined with generation_config.json's eos_token_id (one id or
//    a list). As vLLM does, the file's values are defaults that the user's options override.
//    A GGUF file holds the same: llama.cpp's converter copies generation_config.json into
//    general.sampling.* and the stop ids into tokenizer.ggml.{eos,eot,eom}_token_id.
//  - StopStrings: user stop strings over streamed text. Output ends before the first occurrence
//    of any stop string (the stop text is not emitted), also when it spans several tokens: text
//    that could be the start of a stop string is held back until it is decided.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "format/gguf.h"
#include "model/config.h"

namespace mla {

struct GenerationConfig {
  // Values the file sets; unset ones leave the engine's defaults.
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;
  std::optional<bool> do_sample;  // false: greedy (HF), whatever the temperature says
  std::vector<int64_t> eos_token_ids;  // config.json's, then generation_config.json's new ones

  // Parses a generation_config.json object; `source` names it in errors.
  static GenerationConfig from_json(const nlohmann::json& j, const std::string& source = "generation_config.json");
  // model_dir/generation_config.json if present (else no defaults) plus the EOS ids of `model`.
  static GenerationConfig load(const std::string& model_dir, const ModelConfig& model);
  // The same from a GGUF file's metadata: general.sampling.temp, top_p, top_k, min_p and
  // penalty_repeat (the converter's copies of generation_config.json; it keeps no max_new_tokens
  // nor do_sample) and the EOS ids of `model` joined with tokenizer.ggml.eos_token_id,
  // eot_token_id and eom_token_id (GLM: <|user|> and <|observation|> end a turn too). Throws
  // FormatError naming the key, `source` first, for a value of the wrong kind.
  static GenerationConfig from_gguf(const std::map<std::string, GgufValue>& metadata, const ModelConfig& model,
                                    const std::string& source);
  // The defaults a model runs with, chosen as Tokenizer::load_for_model chooses its tokenizer:
  // `tokenizer_dir`/generation_config.json when that folder is given and has one (--tokenizer
  // DIR), else the GGUF metadata when the model is a GGUF file (`gguf` not null), else the hub
  // folder `model_path`'s.
  static GenerationConfig load_for_model(const std::string& model_path, const std::map<std::string, GgufValue>* gguf,
                                         const std::string& tokenizer_dir, const ModelConfig& model);

  // The file's defaults applied over `base` (greedy when do_sample is false).
  SamplingParams apply(SamplingParams base) const;
  bool is_eos(int64_t id) const;
};

class StopStrings {
 public:
  StopStrings() = default;
  explicit StopStrings(std::vector<std::string> stops);  // empty strings are ignored

  // Feeds the next piece of text; returns the text now safe to emit. After a stop string is
  // found, stopped() is true, the text before it has been returned and later input is ignored.
  std::string push(std::string_view text);
  // End of the stream: returns the text still held back (no stop string completed).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string found, if any

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace mla
