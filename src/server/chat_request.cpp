// Request hygiene and the agent fields of a request (see chat_request.h).
#include "server/chat_request.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "chat/tool_parser.h"
#include "server/openai.h"

namespace mla::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

const std::set<std::string, std::less<>>& common_fields() {
  static const std::set<std::string, std::less<>> f = {
      "model", "stream", "stream_options", "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
      "frequency_penalty", "repetition_penalty", "seed", "stop", "max_tokens", "ignore_eos", "skip_special_tokens",
      "logprobs", "logit_bias", "timeout",
      // harmless metadata, accepted and ignored
      "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"};
  return f;
}

const std::set<std::string, std::less<>>& chat_fields() {
  static const std::set<std::string, std::less<>> f = {
      "messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls", "response_format",
      "chat_template_kwargs", "top_logprobs"};
  return f;
}

const std::set<std::string, std::less<>>& completion_fields() {
  static const std::set<std::string, std::less<>> f = {"prompt", "echo", "best_of"};
  return f;
}

bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

const ordered_json* ofield(const ordered_json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

ordered_json parse_tools(const ordered_json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be a list of tools");
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) bad("tools", where + " must be an object");
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function")
      bad("tools", where + ".type must be \"function\" (the only kind of tool this server calls)");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) bad("tools", where + ".function must be an object");
    for (auto it = f->begin(); it != f->end(); ++it)
      if (it.key() != "name" && it.key() != "description" && it.key() != "parameters" && it.key() != "strict")
        bad("tools", where + ".function." + it.key() + " is not a field of a function tool");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || !valid_function_name(name->get<std::string>()))
      bad("tools", where + ".function.name must be 1-64 characters of a-z, A-Z, 0-9, _, - and .");
    if (!names.insert(name->get<std::string>()).second)
      bad("tools", where + ": a second tool named '" + name->get<std::string>() + "'");
    if (auto d = f->find("description"); d != f->end() && !d->is_null() && !d->is_string())
      bad("tools", where + ".function.description must be a string");
    if (auto p = f->find("parameters"); p != f->end() && !p->is_null() && !p->is_object())
      bad("tools", where + ".function.parameters must be a JSON Schema object");
    if (auto s = f->find("strict"); s != f->end() && !s->is_null() && !s->is_boolean())
      bad("tools", where + ".function.strict must be a boolean");
  }
  return tools;
}

ToolChoice parse_tool_choice(const ordered_json& v) {
  ToolChoice c;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") c.kind = ToolChoice::Kind::None;
    else if (s == "auto") c.kind = ToolChoice::Kind::Auto;
    else if (s == "required") c.kind = ToolChoice::Kind::Required;
    else bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got \"" + s + "\"");
    return c;
  }
  if (v.is_object()) {
    auto type = v.find("type");
    auto f = v.find("function");
    if (type == v.end() || *type != "function" || f == v.end() || !f->is_object() || !f->contains("name") ||
        !(*f)["name"].is_string())
      bad("tool_choice", "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}");
    c.kind = ToolChoice::Kind::Named;
    c.name = (*f)["name"].get<std::string>();
    return c;
  }
  bad("tool_choice", "'tool_choice' must be a string or an object, got " + brief_json(v));
}

}  // namespace

const ordered_json* AgentFields::tool(const std::string& name) const {
  if (!tools.is_array()) return nullptr;
  for (const ordered_json& t : tools)
    if (t["function"]["name"] == name) return &t;
  return nullptr;
}

void check_known_fields(Endpoint endpoint, const json& body) {
  const auto& own = endpoint == Endpoint::ChatCompletions ? chat_fields() : completion_fields();
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it->is_null()) continue;
    const std::string& k = it.key();
    if (common_fields().count(k) || own.count(k)) continue;
    const char* hint = "";
    if (k == "functions" || k == "function_call") hint = " (use 'tools' and 'tool_choice')";
    else if (endpoint == Endpoint::Completions && chat_fields().count(k)) hint = " (a field of /v1/chat/completions)";
    bad(k, "'" + k + "' is not supported by this server" + hint);
  }
}

