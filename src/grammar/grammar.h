// A context-free grammar over bytes, the form the constrained-decoding matcher (matcher.h) runs.
//
// The grammar is flat: every rule is a list of alternatives, every alternative a sequence of
// elements, each element either a byte set (one byte out of up to 256) or a reference to a rule.
// Everything richer — string literals, character classes over Unicode code points, groups,
// repetition — is lowered to that form when the grammar is built: a code-point class becomes a
// helper rule whose alternatives are the UTF-8 byte sequences of its ranges, `x*` becomes a
// right-recursive helper `r ::= x r | ε`, `x{m,n}` m copies followed by a chain of nested
// optionals. Left recursion is rejected (the matcher expands rules top-down).
//
// Text form (GBNF-like, as llama.cpp's grammars):
//   root  ::= "{" ws pair ( "," ws pair )* "}"     # a comment
//   pair  ::= [a-z]+ ":" ws ( "true" | "false" )
//   ws    ::= " "?
// - `name ::= alternatives`; a rule may continue on following lines; names are [A-Za-z0-9_-]+.
// - "literal" (UTF-8 text; escapes \n \r \t \\ \" \' \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH).
// - [class] and [^class] of code points and ranges; negation is over the Unicode scalar values
//   (U+0000..U+10FFFF less the surrogates).
// - \xHH is a raw *byte* (in a literal or a class), so byte-level grammars can be written and
//   to_string() round-trips; \u / \U and literal characters are code points (UTF-8 encoded).
//   Raw bytes >= 0x80 may not appear in a negated class.
// - ( ... ) groups, postfix * + ? {m} {m,} {m,n}; an empty alternative matches the empty string.
// - <[123]> is the token with id 123 as a whole (for special tokens in tool-call formats).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mla::grammar {

// A malformed grammar: the message names the rule or the offset in the text.
class GrammarError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// 256 bits, one per byte value.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) set(uint8_t(b));
  }
  int count() const;
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  // kToken: one whole token by id (a special token such as DeepSeek's <｜tool▁sep｜>, which no
  // byte-level element can match); written <[id]> in the text form.
  enum Kind : uint8_t { kEnd, kBytes, kRef, kToken };
  Kind kind = kEnd;
  int32_t arg = 0;  // kBytes: index into byte_sets(); kRef: rule id; kEnd: the rule id; kToken: the id
  bool terminal() const { return kind == kBytes || kind == kToken; }
};

struct Rule {
  std::string name;
  std::vector<int32_t> alts;  // position of each alternative's first element in elements()
};

class Grammar {
 public:
  // Parses the text form above; `root` names the start rule. Throws GrammarError.
  static Grammar parse(std::string_view text, std::string_view root = "root");

  // The grammar in the text form (helper rules included), parseable by parse().
  std::string to_string() const;

  // Every alternative is a run of elements ending in a kEnd element; a position is an index here.
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  const std::vector<Rule>& rules() const { return rules_; }
  int32_t root() const { return root_; }
  int32_t rule_of(int32_t pos) const { return rule_of_[size_t(pos)]; }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<ByteSet> byte_sets_;
  std::vector<Rule> rules_;
  std::vector<int32_t> rule_of_;
  int32_t root_ = 0;
};

// Appends the UTF-8 encoding of a code point.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace mla::grammar
