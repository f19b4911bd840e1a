// The streaming tool-call parsers on recorded outputs of each family: several calls, nested JSON,
// unicode, escaped quotes, text before and after, malformed and unterminated calls. Each output
// is fed whole, split at every byte boundary, one byte at a time and in random pieces; every way
// must give the same content and calls, no content delta may end inside a UTF-8 character, and
// a call's start must come before its arguments.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "server/stream_splits.h"
#include "chat/tool_parser.h"
#include "chat/chat_template.h"

namespace mla::chat {
namespace {

using Json = nlohmann::json;

// ---- helpers ----------------------------------------------------------------------------------

std::function<std::string()> counter_ids() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

struct Run {
  ToolParseResult result;
  int calls = 0;
};

// Feeds the pieces, checking every delta: content whole UTF-8 characters (when the input is valid
// UTF-8), call indices in order, a call's start before its arguments.
Run feed_pieces(const std::string& parser, const std::vector<std::string>& pieces, const Json& tools,
                bool input_utf8) {
  ToolParserOptions options;
  options.tools = tools;
  options.make_id = counter_ids();
  auto p = make_tool_parser(parser, options);
  Run run;
  int started = 0;
  auto check = [&](const std::vector<ToolCallDelta>& deltas) {
    for (const ToolCallDelta& d : deltas) {
      switch (d.kind) {
        case ToolCallDelta::Kind::Content:
          EXPECT_FALSE(d.text.empty());
          if (input_utf8) {
            EXPECT_TRUE(test::valid_utf8(d.text)) << "content delta cut inside a character";
          }
          break;
        case ToolCallDelta::Kind::CallStart:
          EXPECT_EQ(d.index, started);
          ++started;
          EXPECT_FALSE(d.name.empty());
          EXPECT_FALSE(d.id.empty());
          break;
        case ToolCallDelta::Kind::Arguments:
          EXPECT_EQ(d.index, started - 1) << "arguments before their call's start";
          break;
      }
      run.result.apply(d);
    }
  };
  for (const std::string& piece : pieces) {
    std::vector<ToolCallDelta> deltas;
    p->feed(piece, deltas);
    check(deltas);
  }
  std::vector<ToolCallDelta> deltas;
  p->finish(deltas);
  check(deltas);
  run.calls = p->calls();
  return run;
}

void expect_same(const ToolParseResult& a, const ToolParseResult& b, const std::string& how) {
  EXPECT_EQ(a.content, b.content) << how;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << how;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << how;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << how;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << how;
  }
}

// Parses text whole and in every split; returns the whole result after checking that all agree
// (and agree with parse_tool_calls()).
ToolParseResult parse_all_ways(const std::string& parser, const std::string& text, const Json& tools = nullptr) {
  const bool utf8 = test::valid_utf8(text);
  Run whole = feed_pieces(parser, {text}, tools, utf8);
  EXPECT_EQ(whole.calls, static_cast<int>(whole.result.tool_calls.size()));
  {
    ToolParserOptions options;
    options.tools = tools;
    options.make_id = counter_ids();
    expect_same(parse_tool_calls(parser, text, options), whole.result, "parse_tool_calls");
  }
  test::for_each_split(
      text,
      [&](const std::vector<std::string>& pieces, const std::string& how) {
        expect_same(feed_pieces(parser, pieces, tools, utf8).result, whole.result, how);
      },
      100, 9, 1234);
  return whole.result;
}

// No piece of any family's markers in the content.
void expect_no_marker_text(const std::string& content) {
  for (const char* m : {"tool▁", "<｜", "｜>", "<|tool", "|>", "<tool_call", "</tool_call", "arg_key", "arg_value"})
    EXPECT_EQ(content.find(m), std::string::npos) << "marker text '" << m << "' in content: " << content;
}

Json arguments_of(const ToolCall& call) { return Json::parse(call.arguments); }

// ---- DeepSeek-V3 / R1 -------------------------------------------------------------------------

const std::string kDsV3TwoCalls =
    "Let me check. 天气 ☀️\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"city\": \"北京\", \"opts\": {\"units\": [\"c\", \"f\"], \"note\": \"say \\\"hi\\\"\"}}\n```<｜tool▁call▁end｜>\n"
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"q\": \"emoji 😀 \\u00e9\"}\n```<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>";

TEST(ToolParser, DeepSeekV3TwoCallsWithTextBefore) {
  ToolParseResult r = parse_all_ways("deepseek_v3", kDsV3TwoCalls);
  EXPECT_EQ(r.content, "Let me check. 天气 ☀️\n");
  expect_no_marker_text(r.content);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"北京\", \"opts\": {\"units\": [\"c\", \"f\"], \"note\": \"say \\\"hi\\\"\"}}");
  EXPECT_EQ(arguments_of(r.tool_calls[0])["opts"]["note"], "say \"hi\"");
  EXPECT_EQ(r.tool_calls[1].id, "call_1");
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(arguments_of(r.tool_calls[1])["q"], "emoji 😀 é");
}

