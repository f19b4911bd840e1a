// Byte-level BPE tokenizer: loading tokenizer.json / tokenizer_config.json, pre-tokenization with
// PCRE2, merge-rank BPE with a word cache, decoding and streaming decoding.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <map>
#include <bit>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "format/error.h"
#include "format/gguf.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer_parts.h"
#include "tokenizer/unicode_util.h"

namespace mla {

using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// PCRE2 regex, compiled once, matched with per-call match data.

class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                          &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw std::runtime_error(where + ": cannot compile regex '" + pattern + "' at offset " +
                               std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }
  pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_ = nullptr;
};

// Per-call matching state for one regex (match data are not shareable between threads).
class Matcher {
 public:
  explicit Matcher(const Regex& regex)
      : regex_(regex), data_(pcre2_match_data_create_from_pattern(regex.code(), nullptr)) {}
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;
  ~Matcher() {
    pcre2_match_data_free(data_);
    if (context_) pcre2_match_context_free(context_);
    if (stack_) pcre2_jit_stack_free(stack_);
  }

  // Finds the next match in subject[start..len); returns false when there is none.
  bool find(const char* subject, size_t len, size_t start, size_t* match_begin, size_t* match_end) {
    for (;;) {
      int rc = pcre2_match(regex_.code(), reinterpret_cast<PCRE2_SPTR>(subject), len, start,
                           PCRE2_NO_UTF_CHECK, data_, context_);
      if (rc == PCRE2_ERROR_NOMATCH) return false;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !stack_) {
        stack_ = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
        context_ = pcre2_match_context_create(nullptr);
        pcre2_jit_stack_assign(context_, nullptr, stack_);
        continue;
      }
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        throw std::runtime_error(std::string("tokenizer regex match failed: ") +
                                 reinterpret_cast<char*>(message));
      }
      PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data_);
      *match_begin = ovector[0];
      *match_end = ovector[1];
      return true;
    }
  }

 private:
  const Regex& regex_;
  pcre2_match_data* data_;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

size_t utf8_char_length(const char* s, size_t i, size_t len) {
  uint8_t b = static_cast<uint8_t>(s[i]);
  size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  return std::min(n, len - i);
}

struct Segment {
  size_t b, e;  // byte range relative to the piece being split
  bool match;
};

enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizerStep {
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
};

// GPT-2's pattern, used by ByteLevel when use_regex is true.
const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip, single_word;
};

// Byte trie over added-token contents for leftmost-longest matching.
struct TrieNode {
  std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
  int32_t token = -1;                                 // index into added_tokens, -1 if none
};

std::string read_file(const std::string& path, bool* exists) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *exists = false;
    return {};
  }
  *exists = true;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parse_json_file(const std::string& path, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": bad JSON: " + e.what());
  }
}

// bos_token / eos_token in tokenizer_config.json: a string, an {"content": ...} object, or null.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

bool is_ascii_word_char(uint8_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c >= 0x80;
}

bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Open-addressing map from token text to id; keys live in one arena string.
class TokenIndex {
 public:
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < n * 2) capacity <<= 1;
    rehash(capacity);
  }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    uint32_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && s.length == key.size() && arena_.compare(s.offset, s.length, key) == 0) return s.id;
    }
  }
  void insert_or_assign(std::string_view key, int32_t id) {
    if ((count_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
    uint32_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = {h, id, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size())};
        arena_.append(key);
        ++count_;
        return;
      }
      if (s.hash == h && s.length == key.size() && arena_.compare(s.offset, s.length, key) == 0) {
        s.id = id;
        return;
      }
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.id >= 0) f(std::string_view(arena_).substr(s.offset, s.length), s.id);
  }

 private:
  struct Slot {
    uint32_t hash;
    int32_t id = -1;
    uint32_t offset, length;
  };
  static uint32_t hash(std::string_view key) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a, then mixed
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return static_cast<uint32_t>(h ^ (h >> 32));
  }
  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{0, -1, 0, 0});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.id < 0) continue;
      for (size_t i = s.hash & mask_;; i = (i + 1) & mask_)
        if (slots_[i].id < 0) {
          slots_[i] = s;
          break;
        }
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0, count_ = 0;
};

// Open-addressing map from a pair of token ids to (merge rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0, id = 0;
  };
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < n * 2) capacity <<= 1;
    entries_.assign(capacity, Entry{});
    mask_ = capacity - 1;
    shift_ = 64 - std::countr_zero(capacity);
  }
  // Keeps the first (lowest-rank) merge of a pair, as HuggingFace does for duplicate merges.
  void insert(uint64_t key, int32_t rank, int32_t id) {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (entries_[i].key == key) return;
      if (entries_[i].key == kEmpty) {
        entries_[i] = {key, rank, id};
        return;
      }
    }
  }
  const Entry* find(uint64_t key) const {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 60;
};

// SAX reader for tokenizer.json: model.vocab and model.merges (about all of the file) are
// streamed into flat vectors; everything else becomes an ordinary json document.
class TokenizerJsonReader {
 public:
  explicit TokenizerJsonReader(const std::string& source) : source_(source) {}

  json root;
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false, has_merges = false;

