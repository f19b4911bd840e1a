// OpenAI's Responses API over the shared request path (see api_responses.h).
#include "server/api_responses.h"

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <utility>

#include "server/choice.h"
#include "server/openai.h"

namespace mla::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// A known field's type: absent or null passes; another type is a 400 naming it.
void expect(const ordered_json& body, const char* name, bool ok_string, bool ok_object, bool ok_array = false,
            bool ok_bool = false, bool ok_number = false) {
  const ordered_json* v = field(body, name);
  if (!v) return;
  if ((ok_string && v->is_string()) || (ok_object && v->is_object()) || (ok_array && v->is_array()) ||
      (ok_bool && v->is_boolean()) || (ok_number && v->is_number()))
    return;
  std::string want;
  auto add = [&](bool on, const char* what) {
    if (!on) return;
    if (!want.empty()) want += " or ";
    want += what;
  };
  add(ok_string, "a string");
  add(ok_object, "an object");
  add(ok_array, "a list");
  add(ok_bool, "a boolean");
  add(ok_number, "a number");
  bad_field(name, std::string("'") + name + "' must be " + want + ", got " + brief_json(*v));
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016llx%016llx%016llx", (unsigned long long)rng(), (unsigned long long)rng(),
                (unsigned long long)rng());
  return prefix + std::string(buf);
}

// The text of a content value: a string, or parts with a "text" (input_text, output_text,
// text; refusal's "refusal"). Other parts (images, files) are refused: the model reads text.
std::string content_text(const ordered_json& content, const std::string& where) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field("input", where + " must be a string or a list of content parts");
  std::string text;
  for (const ordered_json& part : content) {
    if (part.is_string()) {
      text += part.get<std::string>();
      continue;
    }
    if (!part.is_object()) bad_field("input", where + ": a content part must be an object");
    const std::string type = part.value("type", "");
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal")
      bad_field("input", where + ": content parts of type \"" + type + "\" are not supported (text only)");
    auto t = part.find(key);
    if (t == part.end() || !t->is_string()) bad_field("input", where + ": a " + type + " part needs a string \"" + key + "\"");
    text += t->get<std::string>();
  }
  return text;
}

std::string prompt_name(const std::string& space, const std::string& name) {
  return space.empty() ? name : space + kNamespaceSeparator + name;
}

const ordered_json kCustomParameters = {
    {"type", "object"}, {"properties", {{"input", {{"type", "string"}}}}}, {"required", {"input"}}};

// One client tool (function or custom) as a chat function tool; nullopt for a type not served.
std::optional<ordered_json> chat_tool(const ordered_json& t, const std::string& space, const std::string& where,
                                      ResponsesToolMap& map) {
  const std::string type = t.value("type", "");
  if (type != "function" && type != "custom") return std::nullopt;
  auto name = t.find("name");
  if (name == t.end() || !name->is_string()) bad_field("tools", where + ".name must be a string");
  const std::string pname = prompt_name(space, name->get<std::string>());
  ordered_json fn = {{"name", pname}};
  std::string description;
  if (const ordered_json* d = field(t, "description")) {
    if (!d->is_string()) bad_field("tools", where + ".description must be a string");
    description = d->get<std::string>();
  }
  if (type == "function") {
    if (!description.empty()) fn["description"] = description;
    if (const ordered_json* p = field(t, "parameters")) fn["parameters"] = *p;
    if (const ordered_json* s = field(t, "strict")) fn["strict"] = *s;
  } else {
    // A free-form input: the model writes it as the one string argument. A grammar the client
    // gives (Lark or regex) is shown to the model in the description; it is not enforced.
    if (const ordered_json* f = field(t, "format"); f && f->is_object() && f->value("type", "") == "grammar") {
      const std::string def = f->value("definition", "");
      if (!def.empty())
        description += (description.empty() ? "" : "\n\n") + std::string("The input follows this ") +
                       f->value("syntax", "") + " grammar:\n" + def;
    }
    if (!description.empty()) fn["description"] = description;
    fn["parameters"] = kCustomParameters;
  }
  map[pname] = {name->get<std::string>(), space, type == "custom"};
  return ordered_json{{"type", "function"}, {"function", fn}};
}

