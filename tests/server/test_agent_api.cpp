// Unit tests of the agent-facing request fields and response shapes: request hygiene and the
// agent fields (chat_request.h), a choice built from engine events with the tool-call and
// reasoning parsers, streamed and whole (choice.h), log-probabilities of a logits row
// (engine/logprobs.h), the tokenizer endpoints and the API key check (agent_api.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/engine.h"
#include "engine/grammar_processor.h"
#include "engine/logprobs.h"
#include "engine/output_stream.h"
#include "server/agent_api.h"
#include "server/chat_request.h"
#include "server/choice.h"
#include "server/openai.h"
#include "server/structured.h"
#include "grammar/matcher.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mla {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using server::AgentFields;
using server::ApiError;
using server::Endpoint;
using server::ToolChoice;

json weather_tool() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Weather of a city"},
            {"parameters",
             {{"type", "object"},
              {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
              {"required", {"city"}}}}}}};
}

AgentFields parse(const json& body, Endpoint ep = Endpoint::ChatCompletions) {
  server::check_known_fields(ep, body);
  return server::parse_agent_fields(ep, body, nullptr, json::object(), 1000);
}

// The param of the ApiError a body raises ("" when it parses).
std::string error_param(const json& body, Endpoint ep = Endpoint::ChatCompletions) {
  try {
    parse(body, ep);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.param.empty() ? "?" : e.param;
  }
  return "";
}

