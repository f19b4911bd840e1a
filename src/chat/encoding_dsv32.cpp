// DeepSeek-V3.2's prompt encoder (see encoding_dsv32.h).
#include "chat/encoding_dsv32.h"

#include "format/json_depth.h"
#include "jinja/error.h"
#include "jinja/value.h"

namespace mla {

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
constexpr const char* kEos = "<｜end▁of▁sentence｜>";
constexpr const char* kThinkStart = "<think>";
constexpr const char* kThinkEnd = "</think>";
constexpr const char* kUser = "<｜User｜>";
constexpr const char* kAssistant = "<｜Assistant｜>";
#define DSML "｜DSML｜"

// The tools section of a system (or developer) message; {tool_schemas} is filled in by tools_text.
constexpr const char* kToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<" DSML "function_calls>\" block like the following as part of your "
    "reply to the user:\n"
    "<" DSML "function_calls>\n"
    "<" DSML "invoke name=\"$FUNCTION_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "function_calls>\n\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects "
    "should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters and "
    "\"false\" for other types (numbers, booleans, arrays, objects).\n\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking "
    "block. Here is an example:\n\n"
    "<" DSML "function_calls>\n"
    "...\n"
    "</" DSML "function_calls>\n\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n\n"
    "<think>...thinking about results</think>\n\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr const char* kToolsTail = "\n</functions>\n";
constexpr const char* kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

[[noreturn]] void fail(const std::string& message) { throw jinja::Error("DeepSeek-V3.2 encoding: " + message); }

// Python's truthiness of a JSON value (None, False, 0, "", [], {} are false).
bool truthy(const Json* v) {
  if (!v) return false;
  switch (v->type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return v->get<bool>();
    case Json::value_t::number_integer: return v->get<int64_t>() != 0;
    case Json::value_t::number_unsigned: return v->get<uint64_t>() != 0;
    case Json::value_t::number_float: return v->get<double>() != 0.0;
    case Json::value_t::string: return !v->get_ref<const std::string&>().empty();  // json::empty() is false for a string
    case Json::value_t::array:
    case Json::value_t::object: return !v->empty();
    default: return false;
  }
}

const Json* get(const Json& msg, const char* key) {
  auto it = msg.find(key);
  return it == msg.end() ? nullptr : &*it;
}

// json.dumps(value, ensure_ascii=False).
std::string to_json(const Json& v) {
  std::string out;
  jinja::to_json(out, jinja::from_json(v), -1, false, jinja::Limits{}.max_string_bytes);
  return out;
}

// str.format's "{}" of a value: a string as is, None as "" (see the header), else Python's str().
std::string text_of(const Json* v) {
  if (!v || v->is_null()) return "";
  if (v->is_string()) return v->get<std::string>();
  return jinja::to_str(jinja::from_json(*v));
}

std::string tools_text(const Json& tools) {
  if (!tools.is_array()) fail("tools must be a list");
  std::string out = kToolsHead;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json* fn = tools[i].is_object() ? get(tools[i], "function") : nullptr;
    if (!fn) fail("tools[" + std::to_string(i) + "] has no \"function\"");
    if (i) out += "\n";
    out += to_json(*fn);
  }
  return out + kToolsTail;
}

// The arguments of a call as DSML parameters, one per line.
std::string arguments_text(const Json& call) {
  const Json* fn = call.is_object() ? get(call, "function") : nullptr;
  const Json* args = fn && fn->is_object() ? get(*fn, "arguments") : nullptr;
  if (!args) fail("a tool call has no function.arguments");
  Json parsed;
  if (args->is_string()) {
    if (!json_depth_ok(args->get_ref<const std::string&>()))
      fail("tool call arguments nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    try {
      parsed = Json::parse(args->get<std::string>());
    } catch (const nlohmann::json::exception&) {
      fail("tool call arguments are not JSON: " + args->get<std::string>());
    }
  } else {
    parsed = *args;
  }
  if (!parsed.is_object()) fail("tool call arguments must be a JSON object");
  std::string out;
  bool first = true;
  for (auto it = parsed.begin(); it != parsed.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    const bool is_str = it.value().is_string();
    out += "<" DSML "parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") + "\">";
    out += is_str ? it.value().get<std::string>() : to_json(it.value());
    out += "</" DSML "parameter>";
  }
  return out;
}

std::string call_name(const Json& call) {
  const Json* fn = get(call, "function");
  const Json* name = fn && fn->is_object() ? get(*fn, "name") : nullptr;
  if (!name) fail("a tool call has no function.name");
  return text_of(name);
}

std::string role_of(const Json& msg) {
  const Json* role = msg.is_object() ? get(msg, "role") : nullptr;
  return role && role->is_string() ? role->get<std::string>() : std::string();
}

