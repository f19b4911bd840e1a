// OpenAI's request bodies and response shapes (see openai.h).
#include "server/openai.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <set>

namespace mla::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

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

ToolChoice parse_tool_choice(const ordered_json& v) {
  ToolChoice c;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") c.kind = ToolChoice::Kind::None;
    else if (s == "auto") c.kind = ToolChoice::Kind::Auto;
    else if (s == "required") c.kind = ToolChoice::Kind::Required;
    else bad_field("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got \"" + s + "\"");
    return c;
  }
  if (v.is_object()) {
    auto type = v.find("type");
    auto f = v.find("function");
    if (type == v.end() || *type != "function" || f == v.end() || !f->is_object() || !f->contains("name") ||
        !(*f)["name"].is_string())
      bad_field("tool_choice", "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}");
    c.kind = ToolChoice::Kind::Named;
    c.name = (*f)["name"].get<std::string>();
    return c;
  }
  bad_field("tool_choice", "'tool_choice' must be a string or an object, got " + brief_json(v));
}

std::vector<int32_t> completion_prompt(const json& body, const ServingContext& ctx) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad_field("prompt", "'prompt' is required");
  const json& p = *it;
  auto encode = [&](const std::string& text) {
    if (text.empty()) bad_field("prompt", "the prompt is empty");
    return ctx.tokenizer->encode(text, true);
  };
  if (p.is_string()) return encode(p.get<std::string>());
  if (p.is_array()) {
    if (p.empty()) bad_field("prompt", "the prompt is empty");
    if (p.size() == 1 && p[0].is_string()) return encode(p[0].get<std::string>());
    if (p[0].is_string() || p[0].is_array())
      bad_field("prompt", "one prompt per request: batched prompts are not supported (send one request each)");
    std::vector<int32_t> ids;
    const int64_t vocab = int64_t(ctx.tokenizer->vocab_size());
    for (const json& x : p) {
      if (!x.is_number_integer()) bad_field("prompt", "'prompt' must be a string or a list of token ids, got " + brief_json(x));
      int64_t id = x.get<int64_t>();
      if (id < 0 || id >= vocab)
        bad_field("prompt", "prompt token " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab));
      ids.push_back(int32_t(id));
    }
    return ids;
  }
  bad_field("prompt", "'prompt' must be a string or a list of token ids, got " + brief_json(p));
}

// The messages of a chat completions body, checked: each an object with a string role, its
// content a string, null or a list of text parts (joined by "\n").
ordered_json chat_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad_field("messages", "'messages' is required");
  if (!it->is_array()) bad_field("messages", "'messages' must be a list of messages");
  if (it->empty()) bad_field("messages", "'messages' is empty");
  json messages = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_field("messages", where + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad_field("messages", where + ".role must be a string");
    json out = m;  // other keys (name, tool_calls ...) go to the template as they are
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      out["content"] = nullptr;
    } else if (content->is_string()) {
      // as is
    } else if (content->is_array()) {
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad_field("messages", where + ".content: only parts of type \"text\" with a string \"text\" are supported");
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else {
      bad_field("messages", where + ".content must be a string or a list of text parts");
    }
    messages.push_back(std::move(out));
  }
  return ordered_json(messages);
}

json usage_object(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

}  // namespace

