// Tokenizer::write_byte_level_tokenizer: writes a small byte-level BPE tokenizer (tokenizer.json
// and tokenizer_config.json, DeepSeek-style) so a random-weight demo checkpoint can be read as
// text. Merges are learned from a built-in English/code sample by plain BPE training and, when
// the sample runs out of repeated pairs, extended by a fixed rule; the result depends only on
// vocab_size.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace mla {

namespace {

const char* kTrainingSample = R"(The quick brown fox jumps over the lazy dog. A language model reads text as tokens,
and a tokenizer turns the text into those tokens and back again. This is a small sample of
ordinary English with common words: the, of, and, to, in, is, that, for, it, as, was, with, be,
by, on, not, he, this, are, or, his, from, at, which, but, have, an, they, you, were, there,
one, all, we, can, her, has, been, if, more, when, will, would, who, so, no, what, about, out.
Attention lets every token look at the tokens before it. The cache keeps the keys and values of
earlier tokens so that each new token costs little. In latent attention the cache keeps one
small latent vector per token instead of a key and a value for every head.
def attention(query, key, value):
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    return weights @ value

for (int i = 0; i < n; ++i) {
    sum += values[i] * weights[i];
}
return sum;
int main(int argc, char** argv) { return 0; }
numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 100 128 256 512 1000 1024 2024 2025
User: What is the capital of France? Assistant: The capital of France is Paris.
User: Write a short poem about the sea. Assistant: The sea is wide, the sea is deep.
)";

const char* kChatTemplate =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}";

// The same pre-tokenizer as DeepSeek-V3's tokenizer.json.
const char* kSplitNumbers = "\\p{N}{1,3}";
const char* kSplitCjk = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
const char* kSplitWords =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

// Rough ASCII word splitter for training only: an optional leading space, then a run of
// letters, a run of digits, or a run of other characters.
std::vector<std::string> training_words(const std::string& text) {
  auto kind = [](unsigned char c) {
    if (std::isalpha(c)) return 0;
    if (std::isdigit(c)) return 1;
    if (c == ' ' || c == '\n') return 2;
    return 3;
  };
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && kind(text[i + 1]) != 2) ++i;
    int k = kind(static_cast<unsigned char>(text[i]));
    while (i < text.size() && kind(static_cast<unsigned char>(text[i])) == k) ++i;
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

std::string byte_level(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8::append(out, utf8::byte_to_char()[b]);
  return out;
}

}  // namespace

void Tokenizer::write_byte_level_tokenizer(const std::string& dir, int vocab_size) {
  const std::vector<std::string> specials = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                                             "<｜Assistant｜>"};
  const int n_special = static_cast<int>(specials.size());
  if (vocab_size < 256 + n_special)
    throw std::invalid_argument("write_byte_level_tokenizer: vocab_size " + std::to_string(vocab_size) +
                                " is below the minimum of " + std::to_string(256 + n_special));
  const int n_merges = vocab_size - 256 - n_special;

  // Tokens as raw bytes; ids 0..255 are the single bytes.
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int> token_index;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    token_index[tokens.back()] = b;
  }
  std::vector<std::pair<int, int>> merges;

  // BPE training on the sample: merge the most frequent adjacent pair (ties: smallest ids).
  std::map<std::string, int> word_counts;
  for (const auto& w : training_words(kTrainingSample)) ++word_counts[w];
  std::vector<std::pair<std::vector<int>, int>> words;
  for (const auto& [w, count] : word_counts) {
    std::vector<int> symbols;
    for (unsigned char c : w) symbols.push_back(c);
    words.emplace_back(std::move(symbols), count);
  }
  int vocab_merges = 0;  // merges that added a new token
  while (vocab_merges < n_merges) {
    std::map<std::pair<int, int>, int> pair_counts;
    for (const auto& [symbols, count] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pair_counts[{symbols[i], symbols[i + 1]}] += count;
    std::pair<int, int> best{-1, -1};
    int best_count = 1;
    for (const auto& [pair, count] : pair_counts)
      if (count > best_count) best = pair, best_count = count;
    if (best.first < 0) break;
    std::string joined = tokens[best.first] + tokens[best.second];
    int merged_id;
    auto found = token_index.find(joined);
    if (found == token_index.end()) {
      merged_id = static_cast<int>(tokens.size());
      tokens.push_back(joined);
      token_index[joined] = merged_id;
      ++vocab_merges;
    } else {
      merged_id = found->second;
    }
    merges.push_back(best);
    for (auto& [symbols, count] : words) {
      std::vector<int> next;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == best.first && symbols[i + 1] == best.second) {
          next.push_back(merged_id);
          ++i;
        } else {
          next.push_back(symbols[i]);
        }
      }
      symbols = std::move(next);
    }
  }

  // Fill the rest by a fixed rule: extend existing tokens, in id order, by common characters.
  const std::string extenders = " etaoinsrhldcumfpgwybvkxjqz";
  for (size_t base = 32; vocab_merges < n_merges; ++base) {
    for (char c : extenders) {
      if (vocab_merges >= n_merges) break;
      std::string joined = tokens[base] + std::string(1, c);
      if (token_index.count(joined)) continue;
      int merged_id = static_cast<int>(tokens.size());
      tokens.push_back(joined);
      token_index[joined] = merged_id;
      merges.emplace_back(static_cast<int>(base), static_cast<unsigned char>(c));
      ++vocab_merges;
    }
  }

  using ojson = nlohmann::ordered_json;
  ojson vocab = ojson::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[byte_level(tokens[id])] = id;
  ojson merge_list = ojson::array();
  for (const auto& [a, b] : merges) merge_list.push_back(byte_level(tokens[a]) + " " + byte_level(tokens[b]));
  ojson added = ojson::array();
  for (int k = 0; k < n_special; ++k) {
    int id = static_cast<int>(tokens.size()) + k;
    added.push_back({{"id", id},
                     {"content", specials[k]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", k < 2}});
  }
  auto split = [](const char* pattern) {
    return ojson{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  ojson tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", ojson::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         ojson::array({split(kSplitNumbers), split(kSplitCjk), split(kSplitWords),
                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
  ojson config = {{"add_bos_token", true},
                  {"add_eos_token", false},
                  {"bos_token", specials[0]},
                  {"eos_token", specials[1]},
                  {"pad_token", specials[1]},
                  {"clean_up_tokenization_spaces", false},
                  {"model_max_length", 16384},
                  {"tokenizer_class", "LlamaTokenizerFast"},
                  {"chat_template", kChatTemplate}};

  std::filesystem::create_directories(dir);
  auto write = [](const std::string& path, const ojson& value) {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw std::runtime_error(path + ": cannot open for writing");
    out << value.dump(1) << "\n";
    if (!out) throw std::runtime_error(path + ": write failed");
  };
  write(dir + "/tokenizer.json", tokenizer);
  write(dir + "/tokenizer_config.json", config);
}

}  // namespace mla
