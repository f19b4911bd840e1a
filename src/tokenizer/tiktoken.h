// Pieces of the tiktoken format that Kimi K2 / K2.5 ship instead of tokenizer.json: the
// tiktoken.model reader, Kimi's pre-tokenization pattern translated to PCRE2, and the input
// chunking Kimi's tokenization_kimi.py applies before tiktoken sees the text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mla::tiktoken {

struct RankedToken {
  std::string bytes;
  int32_t rank;
  size_t line;  // 1-based line in tiktoken.model
};

// Parses tiktoken.model text: one "<base64 of the token's bytes> <rank>" per line; empty lines are
// skipped. Throws std::runtime_error naming `path` and the 1-based line for a malformed line.
// Duplicate ranks and duplicate byte strings are errors too.
std::vector<RankedToken> parse_model(const std::string& path, std::string_view text);

// The tiktoken.model text of `tokens`, in their order: parse_model's inverse (line numbers aside).
std::string format_model(const std::vector<RankedToken>& tokens);

// Kimi's pre-tokenizer pattern in PCRE2 syntax (compile with PCRE2_UTF | PCRE2_UCP).
extern const char* const kKimiPattern;

// Python's str.isspace() for one code point.
bool python_isspace(uint32_t cp);

// Kimi's tokenization_kimi.py encodes the text in pieces: blocks of at most 400,000 code points,
// each further cut so that no run of whitespace (or of non-whitespace, per str.isspace) exceeds
// 25,000 code points. Calls f(piece) for each piece of valid UTF-8 `text`, in order.
void for_each_kimi_chunk(std::string_view text, const std::function<void(std::string_view)>& f);

}  // namespace mla::tiktoken
