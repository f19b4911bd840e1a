// Unit tests of the Responses API adapter (server/api_responses.h) over the real DeepSeek-V3
// tokenizer and chat template: each input item kind in the chat messages and the prompt, custom
// and namespaced tools both ways, dropped hosted tools, text.format's grammar, the store
// (previous_response_id, LRU eviction, store: false, GET / DELETE), and synthetic engine events
// through an Exchange, whole and streamed: the stream's events reassemble to the whole response.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>

#include "server/api_responses.h"
#include "server/structured.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mla {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using server::ApiError;
using server::Exchange;
using server::ResponsesApi;
using server::Usage;

struct Fixture {
  Tokenizer tok;
  std::string v3_template, thinking_template;
  static Fixture& get() {
    static Fixture f;
    return f;
  }

 private:
  Fixture() : tok(Tokenizer::load(test::shared_dir() + "/fixtures/tokenizer/deepseek-v3")) {
    std::ifstream in(test::shared_dir() + "/fixtures/tokenizer/deepseek-v3/tokenizer_config.json");
    v3_template = json::parse(in)["chat_template"].get<std::string>();
    // DeepSeek-V3's template with R1's opened reasoning block when "thinking" is set.
    const std::string gen = "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";
    thinking_template = v3_template;
    const size_t at = thinking_template.find(gen);
    if (at != std::string::npos)
      thinking_template.replace(at, gen.size(),
                                "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}"
                                "{% if thinking %}{{'<think>\\n'}}{% endif %}{% endif %}");
  }
};

server::ServingContext context(bool thinking = false) {
  Fixture& f = Fixture::get();
  server::ServingContext ctx;
  ctx.tokenizer = &f.tok;
  ctx.model_name = "served";
  ctx.context_length = 4096;
  ctx.tool_parser = "deepseek_v3";
  if (thinking) ctx.reasoning_parser = "deepseek_r1";
  ctx.chat_format.kind = ChatFormat::Kind::Jinja;
  ctx.chat_format.jinja = thinking ? f.thinking_template : f.v3_template;
  return ctx;
}

// The param of the ApiError parse raises, with its status ("" when it parses).
std::pair<int, std::string> error_of(ResponsesApi& api, const json& body) {
  try {
    api.parse(body, body.dump());
  } catch (const ApiError& e) {
    EXPECT_FALSE(std::string(e.what()).empty());
    return {e.status, e.param};
  }
  return {0, ""};
}

const std::string kCall = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>";
std::string call_markup(const std::string& name, const std::string& args) {
  return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args + "\n```<｜tool▁call▁end｜>";
}

RequestEvent text_event(const std::string& text) {
  RequestEvent e;
  e.token = 7;
  e.text = text;
  return e;
}
RequestEvent end_event(FinishReason r, int32_t token = 1) {
  RequestEvent e;
  e.token = token;
  e.finished = true;
  e.reason = r;
  return e;
}

// The events of a text split into pieces of n bytes (a marker may be cut anywhere), then the end.
std::vector<RequestEvent> events_of(const std::vector<std::string>& pieces, FinishReason end = FinishReason::Eos) {
  std::vector<RequestEvent> out;
  for (const std::string& p : pieces) out.push_back(text_event(p));
  out.push_back(end_event(end));
  return out;
}

json whole(Exchange& x, const std::vector<RequestEvent>& events, Usage usage = {10, 0, 3}) {
  for (const RequestEvent& e : events) x.add(0, e);
  usage.completion_tokens = x.completion_tokens();
  return x.body(usage);
}

struct SseEvent {
  std::string type;
  json data;
};

