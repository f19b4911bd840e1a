// The floor of server/: what every protocol adapter (api_openai.h, api_responses.h,
// api_anthropic.h) and the shared request path (protocol.h, server.cpp) speak, apart from any
// one API's wire format: the request errors, the endpoint a request came in by, the serving
// context, the agent fields, the engine's parsed request and its usage, the bounded parse of a
// body and the typed readers of its fields. How an adapter's fields become a ParsedRequest is
// chat_request.h; what is OpenAI's own (its request body, response objects and chunks) openai.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "engine/generation_config.h"
#include "engine/request.h"
#include "format/json_depth.h"
#include "tokenizer/tokenizer.h"

namespace mla::grammar {
class CompiledGrammar;
}

namespace mla::server {

class StructuredOutputs;

// A bad request: the HTTP status and OpenAI's error object fields (each protocol writes them in
// its own shape). type defaults from the status (default_error_type).
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = {}, std::string type = {},
           std::string code = {});
  int status;
  std::string type, param, code;
};

// A prompt longer than the room of one request (the context, or what the KV cache holds): the
// 400 carries both numbers, which the Messages adapter writes as Anthropic does.
struct ContextLengthError : ApiError {
  ContextLengthError(const std::string& message, std::string param, int64_t prompt_tokens, int64_t limit);
  int64_t prompt_tokens, limit;
};

// The error type of a status: 400 invalid_request_error, 401 authentication_error, 404
// not_found_error, 503 service_unavailable, other 5xx server_error, else invalid_request_error.
std::string default_error_type(int status);

// 400 naming the field (param) of a request.
[[noreturn]] void bad_field(const std::string& param, const std::string& message);

// The API a request came in by.
enum class Endpoint { Completions, ChatCompletions, Messages, Responses };

// What a request needs from the server: the tokenizer, the checkpoint's defaults and limits.
struct ServingContext {
  const Tokenizer* tokenizer = nullptr;
  const GenerationConfig* generation = nullptr;
  std::string model_name;
  int64_t context_length = 0;       // the model's (0: unknown)
  int64_t max_sequence_tokens = 0;  // the most tokens one request may hold (engine)
  int64_t vocab_size = 0;           // the model's logit rows (logit_bias ids); 0: the tokenizer's
  int64_t max_output_tokens = 0;    // every request generates at most this many (0: no cap)
  // The checkpoint's output parsers ("" for none; server.cpp picks them from the model type and
  // the chat template, or from --tool-call-parser / --reasoning-parser) and the template
  // variables every chat request starts from (--chat-template-kwargs).
  std::string tool_parser, reasoning_parser;
  // Tools written into the system prompt for a template that does not read them (--tool-prompt).
  bool tool_prompt = true;
  std::string_view tool_prompt_syntax() const { return tool_prompt ? std::string_view(tool_parser) : std::string_view(); }
  ChatFormat chat_format;  // how chat messages become a prompt (the template, or a built-in encoder)
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
  StructuredOutputs* structured = nullptr;  // grammars of constrained outputs (null: refused)
  // The logit rows logit_bias may name: vocab_size, else the tokenizer's.
  int64_t logit_rows() const { return vocab_size > 0 ? vocab_size : int64_t(tokenizer->vocab_size()); }
};

struct ToolChoice {
  enum class Kind { None, Auto, Required, Named };
  Kind kind = Kind::Auto;
  std::string name;  // Named
};

enum class ResponseFormat { Text, JsonObject, JsonSchema };

// The request fields agents use, in chat completions' terms whatever the wire format: every
// adapter writes its tools as chat function tools ({"type": "function", "function": {name,
// description, parameters, strict}}), which is what the chat template reads as `tools`.
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
  // tool_choice "required" or a named function: the output is constrained to a call.
  bool forces_call() const {
    return has_tools() && (tool_choice.kind == ToolChoice::Kind::Required || tool_choice.kind == ToolChoice::Kind::Named);
  }
  // The tool whose parameters schema a named choice constrains to; null if absent.
  const nlohmann::ordered_json* tool(const std::string& name) const;
};

// The engine's request, as every protocol's body becomes it.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;  // the name responses echo
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  double timeout_seconds = 0;  // the request's "timeout" field, seconds (0: none)
  Request request;             // the first choice's (each choice i samples with seed + i)
  AgentFields agent;           // tools, response_format, logprobs, n, logit_bias ...
  std::string prompt_text;     // chat: the rendered prompt
  // Chat: the parsers of this request's output ("" for none): the tool parser only when tools
  // are active; reasoning_opened: the rendered prompt opened a reasoning block.
  std::string tool_parser, reasoning_parser;
  bool reasoning_opened = false;
  // The grammar the output must follow (response_format, a forced tool call); null: none.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// A request's token counts, as every protocol reports them.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// The most levels of nested arrays and objects a request body may have (format/json_depth.h).
using mla::kMaxJsonDepth;
using mla::json_nesting_depth;

// The bounded parse of a request body: its nesting depth is checked by a non-recursive scan
// before nlohmann builds (and anything later copies or dumps) the value; a body nested deeper
// than max_depth, or not JSON (a number past double's range included), raises ApiError 400
// naming the problem and its byte offset.
nlohmann::json parse_json_body(std::string_view body, size_t max_depth = kMaxJsonDepth);

// A value as an error message quotes it: its JSON, cut to a short prefix (a client may send
// megabytes where a number belongs).
template <class Json>
std::string brief_json(const Json& v) {
  std::string d = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (d.size() > 80) d = d.substr(0, 77) + "...";
  return d;
}

// Readers of a body's fields, for json and ordered_json alike: absent or null gives nothing; a
// value of another type is a 400 naming the field ("'NAME' must be a number, got VALUE").
template <class Json>
const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

template <class Json>
std::optional<double> get_number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_field(name, std::string("'") + name + "' must be a number, got " + brief_json(*v));
  const double x = v->template get<double>();
  if (!std::isfinite(x)) bad_field(name, std::string("'") + name + "' must be finite");
  return x;
}

// An integer; 5.0 is taken as 5, as Python's JSON clients may send it. integer_value reads a
// value already found, name being what its errors call it.
template <class Json>
int64_t integer_value(const Json& v, const char* name) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.template get<uint64_t>() > uint64_t(INT64_MAX))
      bad_field(name, std::string("'") + name + "' is too large");
    return v.template get<int64_t>();
  }
  if (v.is_number_float()) {
    const double x = v.template get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return int64_t(x);
  }
  bad_field(name, std::string("'") + name + "' must be an integer, got " + brief_json(v));
}

template <class Json>
std::optional<int64_t> get_integer(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  return integer_value(*v, name);
}

template <class Json>
std::optional<bool> get_bool(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_field(name, std::string("'") + name + "' must be a boolean, got " + brief_json(*v));
  return v->template get<bool>();
}

template <class Json>
std::optional<std::string> get_string(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_field(name, std::string("'") + name + "' must be a string, got " + brief_json(*v));
  return v->template get<std::string>();
}

}  // namespace mla::server
