// The steps from an adapter's fields to the engine's request (see chat_request.h).
#include "server/chat_request.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <utility>

#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"
#include "server/structured.h"

namespace mla::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

void check_range(const char* name, double x, double lo, double hi, bool lo_open = false) {
  if (x < lo || x > hi || (lo_open && x == lo)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in %s%g, %g], got %g", name, lo_open ? "(" : "[", lo, hi, x);
    bad_field(name, buf);
  }
}

SamplingParams sampling_params(const SamplingFields& f, const ServingContext& ctx) {
  SamplingParams sp;
  if (ctx.generation) sp = ctx.generation->apply(sp);  // the checkpoint's defaults, then the request's
  if (auto t = f.temperature) check_range("temperature", *t, 0, 2), sp.temperature = float(*t);
  if (auto t = f.top_p) check_range("top_p", *t, 0, 1, true), sp.top_p = float(*t);
  if (auto k = f.top_k) {
    if (*k < -1) bad_field("top_k", "'top_k' must be -1 or 0 (off) or positive, got " + std::to_string(*k));
    sp.top_k = std::max<int64_t>(*k, 0);
  }
  if (auto m = f.min_p) check_range("min_p", *m, 0, 1), sp.min_p = float(*m);
  if (auto x = f.presence_penalty) check_range("presence_penalty", *x, -2, 2), sp.presence_penalty = float(*x);
  if (auto x = f.frequency_penalty) check_range("frequency_penalty", *x, -2, 2), sp.frequency_penalty = float(*x);
  if (auto x = f.repetition_penalty) {
    if (!(*x > 0)) bad_field("repetition_penalty", "'repetition_penalty' must be positive (1 = off)");
    sp.repetition_penalty = float(*x);
  }
  if (f.seed) {
    sp.seed = uint64_t(*f.seed);
  } else {
    std::random_device rd;
    sp.seed = (uint64_t(rd()) << 32) ^ rd();
  }
  return sp;
}

void check_stop(const std::vector<std::string>& stop) {
  if (stop.size() > 64) bad_field("stop", "at most 64 stop strings");
  for (const std::string& s : stop)
    if (s.size() > 4096) bad_field("stop", "a stop string is longer than 4096 bytes");
}

}  // namespace

void check_tools(const ordered_json& tools) {
  if (!tools.is_array()) bad_field("tools", "'tools' must be a list of tools");
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) bad_field("tools", where + " must be an object");
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function")
      bad_field("tools", where + ".type must be \"function\" (the only kind of tool this server calls)");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) bad_field("tools", where + ".function must be an object");
    for (auto it = f->begin(); it != f->end(); ++it)
      if (it.key() != "name" && it.key() != "description" && it.key() != "parameters" && it.key() != "strict")
        bad_field("tools", where + ".function." + it.key() + " is not a field of a function tool");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || !valid_function_name(name->get<std::string>()))
      bad_field("tools", where + ".function.name must be 1-64 characters of a-z, A-Z, 0-9, _, - and .");
    if (!names.insert(name->get<std::string>()).second)
      bad_field("tools", where + ": a second tool named '" + name->get<std::string>() + "'");
    if (auto d = f->find("description"); d != f->end() && !d->is_null() && !d->is_string())
      bad_field("tools", where + ".function.description must be a string");
    if (auto p = f->find("parameters"); p != f->end() && !p->is_null() && !p->is_object())
      bad_field("tools", where + ".function.parameters must be a JSON Schema object");
    if (auto s = f->find("strict"); s != f->end() && !s->is_null() && !s->is_boolean())
      bad_field("tools", where + ".function.strict must be a boolean");
  }
}

void set_tool_choice(AgentFields& a, ToolChoice choice) {
  a.tool_choice = std::move(choice);
  if (!a.has_tools()) bad_field("tool_choice", "'tool_choice' is only allowed when 'tools' are given");
  if (a.tool_choice.kind == ToolChoice::Kind::Named && !a.tool(a.tool_choice.name))
    bad_field("tool_choice", "'tool_choice' names the function '" + a.tool_choice.name + "', which is not in 'tools'");
}

