// Unit tests of the Anthropic Messages adapter (server/api_anthropic.h) over the real
// DeepSeek-V3 tokenizer and chat template: a Messages body's translation into the chat prompt,
// its errors, and an Exchange fed synthetic engine events (DeepSeek-V3 tool-call markup,
// <think> reasoning), whole and streamed: the stream reassembles to the whole message.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "server/api_anthropic.h"
#include "server/openai.h"
#include "server/structured.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mla {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using server::AnthropicMessages;
using server::ApiError;
using server::Exchange;

const Tokenizer& deepseek_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(test::shared_dir() + "/fixtures/tokenizer/deepseek-v3");
  return tok;
}

server::StructuredOutputs& structured() {
  static server::StructuredOutputs so(deepseek_tokenizer(), 129280);
  return so;
}

// A context as server.cpp makes one for a DeepSeek-V3 checkpoint.
server::ServingContext deepseek_context() {
  server::ServingContext ctx;
  ctx.tokenizer = &deepseek_tokenizer();
  ctx.model_name = "deepseek-v3";
  ctx.context_length = 4096;
  ctx.tool_parser = "deepseek_v3";
  ctx.chat_format = chat_format_for("deepseek_v3", deepseek_tokenizer().chat_template());
  ctx.structured = &structured();
  return ctx;
}

// A template that writes what DeepSeek-V3's drops: each turn's reasoning and the tools.
server::ServingContext reasoning_template_context() {
  server::ServingContext ctx = deepseek_context();
  ctx.chat_format.kind = ChatFormat::Kind::Jinja;
  ctx.chat_format.jinja =
      "{% if tools %}{% for t in tools %}[tool {{ t['function']['name'] }}: {{ t['function']['description'] }}]"
      "{% endfor %}{% endif %}"
      "{% for m in messages %}[{{ m['role'] }}]"
      "{% if m['reasoning_content'] is defined %}<r>{{ m['reasoning_content'] }}</r>{% endif %}"
      "{% if m['content'] %}{{ m['content'] }}{% endif %}{% endfor %}[assistant]";
  return ctx;
}

