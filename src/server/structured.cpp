// Grammars of structured outputs and forced tool calls (see structured.h).
#include "server/structured.h"

#include <set>

#include "grammar/json_schema.h"
#include "server/chat_request.h"

namespace mla::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// A GBNF literal of plain text.
std::string lit(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out + "\"";
}

// A marker of a tool-call format: the whole token <[id]> when the tokenizer has it as one token
// (special or added), so that it is written only where the format puts it; else its text.
struct Markers {
  const Tokenizer* tokenizer = nullptr;
  std::string operator()(std::string_view marker) const {
    if (tokenizer)
      if (auto id = tokenizer->token_id(marker)) return "<[" + std::to_string(*id) + "]>";
    return lit(marker);
  }
};

// The parameters schema of a tool as a grammar named prefix + "root".
std::string arguments_gbnf(const ordered_json& tool, size_t index, const std::string& prefix) {
  const ordered_json& f = tool["function"];
  ordered_json schema = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"]
                                                                                : ordered_json{{"type", "object"}};
  const bool strict = f.contains("strict") && f["strict"].is_boolean() && f["strict"].get<bool>();
  try {
    return grammar::json_schema_to_gbnf(schema, {strict, prefix});
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, "tools[" + std::to_string(index) + "].function.parameters: " + e.what(), "tools");
  }
}

// GLM's key/value arguments: the schema's properties in order, string values as raw text.
std::string glm_arguments_gbnf(const ordered_json& tool, size_t index, const std::string& prefix, const Markers& mk,
                               std::string& rules) {
  const ordered_json& f = tool["function"];
  const ordered_json params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : ordered_json::object();
  std::set<std::string> required;
  if (params.contains("required") && params["required"].is_array())
    for (const auto& r : params["required"])
      if (r.is_string()) required.insert(r.get<std::string>());
  std::string seq;
  size_t k = 0;
  if (params.contains("properties") && params["properties"].is_object())
    for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it, ++k) {
      const std::string value_rule = prefix + "v" + std::to_string(k) + "-";
      const bool is_string = it->is_object() && it->contains("type") && (*it)["type"] == "string" &&
                             !it->contains("enum") && !it->contains("const");
      std::string value;
      if (is_string) {
        value = "[^<]*";
      } else {
        try {
          rules += grammar::json_schema_to_gbnf(*it, {false, value_rule}) + "\n";
        } catch (const std::invalid_argument& e) {
          throw ApiError(400, "tools[" + std::to_string(index) + "].function.parameters." + it.key() + ": " + e.what(),
                         "tools");
        }
        value = value_rule + "root";
      }
      std::string pair = "\"\\n\"? " + mk("<arg_key>") + " " + lit(it.key()) + " " + mk("</arg_key>") + " \"\\n\"? " +
                         mk("<arg_value>") + " " + value + " " + mk("</arg_value>");
      seq += required.count(it.key()) ? " " + pair : " (" + pair + ")?";
    }
  return seq;
}

}  // namespace