TEST(ToolParser, DeepSeekV3TextAfterTheSectionIsContent) {
  ToolParseResult r = parse_all_ways("deepseek_v3",
                                     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
                                     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nDone.");
  EXPECT_EQ(r.content, "\n\nDone.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
}

TEST(ToolParser, DeepSeekV3BadJsonStaysContent) {
  const std::string text =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\",}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolParseResult r = parse_all_ways("deepseek_v3", text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParser, DeepSeekV3MalformedCallBesideAGoodOne) {
  // The first call lacks its ```json fence's end; the second is fine.
  const std::string bad = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": 1}<｜tool▁call▁end｜>";
  const std::string text = "<｜tool▁calls▁begin｜>" + bad +
                           "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{\"y\": [1, {\"z\": null}]}\n```"
                           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolParseResult r = parse_all_ways("deepseek_v3", text);
  EXPECT_EQ(r.content, "<｜tool▁calls▁begin｜>" + bad);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_EQ(r.tool_calls[0].name, "b");
  EXPECT_EQ(arguments_of(r.tool_calls[0])["y"][1]["z"], nullptr);
}

TEST(ToolParser, DeepSeekV3UnterminatedCallStaysContent) {
  const std::string first =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜>";
  const std::string cut = "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{\"y\": \"unfinish";
  ToolParseResult r = parse_all_ways("deepseek_v3", first + cut);
  ASSERT_EQ(r.tool_calls.size(), 1u);  // the complete call stands
  EXPECT_EQ(r.tool_calls[0].name, "a");
  EXPECT_EQ(r.content, cut);

  // Nothing complete: the whole section is content.
  const std::string only_cut = "Hi <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```js";
  r = parse_all_ways("deepseek_v3", only_cut);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, only_cut);

  // A marker cut in half at the end is content too.
  r = parse_all_ways("deepseek_v3", "Hello <｜tool▁cal");
  EXPECT_EQ(r.content, "Hello <｜tool▁cal");
}

TEST(ToolParser, DeepSeekV3NoMarkersIsAllContent) {
  const std::string text = "Plain text with ```json\n{\"a\": 1}\n``` and <｜User｜>-like bits, 😀.";
  ToolParseResult r = parse_all_ways("deepseek_v3", text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
}

// ---- DeepSeek-V3.1 ----------------------------------------------------------------------------

TEST(ToolParser, DeepSeekV31TwoCalls) {
  const std::string text =
      "I'll run two tools.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zürich\"}"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>run<｜tool▁sep｜>{\"cmd\": \"echo \\\"a\\\\nb\\\"\", "
      "\"env\": {\"K\": [1, 2, {\"x\": null}]}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolParseResult r = parse_all_ways("deepseek_v31", text);
  EXPECT_EQ(r.content, "I'll run two tools.");
  expect_no_marker_text(r.content);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Zürich\"}");
  EXPECT_EQ(r.tool_calls[1].name, "run");
  EXPECT_EQ(arguments_of(r.tool_calls[1])["cmd"], "echo \"a\\nb\"");
  EXPECT_EQ(arguments_of(r.tool_calls[1])["env"]["K"][2]["x"], nullptr);
}

TEST(ToolParser, DeepSeekV31ArgumentsThatAreNotAnObjectStayContent) {
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1, 2]<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolParseResult r = parse_all_ways("deepseek_v31", text);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, text);
}