ordered_json translate_tools(const ordered_json& tools, ResponsesToolMap& map) {
  if (!tools.is_array()) bad_field("tools", "'tools' must be a list of tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      bad_field("tools", where + " must be an object with a string 'type'");
    if (t["type"] == "namespace") {
      auto name = t.find("name");
      if (name == t.end() || !name->is_string() || name->get<std::string>().empty())
        bad_field("tools", where + ".name must be a non-empty string");
      auto inner = t.find("tools");
      if (inner == t.end() || !inner->is_array()) bad_field("tools", where + ".tools must be a list of tools");
      for (size_t j = 0; j < inner->size(); ++j) {
        const ordered_json& it = (*inner)[j];
        if (!it.is_object()) bad_field("tools", where + ".tools[" + std::to_string(j) + "] must be an object");
        if (auto c = chat_tool(it, name->get<std::string>(), where + ".tools[" + std::to_string(j) + "]", map))
          out.push_back(std::move(*c));
      }
      continue;
    }
    if (auto c = chat_tool(t, "", where, map)) out.push_back(std::move(*c));
    // Hosted tools (web_search, file_search, local_shell, image_generation, ...) run at the
    // provider; this server has none of them, so they are dropped.
  }
  return out;
}

ToolChoice translate_tool_choice(const ordered_json& c) {
  using K = ToolChoice::Kind;
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s != "auto" && s != "none" && s != "required")
      bad_field("tool_choice", "'tool_choice' must be auto, none, required or an object, got \"" + s + "\"");
    return {s == "auto" ? K::Auto : s == "none" ? K::None : K::Required, {}};
  }
  if (!c.is_object()) bad_field("tool_choice", "'tool_choice' must be a string or an object, got " + brief_json(c));
  const std::string type = c.value("type", "");
  if (type == "function" || type == "custom") {
    auto name = c.find("name");
    if (name == c.end() || !name->is_string()) bad_field("tool_choice", "a named 'tool_choice' needs a string 'name'");
    std::string space;
    if (auto ns = c.find("namespace"); ns != c.end() && ns->is_string()) space = ns->get<std::string>();
    return {K::Named, prompt_name(space, name->get<std::string>())};
  }
  if (type == "allowed_tools") return {c.value("mode", "auto") == "required" ? K::Required : K::Auto, {}};
  return {K::Auto, {}};  // a hosted tool's choice: its tool was dropped
}

// text.format into a's format.
void translate_format(const ordered_json& text, AgentFields& a) {
  const ordered_json* f = field(text, "format");
  if (!f) return;
  if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
    bad_field("text.format", "'text.format' must be an object with a 'type'");
  const std::string type = (*f)["type"].get<std::string>();
  if (type == "text") a.format = ResponseFormat::Text;
  else if (type == "json_object") a.format = ResponseFormat::JsonObject;
  else if (type == "json_schema") set_json_schema(a, field(*f, "schema"), field(*f, "strict"));
  else bad_field("text.format", "'text.format.type' must be text, json_object or json_schema, got \"" + type + "\"");
}

// The input items as chat messages, appended to messages.
class InputTranslator {
 public:
  explicit InputTranslator(ordered_json& messages) : messages_(messages) {}

  void item(const ordered_json& it, const std::string& where) {
    if (!it.is_object()) bad_field("input", where + " must be an object");
    std::string type = it.value("type", "");
    if (type.empty() && it.contains("role")) type = "message";
    if (type == "message") return message(it, where);
    if (type == "function_call" || type == "custom_tool_call") return call(it, where, type == "custom_tool_call");
    if (type == "function_call_output" || type == "custom_tool_call_output") {
      auto id = it.find("call_id");
      if (id == it.end() || !id->is_string()) bad_field("input", where + ".call_id must be a string");
      const ordered_json* out = field(it, "output");
      messages_.push_back({{"role", "tool"},
                           {"tool_call_id", *id},
                           {"content", out ? content_text(*out, where + ".output") : std::string()}});
      return;
    }
    if (type == "reasoning") {
      std::string text;
      if (const ordered_json* c = field(it, "content"); c && c->is_array())
        for (const ordered_json& p : *c)
          if (p.is_object() && p.value("type", "") == "reasoning_text") text += p.value("text", "");
      if (text.empty())
        if (const ordered_json* s = field(it, "summary"); s && s->is_array())
          for (const ordered_json& p : *s)
            if (p.is_object() && p.value("type", "") == "summary_text") {
              if (!text.empty()) text += "\n\n";
              text += p.value("text", "");
            }
      reasoning_ += text;
      return;
    }
    // web_search_call, local_shell_call, item_reference, ...: nothing a chat prompt can carry.
  }

