// The DeepSeek-V3 tokenizer fixture, loaded once per test binary and shared by the tokenizer,
// chat-template and CLI tests.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace mla::test {

inline const std::string& deepseek_v3_dir() {
  static const std::string dir = std::string(MLA_SHARED_DIR) + "/fixtures/tokenizer/deepseek-v3";
  return dir;
}

inline const Tokenizer& deepseek_v3_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load(deepseek_v3_dir());
  return tokenizer;
}

}  // namespace mla::test
