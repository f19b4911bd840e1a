// OpenAI's own request and response shapes, apart from HTTP: a /v1/completions or
// /v1/chat/completions body read into the shared RequestFields (chat_request.h) and made the
// engine's request, and results as OpenAI's JSON objects and server-sent-event chunks,
// FinishReason included (openai_finish_reason). OpenAI's error object is error_body.
//
// Request hygiene: a field the endpoint does not know is a 400 naming it (check_known_fields).
// Accepted without effect (harmless metadata): user, metadata, store, service_tier,
// prompt_cache_key, safety_identifier. A field whose value is null counts as absent.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/api_common.h"
#include "server/chat_request.h"

namespace mla::server {

// {"error": {"message", "type", "param", "code"}}; type defaults from the status.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {},
                          const std::string& type = {}, const std::string& code = {});

// 400 naming the first field of body that the endpoint (Completions or ChatCompletions) does
// not know.
void check_known_fields(Endpoint endpoint, const nlohmann::json& body);

// Reads the agent fields of a body: n, logprobs (chat: logprobs and top_logprobs), logit_bias,
// and for chat tools, tool_choice, parallel_tool_calls, response_format, chat_template_kwargs.
// ordered is the same body parsed with its key order (tools and schemas keep their properties'
// order); null: body is used. defaults: the server's chat_template_kwargs. vocab_size bounds
// logit_bias's ids. A value of the wrong shape or a contradictory request raises ApiError 400
// naming the field.
AgentFields parse_agent_fields(Endpoint endpoint, const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                               const nlohmann::json& template_kwarg_defaults, int64_t vocab_size);

// Reads a request body (a JSON object) into the engine's request. A field the server does not
// implement, known fields of the wrong type or out of range, contradictory fields, an empty or
// too long prompt raise ApiError (400; a model name other than the served one: 404). raw_body,
// when given, is the body's text: tools and response_format schemas are read from it with their
// key order.
ParsedRequest parse_request(Endpoint endpoint, const nlohmann::json& body, const ServingContext& ctx,
                            std::string_view raw_body = {});

// OpenAI's finish_reason: "stop" for EOS and stop strings, "length" for the token, context and
// cache limits; "cancelled" / "error" otherwise.
const char* openai_finish_reason(FinishReason r);

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
