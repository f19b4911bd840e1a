// A response's choice from engine events (see choice.h).
#include "server/choice.h"

#include "server/openai.h"

namespace mla::server {

using nlohmann::json;

ChoiceDecoder::ChoiceDecoder(const ParsedRequest& p) : parallel_tool_calls_(p.agent.parallel_tool_calls) {
  if (p.endpoint != Endpoint::Completions && (!p.tool_parser.empty() || !p.reasoning_parser.empty())) {
    chat::ReasoningOptions ro;
    ro.prompt_opened = p.reasoning_opened;
    chat::ToolParserOptions to;
    if (p.agent.has_tools()) to.tools = json(p.agent.tools);
    parser_ = std::make_unique<chat::ChatOutputParser>(p.reasoning_parser, ro, p.tool_parser, std::move(to));
  }
}

std::vector<chat::ChatDelta> ChoiceDecoder::take(const RequestEvent& e) {
  std::vector<chat::ChatDelta> deltas;
  if (e.token >= 0) ++completion_tokens_;
  if (parser_) {
    if (!e.text.empty()) parser_->feed(e.text, deltas);
    if (e.finished) parser_->finish(deltas);
  } else if (!e.text.empty()) {
    deltas.push_back({chat::ChatDelta::Kind::Content, -1, {}, {}, e.text});
  }
  if (!parallel_tool_calls_)  // one call at most: later ones are dropped
    std::erase_if(deltas, [](const chat::ChatDelta& d) {
      return d.kind != chat::ChatDelta::Kind::Content && d.kind != chat::ChatDelta::Kind::Reasoning && d.index > 0;
    });
  if (e.finished) {
    finished_ = true;
    reason_ = e.reason;
  }
  return deltas;
}

ChoiceBuilder::ChoiceBuilder(const ParsedRequest& p, const Tokenizer& tokenizer, int index)
    : p_(p), tokenizer_(tokenizer), index_(index), chat_(p.endpoint != Endpoint::Completions), decoder_(p) {
  if (p.agent.logprobs >= 0) {
    if (chat_) logprobs_ = {{"content", json::array()}};
    else
      logprobs_ = {{"tokens", json::array()},
                   {"token_logprobs", json::array()},
                   {"top_logprobs", json::array()},
                   {"text_offset", json::array()}};
  }
}

json ChoiceBuilder::token_entry(int32_t id, float logprob) const {
  const std::string& raw = tokenizer_.token_bytes(id);
  json bytes = json::array();
  for (unsigned char c : raw) bytes.push_back(int(c));
  return {{"token", sanitize_utf8(raw)}, {"logprob", logprob}, {"bytes", bytes}};
}

void ChoiceBuilder::take(const RequestEvent& e, std::vector<chat::ChatDelta>& deltas, json& lp) {
  const bool eos_end = e.finished && e.reason == FinishReason::Eos;
  if (p_.agent.logprobs >= 0 && e.token >= 0 && !eos_end) {
    if (chat_) {
      json entry = token_entry(e.token, e.logprob);
      json top = json::array();
      for (auto& [id, l] : e.top_logprobs) top.push_back(token_entry(id, l));
      entry["top_logprobs"] = top;
      lp = {{"content", json::array({entry})}};
    } else {
      json top = json::object();
      for (auto& [id, l] : e.top_logprobs) {
        std::string t = sanitize_utf8(tokenizer_.token_bytes(id));
        if (!top.contains(t)) top[t] = l;  // two ids of one text: the likelier
      }
      lp = {{"tokens", {sanitize_utf8(tokenizer_.token_bytes(e.token))}},
            {"token_logprobs", {e.logprob}},
            {"top_logprobs", json::array({top})},
            {"text_offset", {int64_t(text_bytes_)}}};
    }
  }
  text_bytes_ += e.text.size();
  deltas = decoder_.take(e);
}

const char* ChoiceBuilder::finish_reason() const {
  const char* r = openai_finish_reason(decoder_.reason());
  if (decoder_.calls() > 0 && std::string_view(r) == "stop") return "tool_calls";
  return r;
}

std::vector<json> ChoiceBuilder::stream(const RequestEvent& e) {
  std::vector<chat::ChatDelta> deltas;
  json lp;
  take(e, deltas, lp);
  std::vector<json> out;
  if (!chat_) {  // the legacy shape: the text and the finish reason in one chunk
    if (deltas.empty() && lp.is_null() && !e.finished) return out;
    std::string text;
    for (auto& d : deltas) text += d.text;
    out.push_back({{"index", index_},
                   {"text", text},
                   {"logprobs", lp},
                   {"finish_reason", e.finished ? json(finish_reason()) : json(nullptr)}});
    return out;
  }
  if (!deltas.empty() || !lp.is_null()) out.push_back(delta_choice(deltas, lp));
  if (e.finished)
    out.push_back({{"index", index_}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}});
  return out;
}