TEST(AgentRequest, ToolsAndToolChoice) {
  json tools = json::array({weather_tool()});
  AgentFields a = parse({{"messages", json::array()}, {"tools", tools}});
  EXPECT_TRUE(a.has_tools());
  EXPECT_TRUE(a.tools_active());
  EXPECT_EQ(a.tool_choice.kind, ToolChoice::Kind::Auto);
  ASSERT_NE(a.tool("get_weather"), nullptr);
  EXPECT_EQ(a.tool("nope"), nullptr);

  a = parse({{"tools", tools}, {"tool_choice", "none"}});
  EXPECT_FALSE(a.tools_active());
  a = parse({{"tools", tools}, {"tool_choice", "required"}, {"parallel_tool_calls", false}});
  EXPECT_EQ(a.tool_choice.kind, ToolChoice::Kind::Required);
  EXPECT_FALSE(a.parallel_tool_calls);
  a = parse({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_EQ(a.tool_choice.kind, ToolChoice::Kind::Named);
  EXPECT_EQ(a.tool_choice.name, "get_weather");

  // Contradictions and malformed tools.
  EXPECT_EQ(error_param({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}}),
            "tool_choice");
  EXPECT_EQ(error_param({{"tool_choice", "required"}}), "tool_choice");
  EXPECT_EQ(error_param({{"tools", tools}, {"tool_choice", "sometimes"}}), "tool_choice");
  EXPECT_EQ(error_param({{"tools", "get_weather"}}), "tools");
  EXPECT_EQ(error_param({{"tools", {{{"type", "code_interpreter"}}}}}), "tools");
  EXPECT_EQ(error_param({{"tools", {weather_tool(), weather_tool()}}}), "tools");  // two of one name
  json bad_name = weather_tool();
  bad_name["function"]["name"] = "has space";
  EXPECT_EQ(error_param({{"tools", {bad_name}}}), "tools");
  EXPECT_EQ(error_param({{"tools", tools}, {"parallel_tool_calls", "yes"}}), "parallel_tool_calls");
}

TEST(AgentRequest, ResponseFormat) {
  AgentFields a = parse({{"response_format", {{"type", "json_object"}}}});
  EXPECT_EQ(a.format, server::ResponseFormat::JsonObject);
  a = parse({{"response_format",
              {{"type", "json_schema"},
               {"json_schema", {{"name", "x"}, {"strict", true}, {"schema", {{"type", "object"}}}}}}}});
  EXPECT_EQ(a.format, server::ResponseFormat::JsonSchema);
  EXPECT_TRUE(a.strict);
  EXPECT_EQ(a.schema["type"], "object");
  EXPECT_EQ(error_param({{"response_format", {{"type", "yaml"}}}}), "response_format");
  EXPECT_EQ(error_param({{"response_format", {{"type", "json_schema"}}}}), "response_format");
  EXPECT_EQ(error_param({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", 3}}}}}}),
            "response_format");
  // A JSON answer contradicts a forced tool call.
  EXPECT_EQ(error_param({{"tools", {weather_tool()}}, {"tool_choice", "required"},
                         {"response_format", {{"type", "json_object"}}}}),
            "response_format");
}

TEST(AgentRequest, LogprobsNAndLogitBias) {
  AgentFields a = parse({{"logprobs", true}, {"top_logprobs", 5}});
  EXPECT_EQ(a.logprobs, 5);
  EXPECT_EQ(parse({{"logprobs", true}}).logprobs, 0);
  EXPECT_EQ(parse({{"logprobs", false}}).logprobs, -1);
  EXPECT_EQ(parse(json::object()).logprobs, -1);
  EXPECT_EQ(error_param({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs");
  EXPECT_EQ(error_param({{"top_logprobs", 2}}), "top_logprobs");  // without logprobs
  EXPECT_EQ(error_param({{"logprobs", 3}}), "logprobs");           // chat: a boolean
  // Completions: an integer.
  EXPECT_EQ(parse({{"prompt", "x"}, {"logprobs", 3}}, Endpoint::Completions).logprobs, 3);
  EXPECT_EQ(error_param({{"prompt", "x"}, {"logprobs", 21}}, Endpoint::Completions), "logprobs");

  EXPECT_EQ(parse({{"n", 4}}).n, 4);
  EXPECT_EQ(error_param({{"n", 0}}), "n");
  EXPECT_EQ(error_param({{"n", 1.5}}), "n");

  a = parse({{"logit_bias", {{"17", 5}, {"3", -100}}}});
  ASSERT_EQ(a.logit_bias.size(), 2u);
  EXPECT_EQ(error_param({{"logit_bias", {{"1000", 1}}}}), "logit_bias");  // outside the vocabulary
  EXPECT_EQ(error_param({{"logit_bias", {{"x1", 1}}}}), "logit_bias");
  EXPECT_EQ(error_param({{"logit_bias", {{"5", 101}}}}), "logit_bias");
}

TEST(AgentRequest, UnknownFieldsAreNamedHarmlessOnesAccepted) {
  EXPECT_EQ(error_param({{"messages", json::array()}, {"frobnicate", 1}}), "frobnicate");
  EXPECT_EQ(error_param({{"functions", json::array()}}), "functions");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"tools", json::array()}}, Endpoint::Completions), "tools");
  EXPECT_EQ(error_param({{"prompt", "x"}}), "prompt");  // a completions field on chat
  EXPECT_EQ(error_param({{"messages", json::array()}, {"user", "u"}, {"metadata", {{"a", "b"}}}, {"store", false},
                         {"service_tier", "auto"}, {"frobnicate", nullptr}}),
            "");
}

TEST(AgentRequest, ChatTemplateKwargs) {
  json defaults = {{"thinking", false}, {"x", 1}};
  json body = {{"chat_template_kwargs", {{"thinking", true}}}};
  AgentFields a = server::parse_agent_fields(Endpoint::ChatCompletions, body, nullptr, defaults, 10);
  EXPECT_EQ(a.template_kwargs["thinking"], true);  // the request over the server's default
  EXPECT_EQ(a.template_kwargs["x"], 1);
  EXPECT_EQ(error_param({{"chat_template_kwargs", {{"messages", 1}}}}), "chat_template_kwargs");
  EXPECT_EQ(error_param({{"chat_template_kwargs", "thinking"}}), "chat_template_kwargs");
}

TEST(AgentRequest, OrderedBodyKeepsTheToolsPropertyOrder) {
  const std::string raw =
      R"({"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"string"}}}}}]})";
  ordered_json o = ordered_json::parse(raw);
  AgentFields a = server::parse_agent_fields(Endpoint::ChatCompletions, json::parse(raw), &o, json::object(), 10);
  const ordered_json& props = a.tools[0]["function"]["parameters"]["properties"];
  EXPECT_EQ(props.begin().key(), "zeta");
}