  bool null() { return value(json(nullptr)); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) { return number(v); }
  bool number_unsigned(json::number_unsigned_t v) { return number(static_cast<int64_t>(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return value(json(v)); }
  bool binary(json::binary_t&) { return value(json()); }
  bool string(std::string& v) {
    if (mode_ == Mode::Merges) {
      size_t space = v.find(' ');
      if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos)
        throw std::runtime_error(source_ + ": merge " + std::to_string(merges.size()) + " '" + v +
                                 "' is not two tokens separated by one space");
      merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::MergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return value(json(std::move(v)));
  }
  bool start_object(std::size_t) {
    if (mode_ == Mode::Dom && in_model() && key_ == "vocab") {
      mode_ = Mode::Vocab;
      has_vocab = true;
      return true;
    }
    if (mode_ != Mode::Dom) bad_entry();
    open(json::object());
    return true;
  }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::Dom;
      return true;
    }
    close();
    return true;
  }
  bool start_array(std::size_t) {
    if (mode_ == Mode::Dom && in_model() && key_ == "merges") {
      mode_ = Mode::Merges;
      has_merges = true;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::MergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::Dom) bad_entry();
    open(json::array());
    return true;
  }
  bool end_array() {
    if (mode_ == Mode::MergePair) {
      if (pair_.size() != 2)
        throw std::runtime_error(source_ + ": merge " + std::to_string(merges.size()) + " is neither \"a b\" nor [a, b]");
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::Merges;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::Dom;
      return true;
    }
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    throw std::runtime_error(source_ + ": bad JSON: " + e.what());
  }

 private:
  enum class Mode { Dom, Vocab, Merges, MergePair };

  bool in_model() const { return stack_.size() == 2 && path_.size() == 2 && path_[1] == "model"; }
  [[noreturn]] void bad_entry() const {
    if (mode_ == Mode::Vocab)
      throw std::runtime_error(source_ + ": vocab entry '" + key_ + "' has a non-integer id");
    throw std::runtime_error(source_ + ": merge " + std::to_string(merges.size()) + " is neither \"a b\" nor [a, b]");
  }
  bool number(int64_t v) {
    if (mode_ == Mode::Vocab) {
      if (v < 0 || v > INT32_MAX) throw std::runtime_error(source_ + ": vocab entry '" + key_ + "' has a bad id");
      vocab.emplace_back(key_, static_cast<int32_t>(v));
      return true;
    }
    return value(json(v));
  }
  bool value(json v) {
    if (mode_ != Mode::Dom) bad_entry();
    place(std::move(v));
    return true;
  }
  json* place(json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) {
      json& slot = parent[key_];
      slot = std::move(v);
      return &slot;
    }
    parent.push_back(std::move(v));
    return &parent.back();
  }
  void open(json container) {
    std::string under = !stack_.empty() && stack_.back()->is_object() ? key_ : std::string();
    stack_.push_back(place(std::move(container)));
    path_.push_back(std::move(under));
  }
  void close() {
    stack_.pop_back();
    path_.pop_back();
  }

  const std::string& source_;
  Mode mode_ = Mode::Dom;
  std::vector<json*> stack_;
  std::vector<std::string> path_;
  std::string key_;
  std::vector<std::string> pair_;
};

