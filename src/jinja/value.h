// Values of the Jinja interpreter with Python's semantics (None, bool, int, float, str, list,
// dict, callables, and Jinja's undefined), their conversions (str, repr, JSON), comparisons,
// and the Python str operations the filters and methods share.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/limits.h"

namespace mla::jinja {

struct Value;
struct Dict;
struct Args;
using List = std::vector<Value>;
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Function };
  Kind kind = Kind::Undefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string text{};  // String; for Undefined the name that was looked up
  std::shared_ptr<jinja::List> list{};
  std::shared_ptr<Dict> dict{};
  std::shared_ptr<jinja::Function> function{};

  static Value undefined(std::string name = {}) { return {.kind = Kind::Undefined, .text = std::move(name)}; }
  static Value none() { return {.kind = Kind::None}; }
  static Value from(bool b) { return {.kind = Kind::Bool, .boolean = b}; }
  static Value from(int64_t i) { return {.kind = Kind::Int, .integer = i}; }
  static Value from(double d) { return {.kind = Kind::Float, .number = d}; }
  static Value from(std::string s) { return {.kind = Kind::String, .text = std::move(s)}; }
  static Value from(const char* s) { return from(std::string(s)); }
  static Value from(jinja::List l) {
    return {.kind = Kind::List, .list = std::make_shared<jinja::List>(std::move(l))};
  }
  static Value from_dict(std::shared_ptr<Dict> d) { return {.kind = Kind::Dict, .dict = std::move(d)}; }
  static Value from_function(jinja::Function f) {
    return {.kind = Kind::Function, .function = std::make_shared<jinja::Function>(std::move(f))};
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_integral() const { return kind == Kind::Int || kind == Kind::Bool; }
  int64_t as_int() const { return kind == Kind::Bool ? (boolean ? 1 : 0) : kind == Kind::Int ? integer : static_cast<int64_t>(number); }
  double as_double() const { return kind == Kind::Float ? number : static_cast<double>(as_int()); }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> entries;  // insertion order, as Python dicts
  bool is_namespace = false;

  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : entries)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    for (auto& [k, v] : entries)
      if (k == key) {
        v = std::move(value);
        return;
      }
    entries.emplace_back(key, std::move(value));
  }
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at position index or with the given keyword name, or nullptr.
  const Value* get(size_t index, std::string_view name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword)
      if (k == name) return &v;
    return nullptr;
  }
};

// ---------------------------------------------------------------------------------------------

// A JSON value (json or ordered_json: key order is kept as Python dicts keep it).
template <class Json>
Value from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::from(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::from(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::from(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value::from(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::from(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::from(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->entries.emplace_back(it.key(), from_json(it.value()));
      return Value::from_dict(d);
    }
    default: return Value::undefined();
  }
}

// ---------------------------------------------------------------------------------------------
// Conversions

std::string python_float(double d);          // repr(float) as Python prints it
std::string python_repr_string(const std::string& s);
// str(value) as Jinja prints it, and repr(value); the printed form of a list or dict throws
// LimitError past max_bytes or kMaxValueDepth of nesting.
std::string to_str(const Value& v, size_t max_bytes = Limits{}.max_string_bytes);
std::string repr(const Value& v, size_t max_bytes = Limits{}.max_string_bytes);
// json.dumps(value, ensure_ascii=False, indent=indent) as transformers' tojson filter does it;
// indent < 0 for none. Throws LimitError past max_bytes of output or kMaxValueDepth of nesting.
void to_json(std::string& out, const Value& v, int indent, bool sort_keys, size_t max_bytes);

bool truthy(const Value& v);
const char* type_name(const Value& v);
bool equals(const Value& a, const Value& b);
// Three-way comparison for <, <=, >, >=, sort, min, max. Throws for unorderable types.
int compare(const Value& a, const Value& b);

// ---------------------------------------------------------------------------------------------
// Strings as sequences of code points (Python str semantics over UTF-8)

std::u32string to_u32(const std::string& s);
std::string from_u32(const std::u32string& s);
bool is_unicode_space(char32_t c);
// Case mapping for ASCII, Latin-1, Greek and Cyrillic (enough for chat templates).
char32_t to_lower(char32_t c);
char32_t to_upper(char32_t c);
bool is_alpha(char32_t c);
std::string lower(const std::string& s);
std::string upper(const std::string& s);
std::string title(const std::string& s);
std::string capitalize(const std::string& s);
// str.strip / lstrip / rstrip: whitespace when chars is null, None or undefined.
std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right);
// str.split(sep, maxsplit): on runs of whitespace when sep is null, None or undefined.
List split(const std::string& s, const Value* sep, int64_t maxsplit);
// str.replace(from, to, count); count < 0 for all. Throws LimitError past max_bytes of result.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                        size_t max_bytes);

}  // namespace mla::jinja