std::string tool_call_gbnf(const std::string& parser, const AgentFields& a, const Tokenizer* tokenizer) {
  using K = ToolChoice::Kind;
  if (!a.has_tools() || (a.tool_choice.kind != K::Required && a.tool_choice.kind != K::Named)) return {};
  const Markers mk{tokenizer};
  std::string rules, alts;
  for (size_t i = 0; i < a.tools.size(); ++i) {
    const ordered_json& t = a.tools[i];
    const std::string name = t["function"]["name"].get<std::string>();
    if (a.tool_choice.kind == K::Named && name != a.tool_choice.name) continue;
    const std::string p = "t" + std::to_string(i) + "-";
    std::string call;
    if (parser == "glm47") {
      std::string args = glm_arguments_gbnf(t, i, p, mk, rules);
      call = mk("<tool_call>") + " " + lit(name) + args + " \"\\n\"? " + mk("</tool_call>");
    } else {
      rules += arguments_gbnf(t, i, p) + "\n";
      const std::string args = p + "root";
      if (parser == "deepseek_v3")
        call = lit(name + "\n```json\n") + " " + args + " " + lit("\n```") + " " + mk("<｜tool▁call▁end｜>");
      else if (parser == "deepseek_v31")
        call = lit(name) + " " + mk("<｜tool▁sep｜>") + " " + args + " " + mk("<｜tool▁call▁end｜>");
      else if (parser == "kimi_k2")
        call = lit("functions." + name + ":") + " [0-9]{1,4} " + mk("<|tool_call_argument_begin|>") + " " + args +
               " " + mk("<|tool_call_end|>");
      else
        throw ApiError(400, "forcing a tool call needs a tool-call format (this model's: none)", "tool_choice");
    }
    alts += (alts.empty() ? "" : " | ") + ("(" + call + ")");
  }
  // One call, or (parallel_tool_calls) one or more.
  const bool many = a.parallel_tool_calls;
  std::string root;
  if (parser == "deepseek_v3")
    root = "root ::= " + mk("<｜tool▁calls▁begin｜>") + " call " + (many ? "(\"\\n\" call)* " : "") +
           mk("<｜tool▁calls▁end｜>") + "\ncall ::= " + mk("<｜tool▁call▁begin｜>") + " \"function\" " +
           mk("<｜tool▁sep｜>") + " (" + alts + ")\n";
  else if (parser == "deepseek_v31")
    root = "root ::= " + mk("<｜tool▁calls▁begin｜>") + " call " + (many ? "call* " : "") + mk("<｜tool▁calls▁end｜>") +
           "\ncall ::= " + mk("<｜tool▁call▁begin｜>") + " (" + alts + ")\n";
  else if (parser == "kimi_k2")
    root = "root ::= " + mk("<|tool_calls_section_begin|>") + " call " + (many ? "call* " : "") +
           mk("<|tool_calls_section_end|>") + "\ncall ::= " + mk("<|tool_call_begin|>") + " (" + alts + ")\n";
  else  // glm47
    root = std::string("root ::= call") + (many ? " (\"\\n\"? call)*" : "") + "\ncall ::= " + alts + "\n";
  return root + rules;
}

StructuredOutputs::StructuredOutputs(const Tokenizer& tokenizer, int64_t vocab_size)
    : tokenizer_(tokenizer), vocab_size_(vocab_size) {}

grammar::GrammarCache& StructuredOutputs::cache(const std::string& tool_parser, const std::vector<int64_t>& stops) {
  std::string key = tool_parser;
  for (int64_t s : stops) key.append(",").append(std::to_string(s));
  if (auto it = caches_.find(key); it != caches_.end()) return *it->second;
  const std::vector<int32_t> markers = parser_marker_ids(tokenizer_, tool_parser, "", false);
  const size_t n = std::max<size_t>(size_t(vocab_size_), tokenizer_.vocab_size());
  std::vector<std::optional<std::string>> bytes(n);
  for (size_t id = 0; id < tokenizer_.vocab_size(); ++id) {
    try {
      // Special tokens never match bytes, nor do the format's markers: the grammar names them.
      if (tokenizer_.is_special(int32_t(id)) ||
          std::find(markers.begin(), markers.end(), int32_t(id)) != markers.end())
        continue;
      bytes[id] = tokenizer_.token_bytes(int32_t(id));
    } catch (const std::exception&) {
      // a gap in the vocabulary: never allowed
    }
  }
  std::vector<int32_t> stop_ids(stops.begin(), stops.end());
  auto t = std::make_shared<const grammar::TokenTable>(std::move(bytes), std::move(stop_ids));
  return *(caches_[key] = std::make_unique<grammar::GrammarCache>(std::move(t)));
}

std::shared_ptr<const grammar::CompiledGrammar> StructuredOutputs::grammar_for(const ParsedRequest& p) {
  const AgentFields& a = p.agent;
  std::string text, param;
  try {
    if (a.format == ResponseFormat::JsonObject) {
      text = grammar::json_object_gbnf(), param = "response_format";
    } else if (a.format == ResponseFormat::JsonSchema) {
      param = "response_format";
      grammar::JsonSchemaOptions o;
      o.strict = a.strict;
      text = grammar::json_schema_to_gbnf(a.schema, o);
    } else {
      text = tool_call_gbnf(p.tool_parser, a, &tokenizer_), param = "tools";
    }
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("response_format.json_schema.schema: ") + e.what(), "response_format");
  }
  if (text.empty()) return nullptr;
  if (p.request.eos_token_ids.empty())
    throw ApiError(400, "a constrained output needs an end of sequence: 'ignore_eos' cannot be set with it",
                   "ignore_eos");
  std::lock_guard lk(mu_);
  grammar::GrammarCache& grammars = cache(param == "tools" ? p.tool_parser : "", p.request.eos_token_ids);
  try {
    return grammars.gbnf(text);
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("the output's grammar failed: ") + e.what(), param);
  }
}

}  // namespace mla::server
