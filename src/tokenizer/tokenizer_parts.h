// What a Tokenizer is built from, wherever it was read: a hub folder (tokenizer.json or
// tiktoken.model, tokenizer_config.json, chat_template.jinja) or a GGUF file's tokenizer.*
// metadata (tokenizer_gguf.cpp translates it into these same parts). Tokenizer::from_parts is the
// one constructor under both, so a GGUF vocabulary is tokenized by exactly the code that
// tokenizes the folder it was converted from; write_tokenizer_folder writes parts out as that
// folder (mla quantize of a GGUF file).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf.h"
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

// The parts of a GGUF file's tokenizer.* metadata: Tokenizer::from_gguf is from_parts of these.
// Throws FormatError naming `source` and the key (details: tokenizer_gguf.cpp).
TokenizerParts gguf_tokenizer_parts(const std::map<std::string, GgufValue>& metadata, const std::string& source);

// Writes `parts` into `dir` (created if missing) as the hub folder read_folder reads, so that
// Tokenizer::load(dir) is the tokenizer from_parts(parts) builds:
//   byte-level BPE  tokenizer.json: root, with model.vocab (an object, in the parts' order: by
//                   id for a GGUF file) and model.merges ([left, right] pairs, in rank order)
//   tiktoken        tiktoken.model (ranks in the parts' order), and tokenizer_config.json's
//                   added_tokens_decoder for the special tokens; a stale tokenizer.json is removed
//   both            tokenizer_config.json: config, with chat_template where config has none, and
//                   bos_token / eos_token as the text of bos_id / eos_id where those are set
// Throws std::runtime_error naming the file for what cannot be written (an unwritable path, text
// that is not UTF-8) or read back the same (a bos / eos text that names another id first).
void write_tokenizer_folder(const TokenizerParts& parts, const std::string& dir);

}  // namespace mla