AgentFields parse_agent_fields(Endpoint endpoint, const json& body, const ordered_json* ordered,
                               const json& template_kwarg_defaults, int64_t vocab_size) {
  AgentFields a;
  const ordered_json ob = ordered ? ordered_json() : ordered_json(body);
  const ordered_json& o = ordered ? *ordered : ob;
  const bool chat = endpoint == Endpoint::ChatCompletions;

  // n: choices sampled from one prompt.
  if (const ordered_json* n = ofield(o, "n")) {
    if (!n->is_number_integer()) bad("n", "'n' must be an integer, got " + brief_json(*n));
    a.n = n->get<int64_t>();
    if (a.n < 1 || a.n > 16) bad("n", "'n' must be in [1, 16], got " + brief_json(*n));
  }

  // logprobs: chat {logprobs: bool, top_logprobs: 0..20}; completions {logprobs: 0..20}.
  if (chat) {
    bool want = false;
    if (const ordered_json* lp = ofield(o, "logprobs")) {
      if (!lp->is_boolean()) bad("logprobs", "'logprobs' must be a boolean, got " + brief_json(*lp));
      want = lp->get<bool>();
    }
    int64_t top = 0;
    if (const ordered_json* t = ofield(o, "top_logprobs")) {
      if (!t->is_number_integer()) bad("top_logprobs", "'top_logprobs' must be an integer, got " + brief_json(*t));
      top = t->get<int64_t>();
      if (top < 0 || top > 20) bad("top_logprobs", "'top_logprobs' must be in [0, 20], got " + brief_json(*t));
      if (!want) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (want) a.logprobs = int32_t(top);
  } else if (const ordered_json* lp = ofield(o, "logprobs")) {
    if (lp->is_boolean() && !lp->get<bool>()) {
    } else {
      if (!lp->is_number_integer()) bad("logprobs", "'logprobs' must be an integer in [0, 20], got " + brief_json(*lp));
      const int64_t k = lp->get<int64_t>();
      if (k < 0 || k > 20) bad("logprobs", "'logprobs' must be in [0, 20], got " + brief_json(*lp));
      a.logprobs = int32_t(k);
    }
  }

  if (const ordered_json* lb = ofield(o, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id >= vocab_size)
        bad("logit_bias", "'logit_bias' key \"" + key + "\" is not a token id of this model (0.." +
                              std::to_string(vocab_size - 1) + ")");
      if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < -100 || it->get<double>() > 100)
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " + brief_json(*it));
      a.logit_bias.push_back({int32_t(id), it->get<float>()});
    }
  }
  if (!chat) return a;

  if (const ordered_json* t = ofield(o, "tools")) a.tools = parse_tools(*t);
  if (const ordered_json* c = ofield(o, "tool_choice")) {
    a.tool_choice = parse_tool_choice(*c);
    if (!a.has_tools()) bad("tool_choice", "'tool_choice' is only allowed when 'tools' are given");
    if (a.tool_choice.kind == ToolChoice::Kind::Named && !a.tool(a.tool_choice.name))
      bad("tool_choice", "'tool_choice' names the function '" + a.tool_choice.name + "', which is not in 'tools'");
  }
  if (const ordered_json* p = ofield(o, "parallel_tool_calls")) {
    if (!p->is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean, got " + brief_json(*p));
    a.parallel_tool_calls = p->get<bool>();
  }

  if (const ordered_json* rf = ofield(o, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad("response_format", "'response_format' must be an object with a 'type'");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "text") {
      a.format = ResponseFormat::Text;
    } else if (type == "json_object") {
      a.format = ResponseFormat::JsonObject;
    } else if (type == "json_schema") {
      a.format = ResponseFormat::JsonSchema;
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        bad("response_format", "'response_format' of type json_schema needs a 'json_schema' object");
      for (auto it = js->begin(); it != js->end(); ++it)
        if (it.key() != "name" && it.key() != "description" && it.key() != "schema" && it.key() != "strict")
          bad("response_format", "'response_format.json_schema." + it.key() + "' is not a field of a json_schema format");
      if (auto s = js->find("schema"); s != js->end() && !s->is_null()) {
        if (!s->is_object() && !s->is_boolean()) bad("response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
        a.schema = *s;
      } else {
        a.schema = ordered_json::object();
      }
      if (auto s = js->find("strict"); s != js->end() && !s->is_null()) {
        if (!s->is_boolean()) bad("response_format", "'response_format.json_schema.strict' must be a boolean");
        a.strict = s->get<bool>();
      }
    } else {
      bad("response_format", "'response_format.type' must be text, json_object or json_schema, got \"" + type + "\"");
    }
    if (a.format != ResponseFormat::Text && a.has_tools() &&
        (a.tool_choice.kind == ToolChoice::Kind::Required || a.tool_choice.kind == ToolChoice::Kind::Named))
      bad("response_format", "a JSON 'response_format' contradicts a 'tool_choice' that forces a tool call");
  }

  a.template_kwargs = template_kwarg_defaults.is_object() ? template_kwarg_defaults : json::object();
  if (const ordered_json* k = ofield(o, "chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto it = k->begin(); it != k->end(); ++it) {
      static const std::set<std::string> reserved = {"messages", "tools", "add_generation_prompt", "documents",
                                                     "bos_token", "eos_token"};
      if (reserved.count(it.key()))
        bad("chat_template_kwargs", "'chat_template_kwargs." + it.key() + "' is set by the server, not the request");
      a.template_kwargs[it.key()] = json(*it);
    }
  }
  return a;
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
