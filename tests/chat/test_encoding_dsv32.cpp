// DeepSeek-V3.2's built-in chat format against the official Python encoder: data/dsv32/cases.json
// holds conversations (plain, system, multi-turn, thinking on and off, tools, tool calls and
// results, several calls, results followed by text) with the exact prompt that
// encoding_dsv32.py's encode_messages writes for each, and each assistant tool-call turn as the
// model writes it with the official parser's reading of it. The prompts must match byte for
// byte, through the encoder, the chat-format hook and the server's chat request path; the DSML
// tool parser must read back what the encoder writes, however the text is cut.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/deepseek_fixture.h"
#include "server/chat_request.h"
#include "server/openai.h"
#include "chat/reasoning_parser.h"
#include "server/stream_splits.h"
#include "chat/tool_parser.h"
#include "chat/chat_template.h"
#include "chat/encoding_dsv32.h"
#include "test_util.h"

namespace {

using ojson = nlohmann::ordered_json;

const ojson& cases() {
  static const ojson data = [] {
    std::filesystem::path p = std::filesystem::path(MLA_SOURCE_DIR) / "tests" / "tokenizer" / "data" / "dsv32" / "cases.json";
    std::ifstream in(p);
    if (!in) throw std::runtime_error("missing " + p.string());
    return ojson::parse(in);
  }();
  return data["cases"];
}

ojson extra_of(const ojson& c) {
  ojson extra = {{"thinking", c["thinking"]}};
  if (!c["tools"].is_null()) extra["tools"] = c["tools"];
  return extra;
}

TEST(EncodingDsv32, MatchesTheOfficialEncoderByteForByte) {
  ASSERT_GE(cases().size(), 20u);
  for (const ojson& c : cases()) {
    const std::string name = c["name"];
    std::string got;
    try {
      got = mla::render_dsv32_chat(c["messages"], extra_of(c));
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    EXPECT_EQ(got, c["expected"].get<std::string>()) << name;
  }
}

TEST(EncodingDsv32, ChatFormatHookSelectsTheEncoder) {
  mla::ChatFormat f = mla::chat_format_for("deepseek_v32", "");
  EXPECT_EQ(f.kind, mla::ChatFormat::Kind::DeepSeekV32);
  EXPECT_EQ(f.name(), "deepseek_v32");
  for (const ojson& c : cases()) {
    ojson extra = extra_of(c);
    extra["bos_token"] = "<｜begin▁of▁sentence｜>";  // what the server adds; the encoder writes its own
    EXPECT_EQ(mla::render_chat(f, c["messages"], true, extra), c["expected"].get<std::string>()) << c["name"];
  }
  // A checkpoint's own template wins (V3.2-Exp ships V3.1's); other models without one have none.
  mla::ChatFormat j = mla::chat_format_for("deepseek_v32", "{{ messages[0]['content'] }}");
  EXPECT_EQ(j.kind, mla::ChatFormat::Kind::Jinja);
  EXPECT_EQ(mla::render_chat(j, ojson::array({{{"role", "user"}, {"content", "hey"}}}), true), "hey");
  EXPECT_TRUE(mla::chat_format_for("deepseek_v3", "").empty());
  EXPECT_THROW(mla::render_chat(mla::ChatFormat{}, ojson::array(), true), mla::ChatTemplateError);
}

TEST(EncodingDsv32, EncoderOptions) {
  ojson m = ojson::array({{{"role", "user"}, {"content", "a"}},
                          {{"role", "assistant"}, {"content", "b"}, {"reasoning_content", "r"}},
                          {{"role", "user"}, {"content", "c"}}});
  mla::Dsv32Options o;
  o.thinking = true;
  EXPECT_EQ(mla::encode_dsv32(m, o),
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜><think>");
  o.add_bos = false;
  o.drop_thinking = false;  // the earlier turn keeps its reasoning only when it is after the last user turn
  EXPECT_EQ(mla::encode_dsv32(m, o), "<｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜><think>");
  // enable_thinking is read as well as thinking.
  EXPECT_EQ(mla::render_dsv32_chat(ojson::array({{{"role", "user"}, {"content", "x"}}}), {{"enable_thinking", true}}),
            "<｜begin▁of▁sentence｜><｜User｜>x<｜Assistant｜><think>");
  // Arguments given as an object rather than a JSON string are written the same way.
  ojson call = {{"role", "assistant"},
                {"content", nullptr},
                {"tool_calls", ojson::array({{{"type", "function"},
                                               {"function", {{"name", "f"}, {"arguments", {{"n", 1}, {"s", "x"}}}}}}})}};
  EXPECT_EQ(mla::encode_dsv32(ojson::array({{{"role", "user"}, {"content", "q"}}, call}), {}),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke "
            "name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">1</｜DSML｜parameter>\n<｜DSML｜parameter "
            "name=\"s\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁"
            "sentence｜>");
}

TEST(EncodingDsv32, RejectsWhatTheOfficialEncoderRejects) {
  auto fails = [](const ojson& messages, bool thinking) {
    mla::Dsv32Options o;
    o.thinking = thinking;
    try {
      mla::encode_dsv32(messages, o);
    } catch (const mla::ChatTemplateError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(fails(ojson::array({{{"role", "narrator"}, {"content", "x"}}}), false).find("unknown role"),
            std::string::npos);
  EXPECT_NE(fails(ojson::array({{{"role", "user"}, {"content", "x"}}, {{"role", "tool"}, {"content", "r"}}}), false)
                .find("tool result"),
            std::string::npos);
  // Thinking mode: the answer after the last user turn needs its reasoning (an empty one counts
  // as none, as in Python).
  ojson empty_reasoning = {{"role", "assistant"}, {"content", "y"}, {"reasoning_content", std::string()}};
  EXPECT_NE(fails(ojson::array({{{"role", "user"}, {"content", "x"}}, empty_reasoning}), true).find("reasoning_content"),
            std::string::npos);
  EXPECT_NE(fails(ojson::array({{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "y"}}}), true)
                .find("reasoning_content"),
            std::string::npos);
  ojson bad_args = {{"role", "assistant"},
                    {"tool_calls", ojson::array({{{"function", {{"name", "f"}, {"arguments", "[1]"}}}}})}};
  EXPECT_NE(fails(ojson::array({{{"role", "user"}, {"content", "x"}}, bad_args}), false).find("JSON object"),
            std::string::npos);
  // Arguments nested past format/json_depth.h's limit are refused before they are parsed: writing
  // them out as parameters recursed once per level (a stack overflow at 100,000).
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(100000, '}');
  ojson deep_args = {{"role", "assistant"},
                     {"tool_calls", ojson::array({{{"function", {{"name", "f"}, {"arguments", deep}}}}})}};
  EXPECT_NE(fails(ojson::array({{{"role", "user"}, {"content", "x"}}, deep_args}), false).find("nest deeper"),
            std::string::npos);
  ojson developer = {{"role", "developer"}, {"content", std::string()}};
  EXPECT_NE(fails(ojson::array({developer}), false).find("developer"), std::string::npos);
}

// The special tokens of the format are single tokens of the DeepSeek-V3 vocabulary (V3.2 keeps it).
TEST(EncodingDsv32, PromptTokenizesWithTheSpecialTokens) {
  const mla::Tokenizer& tok = mla::test::deepseek_v3_tokenizer();
  for (const ojson& c : cases()) {
    const std::string text = c["expected"];
    std::vector<int32_t> ids = tok.encode(text, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], tok.bos_id()) << c["name"];
    EXPECT_EQ(tok.decode(ids, false), text) << c["name"];
    for (const char* special : {"<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"})
      EXPECT_EQ(tok.encode(special, false).size(), 1u) << special;
  }
}

// ---- the server's chat request path ------------------------------------------------------------

TEST(EncodingDsv32, ChatRequestRendersThroughTheFormat) {
  const mla::Tokenizer& tok = mla::test::deepseek_v3_tokenizer();
  const mla::ChatFormat format = mla::chat_format_for("deepseek_v32", "");
  for (const ojson& c : cases()) {
    ojson body = {{"model", "m"}, {"messages", c["messages"]}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    // thinking from the request's chat_template_kwargs, or the server's default.
    nlohmann::json defaults = nlohmann::json::object();
    if (c["thinking"].get<bool>()) {
      if (c["name"].get<std::string>().size() % 2) defaults["thinking"] = true;
      else body["chat_template_kwargs"] = {{"thinking", true}};
    }
    const nlohmann::json plain = nlohmann::json::parse(body.dump());
    mla::server::AgentFields agent =
        mla::server::parse_agent_fields(mla::server::Endpoint::ChatCompletions, plain, &body, defaults, 129280);
    std::string prompt = mla::server::render_chat_prompt(format, body["messages"], agent, tok, "deepseek_v32");
    EXPECT_EQ(prompt, c["expected"].get<std::string>()) << c["name"];
    // The parsers the server picks for the checkpoint, and whether the prompt opened reasoning.
    // The prompt opens a reasoning block when thinking is on and the model's turn comes next.
    const bool model_next = c["messages"].back()["role"] != "assistant";
    EXPECT_EQ(mla::chat::prompt_opens_reasoning(prompt), c["thinking"].get<bool>() && model_next) << c["name"];
  }
  EXPECT_EQ(mla::chat::default_tool_parser("deepseek_v32", ""), "deepseek_v32");
  EXPECT_EQ(mla::chat::default_reasoning_parser("deepseek_v32", ""), "deepseek_v31");
}

// ---- mla chat-template on a V3.2 checkpoint folder ---------------------------------------------

// A folder with the DeepSeek-V3 tokenizer (V3.2 keeps its vocabulary), a tokenizer_config.json
// without chat_template, as V3.2 ships it, and config.json's model_type deepseek_v32.
TEST(EncodingDsv32, ChatTemplateCommandUsesTheEncoder) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mla_dsv32_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fs::path(mla::test::deepseek_v3_dir()) / "tokenizer.json", dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  ojson config = ojson::parse(std::ifstream(fs::path(mla::test::deepseek_v3_dir()) / "tokenizer_config.json"));
  config.erase("chat_template");
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  int checked = 0;
  for (const ojson& c : cases()) {
    const std::string name = c["name"];
    if (name != "tool_call_and_result_thinking" && name != "multiple_tool_calls" && name != "plain") continue;
    ojson input = {{"messages", c["messages"]}, {"thinking", c["thinking"]}};
    if (!c["tools"].is_null()) input["tools"] = c["tools"];
    std::ofstream(dir / "messages.json") << input.dump();
    const std::string args = "chat-template -m '" + dir.string() + "' --messages '" + (dir / "messages.json").string() +
                             "' --add-generation-prompt";
    std::ofstream(dir / "config.json") << R"({"model_type": "deepseek_v32"})";
    mla::test::CommandResult r = mla::test::run_mla(args, false);
    EXPECT_EQ(r.status, 0) << name;
    EXPECT_EQ(r.output, c["expected"].get<std::string>()) << name;
    // Without the model type the folder has no chat format at all.
    std::ofstream(dir / "config.json") << R"({"model_type": "deepseek_v3"})";
    mla::test::CommandResult none = mla::test::run_mla(args, true);
    EXPECT_NE(none.status, 0) << name;
    EXPECT_NE(none.output.find("no chat_template"), std::string::npos) << none.output;
    ++checked;
  }
  fs::remove_all(dir);
  EXPECT_EQ(checked, 3);
}

// ---- DSML: the parser reads back what the encoder writes ---------------------------------------

TEST(EncodingDsv32, DsmlParserReadsTheEncodersToolCalls) {
  int outputs = 0;
  for (const ojson& c : cases()) {
    if (!c.contains("model_outputs")) continue;
    for (const ojson& o : c["model_outputs"]) {
      ++outputs;
      const std::string text = o["text"];
      mla::test::for_each_split(
          text,
          [&](const std::vector<std::string>& pieces, const std::string& how) {
            mla::chat::ToolParserOptions options;
            options.tools = nlohmann::json::parse(c["tools"].dump());
            int n = 0;
            options.make_id = [&n] { return "call_" + std::to_string(n++); };
            auto parser = mla::chat::make_tool_parser("deepseek_v32", options);
            mla::chat::ToolParseResult r;
            std::vector<mla::chat::ToolCallDelta> deltas;
            for (const std::string& p : pieces) parser->feed(p, deltas);
            parser->finish(deltas);
            for (const auto& d : deltas) {
              if (d.kind == mla::chat::ToolCallDelta::Kind::Content) {
                EXPECT_TRUE(mla::test::valid_utf8(d.text)) << how;
              }
              r.apply(d);
            }
            EXPECT_EQ(r.content, o["content"].get<std::string>()) << c["name"] << ", " << how;
            ASSERT_EQ(r.tool_calls.size(), o["tool_calls"].size()) << c["name"] << ", " << how;
            EXPECT_EQ(parser->calls(), int(o["tool_calls"].size()));
            for (size_t i = 0; i < r.tool_calls.size(); ++i) {
              const ojson& want = o["tool_calls"][i];
              EXPECT_EQ(r.tool_calls[i].name, want["name"].get<std::string>()) << how;
              EXPECT_EQ(r.tool_calls[i].id, "call_" + std::to_string(i)) << how;
              // The same JSON object, keys in the same order (the official text has Python's spacing).
              EXPECT_EQ(ojson::parse(r.tool_calls[i].arguments).dump(),
                        ojson::parse(want["arguments"].get<std::string>()).dump())
                  << c["name"] << ", " << how;
            }
          },
          20);
    }
  }
  EXPECT_GE(outputs, 6);
}

// A thinking turn as the model writes it: reasoning, </think>, then the calls.
TEST(EncodingDsv32, ThinkingTurnWithCallsThroughTheChatOutputParser) {
  const std::string text =
      "need the tool</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
      "name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  mla::test::for_each_split(text, [&](const std::vector<std::string>& pieces, const std::string& how) {
    mla::chat::ReasoningOptions ro;
    ro.prompt_opened = true;
    mla::chat::ChatOutputParser p("deepseek_v31", ro, "deepseek_v32", {});
    std::vector<mla::chat::ChatDelta> out;
    for (const std::string& piece : pieces) p.feed(piece, out);
    p.finish(out);
    std::string reasoning, content, name, args;
    for (const auto& d : out) {
      if (d.kind == mla::chat::ChatDelta::Kind::Reasoning) reasoning += d.text;
      if (d.kind == mla::chat::ChatDelta::Kind::Content) content += d.text;
      if (d.kind == mla::chat::ChatDelta::Kind::CallStart) name += d.name;
      if (d.kind == mla::chat::ChatDelta::Kind::Arguments) args += d.text;
    }
    EXPECT_EQ(reasoning, "need the tool") << how;
    EXPECT_EQ(content, "") << how;
    EXPECT_EQ(name, "get_weather") << how;
    EXPECT_EQ(args, "{\"city\":\"Paris\"}") << how;
    EXPECT_EQ(p.calls(), 1) << how;
  });
}

}  // namespace