 private:
  void message(const ordered_json& it, const std::string& where) {
    auto role_it = it.find("role");
    if (role_it == it.end() || !role_it->is_string()) bad_field("input", where + ".role must be a string");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "user" && role != "assistant" && role != "system")
      bad_field("input", where + ".role must be user, assistant, system or developer, got \"" + role + "\"");
    const ordered_json* c = field(it, "content");
    ordered_json m = {{"role", role}, {"content", c ? content_text(*c, where + ".content") : std::string()}};
    if (role == "assistant") take_reasoning(m);
    messages_.push_back(std::move(m));
  }

  void call(const ordered_json& it, const std::string& where, bool custom) {
    auto id = it.find("call_id");
    auto name = it.find("name");
    if (id == it.end() || !id->is_string()) bad_field("input", where + ".call_id must be a string");
    if (name == it.end() || !name->is_string()) bad_field("input", where + ".name must be a string");
    std::string space;
    if (auto ns = it.find("namespace"); ns != it.end() && ns->is_string()) space = ns->get<std::string>();
    std::string arguments;
    if (custom) {
      const ordered_json* in = field(it, "input");
      if (in && !in->is_string()) bad_field("input", where + ".input must be a string");
      arguments = ordered_json{{"input", in ? in->get<std::string>() : std::string()}}.dump();
    } else {
      const ordered_json* a = field(it, "arguments");
      if (a && !a->is_string()) bad_field("input", where + ".arguments must be a string (JSON text)");
      arguments = a ? a->get<std::string>() : "{}";
    }
    ordered_json tc = {{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", prompt_name(space, name->get<std::string>())}, {"arguments", arguments}}}};
    // A call joins the assistant message just before it (its text, or the calls before it).
    if (!messages_.empty() && messages_.back()["role"] == "assistant" && reasoning_.empty()) {
      ordered_json& last = messages_.back();
      if (!last.contains("tool_calls")) last["tool_calls"] = ordered_json::array();
      last["tool_calls"].push_back(std::move(tc));
      return;
    }
    ordered_json m = {{"role", "assistant"}, {"content", nullptr}};
    take_reasoning(m);
    m["tool_calls"] = ordered_json::array({std::move(tc)});
    messages_.push_back(std::move(m));
  }

  void take_reasoning(ordered_json& m) {
    if (reasoning_.empty()) return;
    m["reasoning_content"] = reasoning_;
    reasoning_.clear();
  }

  ordered_json& messages_;
  std::string reasoning_;  // of the next assistant message
};

}  // namespace