// "SOURCE: " before an error, "FILE: KEY: " when the source names the key (a GGUF file).
std::string where_in(const std::string& source, const std::string& key) {
  return source + ": " + (key.empty() ? "" : key + ": ");
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string source;  // path of tokenizer.json, for messages

  // Vocabulary.
  TokenIndex text_to_id;
  std::vector<std::string> id_to_text;   // as written in tokenizer.json ("" for unused ids)
  std::vector<std::string> id_to_bytes;  // decoded bytes
  std::vector<uint8_t> id_present;
  std::vector<uint8_t> id_special;
  std::array<int32_t, 256> byte_id{};  // id of the single-byte token
  TokenIndex bytes_to_id;  // token bytes -> id, for ignore_merges
  bool ignore_merges = false;
  int32_t unk_id = -1;

  // Merges: (left id, right id) -> (rank, merged id).
  using Merge = MergeTable::Entry;
  MergeTable merges;

  // Added tokens.
  std::vector<AddedToken> added_tokens;
  std::vector<TrieNode> trie;
  std::array<bool, 256> trie_first{};

  // Normalizers (applied in order to the text between added tokens), then pre-tokenization.
  std::vector<NormalForm> normal_forms;
  std::vector<PreTokenizerStep> steps;
  bool add_prefix_space = false;

  // Special tokens and template.
  int32_t bos = -1, eos = -1;
  std::string bos_text, eos_text;
  bool add_bos = false, add_eos = false;
  std::vector<int32_t> prefix_ids, suffix_ids;  // from a TemplateProcessing post-processor
  bool use_config_flags = false;
  std::string chat_template;

  // tiktoken.model (Kimi): the text is cut into Kimi's chunks before added tokens are matched.
  bool kimi_chunks = false;

  // Word cache: piece bytes -> ids.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const { return merges.find(pair_key(a, b)); }

  void load_bpe(TokenizerParts& parts);
  void load_ranked(TokenizerParts& parts);
  // bos_by_id / eos_by_id (a GGUF file's ids) win over the config's bos_token / eos_token names.
  void apply_config(const json& config, const std::string& config_path, std::optional<int32_t> bos_by_id,
                    std::optional<int32_t> eos_by_id);
  void load_model(const json& model, TokenizerParts& parts);
  void load_pre_tokenizer(const json& node);
  void load_normalizer(const json& node);
  void check_decoder(const json& node) const;
  void load_post_processor(const json& node);
  void build_trie();
  void set_token(int32_t id, const std::string& text);

  // Scratch state of one encode call (regex match data are per call, for thread safety).
  struct EncodeState {
    std::vector<int32_t>* out = nullptr;
    std::vector<std::unique_ptr<Matcher>> matchers;
    std::vector<std::vector<Segment>> segments;  // per pre-tokenizer level
    std::string prefixed;
  };

  void encode_span(std::string_view text, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void pre_tokenize(EncodeState& state, const char* base, size_t level, size_t begin, size_t end) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::set_token(int32_t id, const std::string& text) {
  if (id < 0 || id >= (1 << 26))
    throw std::runtime_error(source + ": token id " + std::to_string(id) + " of '" + text + "' is out of range");
  size_t need = static_cast<size_t>(id) + 1;
  if (id_to_text.size() < need) {
    id_to_text.resize(need);
    id_to_bytes.resize(need);
    id_present.resize(need, 0);
    id_special.resize(need, 0);
  }
  id_to_text[id] = text;
  id_present[id] = 1;
  // ByteLevel decoder: every character through the byte alphabet, or the raw text if any
  // character is outside it.
  std::string bytes;
  id_to_bytes[id] = utf8::byte_level_decode(text, &bytes) ? bytes : text;
}

void Tokenizer::Impl::load_model(const json& model, TokenizerParts& parts) {
  std::string type = model.value("type", "");
  if (type != "BPE")
    throw std::runtime_error(source + ": unsupported model type '" + type + "' (only BPE)");
  if (model.contains("continuing_subword_prefix") && !model["continuing_subword_prefix"].is_null() &&
      !model["continuing_subword_prefix"].get<std::string>().empty())
    throw std::runtime_error(source + ": unsupported BPE option continuing_subword_prefix");
  if (model.contains("end_of_word_suffix") && !model["end_of_word_suffix"].is_null() &&
      !model["end_of_word_suffix"].get<std::string>().empty())
    throw std::runtime_error(source + ": unsupported BPE option end_of_word_suffix");
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() &&
      model["byte_fallback"].get<bool>())
    throw std::runtime_error(source + ": unsupported BPE option byte_fallback (not a byte-level BPE)");
  ignore_merges = model.value("ignore_merges", false);
  // "PATH: " for tokenizer.json, "FILE: KEY: " for a GGUF file.
  const std::string vocab_where = where_in(source, parts.vocab_key);
  auto merge_name = [&](int32_t rank) {
    return parts.merges_key.empty() ? "merge " + std::to_string(rank)
                                    : parts.merges_key + "[" + std::to_string(rank) + "]";
  };

  if (!parts.has_vocab) throw std::runtime_error(source + ": model.vocab missing or not an object");
  text_to_id.reserve(parts.vocab.size() + 1024);
  int32_t max_id = -1;
  for (const auto& [text, id] : parts.vocab) max_id = std::max(max_id, id);
  id_to_text.reserve(static_cast<size_t>(max_id) + 1024);
  for (auto& [text, id] : parts.vocab) {
    text_to_id.insert_or_assign(text, id);
    set_token(id, text);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string())
    unk_id = text_to_id.find(model["unk_token"].get<std::string>());
  const auto& alphabet = utf8::byte_to_char();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, alphabet[b]);
    int32_t id = text_to_id.find(ch);
    if (id >= 0) {
      byte_id[b] = id;
    } else if (unk_id >= 0) {
      byte_id[b] = unk_id;
    } else {
      throw FormatError(vocab_where + "vocabulary lacks the byte-level token for byte " + std::to_string(b) +
                        " and has no unk_token");
    }
  }
  if (ignore_merges) {
    bytes_to_id.reserve(parts.vocab.size());
    text_to_id.for_each([&](std::string_view, int32_t id) {
      if (bytes_to_id.find(id_to_bytes[id]) < 0) bytes_to_id.insert_or_assign(id_to_bytes[id], id);
    });
  }
  parts.vocab.clear();
  parts.vocab.shrink_to_fit();

  if (!parts.has_merges) throw std::runtime_error(source + ": model.merges missing or not an array");
  merges.reserve(parts.merges.size());
  std::string joined;
  int32_t rank = 0;
  for (const auto& [left, right] : parts.merges) {
    joined.assign(left).append(right);
    int32_t l = text_to_id.find(left), r = text_to_id.find(right), merged = text_to_id.find(joined);
    if (l < 0 || r < 0 || merged < 0)
      throw FormatError(source + ": " + merge_name(rank) + " ('" + left + "', '" + right +
                        "') uses a token missing from the vocabulary");
    merges.insert(pair_key(l, r), rank, merged);
    ++rank;
  }
  parts.merges.clear();
  parts.merges.shrink_to_fit();
}