json error_body(int status, const std::string& message, const std::string& param, const std::string& type,
                const std::string& code) {
  json e = {{"message", message},
            {"type", type.empty() ? default_error_type(status) : type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return {{"error", e}};
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
    bad_field(k, "'" + k + "' is not supported by this server" + hint);
  }
}

AgentFields parse_agent_fields(Endpoint endpoint, const json& body, const ordered_json* ordered,
                               const json& template_kwarg_defaults, int64_t vocab_size) {
  AgentFields a;
  const ordered_json ob = ordered ? ordered_json() : ordered_json(body);
  const ordered_json& o = ordered ? *ordered : ob;
  const bool chat = endpoint == Endpoint::ChatCompletions;

  // n: choices sampled from one prompt.
  if (const ordered_json* n = field(o, "n")) {
    if (!n->is_number_integer()) bad_field("n", "'n' must be an integer, got " + brief_json(*n));
    a.n = n->get<int64_t>();
    if (a.n < 1 || a.n > 16) bad_field("n", "'n' must be in [1, 16], got " + brief_json(*n));
  }

  // logprobs: chat {logprobs: bool, top_logprobs: 0..20}; completions {logprobs: 0..20}.
  if (chat) {
    bool want = false;
    if (const ordered_json* lp = field(o, "logprobs")) {
      if (!lp->is_boolean()) bad_field("logprobs", "'logprobs' must be a boolean, got " + brief_json(*lp));
      want = lp->get<bool>();
    }
    int64_t top = 0;
    if (const ordered_json* t = field(o, "top_logprobs")) {
      if (!t->is_number_integer()) bad_field("top_logprobs", "'top_logprobs' must be an integer, got " + brief_json(*t));
      top = t->get<int64_t>();
      if (top < 0 || top > 20) bad_field("top_logprobs", "'top_logprobs' must be in [0, 20], got " + brief_json(*t));
      if (!want) bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (want) a.logprobs = int32_t(top);
  } else if (const ordered_json* lp = field(o, "logprobs")) {
    if (lp->is_boolean() && !lp->get<bool>()) {
    } else {
      if (!lp->is_number_integer()) bad_field("logprobs", "'logprobs' must be an integer in [0, 20], got " + brief_json(*lp));
      const int64_t k = lp->get<int64_t>();
      if (k < 0 || k > 20) bad_field("logprobs", "'logprobs' must be in [0, 20], got " + brief_json(*lp));
      a.logprobs = int32_t(k);
    }
  }

  if (const ordered_json* lb = field(o, "logit_bias")) {
    if (!lb->is_object()) bad_field("logit_bias", "'logit_bias' must be an object of token id -> bias");
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
        bad_field("logit_bias", "'logit_bias' key \"" + key + "\" is not a token id of this model (0.." +
                                    std::to_string(vocab_size - 1) + ")");
      if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < -100 || it->get<double>() > 100)
        bad_field("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " + brief_json(*it));
      a.logit_bias.push_back({int32_t(id), it->get<float>()});
    }
  }
  if (!chat) return a;

  if (const ordered_json* t = field(o, "tools")) {
    check_tools(*t);
    a.tools = *t;
  }
  if (const ordered_json* c = field(o, "tool_choice")) set_tool_choice(a, parse_tool_choice(*c));
  if (const ordered_json* p = field(o, "parallel_tool_calls")) {
    if (!p->is_boolean()) bad_field("parallel_tool_calls", "'parallel_tool_calls' must be a boolean, got " + brief_json(*p));
    a.parallel_tool_calls = p->get<bool>();
  }

  if (const ordered_json* rf = field(o, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad_field("response_format", "'response_format' must be an object with a 'type'");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "text") {
      a.format = ResponseFormat::Text;
    } else if (type == "json_object") {
      a.format = ResponseFormat::JsonObject;
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        bad_field("response_format", "'response_format' of type json_schema needs a 'json_schema' object");
      for (auto it = js->begin(); it != js->end(); ++it)
        if (it.key() != "name" && it.key() != "description" && it.key() != "schema" && it.key() != "strict")
          bad_field("response_format", "'response_format.json_schema." + it.key() + "' is not a field of a json_schema format");
      set_json_schema(a, field(*js, "schema"), field(*js, "strict"));
    } else {
      bad_field("response_format", "'response_format.type' must be text, json_object or json_schema, got \"" + type + "\"");
    }
    check_format_and_choice(a);
  }

  a.template_kwargs = template_kwarg_defaults.is_object() ? template_kwarg_defaults : json::object();
  if (const ordered_json* k = field(o, "chat_template_kwargs")) {
    if (!k->is_object()) bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto it = k->begin(); it != k->end(); ++it) {
      static const std::set<std::string> reserved = {"messages", "tools", "add_generation_prompt", "documents",
                                                     "bos_token", "eos_token"};
      if (reserved.count(it.key()))
        bad_field("chat_template_kwargs", "'chat_template_kwargs." + it.key() + "' is set by the server, not the request");
      a.template_kwargs[it.key()] = json(*it);
    }
  }
  return a;
}

