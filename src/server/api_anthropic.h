// Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) over the shared
// request path (protocol.h). A Messages body is read into the shared RequestFields
// (read_messages_body) and made the engine's request by chat_request (chat_request.h), so tool
// parsers, grammars of forced calls, stop strings and limits are the chat endpoint's; the
// engine's events come back through ChoiceDecoder and leave as Anthropic's content blocks
// (thinking, text, tool_use), whole or as its server-sent events.
//
// Request translation (read_messages_body), in chat completions' terms:
//   system (a string or text blocks)           -> a leading system message
//   messages[].content string | blocks:
//     text                                     -> the turn's text (blocks joined by "\n")
//     tool_use (assistant)                     -> tool_calls [{id, type "function", function
//                                                 {name, arguments: input as a JSON string}}]
//     tool_result (user)                       -> a {role "tool", tool_call_id, content} message,
//                                                 before the turn's text; is_error prefixes
//                                                 "Error: " to the content
//     thinking (assistant)                     -> the turn's reasoning_content
//     redacted_thinking                        -> dropped (opaque to this model)
//     image, document, anything else           -> 400 (this model takes text only)
//   role "system" inside messages              -> a system message in place
//   stop_sequences -> stop; temperature, top_p, top_k, max_tokens, stream as they are
//   tools [{name, description, input_schema}]  -> function tools; tools of another "type"
//                                                 (the server tools: web_search_…) are dropped
//   tool_choice auto | any | tool | none       -> "auto" | "required" | named | "none";
//     disable_parallel_tool_use                -> parallel_tool_calls false
//   thinking enabled | disabled                -> chat_template_kwargs thinking / enable_thinking
//                                                 (adaptive: the template's default)
//   other top-level fields (metadata, service_tier, container, new ones): ignored; a known field
//   of the wrong type is a 400.
// A prompt longer than the room of a request is a 400 reading exactly
// "prompt is too long: N tokens > M maximum" (the text Anthropic's clients compact on).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/chat_request.h"
#include "server/protocol.h"

namespace mla::server {

// The request a Messages body means (see above); throws ApiError 400 for what it cannot mean.
// body is read with its key order kept (tools' properties show in the prompt).
RequestFields read_messages_body(const nlohmann::ordered_json& body);

// Anthropic's error type for an HTTP status (400 invalid_request_error ... 529 overloaded_error).
const char* anthropic_error_type(int status);

// The opaque signature of a thinking block: a hash of its text, so a client that sends the
// block back unchanged sends the same signature.
std::string thinking_signature(std::string_view thinking);

class AnthropicMessages : public Protocol {
 public:
  // ctx must outlive the protocol and its exchanges.
  explicit AnthropicMessages(const ServingContext& ctx) : ctx_(ctx) {}
  const char* name() const override { return "messages"; }
  std::unique_ptr<Exchange> parse(const nlohmann::json& body, std::string_view raw) override;
  nlohmann::json error_body(const ErrorInfo& error) const override;

  // POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt a request of this body
  // would render (system and tools included), however long. Throws ApiError as parse() does.
  nlohmann::json count_tokens(const nlohmann::json& body, std::string_view raw = {}) const;

 private:
  const ServingContext& ctx_;
};

}  // namespace mla::server