ResponsesTranslation translate_responses_request(const ordered_json& body, const ordered_json& previous) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  expect(body, "model", true, false);
  expect(body, "instructions", true, false);
  expect(body, "input", true, false, true);
  expect(body, "tools", false, false, true);
  expect(body, "tool_choice", true, true);
  expect(body, "parallel_tool_calls", false, false, false, true);
  expect(body, "text", false, true);
  expect(body, "reasoning", false, true);
  expect(body, "max_output_tokens", false, false, false, false, true);
  expect(body, "temperature", false, false, false, false, true);
  expect(body, "top_p", false, false, false, false, true);
  expect(body, "stream", false, false, false, true);
  expect(body, "store", false, false, false, true);
  expect(body, "background", false, false, false, true);
  expect(body, "previous_response_id", true, false);
  expect(body, "metadata", false, true);
  expect(body, "include", false, false, true);
  expect(body, "stream_options", false, true);
  for (const char* k : {"prompt_cache_key", "truncation", "user", "service_tier", "safety_identifier"})
    expect(body, k, true, false);
  if (const ordered_json* bg = field(body, "background"); bg && bg->get<bool>())
    bad_field("background", "background responses are not supported");
  if (const ordered_json* n = field(body, "n"); n && !(n->is_number_integer() && n->get<int64_t>() == 1))
    bad_field("n", "only n = 1 is supported");

  ResponsesTranslation t;
  RequestFields& f = t.fields;
  f.limits.cap_max_tokens = true;
  if (const ordered_json* m = field(body, "model")) f.model = m->get<std::string>();
  if (const ordered_json* s = field(body, "stream")) f.stream = s->get<bool>();

  ordered_json tools;
  if (const ordered_json* ts = field(body, "tools")) tools = translate_tools(*ts, t.tools);

  // The conversation: instructions, the stored one, the input.
  ordered_json& messages = f.messages;
  if (const ordered_json* ins = field(body, "instructions"); ins && !ins->get_ref<const std::string&>().empty())
    messages.push_back({{"role", "system"}, {"content", *ins}});
  for (const ordered_json& m : previous) messages.push_back(m);
  t.input_messages = ordered_json::array();
  if (const ordered_json* in = field(body, "input")) {
    if (in->is_string()) {
      t.input_messages.push_back({{"role", "user"}, {"content", *in}});
    } else {
      InputTranslator tr(t.input_messages);
      for (size_t i = 0; i < in->size(); ++i) tr.item((*in)[i], "input[" + std::to_string(i) + "]");
    }
  }
  for (const ordered_json& m : t.input_messages) messages.push_back(m);
  if (messages.empty()) bad_field("input", "'input' is required");

  AgentFields& a = f.agent;
  std::optional<ToolChoice> choice;
  if (tools.is_array() && !tools.empty()) {
    a.tools = std::move(tools);
    if (const ordered_json* c = field(body, "tool_choice")) choice = translate_tool_choice(*c);
    if (const ordered_json* p = field(body, "parallel_tool_calls")) a.parallel_tool_calls = p->get<bool>();
  } else if (const ordered_json* c = field(body, "tool_choice")) {
    translate_tool_choice(*c);  // checked, though nothing is left to choose from
  }
  if (const ordered_json* text = field(body, "text")) translate_format(*text, a);
  // Named max_tokens in errors, as the chat endpoint's checks of it are (the param is renamed).
  if (const ordered_json* m = field(body, "max_output_tokens")) f.limits.max_tokens = integer_value(*m, "max_tokens");
  f.sampling = read_sampling_fields(body);
  f.stop = read_stop(body);
  if (const ordered_json* r = field(body, "reasoning")) {
    if (const ordered_json* e = field(*r, "effort")) {
      if (!e->is_string()) bad_field("reasoning.effort", "'reasoning.effort' must be a string");
      const std::string effort = e->get<std::string>();
      bool on;
      if (effort == "none" || effort == "minimal") on = false;
      else if (effort == "low" || effort == "medium" || effort == "high" || effort == "xhigh") on = true;
      else bad_field("reasoning.effort", "'reasoning.effort' must be none, minimal, low, medium, high or xhigh");
      a.template_kwargs = {{"thinking", on}, {"enable_thinking", on}};
    }
  }
  // The chat endpoint's checks of the agent fields.
  if (a.has_tools()) check_tools(a.tools);
  if (choice) set_tool_choice(a, std::move(*choice));
  check_format_and_choice(a);
  return t;
}

// ---- The store ---------------------------------------------------------------------------