ParsedRequest parse_request(Endpoint endpoint, const json& body, const ServingContext& ctx, std::string_view raw_body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_known_fields(endpoint, body);
  RequestFields f;
  if (auto model = get_string(body, "model"); model && *model != ctx.model_name)
    throw ApiError(404, "the model '" + *model + "' does not exist; this server serves '" + ctx.model_name + "'",
                   "model", "not_found_error", "model_not_found");
  f.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_field("stream_options", "'stream_options' must be an object");
    f.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  if (auto b = get_integer(body, "best_of"); b && *b != 1) bad_field("best_of", "only best_of = 1 is supported");
  if (get_bool(body, "echo").value_or(false)) bad_field("echo", "echo is not supported");
  if (auto t = get_number(body, "timeout")) {
    if (!(*t > 0) || *t > 1e6) bad_field("timeout", "'timeout' must be a number of seconds in (0, 1e6]");
    f.timeout_seconds = *t;
  }
  {
    // Tools and schemas keep the request's key order (their properties' order shows in the
    // prompt and in the output the grammar allows).
    std::optional<ordered_json> ordered;
    if (!raw_body.empty() && (body.contains("tools") || body.contains("response_format")))
      ordered = ordered_json::parse(raw_body, nullptr, false);
    f.agent = parse_agent_fields(endpoint, body, ordered && ordered->is_object() ? &*ordered : nullptr,
                                 ctx.chat_template_kwargs, ctx.logit_rows());
  }
  f.sampling = read_sampling_fields(body);
  f.stop = read_stop(body);
  f.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  f.limits.max_tokens = get_integer(body, "max_tokens");
  if (endpoint == Endpoint::ChatCompletions)
    if (auto m = get_integer(body, "max_completion_tokens")) f.limits.max_tokens = m;
  f.limits.ignore_eos = get_bool(body, "ignore_eos").value_or(false);

  // Everything else is checked before the (possibly long) tokenisation.
  const OutputLimits limits = f.limits;
  ParsedRequest p = start_request(endpoint, std::move(f), ctx);
  if (endpoint == Endpoint::Completions) p.request.prompt = completion_prompt(body, ctx);
  else render_prompt(p, chat_messages(body), ctx);
  finish_request(p, limits, ctx);
  return p;
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::Eos:
    case FinishReason::StopString: return "stop";
    case FinishReason::MaxTokens:
    case FinishReason::ContextLength:
    case FinishReason::KvCacheFull: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "error";
}

json completion_response(const ParsedRequest& p, const std::string& id, int64_t created, const std::string& text,
                         const char* finish_reason, const Usage& usage) {
  json choice;
  if (p.endpoint == Endpoint::Completions)
    choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  else
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", text}}},
              {"logprobs", nullptr},
              {"finish_reason", finish_reason}};
  return {{"id", id},
          {"object", p.endpoint == Endpoint::Completions ? "text_completion" : "chat.completion"},
          {"created", created},
          {"model", p.model},
          {"choices", json::array({choice})},
          {"usage", usage_object(usage)}};
}

json stream_chunk(const ParsedRequest& p, const std::string& id, int64_t created, const std::string& text,
                  const char* finish_reason, bool role_only) {
  json reason = finish_reason ? json(finish_reason) : json(nullptr);
  json choice;
  if (p.endpoint == Endpoint::Completions) {
    choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", reason}};
  } else {
    json delta = json::object();
    if (role_only) delta = {{"role", "assistant"}, {"content", ""}};
    else if (!text.empty() || !finish_reason) delta = {{"content", text}};
    choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", reason}};
  }
  return {{"id", id},
          {"object", p.endpoint == Endpoint::Completions ? "text_completion" : "chat.completion.chunk"},
          {"created", created},
          {"model", p.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const ParsedRequest& p, const std::string& id, int64_t created, const Usage& usage) {
  return {{"id", id},
          {"object", p.endpoint == Endpoint::Completions ? "text_completion" : "chat.completion.chunk"},
          {"created", created},
          {"model", p.model},
          {"choices", json::array()},
          {"usage", usage_object(usage)}};
}

std::string sse_event(const json& j) {
  // Invalid UTF-8 cannot reach here (the detokenizer emits valid UTF-8); replace rather than throw.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string new_response_id(Endpoint endpoint) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffff));
  return std::string(endpoint == Endpoint::Completions ? "cmpl-" : "chatcmpl-") + buf;
}

}  // namespace mla::server
