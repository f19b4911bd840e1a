// Byte-level BPE tokenizer read from a HuggingFace tokenizer.json (the format DeepSeek-V2/V3 and
// GLM ship), from a tiktoken.model (Kimi K2 / K2.5) or from a GGUF file's tokenizer.* metadata
// (llama.cpp's "gpt2" vocabularies), plus a streaming detokenizer and a writer for a small demo
// tokenizer. All three sources become the same parts (tokenizer_parts.h) and one constructor;
// write_tokenizer_folder there writes parts out as a hub folder.
//
// Pipeline of encode(): added tokens are matched first (leftmost, longest) and become single ids;
// each stretch of text between them is normalized (NFC / NFD / NFKC / NFKD, via ICU),
// pre-tokenized (Split / Digits / ByteLevel, regexes run with PCRE2 in UTF + UCP mode) and every
// piece is merged by BPE in merge-rank order. For tiktoken.model the ranks are the merge order
// (lowest-rank concatenation first) and Kimi's pre-tokenizer pattern is used.
//
// Invalid UTF-8 input: encode() never throws on bad bytes. Each maximal ill-formed subsequence
// (the Unicode "maximal subpart" rule, as Python's errors="replace" and Rust's from_utf8_lossy)
// is replaced by U+FFFD before encoding. decode() likewise returns valid UTF-8: when the bytes
// of the ids do not form valid UTF-8 (e.g. a multi-byte character cut in half), the ill-formed
// parts become U+FFFD, as HuggingFace's decode does. Use StreamDecoder for token-by-token output.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"

namespace mla {

struct TokenizerParts;

class Tokenizer {
 public:
  // Reads dir/tokenizer.json and (optional) dir/tokenizer_config.json. Without tokenizer.json,
  // reads dir/tiktoken.model, with special tokens from tokenizer_config.json's
  // added_tokens_decoder. Throws std::runtime_error naming the file and the problem (missing file,
  // bad JSON, malformed line, unsupported construct). `dir` naming a GGUF file (format/gguf.h's
  // gguf_path): from_gguf over its metadata.
  static Tokenizer load(const std::string& dir);

  // The vocabulary of a GGUF file (GgufFile::metadata()) as llama.cpp's converter writes it:
  // tokenizer.ggml.model "gpt2" (byte-level BPE; SentencePiece "llama" and the others are
  // refused), tokenizer.ggml.pre naming the pre-tokenizer (deepseek-v3, deepseek-llm, glm4,
  // chatglm-bpe, kimi-k2: the regexes of that family's tokenizer.json, or Kimi's tiktoken rules),
  // tokens, token_type, merges, the special ids (bos / eos), add_bos_token / add_eos_token and
  // tokenizer.chat_template. Token types: control tokens are added tokens marked special,
  // user-defined ones added tokens not special, unused ones ("[PAD<id>]" holes) are left out.
  // `source` (the file) begins every error. Throws FormatError naming the key that is missing or
  // wrong. Details and limits: tokenizer_gguf.cpp.
  static Tokenizer from_gguf(const std::map<std::string, GgufValue>& metadata, const std::string& source);

  // The tokenizer a model runs with. `tokenizer_dir` when not empty: a hub folder (tokenizer.json
  // or tiktoken.model, tokenizer_config.json, chat_template.jinja) standing in for the model's own
  // (the CLI's --tokenizer DIR, for a GGUF file whose metadata is wrong). Else the GGUF metadata
  // when the model is a GGUF file (`gguf` not null; `model_path` is the file). Else the hub
  // folder `model_path`.
  static Tokenizer load_for_model(const std::string& model_path, const std::map<std::string, GgufValue>* gguf,
                                  const std::string& tokenizer_dir = {});

  // The constructor under load() and from_gguf(). Throws std::runtime_error (FormatError for
  // the vocabulary and merges) naming parts.source.
  static Tokenizer from_parts(TokenizerParts parts);

  // Writes a small, valid byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json with
  // a DeepSeek-style chat template) of exactly vocab_size ids into dir (created if missing):
  // 256 byte tokens, deterministic merges, then the special tokens <｜begin▁of▁sentence｜>,
  // <｜end▁of▁sentence｜>, <｜User｜>, <｜Assistant｜>. vocab_size must be at least 260.
  static void write_byte_level_tokenizer(const std::string& dir, int vocab_size);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens: add BOS / EOS as tokenizer_config.json's add_bos_token / add_eos_token
  // say (or, without those keys, as tokenizer.json's TemplateProcessing post-processor says).
  // Added-token strings in the text are always matched as their single ids.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  // Text of the ids; skip_special_tokens drops added tokens marked special. Throws
  // std::out_of_range for an id that is not in the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The raw bytes the token stands for (may be part of a UTF-8 character). Throws for a bad id.
  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;

  int32_t bos_id() const;  // -1 if none
  int32_t eos_id() const;  // -1 if none
  const std::string& bos_token() const;
  const std::string& eos_token() const;

  // Vocabulary lookup by the token's string as written in tokenizer.json (byte-level alphabet,
  // e.g. "Ġthe", or an added token's content). token_text is the inverse; throws for a bad id.
  std::optional<int32_t> token_id(std::string_view token) const;
  std::string token_text(int32_t id) const;
  size_t vocab_size() const;  // largest id + 1

  // From tokenizer_config.json, else chat_template.jinja or chat_template.json (a GGUF file:
  // tokenizer.chat_template); empty if none.
  const std::string& chat_template() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Emits text as ids arrive. Bytes of an incomplete UTF-8 character are held back until the
// character completes; bytes that can never complete become U+FFFD. The concatenation of all
// push() results and flush() equals decode() of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  std::string flush();  // emits whatever is held back (incomplete bytes as U+FFFD) and resets

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

// Replaces each maximal ill-formed subsequence of s by U+FFFD; valid input comes back unchanged.
std::string sanitize_utf8(std::string_view s);

}  // namespace mla