std::vector<SseEvent> parse_sse(const std::string& s) {
  std::vector<SseEvent> out;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event ends with a blank line";
    if (end == std::string::npos) break;
    const std::string block = s.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(block.rfind("event: ", 0), 0u) << block;
    const size_t nl = block.find('\n');
    SseEvent e{block.substr(7, nl - 7), json::parse(block.substr(nl + 1 + 6))};
    EXPECT_EQ(block.substr(nl + 1, 6), "data: ");
    EXPECT_EQ(e.data["type"], e.type);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<SseEvent> streamed(Exchange& x, const std::vector<RequestEvent>& events, Usage usage = {10, 0, 3}) {
  std::string s = x.stream_begin({usage.prompt_tokens, 0, 0});
  for (const RequestEvent& e : events) s += x.stream_event(0, e);
  usage.completion_tokens = x.completion_tokens();
  s += x.stream_end(usage);
  return parse_sse(s);
}

// Items without their random ids (item and call), to compare two exchanges' outputs.
json without_ids(json items) {
  for (json& it : items) it.erase("id"), it.erase("call_id");
  return items;
}

// Checks a stream's invariants and returns the items its output_item.done events carry; each
// item's deltas concatenate to its final text, arguments or input.
json check_stream(const std::vector<SseEvent>& events) {
  EXPECT_GE(events.size(), 3u);
  EXPECT_EQ(events[0].type, "response.created");
  EXPECT_EQ(events[1].type, "response.in_progress");
  EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].data["sequence_number"], int64_t(i));
  std::map<std::string, std::string> deltas;
  json done = json::array();
  for (const SseEvent& e : events) {
    if (e.type.size() > 6 && e.type.compare(e.type.size() - 6, 6, ".delta") == 0)
      deltas[e.data["item_id"].get<std::string>()] += e.data["delta"].get<std::string>();
    if (e.type == "response.output_item.done") {
      EXPECT_EQ(e.data["output_index"], done.size());
      done.push_back(e.data["item"]);
    }
  }
  for (const json& it : done) {
    const std::string id = it["id"];
    const json& final = it["type"] == "function_call"      ? it["arguments"]
                        : it["type"] == "custom_tool_call" ? it["input"]
                                                           : it["content"][0]["text"];
    EXPECT_EQ(deltas[id], final) << it.dump();
  }
  EXPECT_EQ(events.back().data["response"]["output"], done);
  return done;
}