// tokenizer.json nests steps as {"type": "Sequence", <items>: [...]}: the items of such a node
// are loaded in order (true); a null node has nothing to load (true); any other node is the
// caller's to read (false).
template <class Load>
bool sequence_or_null(const json& node, const char* items, Load&& load) {
  if (node.is_null()) return true;
  if (node.value("type", "") != "Sequence") return false;
  for (const json& item : node.at(items)) load(item);
  return true;
}

void Tokenizer::Impl::load_pre_tokenizer(const json& node) {
  if (sequence_or_null(node, "pretokenizers", [&](const json& p) { load_pre_tokenizer(p); })) return;
  std::string type = node.value("type", "");
  PreTokenizerStep step;
  if (type == "Split") {
    const json& pattern = node.at("pattern");
    bool literal = pattern.contains("String");
    std::string text = literal ? pattern["String"].get<std::string>() : pattern.at("Regex").get<std::string>();
    step.regex = std::make_unique<Regex>(text, literal, source + ": pre_tokenizer Split");
    std::string behavior = node.value("behavior", "Isolated");
    if (behavior == "Isolated") step.behavior = SplitBehavior::Isolated;
    else if (behavior == "Removed") step.behavior = SplitBehavior::Removed;
    else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::MergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::MergedWithNext;
    else if (behavior == "Contiguous") step.behavior = SplitBehavior::Contiguous;
    else throw std::runtime_error(source + ": unsupported Split behavior '" + behavior + "'");
    step.invert = node.value("invert", false);
  } else if (type == "Digits") {
    bool individual = node.value("individual_digits", false);
    step.regex = std::make_unique<Regex>(individual ? "\\p{N}" : "\\p{N}+", false, source + ": Digits");
  } else if (type == "ByteLevel") {
    if (node.value("add_prefix_space", false)) add_prefix_space = true;
    if (!node.value("use_regex", true)) return;
    step.regex = std::make_unique<Regex>(kGpt2Pattern, false, source + ": ByteLevel");
  } else {
    throw std::runtime_error(source + ": unsupported pre_tokenizer type '" + type + "'");
  }
  steps.push_back(std::move(step));
}

void Tokenizer::Impl::load_normalizer(const json& node) {
  if (sequence_or_null(node, "normalizers", [&](const json& n) { load_normalizer(n); })) return;
  std::string type = node.value("type", "");
  if (type == "NFC") return normal_forms.push_back(NormalForm::NFC);
  if (type == "NFD") return normal_forms.push_back(NormalForm::NFD);
  if (type == "NFKC") return normal_forms.push_back(NormalForm::NFKC);
  if (type == "NFKD") return normal_forms.push_back(NormalForm::NFKD);
  throw std::runtime_error(source + ": unsupported normalizer type '" + type + "'");
}

void Tokenizer::Impl::check_decoder(const json& node) const {
  if (sequence_or_null(node, "decoders", [&](const json& d) { check_decoder(d); })) return;
  std::string type = node.value("type", "");
  if (type == "ByteLevel") return;
  throw std::runtime_error(source + ": unsupported decoder type '" + type + "'");
}

void Tokenizer::Impl::load_post_processor(const json& node) {
  if (sequence_or_null(node, "processors", [&](const json& p) { load_post_processor(p); })) return;
  std::string type = node.value("type", "");
  if (type != "TemplateProcessing") return;  // ByteLevel and others add no tokens here
  const json& single = node.at("single");
  std::vector<int32_t>* target = &prefix_ids;
  for (const json& piece : single) {
    if (piece.contains("Sequence")) {
      target = &suffix_ids;
      continue;
    }
    if (!piece.contains("SpecialToken")) continue;
    std::string name = piece["SpecialToken"].at("id").get<std::string>();
    const json& specials = node.at("special_tokens");
    if (!specials.contains(name))
      throw std::runtime_error(source + ": post_processor names unknown special token '" + name + "'");
    for (const json& id : specials[name].at("ids")) target->push_back(id.get<int32_t>());
  }
}

void Tokenizer::Impl::build_trie() {
  trie.assign(1, TrieNode{});
  trie_first.fill(false);
  for (size_t t = 0; t < added_tokens.size(); ++t) {
    const std::string& s = added_tokens[t].content;
    if (s.empty()) continue;
    trie_first[static_cast<uint8_t>(s[0])] = true;
    int32_t node = 0;
    for (char c : s) {
      uint8_t b = static_cast<uint8_t>(c);
      auto& kids = trie[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{-1}));
      if (it != kids.end() && it->first == b) {
        node = it->second;
      } else {
        int32_t fresh = static_cast<int32_t>(trie.size());
        kids.insert(it, {b, fresh});
        trie.push_back(TrieNode{});
        node = fresh;
      }
    }
    if (trie[node].token < 0) trie[node].token = static_cast<int32_t>(t);
  }
}

// BPE over one pre-tokenized piece, with the word cache.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  constexpr size_t kMaxCachedLength = 64;
  constexpr size_t kMaxCacheEntries = 1 << 18;
  if (piece.size() <= kMaxCachedLength) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  bpe_uncached(piece, out);
  if (piece.size() <= kMaxCachedLength) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(piece), std::vector<int32_t>(out.begin() + start, out.end()));
  }
}

