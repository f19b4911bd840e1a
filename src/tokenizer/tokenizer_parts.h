// What a Tokenizer is built from, wherever it was read: a hub folder (tokenizer.json or
// tiktoken.model, tokenizer_config.json, chat_template.jinja) or a GGUF file's tokenizer.*
// metadata (tokenizer_gguf.cpp translates it into these same parts). Tokenizer::from_parts is the
// one constructor under both, so a GGUF vocabulary is tokenized by exactly the code that
// tokenizes the folder it was converted from.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tiktoken.h"

namespace mla {

struct TokenizerParts {
  // Names the source in every error: tokenizer.json's path, or the GGUF file.
  std::string source;
  // Where the vocabulary and the merges sit in the source, for errors: empty for tokenizer.json
  // (messages say "merge N"), GGUF keys otherwise ("tokenizer.ggml.merges[N]").
  std::string vocab_key, merges_key;

  // Byte-level BPE as tokenizer.json has it: the document without model.vocab and model.merges
  // (normalizer, pre_tokenizer, decoder, post_processor, added_tokens, model's options), and
  // those two apart, in file order.
  nlohmann::json root;
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false, has_merges = false;

  // Or a tiktoken vocabulary (Kimi K2 / K2.5) when `tiktoken` is set: each token's bytes with its
  // rank (its id), and the special tokens by id: content and whether it is special.
  bool tiktoken = false;
  std::vector<tiktoken::RankedToken> ranked;
  std::map<int32_t, std::pair<std::string, bool>> specials;

  // tokenizer_config.json (null when there is none) and its name in errors. Its keys read here:
  // bos_token, eos_token, add_bos_token, add_eos_token, chat_template.
  nlohmann::json config;
  std::string config_source;
  // The chat template when the config has none (chat_template.jinja or chat_template.json).
  std::string chat_template;
  // Special ids given by number (GGUF), over the ids of the config's bos_token / eos_token names.
  std::optional<int32_t> bos_id, eos_id;
};

}  // namespace mla