TEST(ResponsesApiRequest, InputItemsBecomeChatMessages) {
  ordered_json body = ordered_json::parse(R"({
    "model": "gpt-5-codex", "instructions": "Be brief.",
    "input": [
      {"type": "message", "role": "developer", "content": "Use tools."},
      {"role": "user", "content": [{"type": "input_text", "text": "List "}, {"type": "input_text", "text": "files"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "need ls"}]},
      {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
      {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{\"cmd\":\"pwd\"}"},
      {"type": "web_search_call", "id": "ws_1", "status": "completed"},
      {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "/w"}]},
      {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "done"}], "summary": []},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a.txt in /w"}]},
      {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch"},
      {"type": "custom_tool_call_output", "call_id": "c3", "output": "ok"},
      {"type": "function_call", "call_id": "c4", "namespace": "files", "name": "read", "arguments": "{}"}
    ]})");
  server::ResponsesTranslation t = server::translate_responses_request(body);
  const ordered_json& m = t.fields.messages;
  ASSERT_EQ(m.size(), 9u) << m.dump(1);
  EXPECT_EQ(m[0], ordered_json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1], ordered_json({{"role", "system"}, {"content", "Use tools."}}));
  EXPECT_EQ(m[2], ordered_json({{"role", "user"}, {"content", "List files"}}));
  // The two calls share one assistant message, which carries the reasoning before them.
  EXPECT_EQ(m[3]["role"], "assistant");
  EXPECT_TRUE(m[3]["content"].is_null());
  EXPECT_EQ(m[3]["reasoning_content"], "need ls");
  ASSERT_EQ(m[3]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[3]["tool_calls"][1]["id"], "c2");
  EXPECT_EQ(m[3]["tool_calls"][1]["function"]["arguments"], "{\"cmd\":\"pwd\"}");
  EXPECT_EQ(m[4], ordered_json({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "a.txt"}}));
  EXPECT_EQ(m[5]["content"], "/w");
  EXPECT_EQ(m[6]["content"], "a.txt in /w");
  EXPECT_EQ(m[6]["reasoning_content"], "done");
  // The custom call joins the message before it; its input is the one string argument.
  ASSERT_EQ(m[6]["tool_calls"].size(), 1u);
  EXPECT_EQ(m[6]["tool_calls"][0]["function"]["name"], "apply_patch");
  EXPECT_EQ(json::parse(m[6]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"input", "*** Begin Patch"}}));
  EXPECT_EQ(m[7]["role"], "tool");
  EXPECT_EQ(m[8]["tool_calls"][0]["function"]["name"], "files__read");
  EXPECT_EQ(t.input_messages.size(), m.size() - 1) << "the instructions are not input";
  EXPECT_EQ(t.fields.model, "gpt-5-codex");

  // Through the chat template: the prompt holds each turn.
  auto ctx = context();
  ResponsesApi api(ctx, 0);
  auto x = api.parse(json(body), body.dump());
  const std::string& prompt = x->request.prompt_text;
  EXPECT_EQ(x->request.endpoint, server::Endpoint::Responses);
  EXPECT_EQ(x->request.model, "gpt-5-codex");
  EXPECT_EQ(prompt.find("Be brief.\n\nUse tools."), 0u + Fixture::get().tok.bos_token().size()) << prompt;
  EXPECT_NE(prompt.find("<｜User｜>List files"), std::string::npos);
  EXPECT_NE(prompt.find("shell\n```json\n{\"cmd\":\"pwd\"}\n```"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<｜tool▁output▁begin｜>a.txt<｜tool▁output▁end｜>"), std::string::npos);
  EXPECT_NE(prompt.find("a.txt in /w"), std::string::npos);
  EXPECT_NE(prompt.find("files__read"), std::string::npos);
  EXPECT_EQ(prompt.find("ws_1"), std::string::npos);

  // A plain string input is one user turn.
  auto s = api.parse(json{{"input", "hello"}}, "");
  EXPECT_NE(s->request.prompt_text.find("<｜User｜>hello<｜Assistant｜>"), std::string::npos);
  EXPECT_EQ(s->request.model, "served");
}

TEST(ResponsesApiRequest, ToolsMapBothWays) {
  auto ctx = context();
  Fixture& f = Fixture::get();
  server::StructuredOutputs so(f.tok, int64_t(f.tok.vocab_size()));  // a named tool_choice's grammar
  ctx.structured = &so;
  ResponsesApi api(ctx, 0);
  json body = json::parse(R"({
    "input": "patch it", "tool_choice": "auto", "parallel_tool_calls": false,
    "tools": [
      {"type": "function", "name": "shell", "description": "Run", "strict": false,
       "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
      {"type": "custom", "name": "apply_patch", "description": "Patch files",
       "format": {"type": "grammar", "syntax": "lark", "definition": "start: PATCH"}},
      {"type": "namespace", "name": "mcp_fs", "description": "files",
       "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}},
                 {"type": "custom", "name": "write"}]},
      {"type": "web_search"}, {"type": "local_shell"}, {"type": "image_generation"}
    ]})");
  auto x = api.parse(body, body.dump());
  const auto& tools = x->request.agent.tools;
  ASSERT_EQ(tools.size(), 4u) << "hosted tools are dropped";
  EXPECT_EQ(tools[0]["function"]["name"], "shell");
  EXPECT_EQ(tools[0]["function"]["description"], "Run");
  EXPECT_EQ(tools[1]["function"]["name"], "apply_patch");
  EXPECT_EQ(tools[1]["function"]["parameters"]["required"], ordered_json::array({"input"}));
  EXPECT_NE(tools[1]["function"]["description"].get<std::string>().find("start: PATCH"), std::string::npos);
  EXPECT_EQ(tools[2]["function"]["name"], std::string("mcp_fs") + server::kNamespaceSeparator + "read");
  EXPECT_EQ(tools[3]["function"]["name"], "mcp_fs__write");
  EXPECT_FALSE(x->request.agent.parallel_tool_calls);
  EXPECT_EQ(x->request.tool_parser, "deepseek_v3");

  // The model's calls of each come back as the client's items.
  const std::string out = "I will." + kCall + "apply_patch\n```json\n{\"input\": \"*** Begin Patch\\n\"}\n```<｜tool▁call▁end｜>"
                          "<｜tool▁calls▁end｜>";
  json r = whole(*x, events_of({out.substr(0, 9), out.substr(9, 30), out.substr(39)}));
  ASSERT_EQ(r["output"].size(), 2u) << r.dump(1);
  EXPECT_EQ(r["output"][0]["type"], "message");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "I will.");
  const json& c = r["output"][1];
  EXPECT_EQ(c["type"], "custom_tool_call");
  EXPECT_EQ(c["name"], "apply_patch");
  EXPECT_EQ(c["input"], "*** Begin Patch\n");
  EXPECT_EQ(c["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["tools"], body["tools"]) << "the request's tools are echoed as sent";
  EXPECT_EQ(r["parallel_tool_calls"], false);

  body["parallel_tool_calls"] = true;
  auto y = api.parse(body, body.dump());
  const std::string calls = kCall.substr(0, kCall.find("<｜tool▁call▁begin｜>")) +
                            call_markup("mcp_fs__read", "{\"path\": \"a\"}") + "\n" +
                            call_markup("mcp_fs__write", "{\"input\": \"x\"}") + "\n" +
                            call_markup("shell", "{\"cmd\": \"ls\"}") + "<｜tool▁calls▁end｜>";
  r = whole(*y, events_of({calls}));
  ASSERT_EQ(r["output"].size(), 3u) << r.dump(1);
  EXPECT_EQ(r["output"][0]["type"], "function_call");
  EXPECT_EQ(r["output"][0]["name"], "read");
  EXPECT_EQ(r["output"][0]["namespace"], "mcp_fs");
  EXPECT_EQ(r["output"][0]["arguments"], "{\"path\": \"a\"}");
  EXPECT_EQ(r["output"][0]["status"], "completed");
  EXPECT_EQ(r["output"][1]["type"], "custom_tool_call");
  EXPECT_EQ(r["output"][1]["name"], "write");
  EXPECT_EQ(r["output"][1]["namespace"], "mcp_fs");
  EXPECT_EQ(r["output"][1]["input"], "x");
  EXPECT_EQ(r["output"][2]["name"], "shell");
  EXPECT_FALSE(r["output"][2].contains("namespace"));

  // Named choices of each kind reach the chat request under the prompt's name.
  body["tool_choice"] = {{"type", "function"}, {"name", "read"}, {"namespace", "mcp_fs"}};
  EXPECT_EQ(api.parse(body, body.dump())->request.agent.tool_choice.name, "mcp_fs__read");
  body["tool_choice"] = {{"type", "custom"}, {"name", "apply_patch"}};
  EXPECT_EQ(api.parse(body, body.dump())->request.agent.tool_choice.name, "apply_patch");
  // Only hosted tools: none is left, and a choice among them is no error.
  json hosted = {{"input", "hi"}, {"tools", {{{"type", "web_search"}}}}, {"tool_choice", {{"type", "web_search"}}}};
  EXPECT_FALSE(api.parse(hosted, hosted.dump())->request.agent.has_tools());
}

TEST(ResponsesApiRequest, FieldsAndErrors) {
  auto ctx = context();
  ResponsesApi api(ctx, 0);
  // Unknown top-level fields and the accepted metadata pass.
  json ok = {{"input", "hi"}, {"some_future_field", {{"x", 1}}}, {"metadata", {{"k", "v"}}}, {"include", json::array()},
             {"prompt_cache_key", "k"}, {"truncation", "auto"}, {"store", false}, {"user", "u"},
             {"service_tier", "auto"}, {"safety_identifier", "s"}, {"stream_options", {{"include_obfuscation", false}}},
             {"client_metadata", {{"a", "b"}}}, {"text", {{"verbosity", "low"}}}, {"reasoning", {{"summary", "auto"}}},
             {"max_output_tokens", 100000}, {"temperature", 0.5}, {"top_p", 0.9}};
  auto x = api.parse(ok, ok.dump());
  EXPECT_EQ(x->request.request.max_new_tokens, 4096 - int64_t(x->request.request.prompt.size()))
      << "max_output_tokens beyond the room is capped to it";
  EXPECT_FLOAT_EQ(x->request.request.sampling.temperature, 0.5f);
  EXPECT_FALSE(x->request.grammar);

  auto with = [&](const char* k, json v) {
    json b = {{"input", "hi"}};
    b[k] = std::move(v);
    return error_of(api, b);
  };
  EXPECT_EQ(with("input", 5), std::make_pair(400, std::string("input")));
  EXPECT_EQ(with("instructions", json::array()), std::make_pair(400, std::string("instructions")));
  EXPECT_EQ(with("tools", "shell"), std::make_pair(400, std::string("tools")));
  EXPECT_EQ(with("max_output_tokens", "10"), std::make_pair(400, std::string("max_output_tokens")));
  EXPECT_EQ(with("max_output_tokens", 0), std::make_pair(400, std::string("max_output_tokens")));
  EXPECT_EQ(with("temperature", 3), std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(with("stream", "yes"), std::make_pair(400, std::string("stream")));
  EXPECT_EQ(with("store", 1), std::make_pair(400, std::string("store")));
  EXPECT_EQ(with("metadata", "m"), std::make_pair(400, std::string("metadata")));
  EXPECT_EQ(with("reasoning", {{"effort", "extreme"}}), std::make_pair(400, std::string("reasoning.effort")));
  EXPECT_EQ(with("text", {{"format", {{"type", "yaml"}}}}), std::make_pair(400, std::string("text.format")));
  EXPECT_EQ(with("n", 2), std::make_pair(400, std::string("n")));
  EXPECT_EQ(with("previous_response_id", "resp_x"), std::make_pair(400, std::string("previous_response_id")))
      << "the store is off";
  EXPECT_EQ(error_of(api, {{"input", json::array()}}).first, 400);
  EXPECT_EQ(error_of(api, {{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}).second, "input");
  EXPECT_EQ(error_of(api, {{"input", {{{"type", "function_call"}, {"name", "f"}}}}}).second, "input");

  // reasoning.effort switches the template's thinking variable.
  auto tctx = context(true);
  ResponsesApi tapi(tctx, 0);
  auto on = tapi.parse({{"input", "hi"}, {"reasoning", {{"effort", "high"}}}}, "");
  EXPECT_TRUE(on->request.reasoning_opened);
  EXPECT_EQ(on->request.agent.template_kwargs["enable_thinking"], true);
  auto off = tapi.parse({{"input", "hi"}, {"reasoning", {{"effort", "minimal"}}}}, "");
  EXPECT_FALSE(off->request.reasoning_opened);
  EXPECT_EQ(off->request.agent.template_kwargs["thinking"], false);
}

TEST(ResponsesApiRequest, TextFormatSetsTheGrammar) {
  auto ctx = context();
  Fixture& f = Fixture::get();
  server::StructuredOutputs so(f.tok, int64_t(f.tok.vocab_size()));
  ctx.structured = &so;
  ResponsesApi api(ctx, 0);
  json body = {{"input", "a person"},
               {"text",
                {{"format",
                  {{"type", "json_schema"}, {"name", "person"}, {"strict", true},
                   {"schema", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}}}, {"required", {"name"}}}}}}}}};
  auto x = api.parse(body, body.dump());
  EXPECT_EQ(x->request.agent.format, server::ResponseFormat::JsonSchema);
  EXPECT_TRUE(x->request.agent.strict);
  EXPECT_TRUE(x->request.grammar);
  body["text"]["format"] = {{"type", "json_object"}};
  EXPECT_EQ(api.parse(body, body.dump())->request.agent.format, server::ResponseFormat::JsonObject);
  body["text"]["format"] = {{"type", "text"}};
  EXPECT_FALSE(api.parse(body, body.dump())->request.grammar);
}

