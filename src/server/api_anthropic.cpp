// Anthropic's Messages API over the shared request path (see api_anthropic.h).
#include "server/api_anthropic.h"

#include <cstdio>
#include <optional>
#include <random>

#include "server/choice.h"

namespace mla::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

std::string random_id(const char* prefix) {
  static constexpr char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % 62];
  return id;
}

// The text of a string or of a list of text blocks (joined by "\n"); where: the field, for errors.
// Image and document blocks are refused (400: this model reads text), except in a tool result
// (placeholders): there an agent put them (Claude Code's Read of a PNG), and as it sends the
// whole conversation again every turn, a 400 would end every later turn of the session too.
// The placeholder tells the model what it cannot see.
std::string text_of(const ordered_json& content, const std::string& where, bool placeholders = false) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(where, "'" + where + "' must be a string or a list of text blocks");
  std::string text;
  bool first = true;
  for (const ordered_json& b : content) {
    if (!b.is_object()) bad_field(where, "'" + where + "' must be a string or a list of text blocks");
    const std::string type = b.value("type", "");
    if ((type == "image" || type == "document") && placeholders) {
      if (!first) text += "\n";
      text += "[" + type + " omitted: this model reads text only]";
      first = false;
      continue;
    }
    if (type == "image" || type == "document")
      bad_field(where, "'" + where + "' has a block of type \"" + type + "\": this model takes text only");
    const ordered_json* t = field(b, "text");
    if (type != "text" || !t || !t->is_string())
      bad_field(where, "'" + where + "' must be a string or a list of text blocks, got " + brief_json(b));
    if (!first) text += "\n";
    text += t->get<std::string>();
    first = false;
  }
  return text;
}