TEST(ToolParser, DeepSeekV31CallCutByAnotherCallIsContent) {
  const std::string broken = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": ";
  const std::string good = "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"b\": 2}<｜tool▁call▁end｜>";
  ToolParseResult r = parse_all_ways("deepseek_v31", "<｜tool▁calls▁begin｜>" + broken + good + "<｜tool▁calls▁end｜>");
  EXPECT_EQ(r.content, "<｜tool▁calls▁begin｜>" + broken);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "g");
}

TEST(ToolParser, DeepSeekV31UnterminatedSectionKeepsItsCompleteCalls) {
  // The output stopped (max_tokens) after a call but before the section's end.
  ToolParseResult r = parse_all_ways(
      "deepseek_v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": \"ü\"}<｜tool▁call▁end｜>\n");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(r.tool_calls[0])["a"], "ü");
}

// ---- Kimi K2 ----------------------------------------------------------------------------------

TEST(ToolParser, KimiK2TwoCallsKeepTheModelsIds) {
  const std::string text =
      "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\": \"東京\", \"days\": 3}<|tool_call_end|>"
      "<|tool_call_begin|>functions.web.search:1<|tool_call_argument_begin|>{\"q\": \"a \\\"quoted\\\" ü\", "
      "\"filters\": {\"site\": [\"x.org\"]}}<|tool_call_end|><|tool_calls_section_end|>";
  ToolParseResult r = parse_all_ways("kimi_k2", text);
  EXPECT_EQ(r.content, "Checking both.");
  expect_no_marker_text(r.content);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(arguments_of(r.tool_calls[0])["days"], 3);
  EXPECT_EQ(r.tool_calls[1].id, "functions.web.search:1");
  EXPECT_EQ(r.tool_calls[1].name, "web.search");  // a dot inside the name survives
  EXPECT_EQ(arguments_of(r.tool_calls[1])["q"], "a \"quoted\" ü");
}

TEST(ToolParser, KimiK2WhitespaceBetweenCallsAndARepeatedId) {
  const std::string text =
      "<|tool_calls_section_begin|>\n<|tool_call_begin|> functions.f:0 <|tool_call_argument_begin|> {\"a\": 1} "
      "<|tool_call_end|>\n<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 2}<|tool_call_end|>\n"
      "<|tool_calls_section_end|>";
  ToolParseResult r = parse_all_ways("kimi_k2", text);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "functions.f:0");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(r.tool_calls[1].id, "call_0");  // ids are unique within a response
  EXPECT_EQ(r.tool_calls[1].name, "f");
}

TEST(ToolParser, KimiK2MalformedIdAndUnterminatedCallStayContent) {
  const std::string bad_id =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  ToolParseResult r = parse_all_ways("kimi_k2", bad_id);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, bad_id);

  const std::string cut = "x<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\"";
  r = parse_all_ways("kimi_k2", cut);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, cut);
}

// ---- GLM-4.7 ----------------------------------------------------------------------------------

const Json kGlmTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"},
     "maybe": {"type": ["string", "null"]}, "either": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
     "untyped": {"description": "no type"}}}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
])");

TEST(ToolParser, Glm47TwoCallsTypedBySchema) {
  const std::string text =
      "I'll look it up.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing \"north\" 北</arg_value>"
      "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>opts</arg_key><arg_value>{\"units\": [\"c\"], "
      "\"deep\": {\"a\": [1, 2]}}</arg_value><arg_key>maybe</arg_key><arg_value>42</arg_value>"
      "<arg_key>either</arg_key><arg_value>true</arg_value></tool_call>\n<tool_call>get_time</tool_call>";
  ToolParseResult r = parse_all_ways("glm47", text, kGlmTools);
  EXPECT_EQ(r.content, "I'll look it up.");
  expect_no_marker_text(r.content);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments,
            "{\"city\":\"Beijing \\\"north\\\" 北\",\"days\":3,\"opts\":{\"units\":[\"c\"],\"deep\":{\"a\":[1,2]}},"
            "\"maybe\":\"42\",\"either\":true}");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  EXPECT_EQ(r.tool_calls[1].id, "call_1");
}