void ResponseStore::put(const std::string& id, Entry entry) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(id); it != index_.end()) {
    order_.erase(it->second);
    index_.erase(it);
  }
  order_.emplace_front(id, std::move(entry));
  index_[id] = order_.begin();
  while (order_.size() > capacity_) {
    index_.erase(order_.back().first);
    order_.pop_back();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

bool ResponseStore::remove(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  order_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
}

// ---- The exchange ----------------------------------------------------------------------

namespace {

ApiError not_found(const std::string& id) {
  return ApiError(404, "no response with id '" + id + "' is stored", "response_id", "invalid_request_error",
                  "response_not_found");
}

// One response's output items from the chat deltas, with the stream's events as they open,
// grow and close (written to events when it is set).
class OutputBuilder {
 public:
  explicit OutputBuilder(const ResponsesToolMap& tools) : tools_(tools) {}

  json items = json::array();
  // The chat messages of the output, for the store.
  ordered_json assistant_messages() const { return messages_; }

  // Emits one stream event: its type and fields (sequence_number is added by the emitter).
  std::function<void(const std::string& type, json fields)> emit;

  void add(const chat::ChatDelta& d) {
    using K = chat::ChatDelta::Kind;
    switch (d.kind) {
      case K::Reasoning:
        if (d.text.empty()) return;
        if (open_ != Open::Reasoning) open_reasoning();
        text_ += d.text;
        send("response.reasoning_text.delta", {{"item_id", item_id_}, {"output_index", index_},
                                               {"content_index", 0}, {"delta", d.text}});
        return;
      case K::Content:
        if (d.text.empty()) return;
        if (open_ != Open::Message) {
          // Whitespace alone between items makes no message: it waits for text to follow.
          pending_ += d.text;
          if (pending_.find_first_not_of(" \t\r\n") == std::string::npos) return;
          std::string text = std::move(pending_);
          pending_.clear();
          // After another item, a message starts at its text ("</think>\n\n" leaves no newlines).
          if (open_ != Open::None || !items.empty()) text.erase(0, text.find_first_not_of(" \t\r\n"));
          open_message();
          append_text(text);
          return;
        }
        append_text(d.text);
        return;
      case K::CallStart: {
        close();
        auto t = tools_.find(d.name);
        call_custom_ = t != tools_.end() && t->second.custom;
        call_name_ = t != tools_.end() ? t->second.name : d.name;
        call_space_ = t != tools_.end() ? t->second.space : "";
        call_id_ = d.id;
        call_prompt_name_ = d.name;
        text_.clear();
        open_ = Open::Call;
        index_ = int(items.size());
        item_id_ = random_id(call_custom_ ? "ctc_" : "fc_");
        send("response.output_item.added", {{"output_index", index_}, {"item", call_item("in_progress", "")}});
        return;
      }
      case K::Arguments:
        if (open_ != Open::Call) return;
        text_ += d.text;
        // A custom call's input is a string inside the arguments' JSON: sent whole at its close.
        if (!call_custom_)
          send("response.function_call_arguments.delta", {{"item_id", item_id_}, {"output_index", index_},
                                                          {"delta", d.text}});
        return;
    }
  }

  // Ends the open item (the output's end, or another item's start).
  void close() {
    pending_.clear();
    switch (open_) {
      case Open::None: return;
      case Open::Reasoning: {
        send("response.reasoning_text.done", {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0},
                                              {"text", text_}});
        json item = {{"type", "reasoning"}, {"id", item_id_}, {"summary", json::array()},
                     {"content", json::array({{{"type", "reasoning_text"}, {"text", text_}}})}};
        finish_item(std::move(item));
        reasoning_ += text_;
        break;
      }
      case Open::Message: {
        json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
        send("response.output_text.done", {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0},
                                           {"text", text_}});
        send("response.content_part.done", {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0},
                                            {"part", part}});
        finish_item({{"type", "message"}, {"id", item_id_}, {"status", "completed"}, {"role", "assistant"},
                     {"content", json::array({part})}});
        assistant().at("content") = text_;  // one message item per turn in practice; the last wins
        break;
      }
      case Open::Call: {
        std::string input;
        if (call_custom_) {
          json a = json::parse(text_, nullptr, false);
          input = a.is_object() && a.contains("input") && a["input"].is_string() ? a["input"].get<std::string>() : text_;
          send("response.custom_tool_call_input.delta", {{"item_id", item_id_}, {"output_index", index_},
                                                         {"delta", input}});
          send("response.custom_tool_call_input.done", {{"item_id", item_id_}, {"output_index", index_},
                                                        {"input", input}});
        } else {
          send("response.function_call_arguments.done", {{"item_id", item_id_}, {"output_index", index_},
                                                         {"arguments", text_}});
        }
        finish_item(call_item("completed", input));
        ordered_json& m = assistant();
        if (!m.contains("tool_calls")) m["tool_calls"] = ordered_json::array();
        m["tool_calls"].push_back({{"id", call_id_},
                                   {"type", "function"},
                                   {"function", {{"name", call_prompt_name_}, {"arguments", text_}}}});
        break;
      }
    }
    open_ = Open::None;
    text_.clear();
  }

 private:
  enum class Open { None, Reasoning, Message, Call };

  void send(const std::string& type, json fields) {
    if (emit) emit(type, std::move(fields));
  }

  void open_reasoning() {
    close();
    open_ = Open::Reasoning;
    index_ = int(items.size());
    item_id_ = random_id("rs_");
    send("response.output_item.added",
         {{"output_index", index_},
          {"item", {{"type", "reasoning"}, {"id", item_id_}, {"summary", json::array()}, {"content", json::array()}}}});
  }

  void open_message() {
    close();
    open_ = Open::Message;
    index_ = int(items.size());
    item_id_ = random_id("msg_");
    send("response.output_item.added", {{"output_index", index_},
                                        {"item", {{"type", "message"}, {"id", item_id_}, {"status", "in_progress"},
                                                  {"role", "assistant"}, {"content", json::array()}}}});
    send("response.content_part.added", {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0},
                                         {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  }

  void append_text(const std::string& text) {
    text_ += text;
    send("response.output_text.delta", {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0},
                                        {"delta", text}, {"logprobs", json::array()}});
  }

  json call_item(const char* status, const std::string& input) const {
    if (call_custom_) {
      json item = {{"type", "custom_tool_call"}, {"id", item_id_}, {"call_id", call_id_}, {"name", call_name_},
                   {"input", input}, {"status", status}};
      if (!call_space_.empty()) item["namespace"] = call_space_;
      return item;
    }
    json item = {{"type", "function_call"}, {"id", item_id_}, {"call_id", call_id_}, {"name", call_name_},
                 {"arguments", std::string(status) == std::string("completed") ? text_ : std::string()},
                 {"status", status}};
    if (!call_space_.empty()) item["namespace"] = call_space_;
    return item;
  }

  void finish_item(json item) {
    send("response.output_item.done", {{"output_index", index_}, {"item", item}});
    items.push_back(std::move(item));
  }

  // The assistant message of the output (one chat turn): content, reasoning, calls.
  ordered_json& assistant() {
    if (messages_.empty()) messages_.push_back({{"role", "assistant"}, {"content", nullptr}});
    ordered_json& m = messages_.back();
    if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
    return m;
  }

  const ResponsesToolMap& tools_;
  Open open_ = Open::None;
  int index_ = -1;
  std::string item_id_, text_, pending_, reasoning_;
  bool call_custom_ = false;
  std::string call_name_, call_space_, call_id_, call_prompt_name_;
  ordered_json messages_ = ordered_json::array();

 public:
  // The output's chat messages, reasoning included even when nothing followed it.
  ordered_json conversation_turn() {
    if (!reasoning_.empty()) assistant();
    return messages_;
  }
};