TEST(ResponsesApiStream, ReassemblesToTheWholeResponse) {
  auto ctx = context(true);
  ResponsesApi api(ctx, 0);
  json tools = {{{"type", "function"}, {"name", "shell"}, {"parameters", {{"type", "object"}}}},
                {{"type", "custom"}, {"name", "apply_patch"}}};
  json body = {{"input", "go"}, {"tools", tools}, {"reasoning", {{"effort", "high"}}}, {"stream", true}};
  const std::string text = "Plan: look.</think>\n\nLooking now." + kCall + "shell\n```json\n{\"cmd\": \"ls\"}\n```"
                           "<｜tool▁call▁end｜>\n" + call_markup("apply_patch", "{\"input\": \"+x\"}") + "<｜tool▁calls▁end｜>";
  for (size_t piece : {size_t(1), size_t(3), size_t(7), text.size()}) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size(); at += piece) pieces.push_back(text.substr(at, piece));
    auto a = api.parse(body, body.dump());
    EXPECT_TRUE(a->request.stream);
    const auto events = streamed(*a, events_of(pieces));
    const json items = check_stream(events);
    const json& final = events.back().data["response"];
    EXPECT_EQ(events.back().type, "response.completed");
    EXPECT_EQ(final["status"], "completed");
    ASSERT_EQ(items.size(), 4u) << final.dump(1);
    EXPECT_EQ(items[0]["type"], "reasoning");
    EXPECT_EQ(items[0]["content"][0]["text"], "Plan: look.");
    EXPECT_EQ(items[1]["content"][0]["text"], "Looking now.") << "whitespace after another item is dropped";
    EXPECT_EQ(items[2]["type"], "function_call");
    EXPECT_EQ(items[3]["type"], "custom_tool_call");
    EXPECT_EQ(items[3]["input"], "+x");

    auto b = api.parse(body, body.dump());
    const json r = whole(*b, events_of(pieces));
    EXPECT_EQ(without_ids(r["output"]), without_ids(items)) << "piece " << piece;
    json fu = final["usage"], ru = r["usage"];
    EXPECT_EQ(fu, ru);
    EXPECT_EQ(ru["input_tokens"], 10);
    EXPECT_EQ(ru["input_tokens_details"]["cached_tokens"], 3);
    EXPECT_EQ(ru["output_tokens"], int64_t(pieces.size()) + 1);
    EXPECT_EQ(ru["total_tokens"], 10 + int64_t(pieces.size()) + 1);
    // The reasoning tokens: the events that produced reasoning text ("Plan: look." is 11 bytes,
    // and the event cut inside "</think>" gives none until the marker is known).
    const int64_t rt = ru["output_tokens_details"]["reasoning_tokens"];
    EXPECT_GE(rt, 1);
    EXPECT_LE(rt, (11 + int64_t(piece) - 1) / int64_t(piece) + 1);
    if (piece == 1) {
      EXPECT_EQ(rt, 11);
    }
  }
}

