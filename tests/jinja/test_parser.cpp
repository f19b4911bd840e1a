// The Jinja parser: precedence, the tree's depth, and the nesting limit that keeps a template
// from overflowing the parser's (and the renderer's) stack.
#include <gtest/gtest.h>

#include "jinja/error.h"
#include "jinja/parser.h"

namespace {

using namespace mla::jinja;

Body parse_text(const std::string& source, const Limits& limits = {}) { return parse(source, lex(source), limits); }

const Expr& output_expr(const Body& body) {
  if (body.empty() || body[0]->kind != Node::Kind::Output) throw std::runtime_error("no output node");
  return *body[0]->expr;
}

TEST(JinjaParser, PrecedenceAndDepth) {
  Body body = parse_text("{{ 'x' ~ 2 * 3 + 4 }}");
  const Expr& top = output_expr(body);
  // As in Jinja, + binds looser than ~, which binds looser than *: ('x' ~ (2 * 3)) + 4.
  ASSERT_EQ(top.kind, Expr::Kind::Binary);
  EXPECT_EQ(top.name, "+");
  ASSERT_EQ(top.children[0]->kind, Expr::Kind::Binary);
  EXPECT_EQ(top.children[0]->name, "~");
  ASSERT_EQ(top.children[0]->children.size(), 2u);
  EXPECT_EQ(top.children[0]->children[1]->name, "*");
  EXPECT_EQ(top.depth, 4u);

  Body filtered = parse_text("{{ a | default('b') | upper }}");
  const Expr& f = output_expr(filtered);
  ASSERT_EQ(f.kind, Expr::Kind::Filter);
  EXPECT_EQ(f.name, "upper");
  EXPECT_EQ(f.children[0]->name, "default");
}

TEST(JinjaParser, StatementsBuildTheirBodies) {
  Body body = parse_text("{% for m in ms if m %}{{ m }}{% else %}none{% endfor %}");
  ASSERT_EQ(body.size(), 1u);
  EXPECT_EQ(body[0]->kind, Node::Kind::For);
  EXPECT_TRUE(body[0]->condition);
  EXPECT_EQ(body[0]->body.size(), 1u);
  EXPECT_EQ(body[0]->else_body.size(), 1u);
}

Limit limit_of(const std::string& source, const Limits& limits = {}) {
  try {
    parse_text(source, limits);
  } catch (const LimitError& e) {
    return e.limit();
  }
  throw std::runtime_error("parsed within its limits");
}

TEST(JinjaParser, NestingPastTheLimitIsALimitError) {
  const size_t n = 100'000;  // deep enough to overflow the stack without the limit
  EXPECT_EQ(limit_of("{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}"), Limit::Depth);
  EXPECT_EQ(limit_of("{{ " + std::string(n, '[') + std::string(n, ']') + " }}"), Limit::Depth);
  std::string nots;
  for (size_t i = 0; i < n; ++i) nots += "not ";
  EXPECT_EQ(limit_of("{{ " + nots + "x }}"), Limit::Depth);
  std::string ifs, endifs;
  for (size_t i = 0; i < 10'000; ++i) {
    ifs += "{% if x %}";
    endifs += "{% endif %}";
  }
  EXPECT_EQ(limit_of(ifs + endifs), Limit::Depth);
}

TEST(JinjaParser, LongOperatorChainsAreBoundedByTreeDepth) {
  // a+a+a+... and x|f|f|... are built by loops, not recursion: their tree depth is what counts.
  std::string sum = "{{ a", filters = "{{ a";
  for (int i = 0; i < 100'000; ++i) {
    sum += " + a";
    filters += " | trim";
  }
  EXPECT_EQ(limit_of(sum + " }}"), Limit::Depth);
  EXPECT_EQ(limit_of(filters + " }}"), Limit::Depth);
  Limits small;
  small.max_depth = 8;
  EXPECT_EQ(limit_of("{{ a + a + a + a + a + a + a + a + a }}", small), Limit::Depth);
  EXPECT_NO_THROW(parse_text("{{ a + a + a + a + a + a }}", small));
}

TEST(JinjaParser, SyntaxErrorsNamePosition) {
  try {
    parse_text("line one\n{% for x in %}");
    FAIL() << "a bad for parsed";
  } catch (const LimitError&) {
    FAIL() << "a syntax error reported as a limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

}  // namespace
