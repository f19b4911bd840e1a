// The grammar's text form and the byte-level pushdown matcher.
#include <gtest/gtest.h>

#include <algorithm>

#include "grammar/grammar_test_util.h"

namespace mla::test {
namespace {

using grammar::Grammar;
using grammar::GrammarError;

TEST(GrammarText, LiteralsAlternativesAndGroups) {
  const char* g = R"(root ::= "ab" ( "c" | "de" ) tail
tail ::= "!" | ""   # optional bang
)";
  EXPECT_TRUE(gbnf_accepts(g, "abc"));
  EXPECT_TRUE(gbnf_accepts(g, "abde!"));
  EXPECT_FALSE(gbnf_accepts(g, "ab"));
  EXPECT_FALSE(gbnf_accepts(g, "abcd"));
  EXPECT_FALSE(gbnf_accepts(g, "abd!"));
}

TEST(GrammarText, Repetition) {
  const char* g = R"(root ::= "a"{2,4} "b"* "c"+ "d"? "e"{3} "f"{1,})";
  EXPECT_TRUE(gbnf_accepts(g, "aaceeef"));
  EXPECT_TRUE(gbnf_accepts(g, "aaaabbbcccdeeefff"));
  EXPECT_FALSE(gbnf_accepts(g, "aceeef"));        // one a
  EXPECT_FALSE(gbnf_accepts(g, "aaaaaceeef"));    // five a
  EXPECT_FALSE(gbnf_accepts(g, "aaeeef"));        // no c
  EXPECT_FALSE(gbnf_accepts(g, "aaceef"));        // two e
  EXPECT_FALSE(gbnf_accepts(g, "aaceee"));        // no f
  EXPECT_FALSE(gbnf_accepts(g, "aacddeeef"));     // two d
}

TEST(GrammarText, ClassesOverCodePoints) {
  const char* g = R"(root ::= [a-cx] [α-ω] [^a-z"]+)";
  EXPECT_TRUE(gbnf_accepts(g, "aβ€"));
  EXPECT_TRUE(gbnf_accepts(g, "xω😀Z9"));
  EXPECT_FALSE(gbnf_accepts(g, "dβ1"));
  EXPECT_FALSE(gbnf_accepts(g, "aAZ"));       // A is not Greek
  EXPECT_FALSE(gbnf_accepts(g, "aβq"));       // q is excluded
  EXPECT_FALSE(gbnf_accepts(g, "aβ\""));
  // The negated class takes whole UTF-8 characters only: no overlong, surrogate or cut bytes.
  EXPECT_FALSE(gbnf_accepts(g, "aβ\xC0\x80"));
  EXPECT_FALSE(gbnf_accepts(g, "aβ\xED\xA0\x80"));
  EXPECT_FALSE(gbnf_accepts(g, "aβ\xE2\x82"));
  EXPECT_FALSE(gbnf_accepts(g, "aβ\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_TRUE(gbnf_accepts(g, "aβ\xF4\x8F\xBF\xBF"));   // U+10FFFF
}

TEST(GrammarText, EscapesAndRawBytes) {
  EXPECT_TRUE(gbnf_accepts(R"(root ::= "\n\t\"\\" [\x80-\xbf] "\u00e9")", "\n\t\"\\\x85\xC3\xA9"));
  EXPECT_FALSE(gbnf_accepts(R"(root ::= [\x80-\xbf])", "a"));
  EXPECT_TRUE(gbnf_accepts(R"(root ::= .+)", "any ✓ text"));
}

TEST(GrammarText, RoundTripsThroughToString) {
  const char* g = R"(root ::= "{" ws item ( "," ws item )* "}"
item ::= [a-z\u0100-\u017f]{1,3} | "\"" [^"]* "\""
ws ::= [ \n]?)";
  const Grammar a = Grammar::parse(g);
  const Grammar b = Grammar::parse(a.to_string());
  // The same rules, named alike (the order of the rules may differ).
  auto lines = [](const std::string& s) {
    std::vector<std::string> v;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] == '\n') v.push_back(s.substr(start, i - start)), start = i + 1;
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(lines(a.to_string()), lines(b.to_string()));
  EXPECT_EQ(a.rules().size(), b.rules().size());
  for (const char* text : {"{abc}", "{ a,\nb}", "{\"x ŀ\"}", "{ab,ĀĀ}"}) {
    EXPECT_TRUE(grammar_accepts(byte_grammar(a), text)) << text;
    EXPECT_TRUE(grammar_accepts(byte_grammar(b), text)) << text;
  }
  for (const char* text : {"{abcd}", "{}", "{\"x}", "{a,}"}) {
    EXPECT_FALSE(grammar_accepts(byte_grammar(b), text)) << text;
  }
}

