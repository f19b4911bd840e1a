// gguf_tokenizer_parts and Tokenizer::from_gguf: a GGUF file's tokenizer.* metadata, as llama.cpp's
// convert_hf_to_gguf.py writes it for a "gpt2" (byte-level BPE) vocabulary, translated into the
// parts a hub folder gives (tokenizer_parts.h), so that one loader tokenizes both and
// write_tokenizer_folder can write them out as that folder.
//
// What the converter writes (get_vocab_base, _set_vocab_gpt2; for Kimi K2 a tiktoken vocabulary
// turned into the same keys):
//   tokenizer.ggml.tokens       one string per id up to config.json's vocab_size, in tokenizer.json's
//                               byte-level alphabet ("Ġthe"); added tokens as their content
//   tokenizer.ggml.token_type   1 normal, 2 unknown, 3 control (an added token marked special, or one
//                               that looks special: <｜...｜>, <|...|>), 4 user-defined (other added
//                               tokens), 5 unused (the "[PAD<id>]" filling ids the tokenizer has
//                               none for), 6 byte
//   tokenizer.ggml.merges       "left right", in rank order
//   tokenizer.ggml.pre          which pre-tokenizer; llama.cpp picks it by hashing the ids the
//                               original tokenizer gives a check text
//   tokenizer.ggml.{bos,eos,unknown,padding,eot,eom}_token_id, add_bos_token, add_eos_token,
//   tokenizer.chat_template     from tokenizer_config.json (and config.json) by gguf-py's SpecialVocab
//
// The translation: normal, unknown and byte tokens form the BPE vocabulary (model.vocab); control
// and user-defined tokens are added tokens (special / not special) and stay in the vocabulary, as
// tokenizer.json lists its added tokens in both; unused ids are left out, as the hub folder has no
// token there (vocab_size() is the largest real id + 1, decode() of an unused id throws). The
// pre-tokenizer is the Split sequence of the family's tokenizer.json (see kPreTokenizers).
//
// What a GGUF vocabulary cannot say, and how it comes out here: whether an added token that looks
// special was special (DeepSeek's <｜User｜> is not, so decode(skip_special_tokens) drops it here
// and keeps it from the folder); an added token's lstrip / rstrip / single_word (none is set in
// the supported families); the normalizer (none in the supported families).
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_parts.h"
#include "tokenizer/unicode_util.h"

namespace mla {

using json = nlohmann::json;

namespace {

// llama.cpp's token types (llama_token_type).
enum TokenType : int64_t { kUndefined = 0, kNormal, kUnknown, kControl, kUserDefined, kUnused, kByte };

// The pre-tokenizer of each tokenizer.ggml.pre this engine's model families carry: the regexes of
// Split steps (Isolated) that the family's tokenizer.json runs before its ByteLevel step (which
// has use_regex false in all of them), as PCRE2 patterns. Non-ASCII characters are written as
// \x{...}: the classes hold characters that Unicode normalization would rewrite (U+1F7D, U+212A).
struct PreTokenizer {
  const char* name;
  std::vector<const char*> splits;  // empty: Kimi's tiktoken rules (tiktoken.h)
};

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      // DeepSeek-V3 / R1 / V3.1 / V3.2: tokenizer.json's three Splits.
      {"deepseek-v3",
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      // DeepSeek-LLM, DeepSeek-V2 / V2-Lite: newlines, cased letters, ASCII and full-width
      // punctuation, trailing space, CJK and Hangul, numbers.
      {"deepseek-llm",
       {R"([\r\n])",
        R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
        R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
        R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
        R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
        R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59})"
        R"(\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
        R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC})"
        R"(\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})"
        R"(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B})"
        R"(\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
        R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A})"
        R"(\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2})"
        R"(\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)",
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)",
        R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N}+)"}},
      // GLM-4.5 / 4.7 / 5 ("glm4") and GLM-4 ("chatglm-bpe"): one cl100k-style Split.
      {"glm4",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"chatglm-bpe",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      // Kimi K2 / K2.5: tiktoken's rank rule, Kimi's pattern and input chunking.
      {"kimi-k2", {}},
  };
  return table;
}