TEST(ResponsesApiStream, IncompleteAndFailed) {
  auto ctx = context();
  ResponsesApi api(ctx, 4);
  auto a = api.parse({{"input", "go"}, {"max_output_tokens", 3}}, "");
  EXPECT_EQ(a->request.request.max_new_tokens, 3);
  const auto events = streamed(*a, events_of({"one", " two"}, FinishReason::MaxTokens));
  check_stream(events);
  EXPECT_EQ(events.back().type, "response.incomplete");
  EXPECT_EQ(events.back().data["response"]["status"], "incomplete");
  EXPECT_EQ(events.back().data["response"]["incomplete_details"], json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(events.back().data["response"]["max_output_tokens"], 3);
  EXPECT_EQ(api.store().size(), 1u) << "an incomplete response is stored";

  auto b = api.parse({{"input", "go"}}, "");
  json r = whole(*b, events_of({"done"}, FinishReason::StopString));
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_TRUE(r["error"].is_null());

  // An error after the stream began: an error event, then response.failed; nothing stored.
  auto c = api.parse({{"input", "go"}}, "");
  std::string s = c->stream_begin({5, 0, 0});
  s += c->stream_event(0, text_event("partial"));
  server::ErrorInfo err{503, "the server is shutting down", "", "service_unavailable", "shutting_down"};
  s += c->stream_error(err, {5, 1, 0});
  const auto ev = parse_sse(s);
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i].data["sequence_number"], int64_t(i));
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[ev.size() - 2].type, "error");
  EXPECT_EQ(ev[ev.size() - 2].data["code"], "shutting_down");
  EXPECT_EQ(ev[ev.size() - 2].data["message"], "the server is shutting down");
  EXPECT_EQ(ev.back().type, "response.failed");
  EXPECT_EQ(ev.back().data["response"]["status"], "failed");
  EXPECT_EQ(ev.back().data["response"]["error"]["code"], "shutting_down");
  EXPECT_EQ(api.store().size(), 2u);

  const json e = api.error_body({400, "bad", "input", "", ""});
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "input");
}