class ResponsesExchange : public Exchange {
 public:
  ResponsesExchange(ParsedRequest p, ResponsesTranslation t, const ordered_json& body, ordered_json previous,
                    std::shared_ptr<ResponseStore> store)
      : tools_(std::move(t.tools)), builder_(tools_), store_(std::move(store)) {
    request = std::move(p);
    decoder_ = std::make_unique<ChoiceDecoder>(request);
    id_ = random_id("resp_");
    created_at_ = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
    store_this_ = store_ && store_->capacity() > 0;
    if (const ordered_json* s = field(body, "store")) store_this_ = store_this_ && s->get<bool>();
    conversation_ = std::move(previous);
    for (const ordered_json& m : t.input_messages) conversation_.push_back(m);
    echo_ = echo_fields(body);
  }

  void add(int, const RequestEvent& e) override { take(e); }

  json body(const Usage& usage) override {
    builder_.close();
    json r = response(final_status(), usage);
    keep(r);
    return r;
  }

  std::string stream_begin(const Usage&) override {
    builder_.emit = [this](const std::string& type, json fields) { out_ += event(type, std::move(fields)); };
    json r = response("in_progress", std::nullopt);
    std::string s = event("response.created", {{"response", r}});
    s += event("response.in_progress", {{"response", r}});
    return s;
  }

