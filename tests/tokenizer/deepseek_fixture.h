// The DeepSeek-V3 tokenizer fixture, loaded once per test binary and shared by the tokenizer,
// chat-template and CLI tests.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mla::test {

inline const std::string& deepseek_v3_dir() {
  static const std::string dir = std::string(MLA_SHARED_DIR) + "/fixtures/tokenizer/deepseek-v3";
  return dir;
}

// The rows of one of the fixture's JSON Lines files: "cases.jsonl" or "chat_cases.jsonl".
inline std::vector<nlohmann::json> deepseek_v3_jsonl(const std::string& name) {
  const std::string path = deepseek_v3_dir() + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

inline const Tokenizer& deepseek_v3_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load(deepseek_v3_dir());
  return tokenizer;
}

}  // namespace mla::test