void Tokenizer::Impl::bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    int32_t id = bytes_to_id.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const size_t n = piece.size();
  if (n <= 48) {
    // Short words: repeated scan for the lowest-rank adjacent pair (leftmost on ties).
    int32_t ids[48];
    int32_t ranks[48];  // rank of pair (i, i+1), INT32_MAX if none
    int32_t merged[48];
    size_t count = n;
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id[static_cast<uint8_t>(piece[i])];
    auto rate = [&](size_t i) {
      const Merge* m = find_merge(ids[i], ids[i + 1]);
      ranks[i] = m ? m->rank : INT32_MAX;
      merged[i] = m ? m->id : -1;
    };
    for (size_t i = 0; i + 1 < count; ++i) rate(i);
    while (count > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < count; ++i)
        if (ranks[i] < ranks[best]) best = i;
      if (ranks[best] == INT32_MAX) break;
      ids[best] = merged[best];
      for (size_t i = best + 1; i + 1 < count; ++i) {
        ids[i] = ids[i + 1];
        ranks[i] = ranks[i + 1];
        merged[i] = merged[i + 1];
      }
      --count;
      if (best > 0) rate(best - 1);
      if (best + 1 < count) rate(best);
    }
    out.insert(out.end(), ids, ids + count);
    return;
  }

  // Long words: symbols in a linked list, candidate merges in a min-heap keyed by
  // (rank << 32 | position), so ties go to the leftmost pair. A candidate is stale when the pair
  // now at its position no longer has that rank; stale entries are skipped when popped.
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i)
    symbols[i] = {byte_id[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  std::vector<uint64_t> heap;
  heap.reserve(n * 2);
  const auto later = std::greater<uint64_t>();
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* m = find_merge(symbols[pos].id, symbols[next].id)) {
      heap.push_back((static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(pos));
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id))
      heap.push_back((static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(i));
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const int32_t rank = static_cast<int32_t>(top >> 32);
    Symbol& left = symbols[pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* m = find_merge(left.id, right.id);
    if (!m || m->rank != rank) continue;
    left.id = m->id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pos;
    consider(left.prev);
    consider(pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

// Pre-tokenizes one stretch of text without added tokens and runs BPE on every piece.
void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (!normal_forms.empty()) {
    normalized.assign(text);
    for (NormalForm form : normal_forms) normalized = normalize_unicode(normalized, form);
    text = normalized;
  }
  EncodeState state;
  state.out = &out;
  state.matchers.reserve(steps.size());
  for (const auto& step : steps) state.matchers.push_back(std::make_unique<Matcher>(*step.regex));
  state.segments.resize(steps.size());
  pre_tokenize(state, text.data(), 0, 0, text.size());
}

// Applies pre-tokenizer step `level` to text[begin, end) and recurses into each resulting piece;
// past the last step, the piece goes to BPE.
void Tokenizer::Impl::pre_tokenize(EncodeState& state, const char* base, size_t level, size_t begin,
                                   size_t end) const {
  if (begin >= end) return;
  if (level == steps.size()) {
    std::string_view piece(base + begin, end - begin);
    if (add_prefix_space && piece[0] != ' ') {
      state.prefixed.assign(1, ' ');
      state.prefixed.append(piece);
      bpe(state.prefixed, *state.out);
    } else {
      bpe(piece, *state.out);
    }
    return;
  }
  const PreTokenizerStep& step = steps[level];
  Matcher& matcher = *state.matchers[level];
  const char* subject = base + begin;
  const size_t len = end - begin;

  // Isolated splits (the common case) are streamed without collecting segments.
  if (step.behavior == SplitBehavior::Isolated) {
    size_t prev = 0, pos = 0, mb = 0, me = 0;
    while (pos <= len && matcher.find(subject, len, pos, &mb, &me)) {
      if (mb > prev) pre_tokenize(state, base, level + 1, begin + prev, begin + mb);
      if (me > mb) pre_tokenize(state, base, level + 1, begin + mb, begin + me);
      prev = me;
      pos = me > mb ? me : me + (me < len ? utf8_char_length(subject, me, len) : 1);
    }
    if (prev < len) pre_tokenize(state, base, level + 1, begin + prev, end);
    return;
  }

  // Segments (begin, end, is_match) relative to subject, then the behavior's grouping.
  std::vector<Segment>& segments = state.segments[level];
  segments.clear();
  size_t prev = 0, pos = 0, mb = 0, me = 0;
  while (pos <= len && matcher.find(subject, len, pos, &mb, &me)) {
    if (mb > prev) segments.push_back({prev, mb, step.invert});
    if (me > mb) segments.push_back({mb, me, !step.invert});
    prev = me;
    pos = me > mb ? me : me + (me < len ? utf8_char_length(subject, me, len) : 1);
  }
  if (prev < len) segments.push_back({prev, len, step.invert});

  std::vector<Segment> grouped;
  switch (step.behavior) {
    case SplitBehavior::Isolated:
      grouped = segments;
      break;
    case SplitBehavior::Removed:
      for (const Segment& seg : segments)
        if (!seg.match) grouped.push_back(seg);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& seg : segments) {
        if (seg.match && !previous_match && !grouped.empty()) grouped.back().e = seg.e;
        else grouped.push_back({seg.b, seg.e, false});
        previous_match = seg.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->match && !previous_match && !grouped.empty()) grouped.back().b = it->b;
        else grouped.push_back({it->b, it->e, false});
        previous_match = it->match;
      }
      std::reverse(grouped.begin(), grouped.end());
      break;
    }
    case SplitBehavior::Contiguous:
      for (const Segment& seg : segments) {
        if (!grouped.empty() && grouped.back().match == seg.match) grouped.back().e = seg.e;
        else grouped.push_back(seg);
      }
      break;
  }
  for (const Segment& seg : grouped) pre_tokenize(state, base, level + 1, begin + seg.b, begin + seg.e);
}