void set_json_schema(AgentFields& a, const ordered_json* schema, const ordered_json* strict) {
  a.format = ResponseFormat::JsonSchema;
  if (schema) {
    if (!schema->is_object() && !schema->is_boolean())
      bad_field("response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
    a.schema = *schema;
  } else {
    a.schema = ordered_json::object();
  }
  if (strict) {
    if (!strict->is_boolean()) bad_field("response_format", "'response_format.json_schema.strict' must be a boolean");
    a.strict = strict->get<bool>();
  }
}

void check_format_and_choice(const AgentFields& a) {
  if (a.format != ResponseFormat::Text && a.forces_call())
    bad_field("response_format", "a JSON 'response_format' contradicts a 'tool_choice' that forces a tool call");
}

json template_kwargs(const ServingContext& ctx, const json& request) {
  json kwargs = ctx.chat_template_kwargs.is_object() ? ctx.chat_template_kwargs : json::object();
  for (auto it = request.begin(); it != request.end(); ++it) kwargs[it.key()] = *it;
  return kwargs;
}

ParsedRequest start_request(Endpoint endpoint, RequestFields f, const ServingContext& ctx) {
  ParsedRequest p;
  p.endpoint = endpoint;
  p.model = f.model.empty() ? ctx.model_name : std::move(f.model);
  p.stream = f.stream;
  p.include_usage = f.include_usage;
  p.timeout_seconds = f.timeout_seconds;
  p.agent = std::move(f.agent);
  p.agent.template_kwargs = template_kwargs(ctx, p.agent.template_kwargs);
  Request& r = p.request;
  r.sampling = sampling_params(f.sampling, ctx);
  check_stop(f.stop);
  r.stop = std::move(f.stop);
  r.skip_special_tokens = f.skip_special_tokens;
  r.logprobs = p.agent.logprobs;
  if (auto m = f.limits.max_tokens; m && *m < 1)
    bad_field("max_tokens", "'max_tokens' must be at least 1, got " + std::to_string(*m));
  return p;
}

void render_prompt(ParsedRequest& p, const ordered_json& messages, const ServingContext& ctx) {
  const AgentFields& a = p.agent;
  Request& r = p.request;
  if (a.tools_active() && ctx.tool_parser.empty() && a.tool_choice.kind != ToolChoice::Kind::Auto)
    bad_field("tool_choice", "this model has no tool-call format this server knows (start it with --tool-call-parser)");
  p.prompt_text = render_messages(messages, a, ctx);
  r.prompt = ctx.tokenizer->encode(p.prompt_text, false);  // the template writes the BOS itself
  if (a.tools_active()) p.tool_parser = ctx.tool_parser;
  p.reasoning_parser = ctx.reasoning_parser;
  p.reasoning_opened = !p.reasoning_parser.empty() && chat::prompt_opens_reasoning(p.prompt_text);
  r.keep_special_token_ids = parser_marker_ids(*ctx.tokenizer, p.tool_parser, p.reasoning_parser);
}

void finish_request(ParsedRequest& p, const OutputLimits& limits, const ServingContext& ctx) {
  Request& r = p.request;
  std::optional<int64_t> max_tokens = limits.max_tokens;
  const int64_t n = int64_t(r.prompt.size());
  const char* prompt_param = p.endpoint == Endpoint::Completions ? "prompt" : "messages";
  if (n == 0) bad_field(prompt_param, "the prompt is empty");
  // The room of one request: the model's context and what one request can hold in the KV cache
  // (the engine's page budget); 0: unknown.
  int64_t room = ctx.max_sequence_tokens > 0 ? ctx.max_sequence_tokens : 0;
  if (ctx.context_length > 0 && (room == 0 || ctx.context_length < room)) room = ctx.context_length;
  const std::string what = ctx.context_length > 0 && room == ctx.context_length
                               ? "this model's maximum context length of " + std::to_string(room) + " tokens"
                               : "the " + std::to_string(room) + " tokens one request can hold in the KV cache";
  if (room > 0 && n > room)
    throw ContextLengthError("the prompt is " + std::to_string(n) + " tokens, more than " + what, prompt_param, n, room);
  if (max_tokens && room > 0 && limits.cap_max_tokens) max_tokens = std::min(*max_tokens, room - n);
  // max_tokens > room - n, not n + max_tokens > room: no overflow for max_tokens up to 2^63 - 1.
  if (max_tokens && room > 0 && *max_tokens > room - n)
    bad_field("max_tokens", "the request asks for " + std::to_string(n) + " prompt tokens and " +
                                std::to_string(*max_tokens) + " to generate, more than " + what + " (at most " +
                                std::to_string(room - n) + " to generate for this prompt)");
  // Default: generation_config.json's max_new_tokens, else until EOS; never beyond the room.
  int64_t max_new = max_tokens.value_or(ctx.generation ? ctx.generation->max_new_tokens.value_or(-1) : -1);
  if (room > 0 && (max_new < 0 || max_new > room - n)) max_new = room - n;
  if (ctx.max_output_tokens > 0 && (max_new < 0 || max_new > ctx.max_output_tokens)) max_new = ctx.max_output_tokens;
  r.max_new_tokens = max_new;

  if (!limits.ignore_eos) {
    if (ctx.generation) r.eos_token_ids = ctx.generation->eos_token_ids;
    int64_t eos = ctx.tokenizer->eos_id();
    if (eos >= 0 && std::find(r.eos_token_ids.begin(), r.eos_token_ids.end(), eos) == r.eos_token_ids.end())
      r.eos_token_ids.push_back(eos);
  }
  if (p.agent.format != ResponseFormat::Text || p.agent.forces_call()) {
    if (!ctx.structured)
      bad_field(p.agent.format != ResponseFormat::Text ? "response_format" : "tool_choice",
                "constrained outputs are not available on this server");
    p.grammar = ctx.structured->grammar_for(p);
  }
}

ParsedRequest chat_request(Endpoint endpoint, RequestFields fields, const ServingContext& ctx) {
  const OutputLimits limits = fields.limits;
  ordered_json messages = std::move(fields.messages);
  ParsedRequest p = start_request(endpoint, std::move(fields), ctx);
  render_prompt(p, messages, ctx);
  finish_request(p, limits, ctx);
  return p;
}

std::string render_messages(const ordered_json& messages, const AgentFields& agent, const ServingContext& ctx) {
  if (messages.empty()) bad_field("messages", "'messages' is empty");
  if (ctx.chat_format.empty()) bad_field("messages", "the model has no chat template: use /v1/completions");
  try {
    return render_chat_prompt(ctx.chat_format, messages, agent, *ctx.tokenizer, ctx.tool_prompt_syntax());
  } catch (const std::exception& e) {
    bad_field("messages", std::string("the chat template failed on these messages: ") + e.what());
  }
}

std::vector<int32_t> parser_marker_ids(const Tokenizer& tokenizer, const std::string& tool_parser,
                                       const std::string& reasoning_parser, bool special_only) {
  std::vector<std::string_view> markers;
  if (tool_parser == "deepseek_v3" || tool_parser == "deepseek_v31")
    markers = {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
               "<｜tool▁sep｜>"};
  else if (tool_parser == "kimi_k2")
    markers = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
               "<|tool_call_end|>", "<|tool_call_argument_begin|>"};
  else if (tool_parser == "glm47")
    markers = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
  if (!reasoning_parser.empty()) {
    markers.push_back("<think>");
    markers.push_back("</think>");
  }
  std::vector<int32_t> ids;
  for (std::string_view m : markers)
    if (auto id = tokenizer.token_id(m); id && (!special_only || tokenizer.is_special(*id))) ids.push_back(*id);
  return ids;
}