TEST(ToolParser, Glm45NewlinesBetweenTags) {
  // GLM-4.5's template puts a newline after the name and after each tag pair.
  const std::string text =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>上海</arg_value>\n<arg_key>days</arg_key>\n"
      "<arg_value> 7 </arg_value>\n</tool_call>";
  ToolParseResult r = parse_all_ways("glm47", text, kGlmTools);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\":\"上海\",\"days\":7}");
}

TEST(ToolParser, Glm47ValuesStayStringsWithoutASchemaType) {
  // No tools in the request, an unknown parameter, a parameter without a type, a string-typed
  // value that looks like JSON, and a non-JSON value of an integer parameter.
  const std::string call =
      "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>untyped</arg_key>"
      "<arg_value>[1]</arg_value><arg_key>city</arg_key><arg_value>{\"a\": 1}</arg_value>"
      "<arg_key>extra</arg_key><arg_value>true</arg_value></tool_call>";
  ToolParseResult r = parse_all_ways("glm47", call);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(r.tool_calls[0]),
            Json::parse(R"({"days": "3", "untyped": "[1]", "city": "{\"a\": 1}", "extra": "true"})"));
  r = parse_all_ways("glm47", call, kGlmTools);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(r.tool_calls[0]),
            Json::parse(R"({"days": 3, "untyped": "[1]", "city": "{\"a\": 1}", "extra": "true"})"));
  r = parse_all_ways("glm47", "<tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>",
                     kGlmTools);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(r.tool_calls[0])["days"], "three");
}

// A model's value nested deeper than a request body may be (here 100,000 objects) stays a
// string: writing it back out as arguments would recurse once per level. Parsed whole only (the
// splits of 600 KB would take minutes).
TEST(ToolParser, Glm47DeeplyNestedValueStaysAString) {
  const int depth = 100000;
  std::string deep;
  for (int i = 0; i < depth; ++i) deep += "{\"a\":";
  deep += "1" + std::string(size_t(depth), '}');
  ToolParserOptions options;
  options.tools = kGlmTools;
  options.make_id = counter_ids();
  const ToolParseResult r = parse_tool_calls(
      "glm47", "<tool_call>get_weather<arg_key>opts</arg_key><arg_value>" + deep + "</arg_value></tool_call>", options);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"opts\":" + Json(deep).dump() + "}");
}

TEST(ToolParser, Glm47MalformedAndUnterminatedCallsStayContent) {
  const std::string bad = "<tool_call>get_weather<arg_key>city</arg_key>oops</tool_call>";
  ToolParseResult r = parse_all_ways("glm47", "A" + bad + "\n<tool_call>get_time</tool_call> and then text", kGlmTools);
  EXPECT_EQ(r.content, "A" + bad + " and then text");  // whitespace before a call that succeeds is dropped
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_time");

  const std::string cut = "Let me see <tool_call>get_weather<arg_key>city</arg_key><arg_value>Par";
  r = parse_all_ways("glm47", cut, kGlmTools);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, cut);

  r = parse_all_ways("glm47", "<tool_call></tool_call>", kGlmTools);  // no name
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<tool_call></tool_call>");
}

TEST(ToolParser, Glm47InvalidUtf8InAValueDoesNotThrow) {
  const std::string text = "<tool_call>f<arg_key>k</arg_key><arg_value>\xff\xfe</arg_value></tool_call>";
  ToolParseResult r = parse_all_ways("glm47", text);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(r.tool_calls[0])["k"], "\xEF\xBF\xBD\xEF\xBF\xBD");  // U+FFFD twice
}

// ---- every family -----------------------------------------------------------------------------

TEST(ToolParser, ContentDeltasNeverEndInsideACharacter) {
  // Four-byte characters before a section, fed one byte at a time: every content delta is whole
  // UTF-8 (feed_pieces checks each), and the characters come out as soon as they are complete.
  auto p = make_tool_parser("deepseek_v31");
  const std::string text = "😀😀<｜tool▁calls▁begin｜>";
  std::string seen;
  for (size_t i = 0; i < text.size(); ++i) {
    std::vector<ToolCallDelta> out;
    p->feed(text.substr(i, 1), out);
    for (const auto& d : out) {
      EXPECT_TRUE(test::valid_utf8(d.text));
      seen += d.text;
    }
    if (i == 3) {
      EXPECT_EQ(seen, "😀");
    }
  }
  EXPECT_EQ(seen, "😀😀");
}