// ---------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::load_bpe(TokenizerParts& parts) {
  json& root = parts.root;
  if (!root.is_object()) throw std::runtime_error(source + ": top level is not a JSON object");
  try {
    if (!root.contains("model")) throw std::runtime_error(source + ": no 'model' section");
    load_model(root["model"], parts);
    load_normalizer(root.value("normalizer", json()));
    load_pre_tokenizer(root.value("pre_tokenizer", json()));
    check_decoder(root.value("decoder", json()));
    load_post_processor(root.value("post_processor", json()));

    if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
      for (const json& t : root["added_tokens"]) {
        AddedToken token{t.at("id").get<int32_t>(), t.at("content").get<std::string>(), t.value("special", false),
                         t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false)};
        set_token(token.id, token.content);
        id_special[token.id] = token.special ? 1 : 0;
        text_to_id.insert_or_assign(token.content, token.id);
        added_tokens.push_back(std::move(token));
      }
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(source + ": unexpected structure: " + e.what());
  }
}

// tiktoken.model: the id of a token is its rank, and BPE merges the adjacent pair whose
// concatenation has the lowest rank. That is the merge-table BPE of tokenizer.json with one merge
// (left, right) -> concatenation for every way of cutting a token into two tokens, ranked by the
// concatenation's rank. A piece that is itself a token is taken whole (tiktoken looks pieces up
// before merging), as tokenizer.json's ignore_merges does. As in Kimi's tokenization_kimi.py, the
// 256 ids after the last rank are special tokens, named <|reserved_token_ID|> unless `specials`
// names them.
void Tokenizer::Impl::load_ranked(TokenizerParts& parts) {
  const std::vector<tiktoken::RankedToken>& tokens = parts.ranked;
  int32_t max_rank = 0;
  for (const auto& t : tokens) max_rank = std::max(max_rank, t.rank);
  id_to_text.reserve(static_cast<size_t>(max_rank) + 257);
  text_to_id.reserve(tokens.size() + 512);
  bytes_to_id.reserve(tokens.size());
  const auto& alphabet = utf8::byte_to_char();
  for (const auto& t : tokens) {
    std::string shown;  // the byte-level form tokenizer.json would use, e.g. "Ġthe"
    for (unsigned char b : t.bytes) utf8::append(shown, alphabet[b]);
    set_token(t.rank, shown);
    text_to_id.insert_or_assign(shown, t.rank);
    bytes_to_id.insert_or_assign(t.bytes, t.rank);
  }
  ignore_merges = true;
  const std::string vocab_where = where_in(source, parts.vocab_key);
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    byte_id[b] = bytes_to_id.find(std::string_view(&byte, 1));
    if (byte_id[b] < 0) throw FormatError(vocab_where + "no token for the single byte " + std::to_string(b));
  }

  std::vector<std::array<int32_t, 3>> cuts;  // (left id, right id, rank of the whole)
  for (const auto& t : tokens) {
    std::string_view whole = t.bytes;
    for (size_t k = 1; k < whole.size(); ++k) {
      int32_t left = bytes_to_id.find(whole.substr(0, k));
      if (left < 0) continue;
      int32_t right = bytes_to_id.find(whole.substr(k));
      if (right < 0) continue;
      cuts.push_back({left, right, t.rank});
    }
  }
  merges.reserve(cuts.size());
  for (const auto& [l, r, rank] : cuts) merges.insert(pair_key(l, r), rank, rank);

  std::map<int32_t, std::pair<std::string, bool>>& specials = parts.specials;
  const int32_t first_reserved = static_cast<int32_t>(tokens.size());
  for (int32_t id = first_reserved; id < first_reserved + 256; ++id) {
    bool is_rank = static_cast<size_t>(id) < id_present.size() && id_present[id];  // ranks with gaps
    if (!is_rank && !specials.count(id)) specials[id] = {"<|reserved_token_" + std::to_string(id) + "|>", true};
  }
  for (const auto& [id, entry] : specials) {
    const auto& [content, special] = entry;
    if (static_cast<size_t>(id) < id_present.size() && id_present[id])
      throw FormatError(parts.config_source + ": added token '" + content + "' has id " + std::to_string(id) +
                        ", which " + source + " already gives to a token");
    set_token(id, content);
    id_to_bytes[id] = content;
    id_special[id] = special ? 1 : 0;
    text_to_id.insert_or_assign(content, id);
    added_tokens.push_back(AddedToken{id, content, special, false, false, false});
  }

  PreTokenizerStep step;
  step.regex = std::make_unique<Regex>(tiktoken::kKimiPattern, false, source + ": Kimi pre-tokenizer pattern");
  steps.push_back(std::move(step));
  kimi_chunks = true;
}

