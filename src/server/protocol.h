// One API's wire format over the server's one request path. Every generation endpoint —
// chat completions, completions (api_openai.h), Anthropic Messages (api_anthropic.h), OpenAI
// Responses (api_responses.h) — is a Protocol: it turns a request body into an Exchange (the
// engine's ParsedRequest plus whatever the response needs) and shapes the engine's events into
// its own response body or stream of server-sent events. Everything else is shared and written
// once, in serve_generation (server.cpp): admission and its 429 / 503 (admission.h), the
// client's disconnect, the request's timeout, the shutdown's cut, keep-alive while a prompt is
// prefilled, n choices, and the metrics (metrics.h).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "engine/request.h"
#include "server/api_common.h"

namespace mla::server {

// An error as the shared path reports it; each protocol writes it in its own shape.
struct ErrorInfo {
  int status = 500;
  std::string message;
  std::string param, type, code;  // OpenAI's fields ("" for none); type "" defaults from the status
  static ErrorInfo from(const ApiError& e) { return {e.status, e.what(), e.param, e.type, e.code}; }
};

// One request of one protocol, from its parsed body to its response. The shared path calls
// either add() for every event and then body() (not streamed), or stream_begin(), then
// stream_event() for every event, then stream_end() once every choice has finished; a request
// that fails or is cut after its stream began ends with stream_error() instead.
class Exchange {
 public:
  virtual ~Exchange() = default;
  ParsedRequest request;

  // Not streamed.
  virtual void add(int choice, const RequestEvent& e) = 0;
  virtual nlohmann::json body(const Usage& usage) = 0;

  // Streamed: the bytes to send (whole SSE events; "" for none). usage in stream_begin holds the
  // prompt's tokens (nothing cached known yet); in stream_end and stream_error, the final figures.
  virtual std::string stream_begin(const Usage& usage) = 0;
  virtual std::string stream_event(int choice, const RequestEvent& e) = 0;
  virtual std::string stream_end(const Usage& usage) = 0;
  virtual std::string stream_error(const ErrorInfo& error, const Usage& usage) = 0;
  // Sent when nothing else was for a while (a long prompt being read): by default an SSE comment,
  // which every client's parser skips.
  virtual std::string stream_keepalive() { return ": keep-alive\n\n"; }

  // The tokens the choices generated so far.
  virtual int64_t completion_tokens() const = 0;
};

class Protocol {
 public:
  virtual ~Protocol() = default;
  // The label of its requests in /metrics: "completions", "chat", "messages", "responses".
  virtual const char* name() const = 0;
  // The body (already bounded and parsed: parse_json_body) as an Exchange; raw is its text.
  // Throws ApiError for a bad request, RequestError as the engine's checks do.
  virtual std::unique_ptr<Exchange> parse(const nlohmann::json& body, std::string_view raw) = 0;
  // An error before any response was sent: its JSON body (the status is the HTTP status).
  virtual nlohmann::json error_body(const ErrorInfo& error) const = 0;
};

}  // namespace mla::server
