// Finds the tool calls a model writes in its own syntax and turns them into OpenAI's
// `tool_calls` (id, type "function", function.name, function.arguments as a JSON string),
// streaming: text arrives in fragments of any size, split anywhere (inside a marker, inside a
// UTF-8 character), and leaves as deltas of content, of a call's start (index, id, name) and of
// its arguments. No marker of a well-formed call reaches the content.
//
// Formats (the markers are tokens of each model's vocabulary):
//   deepseek_v3   DeepSeek-V3 / R1:
//     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//     \n<｜tool▁call▁begin｜>…<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//   deepseek_v31  DeepSeek-V3.1:
//     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
//   kimi_k2       Kimi K2 / K2.5:
//     <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>…<|tool_calls_section_end|>
//   glm47         GLM-4.5 / 4.7 (no section markers; calls may be separated by whitespace):
//     <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>
//     A value is a string, unless the request's tool schema gives the parameter a type other
//     than string: then it is JSON-decoded (kept a string if it is not JSON). The arguments are
//     the JSON object of the pairs in their order.
//   deepseek_v32  DeepSeek-V3.2 (DSML; the whitespace before the section belongs to it):
//     \n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
//     <｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>\n…</｜DSML｜invoke>\n…</｜DSML｜function_calls>
//     string="true": V is a string as written; string="false": V is JSON (kept a string if it is
//     not JSON); without the attribute the tool schema decides as for glm47. The arguments are
//     the JSON object of the parameters in their order.
//
// Rules, the same whether the text comes whole or in pieces:
// - A call is checked whole, when its end marker arrives: a name (no whitespace), and for the
//   JSON formats arguments that parse as a JSON object (sent as written, trimmed). A call that
//   fails, or that is cut by the end of the output or by another call's start, stays content,
//   verbatim with its markers. So a call's start and its arguments are sent together, as soon
//   as its end marker arrives: a started call can never turn out to be text.
// - Whitespace between the calls of a section (and, for glm47, after a call) is dropped; other
//   text there is content. A section whose first call succeeds loses its markers; one in which
//   no call succeeds stays content verbatim (as does its begin marker when text or a failed call
//   comes before its first good call).
// - Ids: "call_" + 24 random alphanumerics (ToolParserOptions::make_id replaces the generator),
//   except kimi_k2, which keeps the model's own "functions.NAME:IDX" (as vLLM does): Kimi's chat
//   template writes each call's id back into the next prompt verbatim, and the model was trained
//   on ids of that form, numbered across the conversation. A repeated id within one output gets
//   a generated one instead.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/reasoning_parser.h"