void Tokenizer::Impl::apply_config(const json& config, const std::string& config_path,
                                   std::optional<int32_t> bos_by_id, std::optional<int32_t> eos_by_id) {
  if (!config.is_object()) throw std::runtime_error(config_path + ": top level is not a JSON object");
  try {
    if (config.contains("bos_token")) bos_text = token_content(config["bos_token"]);
    if (config.contains("eos_token")) eos_text = token_content(config["eos_token"]);
    if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
      use_config_flags = true;
      add_bos = config.value("add_bos_token", false);
      add_eos = config.value("add_eos_token", false);
    }
    if (config.contains("chat_template")) {
      const json& t = config["chat_template"];
      if (t.is_string()) {
        chat_template = t.get<std::string>();
      } else if (t.is_array() && !t.empty()) {  // [{"name": ..., "template": ...}]
        chat_template = t[0].at("template").get<std::string>();
        for (const json& named : t)
          if (named.value("name", "") == "default") chat_template = named.at("template").get<std::string>();
      }
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(config_path + ": unexpected structure: " + e.what());
  }
  auto resolve = [&](const std::string& name, const char* what) -> int32_t {
    if (name.empty()) return -1;
    int32_t id = text_to_id.find(name);
    if (id < 0) throw std::runtime_error(config_path + ": " + what + " '" + name + "' is not in the vocabulary");
    return id;
  };
  bos = resolve(bos_text, "bos_token");
  eos = resolve(eos_text, "eos_token");
  if (bos_by_id) {
    bos = *bos_by_id;
    bos_text = id_to_text.at(static_cast<size_t>(bos));
  }
  if (eos_by_id) {
    eos = *eos_by_id;
    eos_text = id_to_text.at(static_cast<size_t>(eos));
  }
  if (add_bos && bos < 0) throw std::runtime_error(config_path + ": add_bos_token is true but there is no bos_token");
  if (add_eos && eos < 0) throw std::runtime_error(config_path + ": add_eos_token is true but there is no eos_token");
}