// The metadata with the error rules of this file: every error is "SOURCE: KEY: what".
class Metadata {
 public:
  Metadata(const std::map<std::string, GgufValue>& map, const std::string& source) : map_(map), source_(source) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw FormatError(source_ + ": " + key + ": " + what);
  }
  const GgufValue* find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  std::optional<std::string> string(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->kind != GgufValue::Kind::String) fail(key, "is not a string");
    return v->s;
  }
  std::optional<bool> boolean(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->kind != GgufValue::Kind::Bool) fail(key, "is not a bool");
    return v->b;
  }
  // A token id: an integer below n_tokens.
  std::optional<int32_t> token_id(const std::string& key, size_t n_tokens) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->kind != GgufValue::Kind::Int) fail(key, "is not an integer");
    if (v->i < 0 || static_cast<uint64_t>(v->i) >= n_tokens)
      fail(key, "id " + std::to_string(v->i) + " is out of range (the vocabulary has " + std::to_string(n_tokens) +
                    " tokens)");
    return static_cast<int32_t>(v->i);
  }
  const std::vector<std::string>* strings(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    if (v->kind != GgufValue::Kind::Array || v->elem != GgufValue::Kind::String) fail(key, "is not an array of strings");
    return &v->strings;
  }
  const std::vector<int64_t>* ints(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    if (v->kind != GgufValue::Kind::Array || v->elem != GgufValue::Kind::Int) fail(key, "is not an array of integers");
    return &v->ints;
  }

 private:
  const std::map<std::string, GgufValue>& map_;
  const std::string& source_;
};

constexpr const char* kModel = "tokenizer.ggml.model";
constexpr const char* kPre = "tokenizer.ggml.pre";
constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kTokenType = "tokenizer.ggml.token_type";
constexpr const char* kMerges = "tokenizer.ggml.merges";
constexpr const char* kBos = "tokenizer.ggml.bos_token_id";
constexpr const char* kEos = "tokenizer.ggml.eos_token_id";
constexpr const char* kUnk = "tokenizer.ggml.unknown_token_id";
constexpr const char* kAddBos = "tokenizer.ggml.add_bos_token";
constexpr const char* kAddEos = "tokenizer.ggml.add_eos_token";
constexpr const char* kChatTemplate = "tokenizer.chat_template";

const PreTokenizer& find_pre_tokenizer(const Metadata& meta) {
  std::optional<std::string> pre = meta.string(kPre);
  std::string known;
  for (const PreTokenizer& p : pre_tokenizers()) {
    if (pre && *pre == p.name) return p;
    known += std::string(known.empty() ? "" : ", ") + p.name;
  }
  meta.fail(kPre, (pre ? "pre-tokenizer '" + *pre + "' is not supported" : std::string("missing")) + " (supported: " +
                      known + "); a hub tokenizer folder can stand in for the file's (--tokenizer DIR)");
}

json split_sequence(const PreTokenizer& pre) {
  json steps = json::array();
  for (const char* regex : pre.splits)
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
  return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
}

}  // namespace