// ---- choices from events ----

struct ChoiceFixture {
  test::TempDir dir{"choice-tok"};
  Tokenizer tok;
  ChoiceFixture() : tok(make()) {}
  Tokenizer make() {
    Tokenizer::write_byte_level_tokenizer(dir.str(), 300);
    return Tokenizer::load(dir.str());
  }
};

std::vector<RequestEvent> events_of(const std::vector<std::string>& pieces, FinishReason end) {
  std::vector<RequestEvent> ev;
  for (size_t i = 0; i < pieces.size(); ++i) {
    RequestEvent e;
    e.token = 65 + int32_t(i % 20);
    e.text = pieces[i];
    e.logprob = -0.5f;
    e.top_logprobs = {{e.token, -0.5f}, {70, -1.5f}};
    e.finished = i + 1 == pieces.size();
    e.reason = end;
    ev.push_back(e);
  }
  return ev;
}

TEST(AgentChoice, ToolCallsAndReasoningStreamedAndWholeAgree) {
  ChoiceFixture f;
  server::ParsedRequest p;
  p.endpoint = Endpoint::ChatCompletions;
  p.agent.tools = ordered_json::array({ordered_json(weather_tool())});
  p.tool_parser = "deepseek_v3";
  p.reasoning_parser = "deepseek_r1";
  p.reasoning_opened = true;
  p.agent.logprobs = 1;
  const std::string out =
      "I should look it up.</think>\n\nLet me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  std::vector<std::string> pieces;
  for (size_t i = 0; i < out.size(); i += 7) pieces.push_back(out.substr(i, 7));
  auto events = events_of(pieces, FinishReason::Eos);

  server::ChoiceBuilder whole(p, f.tok, 0);
  for (auto& e : events) whole.add(e);
  json c = whole.choice();
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["reasoning_content"], "I should look it up.");
  EXPECT_EQ(c["message"]["content"], "Let me check.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(c["message"]["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  // One logprobs entry per token but the ending EOS.
  EXPECT_EQ(c["logprobs"]["content"].size(), events.size() - 1);
  EXPECT_EQ(c["logprobs"]["content"][0]["top_logprobs"].size(), 2u);

  server::ChoiceBuilder streamed(p, f.tok, 0);
  std::string reasoning, content, name, args;
  json last;
  size_t lp_entries = 0;
  for (auto& e : events)
    for (json& ch : streamed.stream(e)) {
      const json& d = ch["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const json& tc : d["tool_calls"]) {
          EXPECT_EQ(tc["index"], 0);
          if (tc["function"].contains("name")) name += tc["function"]["name"].get<std::string>();
          args += tc["function"]["arguments"].get<std::string>();
        }
      if (ch["logprobs"].is_object()) lp_entries += ch["logprobs"]["content"].size();
      last = ch;
    }
  EXPECT_EQ(reasoning, "I should look it up.");
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}}));
  EXPECT_EQ(lp_entries, events.size() - 1);
  EXPECT_EQ(last["finish_reason"], "tool_calls");
  EXPECT_EQ(last["delta"], json::object());
}

TEST(AgentChoice, ParallelToolCallsFalseKeepsTheFirstCall) {
  ChoiceFixture f;
  server::ParsedRequest p;
  p.endpoint = Endpoint::ChatCompletions;
  p.agent.tools = ordered_json::array({ordered_json(weather_tool())});
  p.agent.parallel_tool_calls = false;
  p.tool_parser = "deepseek_v31";
  const std::string out =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"A\"}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"B\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  server::ChoiceBuilder whole(p, f.tok, 0);
  for (auto& e : events_of({out}, FinishReason::Eos)) whole.add(e);
  json c = whole.choice();
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"A\"}");
  EXPECT_TRUE(c["message"]["content"].is_null());
  p.agent.parallel_tool_calls = true;
  server::ChoiceBuilder both(p, f.tok, 0);
  for (auto& e : events_of({out}, FinishReason::Eos)) both.add(e);
  EXPECT_EQ(both.choice()["message"]["tool_calls"].size(), 2u);
}

