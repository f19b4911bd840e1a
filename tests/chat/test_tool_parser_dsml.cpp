// The deepseek_v32 (DSML) tool-call parser on outputs of the form DeepSeek-V3.2 writes, well-formed
// and not: several calls, typed and untyped parameters, unicode, text before and after, the
// whitespace that belongs to the section, malformed and unterminated calls. Each output is fed
// whole, split at every byte boundary, one byte at a time and in random pieces; every way must
// give the same content and calls, and no content delta may end inside a UTF-8 character. The
// outputs of the official encoder are read back in tests/tokenizer/test_encoding_dsv32.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "server/stream_splits.h"
#include "chat/tool_parser.h"

namespace mla::chat {
namespace {

using Json = nlohmann::json;

ToolParseResult feed(const std::vector<std::string>& pieces, const Json& tools) {
  ToolParserOptions options;
  options.tools = tools;
  options.make_id = [n = 0]() mutable { return "call_" + std::to_string(n++); };
  auto p = make_tool_parser("deepseek_v32", options);
  ToolParseResult r;
  std::vector<ToolCallDelta> deltas;
  for (const std::string& piece : pieces) p->feed(piece, deltas);
  p->finish(deltas);
  int started = 0;
  for (const ToolCallDelta& d : deltas) {
    if (d.kind == ToolCallDelta::Kind::Content) {
      EXPECT_FALSE(d.text.empty());
      EXPECT_TRUE(test::valid_utf8(d.text)) << "content delta cut inside a character";
    }
    if (d.kind == ToolCallDelta::Kind::CallStart) {
      EXPECT_EQ(d.index, started++);
    }
    if (d.kind == ToolCallDelta::Kind::Arguments) {
      EXPECT_EQ(d.index, started - 1);
    }
    r.apply(d);
  }
  EXPECT_EQ(p->calls(), int(r.tool_calls.size()));
  return r;
}

ToolParseResult parse_all_ways(const std::string& text, const Json& tools = nullptr) {
  ToolParseResult whole = feed({text}, tools);
  test::for_each_split(
      text,
      [&](const std::vector<std::string>& pieces, const std::string& how) {
        ToolParseResult r = feed(pieces, tools);
        EXPECT_EQ(r.content, whole.content) << how;
        ASSERT_EQ(r.tool_calls.size(), whole.tool_calls.size()) << how;
        for (size_t i = 0; i < r.tool_calls.size(); ++i) {
          EXPECT_EQ(r.tool_calls[i].id, whole.tool_calls[i].id) << how;
          EXPECT_EQ(r.tool_calls[i].name, whole.tool_calls[i].name) << how;
          EXPECT_EQ(r.tool_calls[i].arguments, whole.tool_calls[i].arguments) << how;
        }
      },
      100, 9, 99);
  return whole;
}

std::string param(const std::string& k, const std::string& v, const char* is_str) {
  return "<｜DSML｜parameter name=\"" + k + "\" string=\"" + is_str + "\">" + v + "</｜DSML｜parameter>";
}
std::string invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "\n</｜DSML｜invoke>";
}
std::string section(const std::string& calls) {
  return "\n\n<｜DSML｜function_calls>\n" + calls + "\n</｜DSML｜function_calls>";
}

TEST(ToolParserDsml, TwoCallsWithTypedParameters) {
  const std::string text =
      "Checking 天气 ☀️" +
      section(invoke("get_weather", param("city", "北京 \"quoted\"", "true") + "\n" + param("days", "3", "false")) +
              "\n" +
              invoke("search", param("q", "line1\nline2 😀", "true") + "\n" +
                                   param("opts", "{\"a\": [1, 2.5, null], \"b\": {\"c\": true}}", "false")));
  ToolParseResult r = parse_all_ways(text);
  EXPECT_EQ(r.content, "Checking 天气 ☀️");  // the "\n\n" before the section goes with it
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\":\"北京 \\\"quoted\\\"\",\"days\":3}");
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(Json::parse(r.tool_calls[1].arguments),
            Json::parse("{\"q\": \"line1\\nline2 😀\", \"opts\": {\"a\": [1, 2.5, null], \"b\": {\"c\": true}}}"));
}

TEST(ToolParserDsml, NoParametersAndTextAfterTheSection) {
  ToolParseResult r = parse_all_ways(section("<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>") + "\nDone.");
  EXPECT_EQ(r.content, "\nDone.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "now");
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
}

TEST(ToolParserDsml, SectionRightAfterReasoningWithoutLeadingNewlines) {
  ToolParseResult r = parse_all_ways("<｜DSML｜function_calls>\n" + invoke("f", param("x", "1", "false")) +
                                     "\n</｜DSML｜function_calls>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"x\":1}");
}

TEST(ToolParserDsml, WhitespaceWithoutASectionIsContent) {
  const std::string text = "Line one\n\n  \nLine two\n\n";
  ToolParseResult r = parse_all_ways(text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParserDsml, UntypedParameterFollowsTheToolSchema) {
  Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}}])");
  const std::string params = "<｜DSML｜parameter name=\"n\">42</｜DSML｜parameter>\n"
                             "<｜DSML｜parameter name=\"s\">42</｜DSML｜parameter>\n"
                             "<｜DSML｜parameter name=\"u\">[1]</｜DSML｜parameter>";
  ToolParseResult r = parse_all_ways(section(invoke("f", params)), tools);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"n\":42,\"s\":\"42\",\"u\":\"[1]\"}");
}