  std::string stream_event(int, const RequestEvent& e) override {
    take(e);
    return std::exchange(out_, {});
  }

  std::string stream_end(const Usage& usage) override {
    builder_.close();
    const std::string status = final_status();
    json r = response(status, usage);
    keep(r);
    out_ += event(status == "completed" ? "response.completed" : status == "incomplete" ? "response.incomplete"
                                                                                          : "response.failed",
                  {{"response", r}});
    return std::exchange(out_, {});
  }

  std::string stream_error(const ErrorInfo& error, const Usage& usage) override {
    builder_.emit = nullptr;  // the open item stays as it was: the response failed
    builder_.close();
    const std::string code = !error.code.empty() ? error.code : !error.type.empty() ? error.type : "server_error";
    out_ += event("error", {{"code", code}, {"message", error.message},
                            {"param", error.param.empty() ? json(nullptr) : json(error.param)}});
    failure_ = {{"code", code}, {"message", error.message}};
    out_ += event("response.failed", {{"response", response("failed", usage)}});
    return std::exchange(out_, {});
  }

  int64_t completion_tokens() const override { return decoder_->completion_tokens(); }

 private:
  void take(const RequestEvent& e) {
    bool reasoning = false;
    for (const chat::ChatDelta& d : decoder_->take(e)) {
      if (d.kind == chat::ChatDelta::Kind::Reasoning && !d.text.empty()) reasoning = true;
      builder_.add(d);
    }
    if (reasoning && e.token >= 0) ++reasoning_tokens_;
    if (e.finished) {
      if (e.reason == FinishReason::Error || e.reason == FinishReason::Cancelled)
        failure_ = {{"code", e.reason == FinishReason::Error ? "server_error" : "cancelled"},
                    {"message", e.message.empty() ? std::string(openai_finish_reason(e.reason)) : e.message}};
    }
  }

  std::string final_status() const {
    if (!failure_.is_null()) return "failed";
    switch (decoder_->reason()) {
      case FinishReason::Eos:
      case FinishReason::StopString: return "completed";
      case FinishReason::MaxTokens:
      case FinishReason::ContextLength:
      case FinishReason::KvCacheFull: return "incomplete";
      default: return "failed";
    }
  }