TEST(GrammarText, Errors) {
  auto message = [](const char* g) {
    try {
      Grammar::parse(g);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("root ::= foo").find("undefined rule 'foo'"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
  EXPECT_NE(message("root ::= x\nx ::= \"\" root").find("left recursion"), std::string::npos);
  EXPECT_NE(message("start ::= \"a\"").find("no rule 'root'"), std::string::npos);
  EXPECT_NE(message("root ::= \"a").find("unterminated"), std::string::npos);
  EXPECT_NE(message("root ::= [b-a]").find("out of order"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{3,2}").find("n < m"), std::string::npos);
  EXPECT_NE(message("root ::= ( \"a\" ").find("')'"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(message("root ::= [^\\x80]").find("negated"), std::string::npos);
}

TEST(GrammarMatcher, RecursionAndRollback) {
  auto g = byte_grammar(Grammar::parse(R"(root ::= "[" ( root ( "," root )* )? "]")"));
  EXPECT_TRUE(grammar_accepts(g, "[]"));
  EXPECT_TRUE(grammar_accepts(g, "[[],[[]],[]]"));
  EXPECT_FALSE(grammar_accepts(g, "[[]"));
  EXPECT_FALSE(grammar_accepts(g, "[],[]"));
  grammar::Matcher m(g);
  ASSERT_TRUE(m.accept_bytes("[["));
  ASSERT_TRUE(m.accept_bytes("]"));
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_bytes("]"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.is_done());
  EXPECT_FALSE(m.accept_bytes(","));  // nothing may follow the end
  EXPECT_EQ(m.num_accepted(), 3u);
  m.rollback(2);
  EXPECT_EQ(m.num_accepted(), 1u);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("x"));  // a rejected call changes nothing
  ASSERT_TRUE(m.accept_bytes("],[]]"));
  EXPECT_TRUE(m.can_end());
  EXPECT_THROW(m.rollback(5), std::out_of_range);
}

TEST(GrammarMatcher, AmbiguousGrammarsStayBounded) {
  // Every split of a run of a's is a parse; the stack sets must stay small and correct.
  auto g = byte_grammar(Grammar::parse(R"(root ::= ( "a" | "aa" | x )* "b"
x ::= "a" "a"?)"));
  // A repetition of something that can be empty is left-recursive once lowered: rejected.
  EXPECT_THROW(Grammar::parse(R"(root ::= ( "a" | y )* "b"
y ::= "a"?)"), GrammarError);
  std::string text(200, 'a');
  EXPECT_TRUE(grammar_accepts(g, text + "b"));
  EXPECT_FALSE(grammar_accepts(g, text + "c"));
}

TEST(GrammarMatcher, StaticAnalysis) {
  const Grammar g = Grammar::parse(R"g(root ::= "{" body "}" | "(" body ")"
body ::= [a-z] body | item
item ::= "#")g");
  grammar::CompiledGrammar cg(g, nullptr);
  int32_t body = -1, item = -1;
  for (size_t r = 0; r < g.rules().size(); ++r) {
    if (g.rules()[r].name == "body") body = int32_t(r);
    if (g.rules()[r].name == "item") item = int32_t(r);
  }
  ASSERT_GE(body, 0);
  ASSERT_GE(item, 0);
  EXPECT_TRUE(cg.follow(body).test('}'));
  EXPECT_TRUE(cg.follow(body).test(')'));
  EXPECT_FALSE(cg.follow(body).test('a'));
  EXPECT_EQ(cg.single_site(body), -1);  // two call sites in root (the tail self-call does not count)
  EXPECT_GE(cg.single_site(item), 0);
  EXPECT_EQ(cg.single_site(g.root()), -1);
}

}  // namespace
}  // namespace mla::test