namespace {

// tokenizer.json's text into parts: model.vocab and model.merges streamed apart, the rest a document.
void read_tokenizer_json(const std::string& path, std::string text, TokenizerParts& parts) {
  TokenizerJsonReader reader(path);
  json::sax_parse(text, &reader);
  text.clear();
  text.shrink_to_fit();
  parts.source = path;
  parts.root = std::move(reader.root);
  parts.vocab = std::move(reader.vocab);
  parts.merges = std::move(reader.merges);
  parts.has_vocab = reader.has_vocab;
  parts.has_merges = reader.has_merges;
}

// Kimi's special tokens: tokenizer_config.json's added_tokens_decoder ({"ID": {"content", "special"}}).
std::map<int32_t, std::pair<std::string, bool>> added_tokens_decoder(const json& config,
                                                                     const std::string& config_path) {
  std::map<int32_t, std::pair<std::string, bool>> specials;
  if (!config.is_object() || !config.contains("added_tokens_decoder")) return specials;
  const json& decoder = config["added_tokens_decoder"];
  if (!decoder.is_object()) throw std::runtime_error(config_path + ": added_tokens_decoder is not an object");
  for (const auto& [key, value] : decoder.items()) {
    int64_t id = -1;
    if (!key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos)
      id = std::stoll(key);
    if (id < 0 || id >= (1 << 26))
      throw std::runtime_error(config_path + ": added_tokens_decoder key '" + key + "' is not a token id");
    if (!value.is_object() || !value.contains("content") || !value["content"].is_string() ||
        value["content"].get<std::string>().empty())
      throw std::runtime_error(config_path + ": added_tokens_decoder entry " + key + " has no content string");
    bool special = value.contains("special") && value["special"].is_boolean() ? value["special"].get<bool>() : true;
    specials[static_cast<int32_t>(id)] = {value["content"].get<std::string>(), special};
  }
  return specials;
}

bool has_chat_template(const json& config) {
  if (!config.is_object() || !config.contains("chat_template")) return false;
  const json& t = config["chat_template"];
  return (t.is_string() && !t.get_ref<const std::string&>().empty()) || (t.is_array() && !t.empty());
}

// A hub folder's tokenizer files as parts.
TokenizerParts read_folder(const std::string& dir) {
  TokenizerParts parts;
  const std::string json_path = dir + "/tokenizer.json";
  parts.config_source = dir + "/tokenizer_config.json";
  bool exists = false, has_config = false;
  std::string config_text = read_file(parts.config_source, &has_config);
  if (has_config) {
    parts.config = parse_json_file(parts.config_source, config_text);
    if (!parts.config.is_object()) throw std::runtime_error(parts.config_source + ": top level is not a JSON object");
  }

  std::string text = read_file(json_path, &exists);
  if (exists) {
    read_tokenizer_json(json_path, std::move(text), parts);
  } else {
    // Kimi K2 / K2.5 ship tiktoken.model (with tokenization_kimi.py) instead of tokenizer.json.
    const std::string tiktoken_path = dir + "/tiktoken.model";
    text = read_file(tiktoken_path, &exists);
    if (!exists) throw std::runtime_error(json_path + ": cannot open file (nor " + tiktoken_path + ")");
    parts.source = tiktoken_path;
    parts.tiktoken = true;
    parts.ranked = tiktoken::parse_model(tiktoken_path, text);
    parts.specials = added_tokens_decoder(parts.config, parts.config_source);
  }

  // Newer checkpoints keep the template beside the config: chat_template.jinja or chat_template.json.
  if (!has_chat_template(parts.config)) {
    std::string jinja = read_file(dir + "/chat_template.jinja", &exists);
    if (exists) {
      parts.chat_template = std::move(jinja);
    } else {
      std::string template_path = dir + "/chat_template.json";
      std::string template_text = read_file(template_path, &exists);
      if (exists) {
        json t = parse_json_file(template_path, template_text);
        if (t.is_object() && t.contains("chat_template") && t["chat_template"].is_string())
          parts.chat_template = t["chat_template"].get<std::string>();
      }
    }
  }
  return parts;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& dir) {
  if (const auto gguf = gguf_path(dir)) {
    const GgufFile f(*gguf);
    return from_gguf(f.metadata(), f.path());
  }
  return from_parts(read_folder(dir));
}

Tokenizer Tokenizer::from_parts(TokenizerParts parts) {
  auto impl = std::make_unique<Impl>();
  impl->source = parts.source;
  if (parts.tiktoken) {
    impl->load_ranked(parts);
  } else {
    impl->load_bpe(parts);
  }
  impl->build_trie();
  if (!parts.config.is_null() || parts.bos_id || parts.eos_id)
    impl->apply_config(parts.config.is_null() ? json::object() : parts.config, parts.config_source, parts.bos_id,
                       parts.eos_id);
  if (impl->chat_template.empty()) impl->chat_template = std::move(parts.chat_template);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::string clean;
  std::string_view text = input;
  if (!utf8::is_valid(input)) {
    clean = sanitize_utf8(input);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) {
    if (im.use_config_flags) {
      if (im.add_bos) out.push_back(im.bos);
    } else {
      out.insert(out.end(), im.prefix_ids.begin(), im.prefix_ids.end());
    }
  }

  if (im.kimi_chunks) {
    tiktoken::for_each_kimi_chunk(text, [&](std::string_view chunk) { im.encode_span(chunk, out); });
  } else {
    im.encode_span(text, out);
  }

  if (add_special_tokens) {
    if (im.use_config_flags) {
      if (im.add_eos) out.push_back(im.eos);
    } else {
      out.insert(out.end(), im.suffix_ids.begin(), im.suffix_ids.end());
    }
  }
  return out;
}

// Matches added tokens in text (leftmost, longest) and encodes the text between them.
void Tokenizer::Impl::encode_span(std::string_view text, std::vector<int32_t>& out) const {
  // Leftmost-longest scan for added tokens; the text between matches goes through BPE.
  size_t plain_begin = 0, i = 0;
  const size_t n = text.size();
  while (i < n) {
    uint8_t first = static_cast<uint8_t>(text[i]);
    if (!trie_first[first]) {
      ++i;
      continue;
    }
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t k = i; k < n; ++k) {
      uint8_t b = static_cast<uint8_t>(text[k]);
      const auto& kids = trie[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{-1}));
      if (it == kids.end() || it->first != b) break;
      node = it->second;
      if (trie[node].token >= 0) {
        found = trie[node].token;
        found_end = k + 1;
      }
    }
    if (found >= 0) {
      const AddedToken& token = added_tokens[found];
      if (token.single_word) {
        bool left_ok = i == 0 || !is_ascii_word_char(static_cast<uint8_t>(text[i - 1]));
        bool right_ok = found_end == n || !is_ascii_word_char(static_cast<uint8_t>(text[found_end]));
        if (!left_ok || !right_ok) found = -1;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = added_tokens[found];
    size_t plain_end = i;
    if (token.lstrip)
      while (plain_end > plain_begin && is_space(static_cast<uint8_t>(text[plain_end - 1]))) --plain_end;
    encode_text(text.substr(plain_begin, plain_end - plain_begin), out);
    out.push_back(token.id);
    i = found_end;
    if (token.rstrip)
      while (i < n && is_space(static_cast<uint8_t>(text[i]))) ++i;
    plain_begin = i;
  }
  encode_text(text.substr(plain_begin), out);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_present.size() || !impl_->id_present[id])
    throw std::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
  return impl_->id_to_bytes[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_special.size() && impl_->id_special[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special_tokens && is_special(id)) continue;
    bytes += b;
  }
  if (utf8::is_valid(bytes)) return bytes;
  return sanitize_utf8(bytes);
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_text; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_text; }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  int32_t id = impl_->text_to_id.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::string Tokenizer::token_text(int32_t id) const {
  token_bytes(id);  // validates the id
  return impl_->id_to_text[id];
}

size_t Tokenizer::vocab_size() const { return impl_->id_to_text.size(); }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

// ---------------------------------------------------------------------------------------------

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    size_t len = utf8::sequence_length(s, i, &bad);
    if (len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string& bytes = tokenizer_->token_bytes(id);
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  pending_ += bytes;
  size_t ready = utf8::complete_prefix_length(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace mla