TEST(ToolParser, RandomMarkerSoupNeverThrowsAndSplitsAgree) {
  // Outputs stitched from pieces of every family's syntax: whatever the parser makes of them, it
  // must make the same of every split, and what it returns as content plus the calls must not
  // lose text when no call is found.
  const std::vector<std::string> atoms = {
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁sep｜>", "function", "f", "\n```json\n", "\n```", "{\"a\": 1}", "{", "}", " ", "\n", "é", "😀",
      "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
      "<|tool_call_argument_begin|>", "functions.f:0", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
      "<arg_value>", "</arg_value>", "k", "<", "|", "｜"};
  std::mt19937 rng(99);
  for (const std::string& parser : tool_parser_names()) {
    for (int trial = 0; trial < 60; ++trial) {
      std::string text;
      int n = std::uniform_int_distribution<int>(1, 14)(rng);
      for (int i = 0; i < n; ++i) text += atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)];
      ToolParseResult r = parse_all_ways(parser, text);
      if (r.tool_calls.empty()) {
        EXPECT_EQ(r.content, text) << parser;
      }
      for (const ToolCall& c : r.tool_calls) EXPECT_TRUE(Json::parse(c.arguments).is_object()) << parser;
    }
  }
}

TEST(ToolParser, UnknownNameListsTheKnownOnes) {
  try {
    make_tool_parser("hermes");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("hermes"), std::string::npos);
    for (const char* n : {"deepseek_v3", "deepseek_v31", "kimi_k2", "glm47"}) EXPECT_NE(what.find(n), std::string::npos) << n;
  }
  EXPECT_EQ(tool_parser_names(), (std::vector<std::string>{"deepseek_v3", "deepseek_v31", "kimi_k2", "glm47",
                                                     "deepseek_v32"}));
}

