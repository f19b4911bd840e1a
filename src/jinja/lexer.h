// The Jinja lexer: splits a template into text, {{ output }} and {% statement %} segments under
// Jinja's whitespace rules as transformers configures them (trim_blocks, lstrip_blocks, the
// '-' and '+' controls, {# comments #} dropped, {% raw %} bodies kept as text), and each tag
// into tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mla::jinja {

struct Token {
  enum class Type { Name, String, Int, Float, Op } type;
  std::string text;  // name, operator, or string value
  int64_t integer = 0;
  double number = 0;
  size_t pos = 0;
};

struct Segment {
  enum class Type { Text, Output, Statement } type;
  std::string text;
  std::vector<Token> tokens;
  size_t pos = 0;
};

// "line L, column C" (columns in code points) of a byte offset, for error messages.
std::string position_of(const std::string& source, size_t pos);

// The segments of a template; throws Error naming the line and column of a lexical error.
std::vector<Segment> lex(const std::string& source);

}  // namespace mla::jinja