TEST(ToolParserDsml, NonJsonValueMarkedNotStringStaysAString) {
  ToolParseResult r = parse_all_ways(section(invoke("f", param("v", "not json", "false"))));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"v\":\"not json\"}");
}

TEST(ToolParserDsml, MalformedCallsStayContentVerbatim) {
  // A repeated parameter, a bad flag, a name with a space, a parameter without its end: each
  // section's only call fails, so each section is content as written.
  for (const std::string& bad : {invoke("f", param("a", "1", "true") + "\n" + param("a", "2", "true")),
                                 invoke("f", param("a", "1", "maybe")),
                                 invoke("two words", param("a", "1", "true")),
                                 std::string("<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
                                             "string=\"true\">1\n</｜DSML｜invoke>"),
                                 std::string("<｜DSML｜invoke name=f>\n</｜DSML｜invoke>")}) {
    const std::string text = "Text" + section(bad);
    ToolParseResult r = parse_all_ways(text);
    EXPECT_EQ(r.content, text) << bad;
    EXPECT_TRUE(r.tool_calls.empty()) << bad;
  }
}

TEST(ToolParserDsml, BadCallBesideAGoodOne) {
  const std::string bad = invoke("a b", param("x", "1", "false"));
  const std::string text = "\n\n<｜DSML｜function_calls>\n" + bad + "\n" + invoke("good", param("y", "[]", "false")) +
                           "\n</｜DSML｜function_calls>";
  ToolParseResult r = parse_all_ways(text);
  EXPECT_EQ(r.content, "\n\n<｜DSML｜function_calls>\n" + bad);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "good");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"y\":[]}");
}

TEST(ToolParserDsml, UnterminatedCallsStayContent) {
  const std::string first = "\n\n<｜DSML｜function_calls>\n" + invoke("a", param("x", "1", "false"));
  const std::string cut = "\n<｜DSML｜invoke name=\"b\">\n<｜DSML｜parameter name=\"y\" string=\"true\">unfini";
  ToolParseResult r = parse_all_ways("Hi" + first + cut);
  ASSERT_EQ(r.tool_calls.size(), 1u);  // the complete call stands
  EXPECT_EQ(r.tool_calls[0].name, "a");
  EXPECT_EQ(r.content, "Hi" + cut);

  const std::string only_cut = "Hi\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"b\">\n<｜DSML｜para";
  r = parse_all_ways(only_cut);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, only_cut);

  r = parse_all_ways("Hello\n\n<｜DSML｜funct");  // a marker cut at the end is content, with its whitespace
  EXPECT_EQ(r.content, "Hello\n\n<｜DSML｜funct");
}

TEST(ToolParserDsml, RandomMarkerSoupNeverThrowsAndSplitsAgree) {
  // Outputs stitched from pieces of the syntax: whatever the parser makes of them, it must make
  // the same of every split, lose no text when no call is found, and send only JSON objects.
  const std::vector<std::string> atoms = {
      "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
      "<｜DSML｜parameter", "</｜DSML｜parameter>", " name=\"f\"", " string=\"true\"", " string=\"false\"", ">",
      "1", "{\"a\": 1}", "\n", "\n\n", " ", "é", "😀", "<", "｜", "x"};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 150; ++trial) {
    std::string text;
    int n = std::uniform_int_distribution<int>(1, 16)(rng);
    for (int i = 0; i < n; ++i) text += atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)];
    ToolParseResult r = parse_all_ways(text);
    if (r.tool_calls.empty()) {
      EXPECT_EQ(r.content, text);
    }
    for (const ToolCall& c : r.tool_calls) EXPECT_TRUE(Json::parse(c.arguments).is_object());
  }
}

TEST(ToolParserDsml, SelectedForDeepSeekV32) {
  EXPECT_EQ(default_tool_parser("deepseek_v32", ""), "deepseek_v32");
  // V3.2-Exp ships V3.1's template, whose evidence decides.
  EXPECT_EQ(default_tool_parser("deepseek_v32",
                                "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + "
                                "'<｜tool▁sep｜>' + tool['function']['arguments']}}"),
            "deepseek_v31");
  EXPECT_EQ(default_tool_parser("", "{{ '<｜DSML｜invoke name=\"' }}"), "deepseek_v32");
  auto names = tool_parser_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "deepseek_v32"), names.end());
}

}  // namespace
}  // namespace mla::chat