TEST(AgentChoice, CompletionLogprobsLegacyShape) {
  ChoiceFixture f;
  server::ParsedRequest p;
  p.endpoint = Endpoint::Completions;
  p.agent.logprobs = 2;
  server::ChoiceBuilder whole(p, f.tok, 0);
  auto events = events_of({"ab", "c", "de"}, FinishReason::MaxTokens);
  for (auto& e : events) whole.add(e);
  json c = whole.choice();
  EXPECT_EQ(c["text"], "abcde");
  EXPECT_EQ(c["finish_reason"], "length");
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["text_offset"], json({0, 2, 3}));
  EXPECT_EQ(lp["tokens"][0], f.tok.token_bytes(65));
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_TRUE(lp["top_logprobs"][0].contains(f.tok.token_bytes(70)));
}

// ---- log-probabilities of a row ----

TEST(Logprobs, LogSoftmaxAndTopK) {
  std::vector<float> row = {1.0f, 3.0f, -INFINITY, 3.0f, 0.5f};
  RowLogprobs r = row_logprobs(row);
  double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(0.5);
  EXPECT_NEAR(r.of(3.0f), 3.0 - std::log(z), 1e-6);
  auto top = top_logprobs(row, r, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);  // a tie goes to the lower id
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 0);
  EXPECT_NEAR(top[2].second, 1.0 - std::log(z), 1e-6);
  EXPECT_EQ(top_logprobs(row, r, 10).size(), 4u);  // -inf left out
  EXPECT_TRUE(top_logprobs(row, r, 0).empty());
  std::vector<float> dead = {-INFINITY, -INFINITY};
  EXPECT_THROW(row_logprobs(dead), std::invalid_argument);
}

// ---- tokenizer endpoints and the key ----

TEST(AgentApi, TokenizeDetokenizeAndKey) {
  ChoiceFixture f;
  json t = server::tokenize_body({{"prompt", "hello"}}, f.tok, 256);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), f.tok.encode("hello", true));
  EXPECT_EQ(t["count"], t["tokens"].size());
  json llama = server::tokenize_body({{"content", "hello"}}, f.tok, 256);
  EXPECT_EQ(llama["tokens"].get<std::vector<int32_t>>(), f.tok.encode("hello", false));
  json d = server::detokenize_body({{"tokens", f.tok.encode("hello", false)}}, f.tok);
  EXPECT_EQ(d["prompt"], "hello");
  EXPECT_EQ(d["content"], "hello");
  EXPECT_THROW(server::tokenize_body({{"prompt", 5}}, f.tok, 256), ApiError);
  EXPECT_THROW(server::tokenize_body({{"prompt", "x"}, {"extra", 1}}, f.tok, 256), ApiError);
  EXPECT_THROW(server::detokenize_body({{"tokens", {1, 99999}}}, f.tok), ApiError);

  EXPECT_TRUE(server::authorized("Bearer sk-1", "sk-1"));
  EXPECT_FALSE(server::authorized("Bearer sk-2", "sk-1"));
  EXPECT_FALSE(server::authorized("sk-1", "sk-1"));
  EXPECT_FALSE(server::authorized("", "sk-1"));

  auto c = server::choose_parsers("deepseek_v3", "", "", "");
  EXPECT_EQ(c.tool, "deepseek_v3");
  c = server::choose_parsers("deepseek_v3", "", "none", "deepseek_r1");
  EXPECT_EQ(c.tool, "");
  EXPECT_EQ(c.reasoning, "deepseek_r1");
  EXPECT_THROW(server::choose_parsers("deepseek_v3", "", "no_such_parser", ""), std::invalid_argument);
}

// ---- grammars of forced tool calls ----

