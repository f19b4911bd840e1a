// The OpenAI API's request and response shapes, apart from HTTP: a /v1/completions or
// /v1/chat/completions body becomes an engine Request (prompt tokens, sampling, stop
// conditions), and results become OpenAI's JSON objects and server-sent-event chunks,
// FinishReason included (openai_finish_reason).
// A bad request raises ApiError carrying the HTTP status and OpenAI's error object fields.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "engine/generation_config.h"
#include "engine/request.h"
#include "format/json_depth.h"
#include "server/chat_request.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mla::grammar {
class CompiledGrammar;
}

namespace mla::server {

class StructuredOutputs;

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

// {"error": {"message", "type", "param", "code"}}; type defaults from the status.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {},
                          const std::string& type = {}, const std::string& code = {});

// The API a request came in by. Messages (Anthropic) and Responses (OpenAI) requests are chat
// requests: their adapters translate them into a chat body parsed by parse_request.
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
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;  // the served name (echoed in responses)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  double timeout_seconds = 0;  // the request's "timeout" field, seconds (0: none)
  Request request;             // the first choice's (each choice i samples with seed + i)
  AgentFields agent;           // tools, response_format, logprobs, n, logit_bias ... (chat_request.h)
  std::string prompt_text;     // chat: the rendered prompt
  // Chat: the parsers of this request's output ("" for none): the tool parser only when tools
  // are active; reasoning_opened: the rendered prompt opened a reasoning block.
  std::string tool_parser, reasoning_parser;
  bool reasoning_opened = false;
  // The grammar the output must follow (response_format, a forced tool call); null: none.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
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

// Reads a request body (a JSON object). A field the server does not implement, known fields
// of the wrong type or out of range, contradictory fields, an empty or too long prompt raise
// ApiError (400; a model name other than the served one: 404). raw_body, when given, is the
// body's text: tools and response_format schemas are read from it with their key order.
// How an adapter's translated body is read where the protocols differ from chat completions.
struct ParseOptions {
  bool any_model = false;      // any model name is served (Anthropic's and Codex's clients name their own)
  bool cap_max_tokens = false; // max_tokens beyond the room left is lowered to it, not a 400
};
ParsedRequest parse_request(Endpoint endpoint, const nlohmann::json& body, const ServingContext& ctx,
                            std::string_view raw_body = {}, ParseOptions options = {});

// The special tokens a request's output parsers match (their markers), to keep in its text;
// special_only false: every marker that is one token (special or added).
std::vector<int32_t> parser_marker_ids(const Tokenizer& tokenizer, const std::string& tool_parser,
                                       const std::string& reasoning_parser, bool special_only = true);

// OpenAI's finish_reason: "stop" for EOS and stop strings, "length" for the token, context and
// cache limits; "cancelled" / "error" otherwise.
const char* openai_finish_reason(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  nlohmann::json to_json() const;
};

// A whole (non-streamed) response.
nlohmann::json completion_response(const ParsedRequest& p, const std::string& id, int64_t created,
                                   const std::string& text, const char* finish_reason, const Usage& usage);
// One streamed chunk: text (a delta), or the end (finish_reason set), or the first chat chunk
// (role_only: delta {"role": "assistant", "content": ""}).
nlohmann::json stream_chunk(const ParsedRequest& p, const std::string& id, int64_t created, const std::string& text,
                            const char* finish_reason, bool role_only = false);
// The last chunk with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ParsedRequest& p, const std::string& id, int64_t created, const Usage& usage);

// "data: <json>\n\n" and the terminator "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// "cmpl-…" / "chatcmpl-…" with random hex.
std::string new_response_id(Endpoint endpoint);

}  // namespace mla::server