TEST(ToolParser, GeneratedIdsLookLikeOpenAIs) {
  ToolParseResult r = parse_tool_calls("deepseek_v31",
                                       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                                       "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  for (const ToolCall& c : r.tool_calls) {
    ASSERT_EQ(c.id.size(), 5u + 24u);
    EXPECT_EQ(c.id.substr(0, 5), "call_");
    for (char ch : c.id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << c.id;
  }
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

std::string read_fixture(const std::string& rel) {
  std::ifstream f(std::string(MLA_SHARED_DIR) + "/" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ToolParser, DefaultFromModelTypeAndTemplate) {
  // The real DeepSeek-V3 template (fixtures): "tool['type'] + '<｜tool▁sep｜>' + …name".
  Json config = Json::parse(read_fixture("fixtures/tokenizer/deepseek-v3/tokenizer_config.json"));
  ASSERT_TRUE(config["chat_template"].is_string());
  EXPECT_EQ(default_tool_parser("deepseek_v3", config["chat_template"].get<std::string>()), "deepseek_v3");
  // DeepSeek-V3.1's template: the name before the separator.
  const std::string v31 =
      "{%- else %}{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
      "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜>"
      "<｜end▁of▁sentence｜>'}}{{'<｜tool▁calls▁begin｜>'}}";
  EXPECT_EQ(default_tool_parser("deepseek_v3", v31), "deepseek_v31");
  const std::string kimi =
      "<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}<|tool_call_begin|>{{ formatted_id }}";
  EXPECT_EQ(default_tool_parser("kimi_k2", kimi), "kimi_k2");
  const std::string glm = "{{ '<tool_call>' + tc.name }}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>";
  EXPECT_EQ(default_tool_parser("glm4_moe_lite", glm), "glm47");
  // Without a telling template: by model_type.
  EXPECT_EQ(default_tool_parser("kimi_k25", ""), "kimi_k2");
  EXPECT_EQ(default_tool_parser("glm4_moe_lite", ""), "glm47");
  EXPECT_EQ(default_tool_parser("deepseek_v3", "{{ messages }}"), "deepseek_v3");
  EXPECT_EQ(default_tool_parser("deepseek_v2", "{{ messages }}"), "");
  EXPECT_EQ(default_tool_parser("llama", ""), "");
}

// ---- the templates' own renderings parse back -------------------------------------------------

// An assistant turn with two calls, as a client sends it back in the history.
const Json kTwoCalls = Json::parse(R"([
  {"id": "functions.get_weather:0", "type": "function",
   "function": {"name": "get_weather", "arguments": "{\"city\": \"北京\", \"days\": 3}"}},
  {"id": "functions.run:1", "type": "function",
   "function": {"name": "run", "arguments": "{\"cmd\": \"echo \\\"hi\\\"\", \"env\": {\"A\": [1, 2]}}"}}
])");

void expect_the_two_calls(const ToolParseResult& r) {
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(arguments_of(r.tool_calls[0]), Json::parse(kTwoCalls[0]["function"]["arguments"].get<std::string>()));
  EXPECT_EQ(r.tool_calls[1].name, "run");
  EXPECT_EQ(arguments_of(r.tool_calls[1]), Json::parse(kTwoCalls[1]["function"]["arguments"].get<std::string>()));
}

TEST(ToolParser, DeepSeekV3TemplateRenderingParsesBack) {
  // The real DeepSeek-V3 chat template (fixtures) renders the calls of an assistant turn; the
  // text between <｜Assistant｜> and <｜end▁of▁sentence｜> is what the model was trained to write.
  Json config = Json::parse(read_fixture("fixtures/tokenizer/deepseek-v3/tokenizer_config.json"));
  Json messages = Json::array({{{"role", "user"}, {"content", "weather?"}},
                               {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", kTwoCalls}}});
  std::string prompt = render_chat_template(config["chat_template"].get<std::string>(), messages, false,
                                            {{"bos_token", ""}, {"eos_token", "<｜end▁of▁sentence｜>"}});
  size_t from = prompt.find("<｜Assistant｜>");
  size_t to = prompt.find("<｜end▁of▁sentence｜>");
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  from += std::string_view("<｜Assistant｜>").size();
  ToolParseResult r = parse_all_ways("deepseek_v3", prompt.substr(from, to - from));
  EXPECT_EQ(r.content, "");
  expect_the_two_calls(r);
}

TEST(ToolParser, TemplateSnippetsOfTheOtherFamiliesParseBack) {
  // The tool-call parts of DeepSeek-V3.1's, Kimi K2's and GLM-4.7's chat templates, as their
  // published templates write them.
  const std::string v31 =
      "{%- set ns = namespace(is_first=false) -%}{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}"
      "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
      "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}"
      "{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + "
      "'<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜>'}}";
  const std::string kimi =
      "<|tool_calls_section_begin|>\n{%- for tool_call in message['tool_calls'] -%}\n"
      "  {%- set formatted_id = tool_call['id'] -%}\n"
      "  <|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is "
      "string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}"
      "{% endif %}<|tool_call_end|>\n{%- endfor -%}\n<|tool_calls_section_end|>";
  const std::string glm =
      "{% for tc in message.tool_calls %}{%- if tc.function %}{%- set tc = tc.function %}{%- endif %}"
      "{{- '<tool_call>' + tc.name -}}{% set _args = tc.arguments %}{% for k, v in _args.items() %}"
      "<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson if v is not string else v }}</arg_value>{% endfor %}"
      "</tool_call>{% endfor %}";
  Json message = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", kTwoCalls}};

  ToolParseResult r = parse_all_ways("deepseek_v31", ChatTemplate(v31).render(Json{{"message", message}}));
  EXPECT_EQ(r.content, "");
  expect_the_two_calls(r);

  r = parse_all_ways("kimi_k2", ChatTemplate(kimi).render(Json{{"message", message}}));
  EXPECT_EQ(r.content, "");
  expect_the_two_calls(r);
  EXPECT_EQ(r.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(r.tool_calls[1].id, "functions.run:1");

  // GLM's template takes the arguments as an object; the schema types days and env.
  Json glm_message = message;
  for (Json& call : glm_message["tool_calls"])
    call["function"]["arguments"] = Json::parse(call["function"]["arguments"].get<std::string>());
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
       "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
       "cmd": {"type": "string"}, "env": {"type": "object"}}}}}
  ])");
  r = parse_all_ways("glm47", ChatTemplate(glm).render(Json{{"message", glm_message}}), tools);
  EXPECT_EQ(r.content, "");
  expect_the_two_calls(r);
}

