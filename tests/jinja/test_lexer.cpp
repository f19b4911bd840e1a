// The Jinja lexer: segments, transformers' whitespace settings, tokens, and error positions.
#include <gtest/gtest.h>

#include "jinja/error.h"
#include "jinja/lexer.h"

namespace {

using namespace mla::jinja;

TEST(JinjaLexer, SegmentsAndTokens) {
  std::vector<Segment> s = lex("a{{ x.y + 1.5 }}b{% if 'q' %}{# c #}");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].type, Segment::Type::Text);
  EXPECT_EQ(s[0].text, "a");
  ASSERT_EQ(s[1].type, Segment::Type::Output);
  ASSERT_EQ(s[1].tokens.size(), 5u);
  EXPECT_EQ(s[1].tokens[1].text, ".");
  EXPECT_EQ(s[1].tokens[4].type, Token::Type::Float);
  EXPECT_DOUBLE_EQ(s[1].tokens[4].number, 1.5);
  EXPECT_EQ(s[3].type, Segment::Type::Statement);
  EXPECT_EQ(s[3].tokens[1].type, Token::Type::String);
  EXPECT_EQ(s[3].tokens[1].text, "q");
}

TEST(JinjaLexer, TrimAndLstripBlocksAndControls) {
  // lstrip_blocks drops the indentation before a statement tag, trim_blocks the newline after.
  std::vector<Segment> s = lex("x\n  {% if a %}\ny  {{- z -}}  \nw");
  ASSERT_GE(s.size(), 5u);
  EXPECT_EQ(s[0].text, "x\n");
  EXPECT_EQ(s[2].text, "y");
  EXPECT_EQ(s.back().text, "w");
}

TEST(JinjaLexer, RawBodyIsText) {
  std::vector<Segment> s = lex("{% raw %}{{ not parsed }}{% endraw %}");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].text, "{{ not parsed }}");
}

TEST(JinjaLexer, ErrorsNameLineAndColumn) {
  EXPECT_EQ(position_of("ab\ncd", 4), "line 2, column 2");
  try {
    lex("ok\n  {{ 'open");
    FAIL() << "an unterminated string lexed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unterminated string literal"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lex("{{ a $ b }}"), Error);
  EXPECT_THROW(lex("{# never closed"), Error);
}

}  // namespace
