// One choice of a response, from the engine's events to OpenAI's JSON, streamed or whole: the
// output parsers of a chat request (reasoning_content, tool_calls: tool_parser.h's
// ChatOutputParser), the finish reason ("tool_calls" when a call was made and the model
// stopped), and logprobs (chat: {"content": [{token, logprob, bytes, top_logprobs}]};
// completions, the legacy shape: {tokens, token_logprobs, top_logprobs, text_offset}, offsets
// in bytes of the text). An EOS that ends the output has no text and no logprobs entry.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai.h"
#include "server/tool_parser.h"

namespace mla::server {

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

  bool finished() const { return finished_; }
  FinishReason reason() const { return reason_; }
  const char* finish_reason() const;
  int64_t completion_tokens() const { return completion_tokens_; }

 private:
  // Runs an event through the parsers: the chat deltas and the logprobs entries it makes.
  void take(const RequestEvent& e, std::vector<ChatDelta>& deltas, nlohmann::json& logprobs);
  nlohmann::json token_entry(int32_t id, float logprob) const;
  nlohmann::json delta_choice(const std::vector<ChatDelta>& deltas, const nlohmann::json& logprobs) const;

  const ParsedRequest& p_;
  const Tokenizer& tokenizer_;
  int index_;
  bool chat_;
  std::unique_ptr<ChatOutputParser> parser_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::MaxTokens;
  int64_t completion_tokens_ = 0;
  size_t text_bytes_ = 0;  // completions: the text so far (text_offset)
  // Gathered (not streamed).
  std::string text_, reasoning_;
  ToolParseResult calls_;
  nlohmann::json logprobs_;
};

}  // namespace mla::server