namespace mla::chat {

struct ToolCallDelta {
  enum class Kind { Content, CallStart, Arguments };
  Kind kind = Kind::Content;
  int index = -1;        // CallStart, Arguments: the call's place in the output (0, 1, …)
  std::string id, name;  // CallStart
  std::string text;      // Content; Arguments: a fragment of the arguments' JSON text
};

struct ToolCall {
  std::string id, name, arguments;
};

struct ToolParseResult {
  std::string content;
  std::vector<ToolCall> tool_calls;
  // Adds one delta (Content appends to content, CallStart opens tool_calls[index], Arguments
  // appends to its arguments).
  void apply(const ToolCallDelta& delta);
};

struct ToolParserOptions {
  // The request's `tools` array ([{"type": "function", "function": {"name", "parameters"}}]):
  // glm47 reads the parameters' types from it. Anything else is ignored.
  nlohmann::json tools;
  // Makes a call's id; empty: "call_" + 24 random characters of [0-9A-Za-z].
  std::function<std::string()> make_id;
};

// A StreamParser (chat/stream_parser.h) whose deltas are content, a call's start or its
// arguments. Adjacent Content deltas that one call appends are merged; a Content delta never
// ends inside a UTF-8 character.
class ToolCallParser : public StreamParser<ToolCallDelta> {
 public:
  // How many calls have been emitted: non-zero means finish_reason "tool_calls".
  virtual int calls() const = 0;
};

// The names make_tool_parser() accepts.
std::vector<std::string> tool_parser_names();

// Throws std::invalid_argument for an unknown name; the message lists the known ones.
std::unique_ptr<ToolCallParser> make_tool_parser(std::string_view name, ToolParserOptions options = {});

// The parser for a checkpoint, from config.json's model_type and its chat template text; empty
// if none fits. Evidence, in order: a template that writes <|tool_calls_section_begin|> ->
// kimi_k2; one that writes <arg_key> -> glm47; one that writes <｜DSML｜invoke -> deepseek_v32;
// one that writes <｜tool▁calls▁begin｜> ->
// deepseek_v31 if it puts the name before <｜tool▁sep｜> (`tool['function']['name'] +
// '<｜tool▁sep｜>'`), else deepseek_v3 (`tool['type'] + '<｜tool▁sep｜>' + …name`, "```json").
// Without such a template: kimi_k2 / kimi_k25 -> kimi_k2, glm4_moe / glm4_moe_lite / glm_moe_dsa -> glm47,
// deepseek_v3 -> deepseek_v3, deepseek_v32 -> deepseek_v32 (V3.2 ships no template: the built-in
// encoder writes DSML; with a template, deepseek_v31 as V3.2-Exp's is V3.1's).
std::string default_tool_parser(std::string_view model_type, std::string_view chat_template);

// The tools of a request described for a chat template that writes none (chat_template.h's
// template_reads_tools): a system-prompt section listing each function's name, description and
// parameters schema, then how to call them in the syntax of the named parser, markers included:
// the syntax it reads back and constrained decoding writes. Empty for a parser without a written
// form here (deepseek_v32: its encoder writes the tools itself) and for no tools. tools: the
// request's array of {"type": "function", "function": {"name", "description", "parameters"}}.
std::string tool_use_prompt(std::string_view parser_name, const nlohmann::ordered_json& tools);

// The whole output at once: exactly what feed(text) + finish() stream, gathered.
ToolParseResult parse_tool_calls(std::string_view parser_name, std::string_view text, ToolParserOptions options = {});

// A request's whole output path: the reasoning parser first (optional), its content into the
// tool-call parser (optional); either alone, or neither (then the text passes through as
// content unchanged). Reasoning deltas come first, then content and calls.
//
// Wiring, per request: make one ChatOutputParser when the request is a chat completion (the
// tool parser only when it has `tools` and tool_choice is not "none"; ReasoningOptions::
// prompt_opened = prompt_opens_reasoning(rendered prompt)); decode with the markers kept (Kimi's
// and GLM's markers are special tokens, so skip_special_tokens must be off for such requests);
// call feed() with each text delta of the sequence's output stream, finish() once when the
// sequence ends (stop, EOS, length, cancel). Map ChatDelta to choices[0].delta: Reasoning ->
// {"reasoning_content"}, Content -> {"content"}, CallStart -> {"tool_calls": [{"index", "id",
// "type": "function", "function": {"name", "arguments": ""}}]}, Arguments -> {"tool_calls":
// [{"index", "function": {"arguments"}}]}. A non-streamed response gathers the same deltas
// (ToolParseResult::apply, plus the reasoning text). With calls() > 0 and a finish reason of
// "stop", the finish reason is "tool_calls".
struct ChatDelta {
  enum class Kind { Reasoning, Content, CallStart, Arguments };
  Kind kind = Kind::Content;
  int index = -1;
  std::string id, name, text;
};

class ChatOutputParser {
 public:
  ChatOutputParser(std::unique_ptr<ReasoningParser> reasoning, std::unique_ptr<ToolCallParser> tools);
  // Convenience: parsers by name ("" for none); throws std::invalid_argument for unknown names.
  ChatOutputParser(std::string_view reasoning_parser, ReasoningOptions reasoning_options,
                   std::string_view tool_parser, ToolParserOptions tool_options);
  void feed(std::string_view text, std::vector<ChatDelta>& out);
  void finish(std::vector<ChatDelta>& out);
  int calls() const { return tools_ ? tools_->calls() : 0; }

 private:
  void route(const std::vector<ReasoningDelta>& in, std::vector<ChatDelta>& out, bool at_end);
  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
  std::vector<ReasoningDelta> reasoning_out_;
  std::vector<ToolCallDelta> tool_out_;
};

}  // namespace mla::chat
