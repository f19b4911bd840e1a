// OpenAI request parsing and response shapes (see openai.h).
#include "server/openai.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include "chat/reasoning_parser.h"
#include "server/structured.h"
#include "chat/chat_template.h"

namespace mla::server {

using nlohmann::json;

namespace {

std::string default_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// Field readers: absent or null gives nothing; a value of another type is a 400 naming the field.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(name, std::string("'") + name + "' must be a number, got " + brief_json(*v));
  double x = v->get<double>();
  if (!std::isfinite(x)) bad(name, std::string("'") + name + "' must be finite");
  return x;
}

std::optional<int64_t> get_integer(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
      bad(name, std::string("'") + name + "' is too large");
    return v->get<int64_t>();
  }
  if (v->is_number_float()) {  // 5.0 is accepted as 5, as Python's JSON clients may send it
    double x = v->get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return int64_t(x);
  }
  bad(name, std::string("'") + name + "' must be an integer, got " + brief_json(*v));
}

std::optional<bool> get_bool(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(name, std::string("'") + name + "' must be a boolean, got " + brief_json(*v));
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(name, std::string("'") + name + "' must be a string, got " + brief_json(*v));
  return v->get<std::string>();
}

void check_range(const char* name, double x, double lo, double hi, bool lo_open = false) {
  if (x < lo || x > hi || (lo_open && x == lo)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in %s%g, %g], got %g", name, lo_open ? "(" : "[", lo, hi, x);
    bad(name, buf);
  }
}

std::vector<int32_t> completion_prompt(const json& body, const ServingContext& ctx) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad("prompt", "'prompt' is required");
  const json& p = *it;
  auto encode = [&](const std::string& text) {
    if (text.empty()) bad("prompt", "the prompt is empty");
    return ctx.tokenizer->encode(text, true);
  };
  if (p.is_string()) return encode(p.get<std::string>());
  if (p.is_array()) {
    if (p.empty()) bad("prompt", "the prompt is empty");
    if (p.size() == 1 && p[0].is_string()) return encode(p[0].get<std::string>());
    if (p[0].is_string() || p[0].is_array())
      bad("prompt", "one prompt per request: batched prompts are not supported (send one request each)");
    std::vector<int32_t> ids;
    const int64_t vocab = int64_t(ctx.tokenizer->vocab_size());
    for (const json& x : p) {
      if (!x.is_number_integer()) bad("prompt", "'prompt' must be a string or a list of token ids, got " + brief_json(x));
      int64_t id = x.get<int64_t>();
      if (id < 0 || id >= vocab)
        bad("prompt", "prompt token " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab));
      ids.push_back(int32_t(id));
    }
    return ids;
  }
  bad("prompt", "'prompt' must be a string or a list of token ids, got " + brief_json(p));
}

std::string chat_prompt(const json& body, const ServingContext& ctx, const AgentFields& agent) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad("messages", "'messages' is required");
  if (!it->is_array()) bad("messages", "'messages' must be a list of messages");
  if (it->empty()) bad("messages", "'messages' is empty");
  json messages = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad("messages", where + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad("messages", where + ".role must be a string");
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
          bad("messages", where + ".content: only parts of type \"text\" with a string \"text\" are supported");
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else {
      bad("messages", where + ".content must be a string or a list of text parts");
    }
    messages.push_back(std::move(out));
  }
  if (ctx.chat_format.empty()) bad("messages", "the model has no chat template: use /v1/completions");
  try {
    return render_chat_prompt(ctx.chat_format, nlohmann::ordered_json(messages), agent, *ctx.tokenizer, ctx.tool_prompt_syntax());
  } catch (const std::exception& e) {
    bad("messages", std::string("the chat template failed on these messages: ") + e.what());
  }
}

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) bad("stop", "'stop' must be a string or a list of strings");
  if (v->size() > 64) bad("stop", "at most 64 stop strings");
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
    if (s.get_ref<const std::string&>().size() > 4096) bad("stop", "a stop string is longer than 4096 bytes");
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace

json parse_json_body(std::string_view body, size_t max_depth) {
  size_t at = 0;
  if (json_nesting_depth(body, max_depth, &at) > max_depth)
    throw ApiError(400, "the body nests arrays and objects deeper than " + std::to_string(max_depth) +
                            " levels (at byte " + std::to_string(at) + ")");
  try {
    return json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    std::string what = e.what();        // names the byte; its "last read" may quote a long token
    if (what.size() > 200) what = what.substr(0, 197) + "...";
    throw ApiError(400, "the body is not valid JSON: " + what);
  }
}

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string type_, std::string code_)
    : std::runtime_error(message),
      status(status_),
      type(type_.empty() ? default_type(status_) : std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

json error_body(int status, const std::string& message, const std::string& param, const std::string& type,
                const std::string& code) {
  json e = {{"message", message},
            {"type", type.empty() ? default_type(status) : type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return {{"error", e}};
}

ContextLengthError::ContextLengthError(const std::string& message, std::string param, int64_t prompt_tokens_,
                                       int64_t limit_)
    : ApiError(400, message, std::move(param), "invalid_request_error", "context_length_exceeded"),
      prompt_tokens(prompt_tokens_),
      limit(limit_) {}

ParsedRequest parse_request(Endpoint endpoint, const json& body, const ServingContext& ctx, std::string_view raw_body,
                            ParseOptions options) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_known_fields(endpoint, body);
  ParsedRequest p;
  p.endpoint = endpoint;
  p.model = ctx.model_name;
  if (auto model = get_string(body, "model"); model && *model != ctx.model_name && !options.any_model)
    throw ApiError(404, "the model '" + *model + "' does not exist; this server serves '" + ctx.model_name + "'",
                   "model", "not_found_error", "model_not_found");
  p.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    p.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  if (auto b = get_integer(body, "best_of"); b && *b != 1) bad("best_of", "only best_of = 1 is supported");
  if (get_bool(body, "echo").value_or(false)) bad("echo", "echo is not supported");
  if (auto t = get_number(body, "timeout")) {
    if (!(*t > 0) || *t > 1e6) bad("timeout", "'timeout' must be a number of seconds in (0, 1e6]");
    p.timeout_seconds = *t;
  }
  {
    // Tools and schemas keep the request's key order (their properties' order shows in the
    // prompt and in the output the grammar allows).
    std::optional<nlohmann::ordered_json> ordered;
    if (!raw_body.empty() && (body.contains("tools") || body.contains("response_format")))
      ordered = nlohmann::ordered_json::parse(raw_body, nullptr, false);
    const int64_t vocab = ctx.vocab_size > 0 ? ctx.vocab_size : int64_t(ctx.tokenizer->vocab_size());
    p.agent = parse_agent_fields(endpoint, body, ordered && ordered->is_object() ? &*ordered : nullptr,
                                 ctx.chat_template_kwargs, vocab);
  }

  Request& r = p.request;
  SamplingParams& sp = r.sampling;
  if (ctx.generation) sp = ctx.generation->apply(sp);  // the checkpoint's defaults, then the request's
  if (auto t = get_number(body, "temperature")) check_range("temperature", *t, 0, 2), sp.temperature = float(*t);
  if (auto t = get_number(body, "top_p")) check_range("top_p", *t, 0, 1, true), sp.top_p = float(*t);
  if (auto k = get_integer(body, "top_k")) {
    if (*k < -1) bad("top_k", "'top_k' must be -1 or 0 (off) or positive, got " + std::to_string(*k));
    sp.top_k = std::max<int64_t>(*k, 0);
  }
  if (auto m = get_number(body, "min_p")) check_range("min_p", *m, 0, 1), sp.min_p = float(*m);
  if (auto x = get_number(body, "presence_penalty")) check_range("presence_penalty", *x, -2, 2), sp.presence_penalty = float(*x);
  if (auto x = get_number(body, "frequency_penalty"))
    check_range("frequency_penalty", *x, -2, 2), sp.frequency_penalty = float(*x);
  if (auto x = get_number(body, "repetition_penalty")) {
    if (!(*x > 0)) bad("repetition_penalty", "'repetition_penalty' must be positive (1 = off)");
    sp.repetition_penalty = float(*x);
  }
  if (auto seed = get_integer(body, "seed")) {
    sp.seed = uint64_t(*seed);
  } else {
    std::random_device rd;
    sp.seed = (uint64_t(rd()) << 32) ^ rd();
  }
  r.stop = stop_strings(body);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);

  std::optional<int64_t> max_tokens = get_integer(body, "max_tokens");
  if (endpoint == Endpoint::ChatCompletions)
    if (auto m = get_integer(body, "max_completion_tokens")) max_tokens = m;
  if (max_tokens && *max_tokens < 1)
    bad("max_tokens", "'max_tokens' must be at least 1, got " + std::to_string(*max_tokens));

  // Validate everything else before the (possibly long) tokenisation.
  if (endpoint == Endpoint::Completions) {
    r.prompt = completion_prompt(body, ctx);
  } else {
    const AgentFields& a = p.agent;
    if (a.tools_active() && ctx.tool_parser.empty() && a.tool_choice.kind != ToolChoice::Kind::Auto)
      bad("tool_choice", "this model has no tool-call format this server knows (start it with --tool-call-parser)");
    p.prompt_text = chat_prompt(body, ctx, a);
    r.prompt = ctx.tokenizer->encode(p.prompt_text, false);  // the template writes the BOS itself
    if (a.tools_active()) p.tool_parser = ctx.tool_parser;
    p.reasoning_parser = ctx.reasoning_parser;
    p.reasoning_opened = !p.reasoning_parser.empty() && chat::prompt_opens_reasoning(p.prompt_text);
    r.keep_special_token_ids = parser_marker_ids(*ctx.tokenizer, p.tool_parser, p.reasoning_parser);
  }
  r.logprobs = p.agent.logprobs;
  const int64_t n = int64_t(r.prompt.size());
  const char* prompt_param = endpoint == Endpoint::Completions ? "prompt" : "messages";
  if (n == 0) bad(prompt_param, "the prompt is empty");
  // The room of one request: the model's context and what one request can hold in the KV cache
  // (the engine's page budget); 0: unknown.
  int64_t room = ctx.max_sequence_tokens > 0 ? ctx.max_sequence_tokens : 0;
  if (ctx.context_length > 0 && (room == 0 || ctx.context_length < room)) room = ctx.context_length;
  const std::string what = ctx.context_length > 0 && room == ctx.context_length
                               ? "this model's maximum context length of " + std::to_string(room) + " tokens"
                               : "the " + std::to_string(room) + " tokens one request can hold in the KV cache";
  if (room > 0 && n > room)
    throw ContextLengthError("the prompt is " + std::to_string(n) + " tokens, more than " + what, prompt_param, n, room);
  if (max_tokens && room > 0 && options.cap_max_tokens) max_tokens = std::min(*max_tokens, room - n);
  // max_tokens > room - n, not n + max_tokens > room: no overflow for max_tokens up to 2^63 - 1.
  if (max_tokens && room > 0 && *max_tokens > room - n)
    bad("max_tokens", "the request asks for " + std::to_string(n) + " prompt tokens and " +
                          std::to_string(*max_tokens) + " to generate, more than " + what + " (at most " +
                          std::to_string(room - n) + " to generate for this prompt)");
  // Default: generation_config.json's max_new_tokens, else until EOS; never beyond the room.
  int64_t max_new = max_tokens.value_or(ctx.generation ? ctx.generation->max_new_tokens.value_or(-1) : -1);
  if (room > 0 && (max_new < 0 || max_new > room - n)) max_new = room - n;
  if (ctx.max_output_tokens > 0 && (max_new < 0 || max_new > ctx.max_output_tokens)) max_new = ctx.max_output_tokens;
  r.max_new_tokens = max_new;

  if (!get_bool(body, "ignore_eos").value_or(false)) {
    if (ctx.generation) r.eos_token_ids = ctx.generation->eos_token_ids;
    int64_t eos = ctx.tokenizer->eos_id();
    if (eos >= 0 && std::find(r.eos_token_ids.begin(), r.eos_token_ids.end(), eos) == r.eos_token_ids.end())
      r.eos_token_ids.push_back(eos);
  }
  if (endpoint == Endpoint::ChatCompletions) {
    const bool constrained = p.agent.format != ResponseFormat::Text ||
                             (p.agent.has_tools() && (p.agent.tool_choice.kind == ToolChoice::Kind::Required ||
                                                      p.agent.tool_choice.kind == ToolChoice::Kind::Named));
    if (constrained) {
      if (!ctx.structured) bad(p.agent.format != ResponseFormat::Text ? "response_format" : "tool_choice",
                               "constrained outputs are not available on this server");
      p.grammar = ctx.structured->grammar_for(p);
    }
  }
  return p;
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

json Usage::to_json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
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
          {"usage", usage.to_json()}};
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
          {"usage", usage.to_json()}};
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
