// Parser choice, API key and the tokenizer endpoints (see agent_api.h).
#include "server/agent_api.h"

#include <stdexcept>

#include "server/api_common.h"
#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"

namespace mla::server {

using nlohmann::json;

ChosenParsers choose_parsers(const std::string& model_type, const std::string& chat_template,
                             const std::string& tool_override, const std::string& reasoning_override) {
  ChosenParsers c;
  if (tool_override.empty()) c.tool = chat::default_tool_parser(model_type, chat_template);
  else if (tool_override != "none") chat::make_tool_parser(tool_override), c.tool = tool_override;  // throws if unknown
  if (reasoning_override.empty()) c.reasoning = chat::default_reasoning_parser(model_type, chat_template);
  else if (reasoning_override != "none") chat::make_reasoning_parser(reasoning_override), c.reasoning = reasoning_override;
  return c;
}

namespace {

bool same_secret(const std::string& given, const std::string& want) {
  if (given.size() != want.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i]);
  return diff == 0;
}

}  // namespace

bool authorized(const std::string& header, const std::string& key) { return same_secret(header, "Bearer " + key); }

bool authorized(const std::string& authorization_header, const std::string& x_api_key_header, const std::string& key) {
  // Both compared, so that the time taken does not say which one was present.
  const bool bearer = same_secret(authorization_header, "Bearer " + key);
  const bool x_api_key = same_secret(x_api_key_header, key);
  return bearer || x_api_key;
}

namespace {

void only(const json& body, std::initializer_list<const char*> names) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    bool known = false;
    for (const char* n : names) known = known || it.key() == n;
    if (!known) bad_field(it.key(), "'" + it.key() + "' is not a field of this endpoint");
  }
}

}  // namespace

json tokenize_body(const json& body, const Tokenizer& tokenizer, int64_t max_model_len) {
  only(body, {"model", "prompt", "content", "add_special_tokens", "add_special", "with_pieces"});
  const char* key = body.contains("prompt") ? "prompt" : "content";
  auto it = body.find(key);
  if (it == body.end() || !it->is_string()) bad_field(key, "'prompt' (or 'content') must be a string");
  bool special = true;
  if (auto a = body.find("add_special_tokens"); a != body.end()) {
    if (!a->is_boolean()) bad_field("add_special_tokens", "'add_special_tokens' must be a boolean");
    special = a->get<bool>();
  } else if (auto b = body.find("add_special"); b != body.end()) {
    if (!b->is_boolean()) bad_field("add_special", "'add_special' must be a boolean");
    special = b->get<bool>();
  } else if (std::string(key) == "content") {
    special = false;  // llama-server's default
  }
  std::vector<int32_t> ids = tokenizer.encode(it->get<std::string>(), special);
  json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_model_len}};
  if (auto w = body.find("with_pieces"); w != body.end() && w->is_boolean() && w->get<bool>()) {
    json pieces = json::array();
    for (int32_t id : ids) pieces.push_back({{"id", id}, {"piece", sanitize_utf8(tokenizer.token_bytes(id))}});
    out["tokens"] = pieces;
  }
  return out;
}

json detokenize_body(const json& body, const Tokenizer& tokenizer) {
  only(body, {"model", "tokens"});
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) bad_field("tokens", "'tokens' must be a list of token ids");
  std::vector<int32_t> ids;
  for (const json& x : *it) {
    if (!x.is_number_integer()) bad_field("tokens", "'tokens' must be a list of token ids, got " + brief_json(x));
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id >= int64_t(tokenizer.vocab_size()))
      bad_field("tokens", "token " + std::to_string(id) + " is outside the vocabulary");
    ids.push_back(int32_t(id));
  }
  std::string text;
  try {
    text = tokenizer.decode(ids, false);
  } catch (const std::out_of_range& e) {
    bad_field("tokens", e.what());
  }
  return {{"prompt", text}, {"content", text}};
}

}  // namespace mla::server
