// The OpenAI API's request and response shapes, apart from HTTP: a /v1/completions or
// /v1/chat/completions body becomes an engine Request (prompt tokens, sampling, stop
// conditions), and results become OpenAI's JSON objects and server-sent-event chunks,
// FinishReason included (openai_finish_reason).
// A bad request raises ApiError carrying the HTTP status and OpenAI's error object fields.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "engine/generation_config.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace mla::server {

struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = {}, std::string type = {},
           std::string code = {});
  int status;
  std::string type, param, code;
};

// {"error": {"message", "type", "param", "code"}}; type defaults from the status.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {},
                          const std::string& type = {}, const std::string& code = {});

enum class Endpoint { Completions, ChatCompletions };

// What a request needs from the server: the tokenizer, the checkpoint's defaults and limits.
struct ServingContext {
  const Tokenizer* tokenizer = nullptr;
  const GenerationConfig* generation = nullptr;
  std::string model_name;
  int64_t context_length = 0;       // the model's (0: unknown)
  int64_t max_sequence_tokens = 0;  // the most tokens one request may hold (engine)
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;  // the served name (echoed in responses)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  Request request;
};

// Reads a request body (a JSON object). Unknown fields are ignored; known fields of the wrong
// type or out of range, n != 1, an empty or too long prompt raise ApiError (400; a model name
// other than the served one: 404).
ParsedRequest parse_request(Endpoint endpoint, const nlohmann::json& body, const ServingContext& ctx);

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