TEST(ResponsesApiStore, ContinuesStoredConversations) {
  auto ctx = context();
  ResponsesApi api(ctx, 2);
  json tools = {{{"type", "function"}, {"name", "shell"}, {"parameters", {{"type", "object"}}}}};
  auto a = api.parse({{"input", "first question"}, {"instructions", "SYSTEM-ONE"}, {"tools", tools}}, "");
  const json ra = whole(*a, events_of({kCall + "shell\n```json\n{\"cmd\": \"ls\"}\n```<｜tool▁call▁end｜>"
                                                         "<｜tool▁calls▁end｜>"}));
  ASSERT_EQ(ra["output"].size(), 1u);
  const std::string id = ra["id"];
  EXPECT_EQ(id.rfind("resp_", 0), 0u);
  EXPECT_EQ(api.get(id), ra);

  // The continuation: the stored conversation (its output included), then the new input; the
  // first request's instructions are not carried over.
  json next = {{"previous_response_id", id},
               {"tools", tools},
               {"input", {{{"type", "function_call_output"}, {"call_id", ra["output"][0]["call_id"]}, {"output", "OUT-1"}}}}};
  auto b = api.parse(next, "");
  const std::string& prompt = b->request.prompt_text;
  EXPECT_EQ(prompt.find("SYSTEM-ONE"), std::string::npos) << prompt;
  const size_t q = prompt.find("<｜User｜>first question");
  const size_t call = prompt.find("shell\n```json\n{\"cmd\": \"ls\"}");
  const size_t out = prompt.find("OUT-1");
  ASSERT_NE(q, std::string::npos) << prompt;
  ASSERT_NE(call, std::string::npos) << prompt;
  ASSERT_NE(out, std::string::npos) << prompt;
  EXPECT_LT(q, call);
  EXPECT_LT(call, out);
  const json rb = whole(*b, events_of({"It has files."}));
  EXPECT_EQ(rb["previous_response_id"], id);

  // A chain: the third sees both earlier turns.
  auto c = api.parse({{"previous_response_id", rb["id"]}, {"input", "thanks"}}, "");
  EXPECT_NE(c->request.prompt_text.find("first question"), std::string::npos);
  EXPECT_NE(c->request.prompt_text.find("It has files."), std::string::npos);
  EXPECT_NE(c->request.prompt_text.find("thanks"), std::string::npos);

  // store: false is not stored.
  auto d = api.parse({{"input", "private"}, {"store", false}}, "");
  const json rd = whole(*d, events_of({"ok"}));
  EXPECT_EQ(rd["store"], false);
  EXPECT_THROW(api.get(rd["id"]), ApiError);

  // Capacity 2: a third stored response evicts the least recently used (ra: rb was used since).
  const json rc = whole(*c, events_of({"welcome"}));
  EXPECT_EQ(api.store().size(), 2u);
  try {
    api.get(id);
    ADD_FAILURE() << "the oldest response was evicted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(e.code, "response_not_found");
  }
  EXPECT_EQ(api.get(rb["id"])["id"], rb["id"]);
  EXPECT_EQ(error_of(api, {{"previous_response_id", id}, {"input", "x"}}), std::make_pair(404, std::string("previous_response_id")));

  // DELETE: the deletion object, then 404.
  EXPECT_EQ(api.remove(rc["id"]), json({{"id", rc["id"]}, {"object", "response"}, {"deleted", true}}));
  EXPECT_THROW(api.remove(rc["id"]), ApiError);
  EXPECT_THROW(api.get(rc["id"]), ApiError);
  EXPECT_EQ(api.store().size(), 1u);

  // Capacity 0: nothing is kept.
  ResponsesApi off(ctx, 0);
  auto e = off.parse({{"input", "x"}}, "");
  const json re = whole(*e, events_of({"y"}));
  EXPECT_EQ(off.store().size(), 0u);
  EXPECT_THROW(off.get(re["id"]), ApiError);
}

