// The request fields agents use, apart from the sampling basics of openai.cpp: which fields a
// request may carry at all (request hygiene), tools / tool_choice / parallel_tool_calls,
// response_format, chat_template_kwargs, logprobs / top_logprobs, n and logit_bias. Each is
// checked here and turned into AgentFields; a field this server does not implement, a value of
// the wrong shape or a contradictory request raises ApiError 400 naming the field.
//
// Accepted without effect (harmless metadata): user, metadata, store, service_tier,
// prompt_cache_key, safety_identifier. A field whose value is null counts as absent.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mla::server {

enum class Endpoint;

struct ToolChoice {
  enum class Kind { None, Auto, Required, Named };
  Kind kind = Kind::Auto;
  std::string name;  // Named
};

enum class ResponseFormat { Text, JsonObject, JsonSchema };

struct AgentFields {
  nlohmann::ordered_json tools;  // the request's tools (an array, the request's key order); null: none
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  ResponseFormat format = ResponseFormat::Text;
  nlohmann::ordered_json schema;  // json_schema.schema
  bool strict = false;            // json_schema.strict
  nlohmann::json template_kwargs = nlohmann::json::object();  // the server's defaults, then the request's
  int32_t logprobs = -1;          // top entries per token; -1: no logprobs
  int64_t n = 1;
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool has_tools() const { return tools.is_array() && !tools.empty(); }
  // Tool calls are parsed from the output (tools given, tool_choice not "none").
  bool tools_active() const { return has_tools() && tool_choice.kind != ToolChoice::Kind::None; }
  // The tool whose parameters schema a named choice constrains to; null if absent.
  const nlohmann::ordered_json* tool(const std::string& name) const;
};

// 400 naming the first field of body that the endpoint does not know.
void check_known_fields(Endpoint endpoint, const nlohmann::json& body);

// Reads the agent fields of a body. ordered is the same body parsed with its key order (tools
// and schemas keep their properties' order); null: body is used. defaults: the server's
// chat_template_kwargs. vocab_size bounds logit_bias's ids.
AgentFields parse_agent_fields(Endpoint endpoint, const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                               const nlohmann::json& template_kwarg_defaults, int64_t vocab_size);

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

}  // namespace mla::server
