// write_tokenizer_folder: TokenizerParts out as the hub folder read_folder (tokenizer.cpp) reads
// back into the same parts, so that a GGUF file's tokenizer (gguf_tokenizer_parts) becomes
// tokenizer.json / tiktoken.model and tokenizer_config.json beside the checkpoint mla quantize
// writes.
//
// What the folder can say only by name, the parts say by id: bos_token / eos_token. The loader
// gives a name the id of the last token written with that text (vocabulary, then added tokens),
// so a bos / eos id whose text a later token repeats cannot be written; that is an error here
// rather than a folder that loads differently.
#include "tokenizer/tokenizer_parts.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "tokenizer/unicode_util.h"

namespace mla {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Token texts by id and ids by text, filled in the order the loader fills them (later wins).
struct TokenNames {
  std::unordered_map<int32_t, std::string> text;
  std::unordered_map<std::string, int32_t> id;
  void add(int32_t i, const std::string& t) {
    text[i] = t;
    id[t] = i;
  }
};

TokenNames token_names(const TokenizerParts& parts) {
  TokenNames names;
  if (parts.tiktoken) {
    const auto& alphabet = utf8::byte_to_char();
    for (const auto& t : parts.ranked) {
      std::string shown;
      for (unsigned char b : t.bytes) utf8::append(shown, alphabet[b]);
      names.add(t.rank, shown);
    }
    // The loader's specials: those given, and <|reserved_token_ID|> for the 256 ids after the
    // ranks that are neither a rank nor given (Tokenizer::Impl::load_ranked).
    std::map<int32_t, std::string> specials;
    for (const auto& [id, entry] : parts.specials) specials[id] = entry.first;
    const auto first_reserved = static_cast<int32_t>(parts.ranked.size());
    for (int32_t id = first_reserved; id < first_reserved + 256; ++id)
      if (!names.text.count(id) && !specials.count(id)) specials[id] = "<|reserved_token_" + std::to_string(id) + "|>";
    for (const auto& [id, content] : specials) names.add(id, content);
    return names;
  }
  for (const auto& [text, id] : parts.vocab) names.add(id, text);
  if (parts.root.is_object() && parts.root.contains("added_tokens") && parts.root["added_tokens"].is_array())
    for (const json& t : parts.root["added_tokens"])
      names.add(t.at("id").get<int32_t>(), t.at("content").get<std::string>());
  return names;
}

// The name tokenizer_config.json gives special id `id` (what: "bos_token" / "eos_token").
std::string special_name(const TokenNames& names, int32_t id, const char* what, const std::string& config_path) {
  auto text = names.text.find(id);
  if (text == names.text.end())
    throw std::runtime_error(config_path + ": " + what + " id " + std::to_string(id) + " is not in the vocabulary");
  const int32_t named = names.id.at(text->second);
  if (named != id)
    throw std::runtime_error(config_path + ": " + what + " id " + std::to_string(id) +
                             " cannot be written by name: its text '" + text->second + "' is also token " +
                             std::to_string(named) + "'s, which the name would give");
  return text->second;
}

// tokenizer.json: the parts' root, with model.vocab and model.merges written out entry by entry
// (one a line) from the parts' lists, so that duplicates and order are kept as they are.
std::string tokenizer_json(const TokenizerParts& parts) {
  if (!parts.root.is_object() || !parts.root.contains("model") || !parts.root["model"].is_object())
    throw std::runtime_error(parts.source + ": the tokenizer has no model section to write");
  if (!parts.has_vocab || !parts.has_merges)
    throw std::runtime_error(parts.source + ": the tokenizer has no vocab or merges");
  auto quoted = [](const std::string& s) { return json(s).dump(); };
  std::string out = "{\n";
  bool first = true;
  for (const auto& [key, value] : parts.root.items()) {
    out += first ? "  " : ",\n  ";
    first = false;
    out += quoted(key) + ": ";
    if (key != "model") {
      out += value.dump();
      continue;
    }
    out += "{\n";
    for (const auto& [option, setting] : value.items())
      if (option != "vocab" && option != "merges") out += "    " + quoted(option) + ": " + setting.dump() + ",\n";
    out += "    \"vocab\": {";
    for (size_t i = 0; i < parts.vocab.size(); ++i) {
      const auto& [text, id] = parts.vocab[i];
      out += (i ? ",\n      " : "\n      ") + quoted(text) + ": " + std::to_string(id);
    }
    out += parts.vocab.empty() ? "},\n" : "\n    },\n";
    out += "    \"merges\": [";
    for (size_t i = 0; i < parts.merges.size(); ++i) {
      const auto& [left, right] = parts.merges[i];
      out += (i ? ",\n      [" : "\n      [") + quoted(left) + ", " + quoted(right) + "]";
    }
    out += parts.merges.empty() ? "]\n  }" : "\n    ]\n  }";
  }
  out += "\n}\n";
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error(path.string() + ": cannot open for writing");
  out << text;
  if (!out.flush()) throw std::runtime_error(path.string() + ": write failed");
}

bool has_chat_template(const json& config) {
  if (!config.contains("chat_template")) return false;
  const json& t = config["chat_template"];
  return (t.is_string() && !t.get_ref<const std::string&>().empty()) || (t.is_array() && !t.empty());
}

}  // namespace

void write_tokenizer_folder(const TokenizerParts& parts, const std::string& dir) {
  const fs::path folder(dir);
  const fs::path config_path = folder / "tokenizer_config.json";
  fs::path path;  // the file being made, for errors
  try {
    json config = parts.config.is_null() ? json::object() : parts.config;
    if (!config.is_object()) throw std::runtime_error(parts.config_source + ": the config is not a JSON object");
    if (!has_chat_template(config) && !parts.chat_template.empty()) config["chat_template"] = parts.chat_template;
    if (parts.bos_id || parts.eos_id) {
      const TokenNames names = token_names(parts);
      if (parts.bos_id) config["bos_token"] = special_name(names, *parts.bos_id, "bos_token", config_path.string());
      if (parts.eos_id) config["eos_token"] = special_name(names, *parts.eos_id, "eos_token", config_path.string());
    }

    fs::create_directories(folder);
    if (parts.tiktoken) {
      json decoder = json::object();
      for (const auto& [id, entry] : parts.specials)
        decoder[std::to_string(id)] = {{"content", entry.first}, {"special", entry.second}};
      config["added_tokens_decoder"] = std::move(decoder);
      for (const auto& t : parts.ranked)
        if (t.bytes.empty()) throw std::runtime_error(parts.source + ": token " + std::to_string(t.rank) + " is empty");
      path = folder / "tiktoken.model";
      write_text(path, tiktoken::format_model(parts.ranked));
      fs::remove(folder / "tokenizer.json");  // it would be read instead
    } else {
      path = folder / "tokenizer.json";
      write_text(path, tokenizer_json(parts));
    }
    path = config_path;
    write_text(path, config.dump(2) + "\n");
  } catch (const json::exception& e) {  // text that is not UTF-8, a malformed added token
    throw std::runtime_error((path.empty() ? parts.source : path.string()) + ": " + e.what());
  } catch (const fs::filesystem_error& e) {
    throw std::runtime_error(dir + ": " + e.what());
  }
}

}  // namespace mla