bool grammar_accepts(const std::string& gbnf, const std::string& text) {
  auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::Grammar::parse(gbnf), nullptr);
  grammar::Matcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

TEST(AgentStructured, ForcedToolCallGrammarsParseBackInEveryFormat) {
  AgentFields a;
  a.tools = ordered_json::array({ordered_json(weather_tool()),
                                 ordered_json({{"type", "function"}, {"function", {{"name", "ping"}}}})});
  a.tool_choice.kind = ToolChoice::Kind::Required;
  struct Case {
    std::string parser, one, two;
  };
  const std::string args = R"({"city": "Paris", "days": 3})";
  const std::vector<Case> cases = {
      {"deepseek_v3",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + args +
           "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + args +
           "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>ping\n```json\n{}\n```<｜tool▁call▁end｜>"
           "<｜tool▁calls▁end｜>"},
      {"deepseek_v31",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + args + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + args +
           "<｜tool▁call▁end｜><｜tool▁call▁begin｜>ping<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"kimi_k2",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" + args +
           "<|tool_call_end|><|tool_calls_section_end|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" + args +
           "<|tool_call_end|><|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
           "<|tool_calls_section_end|>"},
      {"glm47",
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
       "<arg_value>3</arg_value></tool_call>",
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n"
       "<tool_call>ping</tool_call>"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.parser);
    a.parallel_tool_calls = true;
    const std::string g = server::tool_call_gbnf(c.parser, a);
    EXPECT_TRUE(grammar_accepts(g, c.one)) << g;
    EXPECT_TRUE(grammar_accepts(g, c.two)) << g;
    EXPECT_FALSE(grammar_accepts(g, "Sure! " + c.one));  // nothing before the call
    // What the grammar allows, the family's parser reads back as calls.
    chat::ToolParserOptions to;
    to.tools = json(a.tools);
    auto r = chat::parse_tool_calls(c.parser, c.one, to);
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(r.tool_calls[0].arguments), json({{"city", "Paris"}, {"days", 3}}));
    EXPECT_EQ(chat::parse_tool_calls(c.parser, c.two, to).tool_calls.size(), 2u);
    // One call only without parallel_tool_calls; a named choice allows that tool alone.
    a.parallel_tool_calls = false;
    const std::string single = server::tool_call_gbnf(c.parser, a);
    EXPECT_TRUE(grammar_accepts(single, c.one));
    EXPECT_FALSE(grammar_accepts(single, c.two));
    a.tool_choice = {ToolChoice::Kind::Named, "ping"};
    EXPECT_FALSE(grammar_accepts(server::tool_call_gbnf(c.parser, a), c.one));
    a.tool_choice = {ToolChoice::Kind::Required, ""};
  }
  // Arguments outside the schema are refused (days is an integer; city is required).
  a.parallel_tool_calls = true;
  const std::string g = server::tool_call_gbnf("deepseek_v31", a);
  EXPECT_FALSE(grammar_accepts(g, R"(<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "P", "days": "x"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>)"));
  EXPECT_FALSE(grammar_accepts(g, R"(<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"days": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>)"));
  // No forced call: no grammar.
  a.tool_choice.kind = ToolChoice::Kind::Auto;
  EXPECT_EQ(server::tool_call_gbnf("deepseek_v3", a), "");
}