json ChoiceBuilder::delta_choice(const std::vector<chat::ChatDelta>& deltas, const json& lp) const {
  json delta = json::object();
  std::string content, reasoning;
  json calls = json::array();
  for (const chat::ChatDelta& d : deltas) {
    switch (d.kind) {
      case chat::ChatDelta::Kind::Content: content += d.text; break;
      case chat::ChatDelta::Kind::Reasoning: reasoning += d.text; break;
      case chat::ChatDelta::Kind::CallStart:
        calls.push_back({{"index", d.index},
                         {"id", d.id},
                         {"type", "function"},
                         {"function", {{"name", d.name}, {"arguments", ""}}}});
        break;
      case chat::ChatDelta::Kind::Arguments:
        if (!calls.empty() && calls.back()["index"] == d.index) {
          calls.back()["function"]["arguments"] = calls.back()["function"]["arguments"].get<std::string>() + d.text;
        } else {
          calls.push_back({{"index", d.index}, {"function", {{"arguments", d.text}}}});
        }
        break;
    }
  }
  if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
  if (!content.empty()) delta["content"] = content;
  if (!calls.empty()) delta["tool_calls"] = calls;
  return {{"index", index_}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}};
}

void ChoiceBuilder::add(const RequestEvent& e) {
  std::vector<chat::ChatDelta> deltas;
  json lp;
  take(e, deltas, lp);
  for (const chat::ChatDelta& d : deltas) {
    switch (d.kind) {
      case chat::ChatDelta::Kind::Reasoning: reasoning_ += d.text; break;
      case chat::ChatDelta::Kind::Content: text_ += d.text; break;
      case chat::ChatDelta::Kind::CallStart: calls_.apply({chat::ToolCallDelta::Kind::CallStart, d.index, d.id, d.name, {}}); break;
      case chat::ChatDelta::Kind::Arguments: calls_.apply({chat::ToolCallDelta::Kind::Arguments, d.index, {}, {}, d.text}); break;
    }
  }
  if (!lp.is_null())
    for (auto it = lp.begin(); it != lp.end(); ++it)
      for (const json& x : *it) logprobs_[it.key()].push_back(x);
}

json ChoiceBuilder::choice() const {
  json lp = p_.agent.logprobs >= 0 ? logprobs_ : json(nullptr);
  if (!chat_) return {{"index", index_}, {"text", text_}, {"logprobs", lp}, {"finish_reason", finish_reason()}};
  json message = {{"role", "assistant"}};
  const bool calls = !calls_.tool_calls.empty();
  message["content"] = text_.empty() && calls ? json(nullptr) : json(text_);
  if (!p_.reasoning_parser.empty()) message["reasoning_content"] = reasoning_.empty() ? json(nullptr) : json(reasoning_);
  if (calls) {
    json list = json::array();
    for (const chat::ToolCall& c : calls_.tool_calls)
      list.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    message["tool_calls"] = list;
  }
  return {{"index", index_}, {"message", message}, {"logprobs", lp}, {"finish_reason", finish_reason()}};
}

}  // namespace mla::server
