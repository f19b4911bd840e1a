// Compiled grammars shared between requests with the same constraint. The first request with a
// schema pays for the per-position token sets it reaches (matcher.h); later ones reuse them.
// A least-recently-used set of a fixed capacity; thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace mla::grammar {

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenTable> tokens, size_t capacity = 64);

  // response_format {"type": "json_object"}.
  std::shared_ptr<const CompiledGrammar> json_object();
  // response_format json_schema / a tool's parameters. Throws SchemaError (message for a 400).
  std::shared_ptr<const CompiledGrammar> json_schema(const nlohmann::ordered_json& schema, bool strict);
  // A grammar in the text form of grammar.h. Throws GrammarError.
  std::shared_ptr<const CompiledGrammar> gbnf(const std::string& text);

  size_t size() const;
  const std::shared_ptr<const TokenTable>& tokens() const { return tokens_; }

 private:
  template <class Make>
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, Make make);

  std::shared_ptr<const TokenTable> tokens_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;  // most recent first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace mla::grammar