json weather_tool() {
  return {{"name", "get_weather"},
          {"description", "Weather of a city"},
          {"input_schema",
           {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}};
}

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// The ApiError a body raises in parse(); fails the test if it parses.
ApiError parse_error(AnthropicMessages& api, const json& body) {
  try {
    api.parse(body, {});
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "parsed: " << body.dump();
  return ApiError(0, "");
}

TEST(AnthropicApiRequest, EveryBlockKindReachesThePrompt) {
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  json body = {
      {"model", "claude-sonnet-4-5"},
      {"max_tokens", 64},
      {"system", json::array({{{"type", "text"}, {"text", "You are terse."}, {"cache_control", {{"type", "ephemeral"}}}}})},
      {"tools", json::array({weather_tool(), {{"type", "web_search_20250305"}, {"name", "web_search"}}})},
      {"messages",
       json::array({user("Weather in Paris?"),
                    {{"role", "assistant"},
                     {"content", json::array({{{"type", "thinking"}, {"thinking", "I should call it."}, {"signature", "x"}},
                                              {{"type", "redacted_thinking"}, {"data", "opaque"}},
                                              {{"type", "tool_use"},
                                               {"id", "toolu_1"},
                                               {"name", "get_weather"},
                                               {"input", {{"city", "Paris"}}}}})}},
                    {{"role", "user"},
                     {"content", json::array({{{"type", "tool_result"},
                                               {"tool_use_id", "toolu_1"},
                                               {"content", json::array({{{"type", "text"}, {"text", "Sunny, 21C"}}})}}})}}})},
      {"metadata", {{"user_id", "u"}}},
      {"service_tier", "auto"},
      {"context_management", {{"edits", json::array()}}},
      {"some_future_field", {{"x", 1}}}};
  auto ex = api.parse(body, {});
  const server::ParsedRequest& p = ex->request;
  EXPECT_EQ(p.endpoint, server::Endpoint::Messages);
  EXPECT_EQ(p.model, "claude-sonnet-4-5");  // echoed, whatever the served name
  EXPECT_EQ(p.request.max_new_tokens, 64);
  EXPECT_EQ(p.tool_parser, "deepseek_v3");
  ASSERT_TRUE(p.agent.tools.is_array());
  EXPECT_EQ(p.agent.tools.size(), 1u) << "the server tool is dropped";
  const std::string& prompt = p.prompt_text;
  // The system prompt first, then the tools (DeepSeek-V3's template writes none of its own).
  EXPECT_EQ(prompt.find("You are terse.\n\n## Tools\n"), deepseek_tokenizer().bos_token().size()) << prompt;
  EXPECT_LT(prompt.find("### get_weather\n"), prompt.find("<｜User｜>")) << prompt;
  EXPECT_NE(prompt.find("<｜User｜>Weather in Paris?"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("function<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"Paris\"}"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<｜tool▁output▁begin｜>Sunny, 21C<｜tool▁output▁end｜>"), std::string::npos) << prompt;
  EXPECT_EQ(prompt.find("opaque"), std::string::npos);

  // A tool error is marked; the user's text after results follows them.
  body["messages"][2]["content"] = json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "no such city"}, {"is_error", true}},
                                                {{"type", "text"}, {"text", "Try again."}}});
  const std::string p2 = api.parse(body, {})->request.prompt_text;
  const size_t result = p2.find("Error: no such city");
  ASSERT_NE(result, std::string::npos) << p2;
  EXPECT_GT(p2.find("<｜User｜>Try again."), result) << p2;
}

TEST(AnthropicApiRequest, ReasoningAndSystemTurnsWhereTheTemplateKeepsThem) {
  server::ServingContext ctx = reasoning_template_context();
  AnthropicMessages api(ctx);
  json body = {{"system", "Be kind."},
               {"tools", json::array({weather_tool()})},
               {"messages",
                json::array({user("hi"),
                             {{"role", "assistant"},
                              {"content", json::array({{{"type", "thinking"}, {"thinking", "greet back"}, {"signature", "s"}},
                                                       {{"type", "text"}, {"text", "Hello!"}}})}},
                             {{"role", "system"}, {"content", "Now in French."}},
                             user("again")})}};
  const std::string prompt = api.parse(body, {})->request.prompt_text;
  EXPECT_EQ(prompt,
            "[tool get_weather: Weather of a city][system]Be kind.[user]hi[assistant]<r>greet back</r>Hello!"
            "[system]Now in French.[user]again[assistant]");
}

TEST(AnthropicApiRequest, TextOnlyAndTooLongPrompts) {
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  json image = {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "AAAA"}}}};
  ApiError e = parse_error(api, {{"max_tokens", 8}, {"messages", json::array({{{"role", "user"}, {"content", json::array({image})}}})}});
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("this model takes text only"), std::string::npos) << e.what();
  // In a tool result (an agent read an image file) the image becomes a placeholder instead:
  // the agent resends it every turn, and a 400 would end the session.
  json use = {{"type", "tool_use"}, {"id", "t"}, {"name", "read"}, {"input", json::object()}};
  json in_result = {{"type", "tool_result"}, {"tool_use_id", "t"},
                    {"content", json::array({{{"type", "text"}, {"text", "shot.png:"}}, image})}};
  const std::string prompt =
      api.parse({{"max_tokens", 8},
                 {"messages", json::array({user("look"), {{"role", "assistant"}, {"content", json::array({use})}},
                                           {{"role", "user"}, {"content", json::array({in_result})}}})}},
                {})
          ->request.prompt_text;
  EXPECT_NE(prompt.find("shot.png:\n[image omitted: this model reads text only]"), std::string::npos) << prompt;

  ctx.context_length = 16;
  json body = {{"max_tokens", 8}, {"messages", json::array({user(std::string(400, 'a') + " the end")})}};
  const int64_t n = api.count_tokens(body)["input_tokens"];
  ASSERT_GT(n, 16);
  e = parse_error(api, body);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(std::string(e.what()), "prompt is too long: " + std::to_string(n) + " tokens > 16 maximum");
  EXPECT_EQ(api.error_body(server::ErrorInfo::from(e)),
            json({{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", e.what()}}}}));
}

TEST(AnthropicApiRequest, FieldsAndTheirTypes) {
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  const json base = {{"messages", json::array({user("hi")})}};
  auto with = [&](const char* k, json v) {
    json b = base;
    b[k] = std::move(v);
    return b;
  };
  // max_tokens: absent, the room left; too large, capped to it.
  const server::ParsedRequest p = api.parse(base, {})->request;
  const int64_t room = 4096 - int64_t(p.request.prompt.size());
  EXPECT_EQ(p.request.max_new_tokens, room);
  EXPECT_EQ(p.model, "deepseek-v3");
  EXPECT_EQ(api.parse(with("max_tokens", 1000000), {})->request.request.max_new_tokens, room);
  const auto s = api.parse(with("stop_sequences", {"END", "STOP"}), {});
  EXPECT_EQ(s->request.request.stop, (std::vector<std::string>{"END", "STOP"}));
  json sampled = base;
  sampled.update({{"temperature", 0.25}, {"top_p", 0.5}, {"top_k", 7}, {"stream", true}});
  const auto q = api.parse(sampled, {});
  EXPECT_FLOAT_EQ(q->request.request.sampling.temperature, 0.25f);
  EXPECT_FLOAT_EQ(q->request.request.sampling.top_p, 0.5f);
  EXPECT_EQ(q->request.request.sampling.top_k, 7);
  EXPECT_TRUE(q->request.stream);
  // Known fields of the wrong type, and n, are 400s naming the field.
  for (const json& b : {with("max_tokens", "10"), with("stop_sequences", "END"), with("stream", "yes"),
                        with("system", 3), with("tools", {{"name", "x"}}), with("tool_choice", "auto"),
                        with("thinking", {{"type", "sometimes"}}), with("n", 2), with("temperature", "hot"),
                        json{{"messages", "hi"}}, json{{"messages", json::array({{{"role", "tool"}, {"content", "x"}}})}}}) {
    ApiError e = parse_error(api, b);
    EXPECT_EQ(e.status, 400) << b.dump();
    EXPECT_FALSE(e.param.empty()) << b.dump();
  }
}

TEST(AnthropicApiRequest, ToolChoiceAndThinkingMapToChat) {
  auto translate = [](const json& extra) {
    ordered_json body = {{"messages", json::array({user("hi")})}, {"tools", json::array({weather_tool()})}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return server::read_messages_body(body);
  };
  using Kind = server::ToolChoice::Kind;
  EXPECT_EQ(translate({{"tool_choice", {{"type", "auto"}}}}).agent.tool_choice.kind, Kind::Auto);
  EXPECT_EQ(translate({{"tool_choice", {{"type", "none"}}}}).agent.tool_choice.kind, Kind::None);
  EXPECT_EQ(translate({{"tool_choice", {{"type", "any"}}}}).agent.tool_choice.kind, Kind::Required);
  server::RequestFields named =
      translate({{"tool_choice", {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}}}});
  EXPECT_EQ(named.agent.tool_choice.kind, Kind::Named);
  EXPECT_EQ(named.agent.tool_choice.name, "get_weather");
  EXPECT_FALSE(named.agent.parallel_tool_calls);
  EXPECT_EQ(json(named.agent.tools[0]),
            json({{"type", "function"},
                  {"function",
                   {{"name", "get_weather"}, {"description", "Weather of a city"}, {"parameters", weather_tool()["input_schema"]}}}}));
  EXPECT_EQ(translate({{"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}}}).agent.template_kwargs,
            json({{"thinking", true}, {"enable_thinking", true}}));
  EXPECT_EQ(translate({{"thinking", {{"type", "disabled"}}}}).agent.template_kwargs["thinking"], false);
  EXPECT_TRUE(translate({{"thinking", {{"type", "adaptive"}}}}).agent.template_kwargs.empty());

  // Through chat_request: a forced call is constrained by the tool's grammar.
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  json body = {{"messages", json::array({user("hi")})},
               {"tools", json::array({weather_tool()})},
               {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}};
  auto forced = api.parse(body, body.dump());
  EXPECT_EQ(forced->request.agent.tool_choice.kind, server::ToolChoice::Kind::Named);
  EXPECT_TRUE(forced->request.grammar);
  body["tool_choice"] = {{"type", "auto"}};
  EXPECT_FALSE(api.parse(body, {})->request.grammar);
  body["tool_choice"] = {{"type", "tool"}, {"name", "nope"}};
  EXPECT_EQ(parse_error(api, body).status, 400);
}

// DeepSeek-V3's template writes calls and results but no tool definitions: the server writes
// them after the system prompt, with the deepseek_v3 call syntax, for the Messages and the chat
// completions routes alike; not when tool_choice is none, and not for a template that reads
// `tools` itself.
TEST(AnthropicApiRequest, ToolsReachATemplateWithoutThem) {
  server::ServingContext ctx = deepseek_context();
  ASSERT_FALSE(template_reads_tools(ctx.chat_format.jinja));
  AnthropicMessages api(ctx);
  json body = {{"max_tokens", 16},
               {"system", "Be brief."},
               {"messages", json::array({user("weather in Paris?")})},
               {"tools", json::array({weather_tool()})}};
  const std::string prompt = api.parse(body, body.dump())->request.prompt_text;
  const size_t tools_at = prompt.find("## Tools\n");
  ASSERT_NE(tools_at, std::string::npos) << prompt;
  EXPECT_NE(prompt.find("Be brief.\n\n## Tools\n"), std::string::npos) << "after the system prompt";
  EXPECT_LT(tools_at, prompt.find("<｜User｜>weather in Paris?")) << "in the system prompt";
  // (the schema's keys in the body's order: nlohmann::json's, sorted)
  EXPECT_NE(prompt.find("### get_weather\nDescription: Weather of a city\nParameters: "
                        "{\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],\"type\":\"object\"}\n"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```"
                        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
            std::string::npos)
      << prompt;
  const int64_t with_tools = api.count_tokens(body)["input_tokens"];
  EXPECT_EQ(with_tools, int64_t(deepseek_tokenizer().encode(prompt, false).size()));

  // The same request through chat completions renders the same prompt.
  const json chat = {{"max_tokens", 16},
                     {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}}, user("weather in Paris?")})},
                     {"tools", json::array({{{"type", "function"},
                                             {"function",
                                              {{"name", "get_weather"},
                                               {"description", "Weather of a city"},
                                               {"parameters", weather_tool()["input_schema"]}}}}})}};
  EXPECT_EQ(server::parse_request(server::Endpoint::ChatCompletions, chat, ctx, chat.dump()).prompt_text, prompt);

  body["tool_choice"] = {{"type", "none"}};
  const std::string none = api.parse(body, body.dump())->request.prompt_text;
  EXPECT_EQ(none.find("## Tools"), std::string::npos) << none;
  EXPECT_LT(api.count_tokens(body)["input_tokens"].get<int64_t>(), with_tools);

  // A template that reads `tools` gets them there and nothing else.
  server::ServingContext reads = reasoning_template_context();
  ASSERT_TRUE(template_reads_tools(reads.chat_format.jinja));
  AnthropicMessages api2(reads);
  body.erase("tool_choice");
  const std::string own = api2.parse(body, body.dump())->request.prompt_text;
  EXPECT_NE(own.find("[tool get_weather: Weather of a city]"), std::string::npos) << own;
  EXPECT_EQ(own.find("## Tools"), std::string::npos) << own;
}

TEST(AnthropicApiRequest, CountTokensIncludesSystemAndTools) {
  server::ServingContext ctx = reasoning_template_context();
  AnthropicMessages api(ctx);
  json body = {{"messages", json::array({user("hi")})}};
  const int64_t plain = api.count_tokens(body)["input_tokens"];
  EXPECT_EQ(plain, int64_t(api.parse(body, {})->request.request.prompt.size()));
  body["system"] = "Be kind and brief.";
  const int64_t with_system = api.count_tokens(body)["input_tokens"];
  EXPECT_GT(with_system, plain);
  body["tools"] = json::array({weather_tool()});
  EXPECT_GT(api.count_tokens(body)["input_tokens"].get<int64_t>(), with_system);
  EXPECT_THROW(api.count_tokens({{"messages", "hi"}}), ApiError);
}

// --- responses from engine events ----------------------------------------------------------

RequestEvent text_event(const std::string& text) {
  RequestEvent e;
  e.token = 1;
  e.text = text;
  return e;
}

RequestEvent end_event(FinishReason reason, const std::string& text = {}) {
  RequestEvent e;
  e.token = reason == FinishReason::Eos ? 1 : -1;
  e.text = text;
  e.finished = true;
  e.reason = reason;
  return e;
}

struct SseEvent {
  std::string name;
  json data;
};

std::vector<SseEvent> parse_sse(const std::string& bytes) {
  std::vector<SseEvent> out;
  size_t at = 0;
  while (at < bytes.size()) {
    size_t end = bytes.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string ev = bytes.substr(at, end - at);
    at = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.push_back({ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7))});
    EXPECT_EQ(out.back().data["type"], out.back().name);
  }
  return out;
}

// A client's view of a stream: checks the order of its events and rebuilds the message.
json reassemble(const std::vector<SseEvent>& events) {
  EXPECT_GE(events.size(), 3u);
  EXPECT_EQ(events.front().name, "message_start");
  json message = events.front().data["message"];
  EXPECT_TRUE(message["content"].empty());
  EXPECT_EQ(events.back().name, "message_stop");
  EXPECT_EQ(events[events.size() - 2].name, "message_delta");
  int open = -1;
  std::string partial_json, last_delta;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    const json& d = events[i].data;
    const std::string& name = events[i].name;
    if (name == "ping") continue;
    EXPECT_EQ(d["index"], open >= 0 ? open : int(message["content"].size())) << name;
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started inside another";
      open = d["index"];
      message["content"].push_back(d["content_block"]);
      partial_json.clear();
      last_delta.clear();
    } else if (name == "content_block_delta") {
      EXPECT_GE(open, 0);
      json& b = message["content"].back();
      const json& delta = d["delta"];
      last_delta = delta["type"];
      if (last_delta == "text_delta") b["text"] = b["text"].get<std::string>() + delta["text"].get<std::string>();
      else if (last_delta == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + delta["thinking"].get<std::string>();
      else if (last_delta == "signature_delta") b["signature"] = delta["signature"];
      else if (last_delta == "input_json_delta") partial_json += delta["partial_json"].get<std::string>();
      else ADD_FAILURE() << "delta " << last_delta;
    } else if (name == "content_block_stop") {
      EXPECT_GE(open, 0);
      json& b = message["content"].back();
      if (b["type"] == "thinking") {
        EXPECT_EQ(last_delta, "signature_delta") << "a thinking block ends with its signature";
      }
      if (b["type"] == "tool_use") {
        EXPECT_EQ(b["input"], json::object());
        b["input"] = json::parse(partial_json);
      }
      open = -1;
    } else {
      ADD_FAILURE() << "event " << name;
    }
  }
  EXPECT_EQ(open, -1) << "a block left open";
  const json& md = events[events.size() - 2].data;
  message["stop_reason"] = md["delta"]["stop_reason"];
  message["stop_sequence"] = md["delta"]["stop_sequence"];
  message["usage"].update(md["usage"]);
  return message;
}

// The same events through two exchanges of one body, whole and streamed.
struct Both {
  json whole, streamed;
  std::vector<SseEvent> events;
};

Both run_both(AnthropicMessages& api, const json& body, const std::vector<RequestEvent>& events, server::Usage usage) {
  Both r;
  auto whole = api.parse(body, {});
  for (const RequestEvent& e : events) whole->add(0, e);
  EXPECT_EQ(whole->completion_tokens(), usage.completion_tokens);
  r.whole = whole->body(usage);

  auto streamed = api.parse(body, {});
  server::Usage begin;
  begin.prompt_tokens = usage.prompt_tokens;
  std::string bytes = streamed->stream_begin(begin);
  bytes += streamed->stream_keepalive();
  for (const RequestEvent& e : events) bytes += streamed->stream_event(0, e);
  bytes += streamed->stream_end(usage);
  r.events = parse_sse(bytes);
  r.streamed = reassemble(r.events);
  return r;
}

// Tool ids are random per response: compare without them.
json without_ids(json m) {
  m.erase("id");
  for (json& b : m["content"]) b.erase("id");
  return m;
}

TEST(AnthropicApiResponse, ToolCallWholeAndStreamed) {
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  json body = {{"model", "claude-x"}, {"max_tokens", 100}, {"stream", true},
               {"messages", json::array({user("Weather?")})}, {"tools", json::array({weather_tool()})}};
  const std::vector<RequestEvent> events = {
      text_event("Let me"), text_event(" check.\n\n"), text_event("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"),
      text_event("<｜tool▁sep｜>get_weather\n```json\n{\"city\": "), text_event("\"Paris\"}\n```<｜tool▁call▁end｜>"),
      text_event("<｜tool▁calls▁end｜>"), end_event(FinishReason::Eos)};
  server::Usage usage{.prompt_tokens = 50, .completion_tokens = 7, .cached_tokens = 32};
  Both r = run_both(api, body, events, usage);

  const json& m = r.whole;
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "claude-x");
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0], json({{"type", "text"}, {"text", "Let me check.\n\n"}}));
  const json& call = m["content"][1];
  EXPECT_EQ(call["type"], "tool_use");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(call["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["stop_sequence"], nullptr);
  EXPECT_EQ(m["usage"], json({{"input_tokens", 18}, {"output_tokens", 7}, {"cache_read_input_tokens", 32},
                              {"cache_creation_input_tokens", 0}}));

  EXPECT_EQ(without_ids(r.streamed), without_ids(r.whole));
  EXPECT_EQ(r.events[1].name, "ping");
  // message_start counts the prompt, nothing generated yet.
  EXPECT_EQ(r.events[0].data["message"]["usage"]["input_tokens"], 50);
  EXPECT_EQ(r.events[0].data["message"]["usage"]["output_tokens"], 0);
}

TEST(AnthropicApiResponse, ThinkingWholeAndStreamed) {
  server::ServingContext ctx = deepseek_context();
  ctx.reasoning_parser = "deepseek_r1";
  AnthropicMessages api(ctx);
  json body = {{"max_tokens", 5}, {"messages", json::array({user("2+2?")})}};
  const std::vector<RequestEvent> events = {text_event("<think>"), text_event("Two and "), text_event("two."),
                                            text_event("</think>"), text_event("\n\nFour"),
                                            end_event(FinishReason::MaxTokens, ".")};
  Both r = run_both(api, body, events, {.prompt_tokens = 9, .completion_tokens = 5});
  const json& m = r.whole;
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "Two and two.");
  EXPECT_EQ(m["content"][0]["signature"], server::thinking_signature("Two and two."));
  EXPECT_FALSE(m["content"][0]["signature"].get<std::string>().empty());
  EXPECT_NE(server::thinking_signature("Two and two!"), server::thinking_signature("Two and two."));
  EXPECT_EQ(m["content"][1], json({{"type", "text"}, {"text", "Four."}}));
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_EQ(m["usage"]["input_tokens"], 9);
  EXPECT_EQ(m["usage"]["output_tokens"], 5);
  EXPECT_EQ(without_ids(r.streamed), without_ids(r.whole));
}

TEST(AnthropicApiResponse, StopReasonsAndEmptyContent) {
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  json body = {{"max_tokens", 10}, {"stop_sequences", {"END", "HALT"}}, {"messages", json::array({user("count")})}};

  RequestEvent stop = end_event(FinishReason::StopString);
  stop.stop_string = "HALT";
  Both r = run_both(api, body, {text_event("1 2 3"), stop}, {.prompt_tokens = 4, .completion_tokens = 1});
  EXPECT_EQ(r.whole["stop_reason"], "stop_sequence");
  EXPECT_EQ(r.whole["stop_sequence"], "HALT");
  EXPECT_EQ(without_ids(r.streamed), without_ids(r.whole));

  // An engine event without the string: with one stop sequence it can only be that one.
  body["stop_sequences"] = {"END"};
  r = run_both(api, body, {text_event("1"), end_event(FinishReason::StopString)}, {.prompt_tokens = 4, .completion_tokens = 1});
  EXPECT_EQ(r.whole["stop_sequence"], "END");

  // Nothing generated but whitespace: one empty text block; EOS is end_turn.
  r = run_both(api, body, {text_event(" \n"), end_event(FinishReason::Eos)}, {.prompt_tokens = 4, .completion_tokens = 2});
  EXPECT_EQ(r.whole["content"], json::array({{{"type", "text"}, {"text", ""}}}));
  EXPECT_EQ(r.whole["stop_reason"], "end_turn");
  EXPECT_EQ(r.whole["stop_sequence"], nullptr);
  EXPECT_TRUE(r.streamed["content"].empty()) << "a stream sends no block for nothing";

  for (FinishReason reason : {FinishReason::ContextLength, FinishReason::KvCacheFull}) {
    r = run_both(api, body, {text_event("x"), end_event(reason)}, {.prompt_tokens = 4, .completion_tokens = 1});
    EXPECT_EQ(r.whole["stop_reason"], "max_tokens");
  }
}

server::ErrorInfo error_info(int status, const std::string& message) {
  server::ErrorInfo e;
  e.status = status;
  e.message = message;
  return e;
}

TEST(AnthropicApiResponse, ErrorsInAnthropicShape) {
  server::ServingContext ctx = deepseek_context();
  AnthropicMessages api(ctx);
  EXPECT_STREQ(api.name(), "messages");
  const std::vector<std::pair<int, const char*>> types = {
      {400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
      {404, "not_found_error"},       {413, "request_too_large"},    {429, "rate_limit_error"},
      {500, "api_error"},             {502, "api_error"},            {503, "overloaded_error"},
      {529, "overloaded_error"},      {504, "timeout_error"}};
  for (auto [status, type] : types) {
    json b = api.error_body(error_info(status, "boom"));
    EXPECT_EQ(b, json({{"type", "error"}, {"error", {{"type", type}, {"message", "boom"}}}})) << status;
  }
  auto ex = api.parse({{"messages", json::array({user("hi")})}}, {});
  std::vector<SseEvent> events = parse_sse(ex->stream_error(error_info(503, "shutting down"), {}));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "error");
  EXPECT_EQ(events[0].data["error"], json({{"type", "overloaded_error"}, {"message", "shutting down"}}));
  EXPECT_EQ(ex->stream_keepalive(), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

}  // namespace
}  // namespace mla