// One Messages turn as chat messages, appended to out.
void translate_turn(const ordered_json& m, size_t i, ordered_json& out) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) bad_field("messages", where + " must be an object");
  const ordered_json* role_v = field(m, "role");
  if (!role_v || !role_v->is_string()) bad_field("messages", where + ".role must be a string");
  const std::string role = role_v->get<std::string>();
  if (role != "user" && role != "assistant" && role != "system")
    bad_field("messages", where + ".role must be \"user\" or \"assistant\", got \"" + role + "\"");
  const ordered_json* content = field(m, "content");
  if (!content) bad_field("messages", where + ".content is required");
  if (role == "system") {
    out.push_back({{"role", "system"}, {"content", text_of(*content, where + ".content")}});
    return;
  }
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) bad_field("messages", where + ".content must be a string or a list of content blocks");

  std::string text, reasoning;
  bool has_text = false;
  ordered_json tool_calls = ordered_json::array();
  ordered_json tool_results = ordered_json::array();
  for (size_t k = 0; k < content->size(); ++k) {
    const ordered_json& b = (*content)[k];
    const std::string at = where + ".content[" + std::to_string(k) + "]";
    if (!b.is_object()) bad_field("messages", at + " must be a content block object");
    const ordered_json* type_v = field(b, "type");
    if (!type_v || !type_v->is_string()) bad_field("messages", at + ".type must be a string");
    const std::string type = type_v->get<std::string>();
    if (type == "text") {
      const ordered_json* t = field(b, "text");
      if (!t || !t->is_string()) bad_field("messages", at + ".text must be a string");
      if (has_text) text += "\n";
      text += t->get<std::string>();
      has_text = true;
    } else if (type == "image" || type == "document") {
      bad_field("messages", at + " is of type \"" + type + "\": this model takes text only");
    } else if (type == "thinking" && role == "assistant") {
      const ordered_json* t = field(b, "thinking");
      if (!t || !t->is_string()) bad_field("messages", at + ".thinking must be a string");
      reasoning += t->get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Opaque to this model: nothing to show it.
    } else if (type == "tool_use" && role == "assistant") {
      const ordered_json* id = field(b, "id");
      const ordered_json* name = field(b, "name");
      const ordered_json* input = field(b, "input");
      if (!id || !id->is_string()) bad_field("messages", at + ".id must be a string");
      if (!name || !name->is_string()) bad_field("messages", at + ".name must be a string");
      if (input && !input->is_object()) bad_field("messages", at + ".input must be an object");
      tool_calls.push_back({{"id", *id},
                            {"type", "function"},
                            {"function", {{"name", *name}, {"arguments", input ? input->dump() : "{}"}}}});
    } else if (type == "tool_result" && role == "user") {
      const ordered_json* id = field(b, "tool_use_id");
      if (!id || !id->is_string()) bad_field("messages", at + ".tool_use_id must be a string");
      std::string result;
      if (const ordered_json* c = field(b, "content")) result = text_of(*c, at + ".content", /*placeholders=*/true);
      if (const ordered_json* e = field(b, "is_error")) {
        if (!e->is_boolean()) bad_field("messages", at + ".is_error must be a boolean");
        // The model sees that the call failed, not only what it printed.
        if (e->get<bool>()) result = "Error: " + result;
      }
      tool_results.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else {
      bad_field("messages", at + " is of type \"" + type + "\", which a " + role + " turn of this server does not take");
    }
  }
  if (role == "user") {
    // A tool's results answer the assistant's calls, so they come before the user's new text.
    for (auto& r : tool_results) out.push_back(std::move(r));
    if (has_text || tool_results.empty()) out.push_back({{"role", "user"}, {"content", text}});
    return;
  }
  ordered_json a = {{"role", "assistant"}};
  // Content null with calls: the templates write the calls of a turn without text that way.
  a["content"] = has_text || tool_calls.empty() ? ordered_json(text) : ordered_json(nullptr);
  if (!reasoning.empty()) a["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) a["tool_calls"] = std::move(tool_calls);
  out.push_back(std::move(a));
}

ordered_json translate_tools(const ordered_json& tools) {
  if (!tools.is_array()) bad_field("tools", "'tools' must be a list of tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) bad_field("tools", at + " must be an object");
    if (const ordered_json* type = field(t, "type")) {
      if (!type->is_string()) bad_field("tools", at + ".type must be a string");
      // The server tools (web_search_…, code_execution_…, ...) run at Anthropic: none here.
      if (type->get<std::string>() != "custom") continue;
    }
    const ordered_json* name = field(t, "name");
    if (!name || !name->is_string()) bad_field("tools", at + ".name must be a string");
    ordered_json fn = {{"name", *name}};
    if (const ordered_json* d = field(t, "description")) {
      if (!d->is_string()) bad_field("tools", at + ".description must be a string");
      fn["description"] = *d;
    }
    const ordered_json* schema = field(t, "input_schema");
    if (schema && !schema->is_object()) bad_field("tools", at + ".input_schema must be an object");
    fn["parameters"] = schema ? *schema : ordered_json({{"type", "object"}, {"properties", ordered_json::object()}});
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// tool_choice as chat's, into a (its tools already set): auto and none without tools mean no
// calls and are dropped; disable_parallel_tool_use allows one call.
std::optional<ToolChoice> translate_tool_choice(const ordered_json& c, AgentFields& a) {
  using K = ToolChoice::Kind;
  if (!c.is_object()) bad_field("tool_choice", "'tool_choice' must be an object with a \"type\"");
  const ordered_json* type_v = field(c, "type");
  if (!type_v || !type_v->is_string()) bad_field("tool_choice", "'tool_choice.type' must be a string");
  const std::string type = type_v->get<std::string>();
  if (const ordered_json* d = field(c, "disable_parallel_tool_use")) {
    if (!d->is_boolean()) bad_field("tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean");
    if (d->get<bool>() && a.has_tools()) a.parallel_tool_calls = false;
  }
  if (type == "auto" || type == "none") {
    if (a.has_tools()) return ToolChoice{type == "auto" ? K::Auto : K::None, {}};
    return std::nullopt;
  }
  if (type == "any") return ToolChoice{K::Required, {}};
  if (type == "tool") {
    const ordered_json* name = field(c, "name");
    if (!name || !name->is_string()) bad_field("tool_choice", "'tool_choice' of type \"tool\" needs a string \"name\"");
    return ToolChoice{K::Named, name->get<std::string>()};
  }
  bad_field("tool_choice", "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", got \"" + type + "\"");
}

// FNV-1a, 64 bits: stable across runs and builds (std::hash is not promised to be).
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

const char* stop_reason(FinishReason r, int calls) {
  if (calls > 0) return "tool_use";
  switch (r) {
    case FinishReason::StopString: return "stop_sequence";
    case FinishReason::MaxTokens:
    case FinishReason::ContextLength:
    case FinishReason::KvCacheFull: return "max_tokens";
    default: return "end_turn";
  }
}

json usage_json(const Usage& u, bool with_output) {
  json j = {{"input_tokens", u.prompt_tokens - u.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", u.cached_tokens}};
  j["output_tokens"] = with_output ? u.completion_tokens : 0;
  return j;
}

std::string sse(const char* event, const json& data) {
  return std::string("event: ") + event + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n\n";
}

// The content blocks of one message as Anthropic streams them: a choice's chat deltas become
// content_block_start / content_block_delta / content_block_stop events. A text block opens only
// once its text has more than whitespace (the whitespace a model writes between its thinking and
// a call is no block of its own); a thinking block ends with its signature_delta.
class BlockStream {
 public:
  // The events the deltas make (data objects; each has its "type").
  void take(const std::vector<chat::ChatDelta>& deltas, std::vector<json>& out) {
    for (const chat::ChatDelta& d : deltas) {
      switch (d.kind) {
        case chat::ChatDelta::Kind::Reasoning:
          if (d.text.empty()) break;
          if (open_ != Open::Thinking) {
            close(out);
            start(Open::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
          }
          thinking_ += d.text;
          delta({{"type", "thinking_delta"}, {"thinking", d.text}}, out);
          break;
        case chat::ChatDelta::Kind::Content:
          if (open_ == Open::Text) {
            if (!d.text.empty()) delta({{"type", "text_delta"}, {"text", d.text}}, out);
            break;
          }
          pending_ += d.text;
          if (pending_.find_first_not_of(" \t\r\n") != std::string::npos) {
            std::string text = std::move(pending_);
            close(out);  // clears pending_
            start(Open::Text, {{"type", "text"}, {"text", ""}}, out);
            delta({{"type", "text_delta"}, {"text", std::move(text)}}, out);
          }
          break;
        case chat::ChatDelta::Kind::CallStart:
          close(out);
          start(Open::ToolUse,
                {{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", d.name}, {"input", json::object()}}, out);
          break;
        case chat::ChatDelta::Kind::Arguments:
          if (open_ == Open::ToolUse && !d.text.empty())
            delta({{"type", "input_json_delta"}, {"partial_json", d.text}}, out);
          break;
      }
    }
  }
  // Ends the open block, if any.
  void close(std::vector<json>& out) {
    pending_.clear();
    if (open_ == Open::None) return;
    if (open_ == Open::Thinking) delta({{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}}, out);
    out.push_back({{"type", "content_block_stop"}, {"index", index_}});
    open_ = Open::None;
    thinking_.clear();
    ++index_;
  }

 private:
  enum class Open { None, Thinking, Text, ToolUse };
  void start(Open kind, json block, std::vector<json>& out) {
    open_ = kind;
    out.push_back({{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }
  void delta(json d, std::vector<json>& out) {
    out.push_back({{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  }
  Open open_ = Open::None;
  int index_ = 0;
  std::string thinking_, pending_;
};

// A message's content from its block events, as a client assembles it.
class BlockGatherer {
 public:
  void apply(const json& e) {
    const std::string type = e["type"];
    if (type == "content_block_start") {
      blocks_.push_back(e["content_block"]);
      partial_json_.clear();
    } else if (type == "content_block_delta") {
      json& b = blocks_.back();
      const json& d = e["delta"];
      const std::string kind = d["type"];
      if (kind == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      else if (kind == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (kind == "signature_delta") b["signature"] = d["signature"];
      else if (kind == "input_json_delta") partial_json_ += d["partial_json"].get<std::string>();
    } else if (type == "content_block_stop") {
      json& b = blocks_.back();
      if (b["type"] == "tool_use" && !partial_json_.empty()) {
        // The tool parser checked the arguments are a JSON object; should they not parse, the
        // input stays {} rather than failing the response.
        json input = json::parse(partial_json_, nullptr, false);
        if (input.is_object()) b["input"] = std::move(input);
      }
    }
  }
  json content() const {
    if (blocks_.empty()) return json::array({{{"type", "text"}, {"text", ""}}});
    return blocks_;
  }

 private:
  json blocks_ = json::array();
  std::string partial_json_;
};

class MessagesExchange : public Exchange {
 public:
  MessagesExchange(ParsedRequest p) : id_(random_id("msg_")) {
    request = std::move(p);
    decoder_.emplace(request);
  }

  void add(int, const RequestEvent& e) override {
    std::vector<json> events;
    take(e, events);
    for (const json& ev : events) gathered_.apply(ev);
  }

  json body(const Usage& usage) override {
    return {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", request.model},
            {"content", gathered_.content()},
            {"stop_reason", stop_reason(decoder_->reason(), decoder_->calls())},
            {"stop_sequence", stop_sequence()},
            {"usage", usage_json(usage, true)}};
  }

  std::string stream_begin(const Usage& usage) override {
    json message = {{"id", id_},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", request.model},
                    {"content", json::array()},
                    {"stop_reason", nullptr},
                    {"stop_sequence", nullptr},
                    {"usage", usage_json(usage, false)}};
    return sse("message_start", {{"type", "message_start"}, {"message", std::move(message)}});
  }

  std::string stream_event(int, const RequestEvent& e) override {
    std::vector<json> events;
    take(e, events);
    std::string out;
    for (const json& ev : events) out += sse(ev["type"].get_ref<const std::string&>().c_str(), ev);
    return out;
  }

  std::string stream_end(const Usage& usage) override {
    std::vector<json> events;
    blocks_.close(events);  // normally closed by the last event already
    std::string out;
    for (const json& ev : events) out += sse(ev["type"].get_ref<const std::string&>().c_str(), ev);
    json u = usage_json(usage, true);
    out += sse("message_delta",
               {{"type", "message_delta"},
                {"delta",
                 {{"stop_reason", stop_reason(decoder_->reason(), decoder_->calls())}, {"stop_sequence", stop_sequence()}}},
                {"usage", u}});
    out += sse("message_stop", {{"type", "message_stop"}});
    return out;
  }

  std::string stream_error(const ErrorInfo& error, const Usage&) override {
    return sse("error", {{"type", "error"}, {"error", {{"type", anthropic_error_type(error.status)}, {"message", error.message}}}});
  }

  std::string stream_keepalive() override { return sse("ping", {{"type", "ping"}}); }

  int64_t completion_tokens() const override { return decoder_->completion_tokens(); }

 private:
  void take(const RequestEvent& e, std::vector<json>& events) {
    blocks_.take(decoder_->take(e), events);
    if (e.finished) {
      blocks_.close(events);
      if (e.reason == FinishReason::StopString) matched_stop_ = e.stop_string;
    }
  }

  json stop_sequence() const {
    if (decoder_->calls() > 0 || decoder_->reason() != FinishReason::StopString) return nullptr;
    if (!matched_stop_.empty()) return matched_stop_;
    // An engine that did not say which matched: with one stop string there is no doubt.
    if (request.request.stop.size() == 1) return request.request.stop[0];
    return nullptr;
  }

  std::string id_;
  std::optional<ChoiceDecoder> decoder_;
  BlockStream blocks_;
  BlockGatherer gathered_;
  std::string matched_stop_;
};

// body with its key order: raw's parse when given (tools' properties keep their order).
ordered_json ordered_body(const json& body, std::string_view raw) {
  if (!raw.empty()) {
    ordered_json o = ordered_json::parse(raw, nullptr, false);
    if (o.is_object()) return o;
  }
  return ordered_json(body);
}

}  // namespace

RequestFields read_messages_body(const ordered_json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", {}, "invalid_request_error");
  RequestFields f;
  f.limits.cap_max_tokens = true;
  if (const ordered_json* m = field(body, "model")) {
    if (!m->is_string()) bad_field("model", "'model' must be a string");
    f.model = m->get<std::string>();
  }
  if (const ordered_json* n = field(body, "n"); n && *n != 1) bad_field("n", "'n' must be 1: a message has one answer");
  if (const ordered_json* v = field(body, "max_tokens")) {
    if (!v->is_number_integer()) bad_field("max_tokens", "'max_tokens' must be an integer, got " + brief_json(*v));
    f.limits.max_tokens = get_integer(body, "max_tokens");
  }
  if (const ordered_json* v = field(body, "stream")) {
    if (!v->is_boolean()) bad_field("stream", "'stream' must be a boolean");
    f.stream = v->get<bool>();
  }
  f.sampling.temperature = get_number(body, "temperature");
  f.sampling.top_p = get_number(body, "top_p");
  if (get_number(body, "top_k")) f.sampling.top_k = get_integer(body, "top_k");
  if (const ordered_json* v = field(body, "stop_sequences")) {
    if (!v->is_array()) bad_field("stop_sequences", "'stop_sequences' must be a list of strings");
    for (const ordered_json& s : *v) {
      if (!s.is_string()) bad_field("stop_sequences", "'stop_sequences' must be a list of strings");
      f.stop.push_back(s.get<std::string>());
    }
  }

  ordered_json& messages = f.messages;
  if (const ordered_json* s = field(body, "system")) {
    std::string text = text_of(*s, "system");
    if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
  }
  const ordered_json* turns = field(body, "messages");
  if (!turns) bad_field("messages", "'messages' is required");
  if (!turns->is_array()) bad_field("messages", "'messages' must be a list of messages");
  for (size_t i = 0; i < turns->size(); ++i) translate_turn((*turns)[i], i, messages);

  AgentFields& a = f.agent;
  if (const ordered_json* t = field(body, "tools")) {
    ordered_json tools = translate_tools(*t);
    if (!tools.empty()) a.tools = std::move(tools);
  }
  std::optional<ToolChoice> choice;
  if (const ordered_json* c = field(body, "tool_choice")) choice = translate_tool_choice(*c, a);

  if (const ordered_json* t = field(body, "thinking")) {
    if (!t->is_object()) bad_field("thinking", "'thinking' must be an object with a \"type\"");
    const ordered_json* type_v = field(*t, "type");
    if (!type_v || !type_v->is_string()) bad_field("thinking", "'thinking.type' must be a string");
    const std::string type = type_v->get<std::string>();
    if (const ordered_json* b = field(*t, "budget_tokens"); b && !b->is_number_integer())
      bad_field("thinking", "'thinking.budget_tokens' must be an integer");
    if (type == "enabled" || type == "disabled") {
      const bool on = type == "enabled";
      // Templates name the switch differently (DeepSeek's "thinking", Qwen's and GLM's
      // "enable_thinking"): both are set.
      a.template_kwargs = {{"thinking", on}, {"enable_thinking", on}};
    } else if (type != "adaptive") {
      bad_field("thinking", "'thinking.type' must be \"enabled\", \"disabled\" or \"adaptive\", got \"" + type + "\"");
    }
  }
  if (a.has_tools()) check_tools(a.tools);
  if (choice) set_tool_choice(a, std::move(*choice));
  return f;
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    case 504: return "timeout_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string thinking_signature(std::string_view thinking) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "mla-%016llx", (unsigned long long)fnv1a(thinking));
  return buf;
}

std::unique_ptr<Exchange> AnthropicMessages::parse(const json& body, std::string_view raw) {
  RequestFields fields = read_messages_body(ordered_body(body, raw));
  ParsedRequest p;
  try {
    p = chat_request(Endpoint::Messages, std::move(fields), ctx_);
  } catch (const ContextLengthError& e) {
    // Anthropic's wording, which its clients read to compact the conversation.
    throw ApiError(400,
                   "prompt is too long: " + std::to_string(e.prompt_tokens) + " tokens > " + std::to_string(e.limit) +
                       " maximum",
                   "messages", "invalid_request_error");
  }
  return std::make_unique<MessagesExchange>(std::move(p));
}

json AnthropicMessages::error_body(const ErrorInfo& error) const {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(error.status)}, {"message", error.message}}}};
}

json AnthropicMessages::count_tokens(const json& body, std::string_view raw) const {
  RequestFields f = read_messages_body(ordered_body(body, raw));
  if (ctx_.chat_format.empty()) bad_field("messages", "the model has no chat template");
  f.agent.template_kwargs = template_kwargs(ctx_, f.agent.template_kwargs);
  const std::string prompt = render_messages(f.messages, f.agent, ctx_);
  return {{"input_tokens", int64_t(ctx_.tokenizer->encode(prompt, false).size())}};
}

}  // namespace mla::server
