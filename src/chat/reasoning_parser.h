// Separates a thinking model's reasoning from its answer, streaming: text arrives in fragments
// of any size (split anywhere, even inside a marker or a UTF-8 character) and leaves as deltas
// of reasoning (OpenAI's `reasoning_content`) or content. Markers never reach either side.
//
// Every family here writes its reasoning as <think>…</think>:
//   deepseek_r1   DeepSeek-R1 (its newer templates end the generation prompt with "<think>\n";
//                 older ones leave the model to write <think> itself)
//   deepseek_v31  DeepSeek-V3.1: reasoning only when the template variable `thinking` is true,
//                 and then the prompt ends with "<think>" (otherwise with "</think>"); the
//                 model does not open a block of its own, so without the flag all is content
//   kimi_k2       Kimi K2-Thinking / K2.5: the model writes <think>…</think>; the reasoning also
//                 ends where a tool-call section (<|tool_calls_section_begin|>) starts, and
//                 that marker is kept, as content, for the tool-call parser
//   glm45         GLM-4.5 / 4.7 (enable_thinking): GLM-4.7's prompt ends with "<think>",
//                 GLM-4.5's model writes it; "<think></think>" in the prompt disables thinking
//
// ReasoningOptions::prompt_opened says that the rendered prompt already opened the block (see
// prompt_opens_reasoning()): the output then starts as reasoning and a </think> ends it. When it
// did not, a <think> at the very start of the output (after whitespace) opens the block, except
// for deepseek_v31. A block that never closes leaves everything after its start as reasoning.
// Whitespace right after </think> is dropped; everything else passes through byte for byte.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/stream_parser.h"

namespace mla::chat {

struct ReasoningDelta {
  enum class Kind { Reasoning, Content };
  Kind kind = Kind::Content;
  std::string text;
};

struct ReasoningOptions {
  bool prompt_opened = false;  // the rendered prompt ends with an open <think>
};

// A StreamParser (chat/stream_parser.h) whose deltas are reasoning or content. Adjacent deltas
// of one kind that one call appends are merged. A delta never ends inside a UTF-8 character: an
// incomplete trailing sequence waits for its next bytes (finish() emits whatever is left,
// complete or not).
class ReasoningParser : public StreamParser<ReasoningDelta> {
 public:
  // True once the reasoning block has ended (content follows).
  virtual bool reasoning_ended() const = 0;
};

// The names make_reasoning_parser() accepts.
std::vector<std::string> reasoning_parser_names();

// Throws std::invalid_argument for an unknown name; the message lists the known ones.
std::unique_ptr<ReasoningParser> make_reasoning_parser(std::string_view name, ReasoningOptions options = {});

// The parser for a checkpoint, from config.json's model_type and its chat template text; empty
// when the model does not think. Evidence: deepseek_v3 / deepseek_v2 with a template that sets
// the `thinking` variable and writes '<think>' / '</think>' into the generation prompt ->
// deepseek_v31; with a template that mentions </think> (R1 strips it from history) ->
// deepseek_r1; deepseek_v32 without a template (its built-in encoder) -> deepseek_v31, with one
// -> as deepseek_v3; kimi_k2 / kimi_k25 whose template mentions <think> -> kimi_k2; glm4_moe /
// glm4_moe_lite / glm_moe_dsa (GLM-5) whose template mentions <think> -> glm45.
std::string default_reasoning_parser(std::string_view model_type, std::string_view chat_template);

// True when the rendered prompt ends (ignoring trailing whitespace) with "<think>", i.e. the
// generation prompt opened the reasoning block: the value for ReasoningOptions::prompt_opened.
bool prompt_opens_reasoning(std::string_view rendered_prompt);

struct ReasoningSplit {
  std::string reasoning, content;
};

// The whole output at once: exactly the concatenation of what feed(text) + finish() stream.
ReasoningSplit split_reasoning(std::string_view parser_name, std::string_view text, ReasoningOptions options = {});

}  // namespace mla::chat
