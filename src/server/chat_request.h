// A generation request apart from its wire format, and the steps that make it the engine's
// request (ParsedRequest, api_common.h). Every adapter reads its own body into RequestFields —
// sampling, stop strings, output limits, the agent fields in chat's terms (api_common.h) and,
// for a chat, the messages as the chat template reads them — and calls chat_request();
// /v1/completions calls start_request and finish_request around its own prompt. The steps check
// what every protocol shares (ranges, the tools, the tool choice, the room of the context) and
// name the field in chat completions' terms ("temperature", "stop", "max_tokens", "messages",
// "tools", "tool_choice", "response_format"); an adapter whose fields are named otherwise
// renames the param of the ApiError.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_common.h"

namespace mla::server {

// The request's sampling fields; nullopt: the checkpoint's default (seed: a random one).
struct SamplingFields {
  std::optional<double> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> top_k, seed;
};

// temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty and
// seed, by those names (400 for a value of another type).
template <class Json>
SamplingFields read_sampling_fields(const Json& body) {
  SamplingFields s;
  s.temperature = get_number(body, "temperature");
  s.top_p = get_number(body, "top_p");
  s.top_k = get_integer(body, "top_k");
  s.min_p = get_number(body, "min_p");
  s.presence_penalty = get_number(body, "presence_penalty");
  s.frequency_penalty = get_number(body, "frequency_penalty");
  s.repetition_penalty = get_number(body, "repetition_penalty");
  s.seed = get_integer(body, "seed");
  return s;
}

// "stop": a string or a list of strings (400 param "stop" otherwise).
template <class Json>
std::vector<std::string> read_stop(const Json& body) {
  const Json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->template get<std::string>()};
  if (!v->is_array()) bad_field("stop", "'stop' must be a string or a list of strings");
  std::vector<std::string> out;
  for (const Json& s : *v) {
    if (!s.is_string()) bad_field("stop", "'stop' must be a string or a list of strings");
    out.push_back(s.template get<std::string>());
  }
  return out;
}

// How many tokens a request may generate and when it ends.
struct OutputLimits {
  std::optional<int64_t> max_tokens;  // absent: generation_config's max_new_tokens, else the room left
  bool cap_max_tokens = false;         // max_tokens beyond the room left is lowered to it, not a 400
  bool ignore_eos = false;
};

// One request as an adapter reads it from its wire format.
struct RequestFields {
  std::string model;  // the name responses echo ("": the served one)
  bool stream = false;
  bool include_usage = false;
  double timeout_seconds = 0;
  SamplingFields sampling;
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  OutputLimits limits;
  AgentFields agent;  // template_kwargs: the request's, laid over the server's defaults
  // A chat's messages as the template reads them: role, content (a string or null), and
  // whatever else a turn carries (tool_calls with JSON-string arguments, tool_call_id,
  // reasoning_content).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
};

// ---- The agent fields, each adapter's tools in chat's shape --------------------------------

// Checks chat function tools (400 param "tools"): each {"type": "function", "function": {name
// (1-64 of a-z A-Z 0-9 _ - .), description, parameters (an object), strict}}, names unique.
void check_tools(const nlohmann::ordered_json& tools);

// Sets a's tool choice: 400 param "tool_choice" when a has no tools, or a named choice names
// none of them.
void set_tool_choice(AgentFields& a, ToolChoice choice);

// Sets a's JSON schema format from json_schema's schema (null: {}) and strict; 400 param
// "response_format" for a schema that is not an object or a boolean, a strict not a boolean.
void set_json_schema(AgentFields& a, const nlohmann::ordered_json* schema, const nlohmann::ordered_json* strict);

// 400 param "response_format" when a JSON format contradicts a tool choice that forces a call.
void check_format_and_choice(const AgentFields& a);

// The template variables of a request: the server's defaults (--chat-template-kwargs), then the
// request's (an object).
nlohmann::json template_kwargs(const ServingContext& ctx, const nlohmann::json& request);

// ---- Making the engine's request -------------------------------------------------------------

// The request's fields checked into a ParsedRequest without its prompt: the checkpoint's
// sampling defaults, then the request's (ranges checked), its seed, stop strings (at most 64, each
// at most 4096 bytes), max_tokens at least 1, the template variables over the server's.
ParsedRequest start_request(Endpoint endpoint, RequestFields fields, const ServingContext& ctx);

// A chat's prompt: the messages rendered (render_messages), tokenised, and the output parsers
// they call for (the tool parser when tools are active, the reasoning parser), whose markers
// are kept in the text.
void render_prompt(ParsedRequest& p, const nlohmann::ordered_json& messages, const ServingContext& ctx);

// The prompt's room: a prompt longer than the context or what one request holds in the KV cache
// raises ContextLengthError; max_new_tokens within the room (and --max-output-tokens); the EOS
// ids; the grammar of a response_format or a forced call (ctx.structured).
void finish_request(ParsedRequest& p, const OutputLimits& limits, const ServingContext& ctx);

// A chat request: start_request, render_prompt of fields.messages, finish_request.
ParsedRequest chat_request(Endpoint endpoint, RequestFields fields, const ServingContext& ctx);

// The prompt of chat messages through ctx's chat format (render_chat_prompt): 400 param
// "messages" when there are none, the model has no chat template, or the template fails.
std::string render_messages(const nlohmann::ordered_json& messages, const AgentFields& agent, const ServingContext& ctx);

// The prompt of a chat request through the checkpoint's chat format (a Jinja template or a
// built-in encoder, chat/chat_template.h), with the variables transformers passes a template:
// the request's chat_template_kwargs (over the server's defaults), its tools, the tokenizer's
// bos_token and eos_token; the generation prompt is added. messages are the request's, each with
// role and content (a string or null) and whatever else it carries (tool_calls, tool_call_id,
// reasoning_content). A Jinja template that reads a call's arguments as a mapping (GLM's) gets
// them decoded from the request's JSON strings, as transformers' templates expect them; others
// get the strings. A Jinja template that never reads `tools` (DeepSeek-V3 / R1's) gets them
// written into the system prompt when tool calls are on (tools given, tool_choice not "none"):
// chat::tool_use_prompt in the syntax of tool_parser, the checkpoint's tool-call parser (none
// for ""), so that the model knows what it may call and how. Throws ChatTemplateError where the
// format rejects the messages.
std::string render_chat_prompt(const ChatFormat& format, const nlohmann::ordered_json& messages,
                               const AgentFields& agent, const Tokenizer& tokenizer, std::string_view tool_parser);

// The special tokens a request's output parsers match (their markers), to keep in its text;
// special_only false: every marker that is one token (special or added).
std::vector<int32_t> parser_marker_ids(const Tokenizer& tokenizer, const std::string& tool_parser,
                                       const std::string& reasoning_parser, bool special_only = true);

}  // namespace mla::server
