// Pieces of the server for agent clients, kept apart from the HTTP routes: the output parsers a
// checkpoint gets (from config.json's model_type and the chat template, or named on the
// command line), the key check of /v1/* (Bearer or x-api-key), and the /tokenize and /detokenize bodies.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"

namespace mla::server {

struct ChosenParsers {
  std::string tool, reasoning;  // "" for none
};

// The override when given ("none": no parser; another name must be known: std::invalid_argument
// listing the known ones), else default_tool_parser / default_reasoning_parser of the checkpoint.
ChosenParsers choose_parsers(const std::string& model_type, const std::string& chat_template,
                             const std::string& tool_override, const std::string& reasoning_override);

// True when the Authorization header carries "Bearer <key>" (compared in constant time).
bool authorized(const std::string& authorization_header, const std::string& key);
// The same, or the x-api-key header carrying the key (Anthropic's clients send it).
bool authorized(const std::string& authorization_header, const std::string& x_api_key_header, const std::string& key);

// POST /tokenize: {"prompt" | "content": text, "add_special_tokens"? (vLLM, default true) |
// "add_special"? (llama-server, default false)} -> {"tokens": [...], "count", "max_model_len"}.
// POST /detokenize: {"tokens": [ids]} -> {"prompt": text, "content": text}. ApiError 400 for a
// bad body (unknown fields included).
nlohmann::json tokenize_body(const nlohmann::json& body, const Tokenizer& tokenizer, int64_t max_model_len);
nlohmann::json detokenize_body(const nlohmann::json& body, const Tokenizer& tokenizer);

}  // namespace mla::server