TokenizerParts gguf_tokenizer_parts(const std::map<std::string, GgufValue>& metadata, const std::string& source) {
  const Metadata meta(metadata, source);
  std::optional<std::string> model = meta.string(kModel);
  if (!model) meta.fail(kModel, "missing (the file has no tokenizer)");
  if (*model != "gpt2") {
    std::string kind = *model == "llama"  ? " (SentencePiece)"
                       : *model == "bert" ? " (WordPiece)"
                       : *model == "t5"   ? " (Unigram)"
                                          : "";
    meta.fail(kModel, "tokenizer '" + *model + "'" + kind +
                          " is not supported, only 'gpt2' (byte-level BPE); a hub tokenizer folder can stand in "
                          "for the file's (--tokenizer DIR)");
  }
  const PreTokenizer& pre = find_pre_tokenizer(meta);

  const std::vector<std::string>* tokens = meta.strings(kTokens);
  if (!tokens) meta.fail(kTokens, "missing");
  if (tokens->empty()) meta.fail(kTokens, "is empty");
  if (tokens->size() > (size_t{1} << 26)) meta.fail(kTokens, "has " + std::to_string(tokens->size()) + " tokens");
  const size_t n = tokens->size();
  const std::vector<int64_t>* types = meta.ints(kTokenType);
  if (types && types->size() != n)
    meta.fail(kTokenType, "has " + std::to_string(types->size()) + " entries for " + std::to_string(n) + " tokens");
  auto type_of = [&](size_t id) -> int64_t {
    if (!types) return kNormal;
    int64_t t = (*types)[id];
    if (t < kUndefined || t > kByte)
      meta.fail(kTokenType, "token " + std::to_string(id) + " has type " + std::to_string(t) + " (types are 0 to 6)");
    return t == kUndefined ? kNormal : t;
  };

  TokenizerParts parts;
  parts.source = source;
  parts.config_source = source;
  parts.vocab_key = kTokens;
  parts.merges_key = kMerges;
  json added = json::array();
  std::vector<uint8_t> unused(n, 0);
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = (*tokens)[id];
    const int64_t type = type_of(id);
    if (type == kUnused) {
      unused[id] = 1;
      continue;
    }
    const bool is_added = type == kControl || type == kUserDefined;
    if (pre.splits.empty()) {  // tiktoken: ranks are ids, in raw bytes
      if (is_added) {
        if (text.empty()) meta.fail(kTokens, "token " + std::to_string(id) + " is an empty added token");
        parts.specials[static_cast<int32_t>(id)] = {text, type == kControl};
        continue;
      }
      tiktoken::RankedToken ranked{{}, static_cast<int32_t>(id), 0};
      if (!utf8::byte_level_decode(text, &ranked.bytes))
        meta.fail(kTokens, "token " + std::to_string(id) + " '" + text + "' is not in the byte-level alphabet");
      parts.ranked.push_back(std::move(ranked));
      continue;
    }
    parts.vocab.emplace_back(text, static_cast<int32_t>(id));
    if (is_added)
      added.push_back({{"id", id}, {"content", text}, {"special", type == kControl}});
  }
  parts.has_vocab = true;

  if (pre.splits.empty()) {
    parts.tiktoken = true;  // the merges, when written, are implied by the ranks (load_ranked)
  } else {
    const std::vector<std::string>* merges = meta.strings(kMerges);
    if (!merges) meta.fail(kMerges, "missing");
    parts.merges.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      const std::string& m = (*merges)[i];
      size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;  // a token may begin with a space
      if (space == std::string::npos || space + 1 == m.size())
        meta.fail(kMerges, "merge " + std::to_string(i) + " '" + m + "' is not two tokens separated by a space");
      parts.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
    parts.has_merges = true;
    json model_node = {{"type", "BPE"}};
    if (auto unk = meta.token_id(kUnk, n); unk && !unused[*unk]) model_node["unk_token"] = (*tokens)[*unk];
    parts.root = {{"model", std::move(model_node)},
                  {"pre_tokenizer", split_sequence(pre)},
                  {"decoder", {{"type", "ByteLevel"}}},
                  {"added_tokens", std::move(added)}};
  }

  // bos / eos by id; the eot / eom ids matter to generation only (GenerationConfig::from_gguf).
  auto special_id = [&](const char* key) {
    std::optional<int32_t> id = meta.token_id(key, n);
    if (id && unused[*id]) meta.fail(key, "id " + std::to_string(*id) + " is an unused token");
    return id;
  };
  parts.bos_id = special_id(kBos);
  parts.eos_id = special_id(kEos);
  for (const char* key : {"tokenizer.ggml.padding_token_id", "tokenizer.ggml.seperator_token_id",
                          "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    meta.token_id(key, n);
  parts.config = json::object();
  if (std::optional<bool> add = meta.boolean(kAddBos)) {
    if (*add && !parts.bos_id) meta.fail(kAddBos, std::string("is true but there is no ") + kBos);
    parts.config["add_bos_token"] = *add;
  }
  if (std::optional<bool> add = meta.boolean(kAddEos)) {
    if (*add && !parts.eos_id) meta.fail(kAddEos, std::string("is true but there is no ") + kEos);
    parts.config["add_eos_token"] = *add;
  }
  if (std::optional<std::string> tmpl = meta.string(kChatTemplate)) parts.chat_template = std::move(*tmpl);
  return parts;
}

Tokenizer Tokenizer::from_gguf(const std::map<std::string, GgufValue>& metadata, const std::string& source) {
  return from_parts(gguf_tokenizer_parts(metadata, source));
}

Tokenizer Tokenizer::load_for_model(const std::string& model_path, const std::map<std::string, GgufValue>* gguf,
                                    const std::string& tokenizer_dir) {
  if (!tokenizer_dir.empty()) return load(tokenizer_dir);
  if (gguf) return from_gguf(*gguf, model_path);
  return load(model_path);
}

}  // namespace mla