TEST(ToolParser, ContentStreamsAheadAndACallArrivesWithItsEndMarker) {
  auto p = make_tool_parser("deepseek_v31");
  std::vector<ToolCallDelta> out;
  p->feed("Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":", out);
  ASSERT_EQ(out.size(), 1u);  // the text before the section, at once; the call waits
  EXPECT_EQ(out[0].kind, ToolCallDelta::Kind::Content);
  EXPECT_EQ(out[0].text, "Let me look.");
  out.clear();
  p->feed(" 1}<｜tool▁call▁end｜>", out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, ToolCallDelta::Kind::CallStart);
  EXPECT_EQ(out[0].index, 0);
  EXPECT_EQ(out[0].name, "f");
  EXPECT_EQ(out[1].kind, ToolCallDelta::Kind::Arguments);
  EXPECT_EQ(out[1].text, "{\"a\": 1}");
  EXPECT_EQ(p->calls(), 1);
}

// ---- reasoning, then tool calls ----------------------------------------------------------------

struct ChatRun {
  std::string reasoning, content;
  ToolParseResult calls;
};

ChatRun chat_pieces(const std::string& reasoning, ReasoningOptions ro, const std::string& tools,
                    const std::vector<std::string>& pieces) {
  ToolParserOptions to;
  to.make_id = counter_ids();
  ChatOutputParser p(reasoning, ro, tools, to);
  ChatRun run;
  bool content_or_calls_seen = false;
  auto take = [&](const std::vector<ChatDelta>& out) {
    for (const ChatDelta& d : out) {
      switch (d.kind) {
        case ChatDelta::Kind::Reasoning:
          EXPECT_FALSE(content_or_calls_seen) << "reasoning after content";
          run.reasoning += d.text;
          break;
        case ChatDelta::Kind::Content:
          content_or_calls_seen = true;
          run.content += d.text;
          break;
        case ChatDelta::Kind::CallStart:
          content_or_calls_seen = true;
          run.calls.apply({ToolCallDelta::Kind::CallStart, d.index, d.id, d.name, {}});
          break;
        case ChatDelta::Kind::Arguments:
          run.calls.apply({ToolCallDelta::Kind::Arguments, d.index, {}, {}, d.text});
          break;
      }
    }
  };
  for (const std::string& piece : pieces) {
    std::vector<ChatDelta> out;
    p.feed(piece, out);
    take(out);
  }
  std::vector<ChatDelta> out;
  p.finish(out);
  take(out);
  EXPECT_EQ(p.calls(), static_cast<int>(run.calls.tool_calls.size()));
  return run;
}

ChatRun chat_all_ways(const std::string& reasoning, ReasoningOptions ro, const std::string& tools, const std::string& text) {
  ChatRun whole = chat_pieces(reasoning, ro, tools, {text});
  test::for_each_split(text, [&](const std::vector<std::string>& pieces, const std::string& how) {
    ChatRun split = chat_pieces(reasoning, ro, tools, pieces);
    EXPECT_EQ(split.reasoning, whole.reasoning) << how;
    EXPECT_EQ(split.content, whole.content) << how;
    expect_same(split.calls, whole.calls, "chat " + how);
  });
  return whole;
}

TEST(ToolParser, KimiThinkingThenToolCalls) {
  // K2-Thinking: the reasoning ends at </think>, or implicitly where a tool section starts.
  const std::string calls =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>"
      "{\"q\": \"MLA\"}<|tool_call_end|><|tool_calls_section_end|>";
  ChatRun r = chat_all_ways("kimi_k2", {}, "kimi_k2", "<think>I need to search. 検索</think>Searching." + calls);
  EXPECT_EQ(r.reasoning, "I need to search. 検索");
  EXPECT_EQ(r.content, "Searching.");
  ASSERT_EQ(r.calls.tool_calls.size(), 1u);
  EXPECT_EQ(r.calls.tool_calls[0].id, "functions.search:0");
  EXPECT_EQ(r.calls.tool_calls[0].name, "search");

  r = chat_all_ways("kimi_k2", {}, "kimi_k2", "<think>Straight to the tool." + calls);
  EXPECT_EQ(r.reasoning, "Straight to the tool.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.tool_calls.size(), 1u);
}

TEST(ToolParser, DeepSeekR1ThinkingThenToolCalls) {
  // The prompt opened <think>; the output has only the close.
  ChatRun r = chat_all_ways(
      "deepseek_r1", {.prompt_opened = true}, "deepseek_v3",
      "The user wants weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Hangzhou\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(r.reasoning, "The user wants weather.\n");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.tool_calls.size(), 1u);
  EXPECT_EQ(r.calls.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.calls.tool_calls[0].arguments, "{\"city\": \"Hangzhou\"}");
}

TEST(ToolParser, Glm47ThinkingThenToolCallsAndNoParsers) {
  ChatRun r = chat_all_ways("glm45", {.prompt_opened = true}, "glm47",
                            "Think: need time.</think>Let me check.<tool_call>get_time</tool_call>");
  EXPECT_EQ(r.reasoning, "Think: need time.");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.tool_calls.size(), 1u);
  EXPECT_EQ(r.calls.tool_calls[0].arguments, "{}");

  // Neither parser: the text passes through as content.
  r = chat_all_ways("", {}, "", "<think>x</think><tool_call>get_time</tool_call>");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "<think>x</think><tool_call>get_time</tool_call>");
  EXPECT_TRUE(r.calls.tool_calls.empty());
}

// The tool section for a template without tools: each function's name, description and schema,
// then a call in the parser's syntax; that call, its placeholders filled in, parses back through
// the same parser as one call.
TEST(ToolUsePrompt, WritesEachToolAndACallItsParserReads) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}])");
  auto fill = [](std::string s) {
    for (auto [from, to] : {std::pair<std::string, std::string>{"NAME", "get_weather"},
                            {"ARGUMENTS", R"({"city": "Paris"})"}, {"INDEX", "0"}, {"KEY", "city"}, {"VALUE", "Paris"}})
      for (size_t at; (at = s.find(from)) != std::string::npos;) s.replace(at, from.size(), to);
    return s;
  };
  for (const char* parser : {"deepseek_v3", "deepseek_v31", "kimi_k2", "glm47"}) {
    SCOPED_TRACE(parser);
    const std::string p = tool_use_prompt(parser, tools);
    EXPECT_EQ(p.rfind("## Tools\n", 0), 0u) << p;
    EXPECT_NE(p.find("### get_weather\nDescription: Weather of a city\nParameters: {\"type\":\"object\","
                     "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}\n"),
              std::string::npos)
        << p;
    EXPECT_NE(p.find("### ping\nParameters: {\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}}}\n"),
              std::string::npos)
        << p;
    const std::string head = "answer with exactly this:\n";
    const size_t from = p.find(head), to = p.find("\nNAME is one of");
    ASSERT_NE(from, std::string::npos);
    ASSERT_NE(to, std::string::npos);
    const std::string call = fill(p.substr(from + head.size(), to - from - head.size()));
    ToolParserOptions options;
    options.tools = Json(tools);
    const ToolParseResult r = parse_tool_calls(parser, call, options);
    EXPECT_EQ(r.content, "") << call;
    ASSERT_EQ(r.tool_calls.size(), 1u) << call;
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");
    EXPECT_EQ(Json::parse(r.tool_calls[0].arguments), Json({{"city", "Paris"}})) << call;
  }
  EXPECT_EQ(tool_use_prompt("deepseek_v32", tools), "");  // its encoder writes the tools itself
  EXPECT_EQ(tool_use_prompt("", tools), "");
  EXPECT_EQ(tool_use_prompt("deepseek_v3", nlohmann::ordered_json::array()), "");
}

}  // namespace
}  // namespace mla::chat
