// Helpers of the grammar tests: byte-level recognizers, a validator of the JSON Schema subset
// that json_schema.h supports, the DeepSeek-V3 token table.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/deepseek_fixture.h"

namespace mla::test {

inline std::shared_ptr<const grammar::CompiledGrammar> byte_grammar(const grammar::Grammar& g) {
  return std::make_shared<const grammar::CompiledGrammar>(g, nullptr);
}

// Whether the whole byte string is a sentence of the grammar.
inline bool grammar_accepts(const std::shared_ptr<const grammar::CompiledGrammar>& g, std::string_view text) {
  grammar::Matcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

inline bool gbnf_accepts(std::string_view gbnf, std::string_view text) {
  return grammar_accepts(byte_grammar(grammar::Grammar::parse(gbnf)), text);
}

inline bool schema_accepts(const nlohmann::ordered_json& schema, std::string_view text, bool strict = false) {
  return grammar_accepts(byte_grammar(grammar::json_schema_grammar(schema, {strict})), text);
}

// Code points of a valid UTF-8 string.
inline size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Validates a JSON value against the supported keywords (json_schema.h), reading $ref from root.
inline bool validate(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s,
                     const nlohmann::ordered_json& root, bool strict = false) {
  using J = nlohmann::ordered_json;
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    const J& t = ref == "#" ? root : root.at(J::json_pointer(ref.substr(1)));
    return validate(v, t, root, strict);
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool found = false;
    for (const auto& e : s["enum"]) found |= e == v;
    if (!found) return false;
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      bool any = false;
      for (const auto& sub : s[key]) any |= validate(v, sub, root, strict);
      if (!any) return false;
    }
  if (s.contains("allOf"))
    for (const auto& sub : s["allOf"])
      if (!validate(v, sub, root, strict)) return false;
  if (s.contains("type")) {
    auto is = [&](const std::string& t) {
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer() || v.is_number_unsigned();
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      return false;
    };
    bool ok = false;
    if (s["type"].is_string()) {
      ok = is(s["type"]);
    } else {
      for (const auto& t : s["type"]) ok |= is(t);
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const J props = s.value("properties", J::object());
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!validate(x, props[k], root, strict)) return false;
        continue;
      }
      J add = s.contains("additionalProperties") ? s["additionalProperties"]
                                                   : J((!strict && !s.contains("properties")));
      if (!validate(x, add, root, strict)) return false;
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const auto& x : v)
        if (!validate(x, s["items"], root, strict)) return false;
  }
  if (v.is_string()) {
    const size_t n = utf8_length(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>())
      return false;
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>())
      return false;
  }
  return true;
}

inline std::shared_ptr<const grammar::TokenTable> deepseek_v3_token_table() {
  static const auto table = grammar::TokenTable::from_tokenizer(deepseek_v3_tokenizer(), 129280);
  return table;
}

}  // namespace mla::test
