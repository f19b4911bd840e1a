// One choice of a response, from the engine's events to OpenAI's JSON, streamed or whole: the
// output parsers of a chat request (reasoning_content, tool_calls: tool_parser.h's
// chat::ChatOutputParser), the finish reason ("tool_calls" when a call was made and the model
// stopped), and logprobs (chat: {"content": [{token, logprob, bytes, top_logprobs}]};
// completions, the legacy shape: {tokens, token_logprobs, top_logprobs, text_offset}, offsets
// in bytes of the text). An EOS that ends the output has no text and no logprobs entry.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_common.h"
#include "chat/tool_parser.h"

namespace mla::server {

// One chat choice's output apart from any wire format: the engine's events through the
// request's output parsers (reasoning, then tool calls; neither: the text is content) into
// deltas of reasoning, content, a call's start and its arguments. With parallel_tool_calls
// false, calls after the first are dropped. Every protocol adapter shapes these deltas.
class ChoiceDecoder {
 public:
  explicit ChoiceDecoder(const ParsedRequest& p);
  // The deltas one event makes (the parsers' finish() on the last event).
  std::vector<chat::ChatDelta> take(const RequestEvent& e);
  bool finished() const { return finished_; }
  FinishReason reason() const { return reason_; }
  int calls() const { return parser_ ? parser_->calls() : 0; }
  int64_t completion_tokens() const { return completion_tokens_; }

 private:
  bool parallel_tool_calls_;
  std::unique_ptr<chat::ChatOutputParser> parser_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::MaxTokens;
  int64_t completion_tokens_ = 0;
};

class ChoiceBuilder {
 public:
  // p and tokenizer must outlive the builder.
  ChoiceBuilder(const ParsedRequest& p, const Tokenizer& tokenizer, int index);

  // Streaming: the choice objects of the chunks this event makes ({"index", "delta"|"text",
  // "logprobs", "finish_reason"}): none when it adds nothing; the last event (finished) ends
  // with one carrying the finish reason (a chat delta {} then). Not for Error / Cancelled ends.
  std::vector<nlohmann::json> stream(const RequestEvent& e);
  // Not streamed: gathers an event.
  void add(const RequestEvent& e);
  // The whole choice, after the last event.
  nlohmann::json choice() const;

  bool finished() const { return decoder_.finished(); }
  FinishReason reason() const { return decoder_.reason(); }
  const char* finish_reason() const;
  int64_t completion_tokens() const { return decoder_.completion_tokens(); }

 private:
  // Runs an event through the parsers: the chat deltas and the logprobs entries it makes.
  void take(const RequestEvent& e, std::vector<chat::ChatDelta>& deltas, nlohmann::json& logprobs);
  nlohmann::json token_entry(int32_t id, float logprob) const;
  nlohmann::json delta_choice(const std::vector<chat::ChatDelta>& deltas, const nlohmann::json& logprobs) const;

  const ParsedRequest& p_;
  const Tokenizer& tokenizer_;
  int index_;
  bool chat_;
  ChoiceDecoder decoder_;
  size_t text_bytes_ = 0;  // completions: the text so far (text_offset)
  // Gathered (not streamed).
  std::string text_, reasoning_;
  chat::ToolParseResult calls_;
  nlohmann::json logprobs_;
};

}  // namespace mla::server
