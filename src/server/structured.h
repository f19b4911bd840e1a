// Structured outputs: the grammar a chat request's output must follow, for constrained
// decoding (engine/grammar_processor.h).
//  - response_format json_object: any JSON object; json_schema: the schema's grammar
//    (grammar/json_schema.h; strict sets additionalProperties false by default).
//  - tool_choice "required" or a named function: a grammar of the model family's own tool-call
//    syntax, markers included, whose arguments follow each tool's parameters schema, so the
//    tool-call parser reads the output back as calls. "required" allows any of the tools, a
//    named choice that one; parallel_tool_calls false allows exactly one call, else one or
//    more. Formats (as tool_parser.h):
//      deepseek_v3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//                    (calls separated by "\n") <｜tool▁calls▁end｜>
//      deepseek_v31  <｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>)+<｜tool▁calls▁end｜>
//      kimi_k2       <|tool_calls_section_begin|>(<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>)+<|tool_calls_section_end|>
//      glm47         (<tool_call>NAME(<arg_key>K</arg_key><arg_value>V</arg_value>)*</tool_call>)+ with the
//                    schema's properties in order (optional ones may be left out); a string
//                    value is raw text without '<', any other the property's JSON grammar.
//    Each marker that is one token of the vocabulary (special for Kimi and GLM, added for
//    DeepSeek) is a whole-token terminal of the grammar: it is written only where the format
//    puts it, never inside the arguments; no other special token is allowed.
// A schema with unsupported keywords or malformed raises ApiError 400 naming them (param
// "response_format" or "tools"). Compiled grammars are kept in a grammar::GrammarCache per
// token table, by their text (the per-position token sets are computed once for repeated
// requests).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "grammar/cache.h"
#include "grammar/matcher.h"
#include "server/api_common.h"

namespace mla::server {

// The grammar text (GBNF, root "root") for a request's tool calls in the given format; empty
// when tool_choice does not force a call. Throws ApiError for bad schemas. With a tokenizer,
// each marker that is one token of it is written as that whole token (<[id]>), else as text.
std::string tool_call_gbnf(const std::string& tool_parser, const AgentFields& agent,
                           const Tokenizer* tokenizer = nullptr);

class StructuredOutputs {
 public:
  // vocab_size: the model's logit rows. The tokenizer must outlive this object.
  StructuredOutputs(const Tokenizer& tokenizer, int64_t vocab_size);

  // The compiled grammar of the request (null when it has none): response_format, or the forced
  // tool call. stop_ids: the request's EOS ids (allowed once the grammar can end).
  std::shared_ptr<const grammar::CompiledGrammar> grammar_for(const ParsedRequest& p);

 private:
  // The compiled grammars over the token table of a tool parser's markers and stop ids.
  grammar::GrammarCache& cache(const std::string& tool_parser, const std::vector<int64_t>& stops);
  const Tokenizer& tokenizer_;
  int64_t vocab_size_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<grammar::GrammarCache>> caches_;  // by parser and stop ids
};

}  // namespace mla::server