TEST(ResponsesApiStore, ReasoningIsKeptForTheNextTurn) {
  auto ctx = context(true);
  ResponsesApi api(ctx, 4);
  auto a = api.parse({{"input", "q"}, {"reasoning", {{"effort", "high"}}}}, "");
  const json ra = whole(*a, events_of({"THOUGHT</think>", "ANSWER"}));
  ASSERT_EQ(ra["output"].size(), 2u) << ra.dump(1);
  // The stored turn is one assistant message with its reasoning (a template that renders
  // reasoning_content shows it to the next turn).
  auto entry = api.store().get(ra["id"]);
  ASSERT_TRUE(entry);
  ASSERT_EQ(entry->conversation.size(), 2u) << entry->conversation.dump(1);
  EXPECT_EQ(entry->conversation[1]["role"], "assistant");
  EXPECT_EQ(entry->conversation[1]["content"], "ANSWER");
  EXPECT_EQ(entry->conversation[1]["reasoning_content"], "THOUGHT");
  auto b = api.parse({{"previous_response_id", ra["id"]}, {"input", "q2"}}, "");
  const std::string& prompt = b->request.prompt_text;
  EXPECT_NE(prompt.find("ANSWER"), std::string::npos) << prompt;
  EXPECT_LT(prompt.find("<｜User｜>q"), prompt.find("<｜User｜>q2"));
}

}  // namespace
}  // namespace mla
