// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) over the
// server's one request path: a Responses body is read into the shared RequestFields
// (translate_responses_request) and made the engine's request by chat_request (chat_request.h),
// so the chat template, the output parsers, grammars, stops and limits are the chat endpoint's; the engine's events, through ChoiceDecoder, become Responses output items
// (reasoning, message, function_call, custom_tool_call), whole or as the typed event stream.
//
// Request translation (translate_responses_request), in chat completions' terms:
//   instructions                -> a leading system message (not carried to continuations)
//   input: a string             -> one user message
//   input items:
//     message (role user | assistant | system | developer; content a string or parts of
//       input_text / output_text / text / refusal)  -> a chat message (developer -> system)
//     function_call {call_id, name, arguments}       -> a tool call of an assistant message;
//       consecutive calls (and calls right after an assistant message) share one message
//     function_call_output {call_id, output}         -> a tool message
//     custom_tool_call {call_id, name, input}        -> a tool call with arguments {"input": input}
//     custom_tool_call_output {call_id, output}      -> a tool message
//     reasoning {content: [reasoning_text] | summary: [summary_text]} -> reasoning_content of the
//       next assistant message
//     anything else (web_search_call, item_reference, ...) is skipped
//   tools:
//     function {name, description, parameters, strict} -> a chat function tool
//     custom {name, description, format}  (free-form input, e.g. apply_patch) -> a function of one
//       string, parameters {"type": "object", "properties": {"input": {"type": "string"}},
//       "required": ["input"]}; a grammar format's definition is appended to the description.
//       Its calls are answered as custom_tool_call items, input = that string.
//     namespace {name, tools: [function | custom]} -> each inner tool as the function
//       NAMESPACE + "__" + TOOL (kNamespaceSeparator; "_" is valid in every function name); a
//       call of it is answered with name TOOL and "namespace": NAMESPACE, as the Responses API
//       names a namespaced call. An input call carrying "namespace" maps back the same way.
//     other types (web_search, local_shell, file_search, image_generation, ...) are dropped.
//   tool_choice auto | none | required | {type: function | custom, name} | {type: allowed_tools,
//     mode}; a hosted tool's choice is auto. text.format -> response_format. max_output_tokens ->
//     max_tokens. reasoning.effort none | minimal -> chat_template_kwargs thinking off, low |
//     medium | high | xhigh -> on (both "thinking" and "enable_thinking").
//   Accepted without effect: metadata, include, prompt_cache_key, truncation, user,
//   service_tier, safety_identifier, stream_options, client_metadata, text.verbosity,
//   reasoning.summary, background false; unknown top-level fields are ignored (clients add
//   fields across versions), a known field of the wrong type is a 400. n must be 1.
//   Sampling fields of local servers (top_k, min_p, seed, stop, presence_penalty,
//   frequency_penalty, repetition_penalty) are read as the chat endpoint reads them.
//
// Output: an event's deltas open and close items in order (a change of kind closes the open
// item). Content that is only whitespace between other items (the "\n\n" after </think>, before
// a call) makes no message, and a message after another item starts at its first non-space.
// usage.output_tokens_details.reasoning_tokens counts the generated tokens whose event produced
// reasoning text (the token that closes </think> is not one).
// A finish by EOS or a stop string is "completed"; by a length limit "incomplete" with
// incomplete_details {reason: "max_output_tokens"}; an error "failed".
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/chat_request.h"
#include "server/protocol.h"

namespace mla::server {

inline constexpr const char* kNamespaceSeparator = "__";

// How a function name of the prompt maps back to the client's tool.
struct ResponsesTool {
  std::string name;        // the client's name (inside its namespace)
  std::string space;       // the namespace ("" for none)
  bool custom = false;     // a custom tool: calls are custom_tool_call items of one string
};
using ResponsesToolMap = std::map<std::string, ResponsesTool>;  // by the prompt's function name

struct ResponsesTranslation {
  RequestFields fields;                    // the request in chat's terms
  nlohmann::ordered_json input_messages;   // the request's input as chat messages (no instructions)
  ResponsesToolMap tools;
};

// The request a Responses body means (ordered: the request's key order kept). previous: the
// stored conversation a previous_response_id names (chat messages), put before the input.
// Throws ApiError 400 naming the Responses field, or (the chat endpoint's checks of tools, tool
// choice and format) the chat field, which ResponsesApi::parse renames.
ResponsesTranslation translate_responses_request(const nlohmann::ordered_json& body,
                                                 const nlohmann::ordered_json& previous = nlohmann::ordered_json::array());

// Stored responses: the last `capacity` of them by use (a get or a continuation is a use), each
// with its conversation as chat messages. Thread-safe.
class ResponseStore {
 public:
  struct Entry {
    nlohmann::ordered_json conversation;  // chat messages: all inputs and outputs so far
    nlohmann::json response;              // the response object
  };
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
  size_t capacity() const { return capacity_; }
  void put(const std::string& id, Entry entry);
  std::optional<Entry> get(const std::string& id);
  bool remove(const std::string& id);
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, Entry>> order_;  // most recently used first
  std::unordered_map<std::string, std::list<std::pair<std::string, Entry>>::iterator> index_;
};

class ResponsesApi : public Protocol {
 public:
  // ctx must outlive the protocol; store_capacity 0: nothing is stored (previous_response_id is a
  // 400, GET and DELETE answer 404).
  ResponsesApi(const ServingContext& ctx, size_t store_capacity);
  const char* name() const override { return "responses"; }
  std::unique_ptr<Exchange> parse(const nlohmann::json& body, std::string_view raw) override;
  nlohmann::json error_body(const ErrorInfo& error) const override;

  // GET /v1/responses/{id}: the stored response object; DELETE: {id, object: "response",
  // deleted: true}. An unknown id: ApiError 404, code "response_not_found".
  nlohmann::json get(const std::string& id);
  nlohmann::json remove(const std::string& id);

  ResponseStore& store() { return *store_; }

 private:
  const ServingContext& ctx_;
  std::shared_ptr<ResponseStore> store_;
};

}  // namespace mla::server
