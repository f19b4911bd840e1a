#include "grammar/cache.h"

namespace mla::grammar {

GrammarCache::GrammarCache(std::shared_ptr<const TokenTable> tokens, size_t capacity)
    : tokens_(std::move(tokens)), capacity_(std::max<size_t>(capacity, 1)) {}

template <class Make>
std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& key, Make make) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  auto g = std::make_shared<const CompiledGrammar>(make(), tokens_);  // throws before anything is stored
  lru_.emplace_front(key, g);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_object() {
  return get("json_object", [] { return json_object_grammar(); });
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_schema(const nlohmann::ordered_json& schema, bool strict) {
  return get(std::string(strict ? "schema-strict:" : "schema:") + schema.dump(),
             [&] { return json_schema_grammar(schema, {strict}); });
}

std::shared_ptr<const CompiledGrammar> GrammarCache::gbnf(const std::string& text) {
  return get("gbnf:" + text, [&] { return Grammar::parse(text); });
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

}  // namespace mla::grammar
