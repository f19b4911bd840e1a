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

// A \u or \x escape takes exactly its hex digits: anything else is the lexer's Error, not
// std::stoul's std::invalid_argument (or a sign stoul would have read).
TEST(JinjaLexer, HexEscapesNeedHexDigits) {
  std::vector<Segment> s = lex(R"({{ '\u0041\x42' }})");
  ASSERT_EQ(s.size(), 1u);
  ASSERT_GE(s[0].tokens.size(), 1u);
  EXPECT_EQ(s[0].tokens[0].text, "AB");
  for (const char* bad : {R"({{ '\uZZZZ' }})", R"({{ '\u+041' }})", R"({{ '\x-1' }})", R"({{ '\xg0' }})",
                          R"({{ '\u 041' }})"}) {
    SCOPED_TRACE(bad);
    try {
      lex(bad);
      ADD_FAILURE() << "lexed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("hex digits"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not the lexer's Error: " << e.what();
    }
  }
}

}  // namespace
