// The GLM chat template through the Jinja interpreter: data/glm/GLM-4.7-Flash.jinja is
// GLM-4.7-Flash's chat_template.jinja byte for byte (sha256 d63ad536…), the template of the GLM
// family whose format (generation prompt, <tool_call>NAME<arg_key>…</tool_call>, <|observation|>
// results) GLM-5 keeps. data/glm/cases.json holds Jinja2's renderings of it, set up as
// transformers' apply_chat_template sets Jinja2 up: plain, system, multi-turn, thinking on and off, reasoning kept or
// cleared, tools, tool calls and results, several calls, results followed by text. The prompts
// must match byte for byte, and the glm47 tool parser must read back the calls the template
// writes, however the text is cut.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/chat_request.h"
#include "server/openai.h"
#include "chat/reasoning_parser.h"
#include "server/stream_splits.h"
#include "chat/tool_parser.h"
#include "chat/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

std::filesystem::path data_dir() { return std::filesystem::path(MLA_SOURCE_DIR) / "tests" / "tokenizer" / "data" / "glm"; }

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("missing " + p.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string& glm_template() {
  static const std::string t = read_file(data_dir() / "GLM-4.7-Flash.jinja");
  return t;
}

const ojson& cases() {
  static const ojson data = ojson::parse(read_file(data_dir() / "cases.json"));
  return data["cases"];
}

ojson extra_of(const ojson& c) {
  ojson extra = {{"bos_token", ""}, {"eos_token", "<|endoftext|>"}};
  if (!c["tools"].is_null()) extra["tools"] = c["tools"];
  for (auto it = c["kwargs"].begin(); it != c["kwargs"].end(); ++it) extra[it.key()] = it.value();
  return extra;
}

TEST(GlmTemplate, MatchesJinja2ByteForByte) {
  ASSERT_GE(cases().size(), 12u);
  for (const ojson& c : cases()) {
    std::string got;
    try {
      got = mla::render_chat_template(glm_template(), c["messages"], c["add_generation_prompt"].get<bool>(), extra_of(c));
    } catch (const std::exception& e) {
      ADD_FAILURE() << c["name"] << ": " << e.what();
      continue;
    }
    EXPECT_EQ(got, c["expected"].get<std::string>()) << c["name"];
  }
}

// The server's chat request path: clients send each call's arguments as OpenAI's JSON string,
// and the template reads them as a mapping (`tc.arguments` then `_args.items()`); the prompt is
// the one Jinja2 renders from the objects.
TEST(GlmTemplate, ChatRequestDecodesStringArguments) {
  const mla::Tokenizer tokenizer = mla::Tokenizer::load(std::string(MLA_SHARED_DIR) + "/fixtures/tokenizer/deepseek-v3");
  const mla::ChatFormat format = mla::chat_format_for("glm_moe_dsa", glm_template());
  ASSERT_EQ(format.kind, mla::ChatFormat::Kind::Jinja);
  int with_calls = 0;
  for (const ojson& c : cases()) {
    if (!c["add_generation_prompt"].get<bool>()) continue;
    ojson messages = c["messages"];
    for (ojson& m : messages)
      if (m.contains("tool_calls")) {
        ++with_calls;
        for (ojson& call : m["tool_calls"]) call["function"]["arguments"] = call["function"]["arguments"].dump();
      }
    ojson body = {{"model", "m"}, {"messages", messages}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    if (!c["kwargs"].empty()) body["chat_template_kwargs"] = c["kwargs"];
    const nlohmann::json plain = nlohmann::json::parse(body.dump());
    mla::server::AgentFields agent = mla::server::parse_agent_fields(mla::server::Endpoint::ChatCompletions, plain,
                                                                     &body, nlohmann::json::object(), 1000);
    // The tokenizer's special tokens are DeepSeek's here; GLM's template writes neither.
    EXPECT_EQ(mla::server::render_chat_prompt(format, body["messages"], agent, tokenizer, "glm47"),
              c["expected"].get<std::string>())
        << c["name"];
    // Passed as strings straight to the template, they fail it (`_args.items()` of a string), as
    // in Jinja2.
    if (c.contains("model_outputs")) {
      EXPECT_THROW(mla::render_chat_template(glm_template(), body["messages"], true, extra_of(c)), mla::ChatTemplateError)
          << c["name"];
    }
  }
  EXPECT_GE(with_calls, 3);
}

// The checkpoint's parsers follow from its template: glm47 calls, glm45 reasoning (the prompt
// opens <think> unless enable_thinking is false).
TEST(GlmTemplate, SelectsTheGlmParsers) {
  EXPECT_EQ(mla::chat::default_tool_parser("glm4_moe_lite", glm_template()), "glm47");
  EXPECT_EQ(mla::chat::default_reasoning_parser("glm4_moe_lite", glm_template()), "glm45");
  // GLM-5's model_type; its template is of the same family.
  EXPECT_EQ(mla::chat::default_tool_parser("glm_moe_dsa", glm_template()), "glm47");
  EXPECT_EQ(mla::chat::default_reasoning_parser("glm_moe_dsa", glm_template()), "glm45");
  EXPECT_EQ(mla::chat::default_tool_parser("glm_moe_dsa", ""), "glm47");
  for (const ojson& c : cases()) {
    if (!c["add_generation_prompt"].get<bool>()) continue;
    const bool off = c["kwargs"].contains("enable_thinking") && !c["kwargs"]["enable_thinking"].get<bool>();
    EXPECT_EQ(mla::chat::prompt_opens_reasoning(c["expected"].get<std::string>()), !off) << c["name"];
  }
}

TEST(GlmTemplate, Glm47ParserReadsTheTemplatesToolCalls) {
  int outputs = 0;
  for (const ojson& c : cases()) {
    if (!c.contains("model_outputs")) continue;
    const nlohmann::json tools = nlohmann::json::parse(c["tools"].dump());
    for (const ojson& o : c["model_outputs"]) {
      ++outputs;
      mla::test::for_each_split(
          o["text"].get<std::string>(),
          [&](const std::vector<std::string>& pieces, const std::string& how) {
            mla::chat::ToolParserOptions options;
            options.tools = tools;
            auto parser = mla::chat::make_tool_parser("glm47", options);
            std::vector<mla::chat::ToolCallDelta> deltas;
            for (const std::string& p : pieces) parser->feed(p, deltas);
            parser->finish(deltas);
            mla::chat::ToolParseResult r;
            for (const auto& d : deltas) r.apply(d);
            EXPECT_EQ(r.content, o["content"].get<std::string>()) << c["name"] << ", " << how;
            ASSERT_EQ(r.tool_calls.size(), o["tool_calls"].size()) << c["name"] << ", " << how;
            for (size_t i = 0; i < r.tool_calls.size(); ++i) {
              EXPECT_EQ(r.tool_calls[i].name, o["tool_calls"][i]["name"].get<std::string>()) << how;
              EXPECT_EQ(ojson::parse(r.tool_calls[i].arguments), o["tool_calls"][i]["arguments"])
                  << c["name"] << ", " << how;
            }
          },
          10);
    }
  }
  EXPECT_GE(outputs, 3);
}

}  // namespace

// A client's call arguments nested far deeper than any tool takes (here 100,000 objects) are not
// decoded for the template: the request body's depth check cannot see into a string, and the
// template's walk over the decoded object would recurse once per level. They stay a string, so
// GLM's template fails on them (`_args.items()`) with a template error, as on any string.
TEST(GlmTemplate, DeeplyNestedArgumentsStayAString) {
  const mla::Tokenizer tokenizer = mla::Tokenizer::load(std::string(MLA_SHARED_DIR) + "/fixtures/tokenizer/deepseek-v3");
  const mla::ChatFormat format = mla::chat_format_for("glm_moe_dsa", glm_template());
  const int depth = 100000;
  std::string deep;
  for (int i = 0; i < depth; ++i) deep += "{\"a\":";
  deep += "1";
  deep += std::string(size_t(depth), '}');
  ojson call = {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", deep}}}};
  ojson messages = ojson::array({ojson{{"role", "user"}, {"content", "hi"}},
                                 ojson{{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}}});
  ojson body = {{"model", "m"}, {"messages", messages}};
  const nlohmann::json plain = nlohmann::json::parse(body.dump());
  mla::server::AgentFields agent = mla::server::parse_agent_fields(mla::server::Endpoint::ChatCompletions, plain, &body,
                                                                   nlohmann::json::object(), 1000);
  EXPECT_THROW(mla::server::render_chat_prompt(format, body["messages"], agent, tokenizer, "glm47"), mla::ChatTemplateError);
  // At a depth a tool can take, the arguments are decoded as before.
  call["function"]["arguments"] = R"({"a": {"b": [1, 2]}})";
  body["messages"][1]["tool_calls"] = ojson::array({call});
  EXPECT_NE(mla::server::render_chat_prompt(format, body["messages"], agent, tokenizer, "glm47").find("<arg_key>a</arg_key>"),
            std::string::npos);
}