  std::string event(const std::string& type, json fields) {
    fields["type"] = type;
    fields["sequence_number"] = sequence_++;
    return "event: " + type + "\ndata: " + fields.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  static json echo_fields(const ordered_json& body) {
    auto get = [&](const char* k, json fallback) {
      const ordered_json* v = field(body, k);
      return v ? json(*v) : fallback;
    };
    json e;
    e["instructions"] = get("instructions", nullptr);
    e["tools"] = get("tools", json::array());
    e["tool_choice"] = get("tool_choice", "auto");
    e["parallel_tool_calls"] = get("parallel_tool_calls", true);
    e["max_output_tokens"] = get("max_output_tokens", nullptr);
    e["previous_response_id"] = get("previous_response_id", nullptr);
    e["store"] = get("store", true);
    e["metadata"] = get("metadata", json::object());
    json text = get("text", json::object());
    if (!text.contains("format")) text["format"] = {{"type", "text"}};
    e["text"] = text;
    json reasoning = get("reasoning", json::object());
    if (!reasoning.contains("effort")) reasoning["effort"] = nullptr;
    if (!reasoning.contains("summary")) reasoning["summary"] = nullptr;
    e["reasoning"] = reasoning;
    e["truncation"] = get("truncation", "disabled");
    e["user"] = get("user", nullptr);
    e["background"] = false;
    return e;
  }

  json response(const std::string& status, std::optional<Usage> usage) const {
    json r = {{"id", id_}, {"object", "response"}, {"created_at", created_at_}, {"status", status},
              {"model", request.model}};
    for (auto it = echo_.begin(); it != echo_.end(); ++it) r[it.key()] = *it;
    r["temperature"] = request.request.sampling.temperature;
    r["top_p"] = request.request.sampling.top_p;
    r["output"] = status == "in_progress" ? json::array() : builder_.items;
    r["error"] = status == "failed" ? failure_ : json(nullptr);
    r["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
    if (usage)
      r["usage"] = {{"input_tokens", usage->prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", usage->cached_tokens}}},
                    {"output_tokens", usage->completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
                    {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
    else
      r["usage"] = nullptr;
    return r;
  }

  // A finished response (completed or incomplete) joins the store with its conversation.
  void keep(const json& r) {
    if (!store_this_ || r["status"] == "failed") return;
    ordered_json conversation = conversation_;
    for (const ordered_json& m : builder_.conversation_turn()) conversation.push_back(m);
    store_->put(id_, {std::move(conversation), r});
  }

  ResponsesToolMap tools_;
  OutputBuilder builder_;
  std::unique_ptr<ChoiceDecoder> decoder_;
  std::shared_ptr<ResponseStore> store_;
  bool store_this_ = false;
  ordered_json conversation_;
  json echo_;
  std::string id_;
  int64_t created_at_ = 0;
  int64_t sequence_ = 0;
  int64_t reasoning_tokens_ = 0;
  json failure_;  // {code, message} of a failed response
  std::string out_;
};

}  // namespace

ResponsesApi::ResponsesApi(const ServingContext& ctx, size_t store_capacity)
    : ctx_(ctx), store_(std::make_shared<ResponseStore>(store_capacity)) {}

std::unique_ptr<Exchange> ResponsesApi::parse(const json& body, std::string_view raw) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  // The request's key order (tools' and schemas' properties show in the prompt in that order).
  ordered_json ob = raw.empty() ? ordered_json(body) : ordered_json::parse(raw, nullptr, false);
  if (!ob.is_object()) ob = ordered_json(body);

  ordered_json previous = ordered_json::array();
  if (const ordered_json* prev = field(ob, "previous_response_id")) {
    if (!prev->is_string()) bad_field("previous_response_id", "'previous_response_id' must be a string");
    if (store_->capacity() == 0)
      bad_field("previous_response_id", "this server stores no responses (start it with --responses-store N): "
                                  "send the whole conversation as 'input'");
    auto entry = store_->get(prev->get<std::string>());
    if (!entry) {
      ApiError e = not_found(prev->get<std::string>());
      throw ApiError(404, e.what(), "previous_response_id", e.type, e.code);
    }
    previous = std::move(entry->conversation);
  }
  ResponsesTranslation t;
  ParsedRequest p;
  try {
    t = translate_responses_request(ob, previous);
    p = chat_request(Endpoint::Responses, std::move(t.fields), ctx_);
  } catch (const ContextLengthError& e) {
    throw ContextLengthError(e.what(), "input", e.prompt_tokens, e.limit);
  } catch (const ApiError& e) {
    // The chat endpoint's names, as the client wrote them.
    std::string param = e.param;
    if (param == "messages") param = "input";
    else if (param == "max_tokens") param = "max_output_tokens";
    else if (param == "response_format") param = "text.format";
    else if (param == "chat_template_kwargs") param = "reasoning";
    throw ApiError(e.status, e.what(), param, e.type, e.code);
  }
  return std::make_unique<ResponsesExchange>(std::move(p), std::move(t), ob, std::move(previous), store_);
}

json ResponsesApi::error_body(const ErrorInfo& error) const {
  return server::error_body(error.status, error.message, error.param, error.type, error.code);
}

json ResponsesApi::get(const std::string& id) {
  auto entry = store_->get(id);
  if (!entry) throw not_found(id);
  return entry->response;
}

json ResponsesApi::remove(const std::string& id) {
  if (!store_->remove(id)) throw not_found(id);
  return {{"id", id}, {"object", "response"}, {"deleted", true}};
}

}  // namespace mla::server