TEST(AgentStructured, UnsupportedSchemaKeywordsAre400sNamingThem) {
  ChoiceFixture f;
  server::StructuredOutputs so(f.tok, 300);
  server::ParsedRequest p;
  p.endpoint = Endpoint::ChatCompletions;
  p.request.eos_token_ids = {f.tok.eos_id()};
  p.agent.format = server::ResponseFormat::JsonSchema;
  p.agent.schema = {{"type", "object"}, {"patternProperties", {{"^x", {{"type", "string"}}}}}};
  try {
    so.grammar_for(p);
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "response_format");
    EXPECT_NE(std::string(e.what()).find("patternProperties"), std::string::npos) << e.what();
  }
  p.agent.schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}};
  auto g = so.grammar_for(p);
  ASSERT_TRUE(g);
  EXPECT_EQ(so.grammar_for(p), g) << "cached";
  grammar::Matcher m(g);
  EXPECT_TRUE(m.accept_bytes("{\"a\": 12}"));
  EXPECT_TRUE(m.can_end());
  p.request.eos_token_ids.clear();  // ignore_eos: a grammar could never end the output
  EXPECT_THROW(so.grammar_for(p), ApiError);
  // Tools' schemas likewise, named "tools".
  server::ParsedRequest t;
  t.endpoint = Endpoint::ChatCompletions;
  t.request.eos_token_ids = {f.tok.eos_id()};
  t.tool_parser = "deepseek_v3";
  json tool = weather_tool();
  tool["function"]["parameters"]["not"] = {{"type", "null"}};
  t.agent.tools = ordered_json::array({ordered_json(tool)});
  t.agent.tool_choice.kind = ToolChoice::Kind::Required;
  try {
    so.grammar_for(t);
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools");
    EXPECT_NE(std::string(e.what()).find("not"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

TEST(AgentEngine, KeptSpecialTokensReachTheTextOthersDoNot) {
  ChoiceFixture f;
  const int32_t bos = f.tok.bos_id(), eos = f.tok.eos_id();
  ASSERT_TRUE(f.tok.is_special(bos) && f.tok.is_special(eos));
  OutputStream kept(&f.tok, true, {}, {bos});
  EXPECT_EQ(kept.push(bos), f.tok.bos_token());
  EXPECT_EQ(kept.push(eos), "");
  EXPECT_EQ(kept.push(f.tok.encode("a", false)[0]), "a");
  OutputStream plain(&f.tok, true, {});
  EXPECT_EQ(plain.push(bos), "");
}

TEST(AgentEngine, GrammarProcessorMasksAfterItsActivation) {
  ChoiceFixture f;
  auto table = grammar::TokenTable::from_tokenizer(f.tok, 512, {f.tok.eos_id()});
  auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::Grammar::parse(R"(root ::= "a" "b")"), table);
  const std::vector<int32_t> prompt = {f.tok.bos_id(), 100, 101};
  LogitsProcessor p = grammar_processor(g, prompt.size(), &f.tok, "</think>");
  std::vector<float> logits(512, 0.0f);
  p(logits, prompt);  // not active yet: nothing masked
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return x == 0.0f; }));
  std::vector<int32_t> tokens = prompt;
  for (int32_t id : f.tok.encode("hmm</think>", false)) tokens.push_back(id);
  p(logits, tokens);
  const int32_t a = f.tok.encode("a", false)[0], b = f.tok.encode("b", false)[0];
  EXPECT_EQ(logits[size_t(a)], 0.0f);
  EXPECT_EQ(logits[size_t(b)], -INFINITY);
  EXPECT_EQ(logits[size_t(f.tok.eos_id())], -INFINITY) << "the grammar cannot end yet";
  EXPECT_EQ(logits[400], -INFINITY);
  tokens.push_back(a);
  std::fill(logits.begin(), logits.end(), 0.0f);
  p(logits, tokens);
  EXPECT_EQ(logits[size_t(b)], 0.0f);
  EXPECT_EQ(logits[size_t(a)], -INFINITY);
  tokens.push_back(b);
  std::fill(logits.begin(), logits.end(), 0.0f);
  p(logits, tokens);
  EXPECT_EQ(logits[size_t(f.tok.eos_id())], 0.0f) << "only the stop id once the grammar has ended";
  EXPECT_EQ(std::count(logits.begin(), logits.end(), 0.0f), 1);
  tokens.push_back(b);  // a token the grammar refused: the sequence's error
  EXPECT_THROW(p(logits, tokens), std::runtime_error);
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// The real DeepSeek-V3 tokenizer: the markers (added tokens) are whole-token terminals, so a
// forced call encodes through the mask token by token, and a marker token is refused inside the
// arguments, where its text would cut the call.
TEST(AgentStructured, DeepSeekMarkersAreWholeTokensOfTheGrammar) {
  Tokenizer tok = Tokenizer::load(test::shared_dir() + "/fixtures/tokenizer/deepseek-v3");
  server::StructuredOutputs so(tok, 129280);
  server::ParsedRequest p;
  p.endpoint = Endpoint::ChatCompletions;
  p.request.eos_token_ids = {tok.eos_id()};
  p.tool_parser = "deepseek_v3";
  json tool = {{"type", "function"},
               {"function",
                {{"name", "say"},
                 {"parameters", {{"type", "object"}, {"properties", {{"text", {{"type", "string"}}}}}, {"required", {"text"}}}}}}};
  p.agent.tools = ordered_json::array({ordered_json(tool)});
  p.agent.tool_choice.kind = ToolChoice::Kind::Required;
  p.agent.parallel_tool_calls = false;
  EXPECT_NE(server::tool_call_gbnf("deepseek_v3", p.agent, &tok).find("<[" + std::to_string(*tok.token_id("<｜tool▁sep｜>")) + "]>"),
            std::string::npos);
  auto g = so.grammar_for(p);
  ASSERT_TRUE(g);
  const std::string call = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>say\n```json\n{\"text\": \"hi\"}\n```"
                           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  grammar::Matcher m(g);
  for (int32_t id : tok.encode(call, false)) ASSERT_TRUE(m.accept_token(id)) << id;
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.accept_token(tok.eos_id()));
  EXPECT_EQ(chat::parse_tool_calls("deepseek_v3", call).tool_calls.size(), 1u);

  grammar::Matcher inside(g);
  for (int32_t id : tok.encode("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>say\n```json\n{\"text\": \"a", false))
    ASSERT_TRUE(inside.accept_token(id));
  EXPECT_FALSE(inside.accept_token(*tok.token_id("<｜tool▁call▁end｜>"))) << "a marker token inside a string";
  EXPECT_TRUE(inside.accept_token(tok.encode("b", false)[0]));
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// Engine logprobs: of the model's own row, before the logits processor; at temperature 0 the
// sampled token is the most likely unless a processor moved it.
TEST(AgentEngine, LogprobsAreOfTheRawRow) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  ChoiceFixture f;  // 300 tokens under 512 logit rows: the gap is never reported
  Engine engine(*model, &f.tok, {});
  Request r;
  r.prompt = f.tok.encode("logprobs of a row", true);
  r.sampling.temperature = 0;
  r.max_new_tokens = 6;
  r.logprobs = 5;
  std::vector<RequestEvent> plain;
  engine.generate(r, [&](const RequestEvent& e) {
    if (e.token >= 0) plain.push_back(e);
  });
  ASSERT_EQ(plain.size(), 6u);
  for (const RequestEvent& e : plain) {
    ASSERT_EQ(e.top_logprobs.size(), 5u);
    EXPECT_EQ(e.top_logprobs[0].first, e.token);
    EXPECT_FLOAT_EQ(e.top_logprobs[0].second, e.logprob);
    for (auto& [id, lp] : e.top_logprobs) EXPECT_LT(id, 300) << "an id without a token";
    EXPECT_LE(e.logprob, 0.0f);
  }
  // A processor that forces token 65: sampled, but its logprob is the model's, and the top
  // entries are those of the unprocessed row.
  r.logits_processor = [](std::span<float> logits, std::span<const int32_t>) { logits[65] = 1e9f; };
  std::vector<RequestEvent> forced;
  engine.generate(r, [&](const RequestEvent& e) {
    if (e.token >= 0) forced.push_back(e);
  });
  ASSERT_FALSE(forced.empty());
  EXPECT_EQ(forced[0].token, 65);
  EXPECT_EQ(forced[0].top_logprobs, plain[0].top_logprobs);
  EXPECT_LT(forced[0].logprob, 0.0f);
  if (plain[0].token != 65) {
    EXPECT_LT(forced[0].logprob, plain[0].logprob);
  }
}

}  // namespace
}  // namespace mla