int64_t last_user_index(const Json& messages) {
  for (int64_t i = int64_t(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[size_t(i)]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

std::string system_extras(const Json& msg) {
  std::string out;
  if (const Json* tools = get(msg, "tools"); truthy(tools)) out += "\n\n" + tools_text(*tools);
  if (const Json* rf = get(msg, "response_format"); truthy(rf)) out += "\n\n" + std::string(kResponseFormatHead) + to_json(*rf);
  return out;
}

std::string render_message(size_t index, const Json& messages, bool thinking, int64_t last_user) {
  const Json& msg = messages[index];
  if (!msg.is_object()) fail("messages[" + std::to_string(index) + "] is not an object");
  const std::string role = role_of(msg);
  const int64_t idx = int64_t(index);
  std::string out;
  if (role == "system") {
    out += text_of(get(msg, "content"));
    out += system_extras(msg);
  } else if (role == "developer") {
    if (!truthy(get(msg, "content"))) fail("a developer message needs content");
    out += kUser;
    out += system_extras(msg);
    out += "\n\n# The user's message is: " + text_of(get(msg, "content"));
    out += kAssistant;
    out += idx == last_user && thinking ? kThinkStart : kThinkEnd;
  } else if (role == "user") {
    out += kUser + text_of(get(msg, "content")) + kAssistant;
    out += idx == last_user && thinking ? kThinkStart : kThinkEnd;
  } else if (role == "tool") {
    int64_t prev = idx - 1;
    while (prev >= 0 && role_of(messages[size_t(prev)]) == "tool") --prev;
    if (prev < 0 || role_of(messages[size_t(prev)]) != "assistant")
      fail("messages[" + std::to_string(index) + "]: a tool result must follow an assistant message");
    const Json* calls = get(messages[size_t(prev)], "tool_calls");
    const int64_t order = idx - prev;
    if (!truthy(calls) || !calls->is_array() || int64_t(calls->size()) < order)
      fail("messages[" + std::to_string(index) + "]: a tool result without a matching tool call");
    if (order == 1) out += "\n\n<function_results>";
    out += "\n<result>" + text_of(get(msg, "content")) + "</result>";
    if (order == int64_t(calls->size())) {
      out += "\n</function_results>";
      out += "\n\n";
      out += idx >= last_user && thinking ? kThinkStart : kThinkEnd;
    }
  } else if (role == "assistant") {
    std::string calls_text;
    const Json* calls = get(msg, "tool_calls");
    const bool has_calls = truthy(calls);
    if (has_calls) {
      if (!calls->is_array()) fail("tool_calls must be a list");
      calls_text = "\n\n<" DSML "function_calls>\n";
      for (size_t i = 0; i < calls->size(); ++i) {
        if (i) calls_text += "\n";
        calls_text += "<" DSML "invoke name=\"" + call_name((*calls)[i]) + "\">\n" + arguments_text((*calls)[i]) +
                      "\n</" DSML "invoke>";
      }
      calls_text += "\n</" DSML "function_calls>";
    }
    std::string reasoning;
    if (thinking && idx > last_user) {
      const Json* r = get(msg, "reasoning_content");
      if (!truthy(r) && !has_calls)
        fail("messages[" + std::to_string(index) +
             "]: in thinking mode an assistant message after the last user message needs reasoning_content or "
             "tool_calls");
      reasoning = text_of(r) + kThinkEnd;
    }
    out += reasoning + text_of(get(msg, "content")) + calls_text + kEos;
  } else {
    fail("unknown role '" + role + "'");
  }
  return out;
}

#undef DSML

}  // namespace

std::string encode_dsv32(const Json& messages, const Dsv32Options& options) {
  if (!messages.is_array()) fail("messages must be a list");
  Json full = messages;
  const int64_t last_user = last_user_index(full);
  if (options.thinking && options.drop_thinking)
    for (int64_t i = 0; i < last_user; ++i)
      if (role_of(full[size_t(i)]) == "assistant") full[size_t(i)].erase("reasoning_content");
  std::string out = options.add_bos ? kBos : "";
  for (size_t i = 0; i < full.size(); ++i) out += render_message(i, full, options.thinking, last_user);
  return out;
}

std::string render_dsv32_chat(const Json& messages, const Json& extra) {
  if (!messages.is_array()) fail("messages must be a list");
  Dsv32Options options;
  if (extra.is_object()) {
    if (const Json* t = get(extra, "thinking"); t && !t->is_null()) options.thinking = truthy(t);
    else options.thinking = truthy(get(extra, "enable_thinking"));
  }
  const Json* tools = extra.is_object() ? get(extra, "tools") : nullptr;
  if (!truthy(tools)) return encode_dsv32(messages, options);
  Json with_tools = messages;
  if (with_tools.empty() || role_of(with_tools[0]) != "system")
    with_tools.insert(with_tools.begin(), Json{{"role", "system"}, {"content", ""}});
  with_tools[0]["tools"] = *tools;
  return encode_dsv32(with_tools, options);
}

}  // namespace mla