namespace {

// True when a Jinja template reads a call's arguments as a mapping (GLM's `set _args =
// tc.arguments` then `_args.items()`, `arguments | items`) rather than writing the JSON string as
// is (DeepSeek's `+ tool['function']['arguments'] +`).
bool reads_arguments_as_mapping(const std::string& tmpl) {
  for (const char* s : {"arguments is mapping", "arguments.items()", "_args.items()", "arguments | items", "arguments|items"})
    if (tmpl.find(s) != std::string::npos) return true;
  return false;
}

// The request's messages with each assistant tool call's arguments decoded from OpenAI's JSON
// string to the object (key order kept), where it is one; anything else stays as it was.
nlohmann::ordered_json with_decoded_arguments(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      const std::string& text = fn["arguments"].get_ref<const std::string&>();
      // The body's depth check cannot see into this string, and the template walks the
      // decoded object recursively: arguments nested deeper than a body may be stay a string.
      if (!json_depth_ok(text)) continue;
      nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = std::move(parsed);
    }
  }
  return out;
}

// The messages with `section` at the end of the system prompt: appended to the last of the
// leading system messages (after a blank line), or as a system message of its own at the start.
// A template that takes one system message first (most do) reads it either way.
nlohmann::ordered_json with_system_section(nlohmann::ordered_json out, const std::string& section) {
  size_t k = 0;
  while (k < out.size() && out[k].is_object() && out[k].value("role", "") == "system") ++k;
  if (k > 0 && out[k - 1].contains("content") && out[k - 1]["content"].is_string()) {
    std::string text = out[k - 1]["content"].get<std::string>();
    out[k - 1]["content"] = text.empty() ? section : text + "\n\n" + section;
  } else {
    out.insert(out.begin() + std::ptrdiff_t(k), nlohmann::ordered_json{{"role", "system"}, {"content", section}});
  }
  return out;
}

}  // namespace

std::string render_chat_prompt(const ChatFormat& format, const nlohmann::ordered_json& messages,
                               const AgentFields& agent, const Tokenizer& tokenizer, std::string_view tool_parser) {
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  for (auto kv = agent.template_kwargs.begin(); kv != agent.template_kwargs.end(); ++kv)
    extra[kv.key()] = nlohmann::ordered_json(*kv);
  if (agent.has_tools()) extra["tools"] = agent.tools;
  extra["bos_token"] = tokenizer.bos_token();
  extra["eos_token"] = tokenizer.eos_token();
  if (format.kind != ChatFormat::Kind::Jinja) return render_chat(format, messages, true, extra);
  const bool decode = reads_arguments_as_mapping(format.jinja);
  const std::string section = agent.tools_active() && !template_reads_tools(format.jinja)
                                  ? chat::tool_use_prompt(tool_parser, agent.tools)
                                  : std::string();
  // The request's messages are copied only where something changes them (a long conversation
  // is most of a request).
  if (!decode && section.empty()) return render_chat(format, messages, true, extra);
  nlohmann::ordered_json msgs = decode ? with_decoded_arguments(messages) : messages;
  if (!section.empty()) msgs = with_system_section(std::move(msgs), section);
  return render_chat(format, msgs, true, extra);
}

}  // namespace mla::server
