// Jinja2 subset interpreter for HuggingFace chat templates: values with Python semantics, a
// lexer applying Jinja's whitespace rules, a recursive-descent parser to a small AST, and a
// tree-walking renderer with filters, tests and Python methods. See chat_template.h.
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>

#include "tokenizer/unicode_util.h"

namespace mla {

namespace {

// =============================================================================================
// Values

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
  std::string text;  // String; for Undefined the name that was looked up
  std::shared_ptr<mla::List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<mla::Function> function;

  static Value undefined(std::string name = {}) {
    Value v;
    v.text = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::None;
    return v;
  }
  static Value from(bool b) {
    Value v;
    v.kind = Kind::Bool;
    v.boolean = b;
    return v;
  }
  static Value from(int64_t i) {
    Value v;
    v.kind = Kind::Int;
    v.integer = i;
    return v;
  }
  static Value from(double d) {
    Value v;
    v.kind = Kind::Float;
    v.number = d;
    return v;
  }
  static Value from(std::string s) {
    Value v;
    v.kind = Kind::String;
    v.text = std::move(s);
    return v;
  }
  static Value from(const char* s) { return from(std::string(s)); }
  static Value from(mla::List l) {
    Value v;
    v.kind = Kind::List;
    v.list = std::make_shared<mla::List>(std::move(l));
    return v;
  }
  static Value from_dict(std::shared_ptr<Dict> d) {
    Value v;
    v.kind = Kind::Dict;
    v.dict = std::move(d);
    return v;
  }
  static Value from_function(mla::Function f) {
    Value v;
    v.kind = Kind::Function;
    v.function = std::make_shared<mla::Function>(std::move(f));
    return v;
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
// Conversions

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

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf = [-]d.ddde[+-]XX: take the digits and the exponent.
  std::string s = buf;
  bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  size_t e = s.find('e');
  int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits.push_back(s[i]);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return out;
}

std::string python_repr_string(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out.push_back(static_cast<char>(c));
  }
  out.push_back(quote);
  return out;
}

std::string repr(const Value& v);

// str(value) as Jinja prints it.
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.boolean ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.integer);
    case Value::Kind::Float: return python_float(v.number);
    case Value::Kind::String: return v.text;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return python_repr_string(v.text);
    case Value::Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr((*v.list)[i]);
      return out + "]";
    }
    case Value::Kind::Dict: {
      if (v.dict->is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->entries) {
        out += (first ? "" : ", ") + python_repr_string(k) + ": " + repr(e);
        first = false;
      }
      return out + "}";
    }
    case Value::Kind::Function: return "<function>";
    default: return to_str(v);
  }
}

void json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

// json.dumps(value, ensure_ascii=False, indent=indent) as transformers' tojson filter does it.
void to_json(std::string& out, const Value& v, int indent, int depth, bool sort_keys) {
  auto newline = [&](int level) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent) * level, ' ');
  };
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.integer); return;
    case Value::Kind::Float:
      if (std::isnan(v.number)) out += "NaN";
      else if (std::isinf(v.number)) out += v.number > 0 ? "Infinity" : "-Infinity";
      else out += python_float(v.number);
      return;
    case Value::Kind::String: json_string(out, v.text); return;
    case Value::Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        to_json(out, (*v.list)[i], indent, depth + 1, sort_keys);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.dict->entries) entries.push_back(&e);
      if (sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        json_string(out, entries[i]->first);
        out += ": ";
        to_json(out, entries[i]->second, indent, depth + 1, sort_keys);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    case Value::Kind::Undefined: throw ChatTemplateError("tojson: value is undefined");
    case Value::Kind::Function: throw ChatTemplateError("tojson: a function is not JSON serializable");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.boolean;
    case Value::Kind::Int: return v.integer != 0;
    case Value::Kind::Float: return v.number != 0;
    case Value::Kind::String: return !v.text.empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return v.dict->is_namespace || !v.dict->entries.empty();
    case Value::Kind::Function: return true;
  }
  return false;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return v.dict->is_namespace ? "Namespace" : "dict";
    case Value::Kind::Function: return "function";
  }
  return "?";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.text == b.text;
    case Value::Kind::List: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, v] : a.dict->entries) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::Function: return a.function == b.function;
    default: return false;
  }
}

// Three-way comparison for <, <=, >, >=, sort, min, max. Throws for unorderable types.
int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.text < b.text ? -1 : a.text > b.text ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i)
      if (int c = compare((*a.list)[i], (*b.list)[i])) return c;
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw ChatTemplateError(std::string("cannot compare ") + type_name(a) + " with " + type_name(b));
}

// ---------------------------------------------------------------------------------------------
// Strings as sequences of code points

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    size_t len = utf8::sequence_length(s, i, &bad);
    if (len == 0) {
      out.push_back(0xFFFD);
      i += bad;
    } else {
      out.push_back(utf8::decode_at(s, i, len));
      i += len;
    }
  }
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) utf8::append(out, c);
  return out;
}

bool is_unicode_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Case mapping for ASCII, Latin-1, Greek and Cyrillic (enough for chat templates).
char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) || (c >= 0x410 && c <= 0x42F))
    return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
char32_t to_upper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) || (c >= 0x430 && c <= 0x44F))
    return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
bool is_alpha(char32_t c) { return to_lower(c) != to_upper(c) || (c >= 0x4E00 && c <= 0x9FFF) || c == 0xDF; }

std::string lower(const std::string& s) {
  std::u32string u = to_u32(s);
  for (auto& c : u) c = to_lower(c);
  return from_u32(u);
}
std::string upper(const std::string& s) {
  std::u32string u = to_u32(s);
  for (auto& c : u) c = to_upper(c);
  return from_u32(u);
}

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = to_u32(s);
  std::u32string set;
  bool whitespace = !chars || chars->is_none() || chars->is_undefined();
  if (!whitespace) set = to_u32(chars->text);
  auto strip = [&](char32_t c) { return whitespace ? is_unicode_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b])) ++b;
  if (right)
    while (e > b && strip(u[e - 1])) --e;
  return from_u32(u.substr(b, e - b));
}

List split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    std::u32string u = to_u32(s);
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_unicode_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::u32string rest = u.substr(i);
        while (!rest.empty() && is_unicode_space(rest.back())) rest.pop_back();
        out.push_back(Value::from(from_u32(rest)));
        return out;
      }
      size_t j = i;
      while (j < u.size() && !is_unicode_space(u[j])) ++j;
      out.push_back(Value::from(from_u32(u.substr(i, j - i))));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->text;
  if (d.empty()) throw ChatTemplateError("split: empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    out.push_back(Value::from(s.substr(start, at - start)));
    start = at + d.size();
  }
  out.push_back(Value::from(s.substr(start)));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::u32string u = to_u32(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < u.size()) utf8::append(out, u[i]);
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// =============================================================================================
// Lexer

struct Token {
  enum class Type { Name, String, Int, Float, Op } type;
  std::string text;  // name, operator, or string value
  int64_t integer = 0;
  double number = 0;
  size_t pos = 0;
};

struct Segment {
  enum class Type { Text, Output, Statement } type;
  std::string text;
  std::vector<Token> tokens;
  size_t pos = 0;
};

std::string position_of(const std::string& source, size_t pos) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {}

  std::vector<Segment> run() {
    std::vector<Segment> out;
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? n : tag) - pos);
      if (tag == std::string::npos) {
        add_text(out, text, pos);
        break;
      }
      char kind = src_[tag + 1];
      size_t inner = tag + 2;
      char control = inner < n ? src_[inner] : '\0';
      if (control == '-') {
        size_t end = text.size();
        while (end > 0 && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
        text.resize(end);
      } else if (control != '+' && kind != '{') {
        size_t line_begin = text.rfind('\n');
        line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
        if (line_begin > 0 || line_starting) {
          bool blank = std::all_of(text.begin() + line_begin, text.end(),
                                   [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
          if (blank) text.resize(line_begin);
        }
      }
      add_text(out, text, pos);
      if (control == '-' || control == '+') ++inner;

      bool strip_after = false;
      size_t after;
      if (kind == '#') {
        size_t close = src_.find("#}", inner);
        if (close == std::string::npos) fail(tag, "unclosed comment");
        strip_after = close > inner && src_[close - 1] == '-';
        after = close + 2;
      } else {
        Segment seg;
        seg.type = kind == '{' ? Segment::Type::Output : Segment::Type::Statement;
        seg.pos = tag;
        after = lex_tag(inner, kind == '{' ? '}' : '%', seg.tokens, &strip_after, tag);
        if (seg.type == Segment::Type::Statement && seg.tokens.empty()) fail(tag, "empty statement tag");
        bool raw = seg.type == Segment::Type::Statement && seg.tokens[0].type == Token::Type::Name &&
                   seg.tokens[0].text == "raw";
        if (raw) {
          after = skip_after(after, strip_after, true, &line_starting);
          after = lex_raw(after, tag, out, &strip_after);
        } else {
          out.push_back(std::move(seg));
        }
      }
      pos = skip_after(after, strip_after, kind != '{', &line_starting);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw ChatTemplateError("chat template " + position_of(src_, pos) + ": " + what);
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // After a tag: '-' strips all following whitespace; trim_blocks drops one newline after a
  // statement or comment tag.
  size_t skip_after(size_t pos, bool strip_all, bool trim_newline, bool* line_starting) const {
    size_t start = pos;
    if (strip_all) {
      while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
    } else if (trim_newline && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    *line_starting = pos > start && src_[pos - 1] == '\n';
    return pos;
  }

  static void add_text(std::vector<Segment>& out, const std::string& text, size_t pos) {
    if (text.empty()) return;
    std::string normalized;
    normalized.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\r') {
        normalized.push_back('\n');
        if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
      } else {
        normalized.push_back(text[i]);
      }
    }
    Segment seg{Segment::Type::Text, std::move(normalized), {}, pos};
    out.push_back(std::move(seg));
  }

  // {% raw %} ... {% endraw %}: the body is text.
  size_t lex_raw(size_t pos, size_t tag, std::vector<Segment>& out, bool* strip_after) {
    for (size_t i = src_.find("{%", pos); i != std::string::npos; i = src_.find("{%", i + 2)) {
      size_t k = i + 2;
      bool strip_before = k < src_.size() && src_[k] == '-';
      if (strip_before || (k < src_.size() && src_[k] == '+')) ++k;
      while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
      if (src_.compare(k, 6, "endraw") != 0) continue;
      k += 6;
      while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
      *strip_after = k < src_.size() && src_[k] == '-';
      if (*strip_after) ++k;
      if (src_.compare(k, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos, i - pos);
      if (strip_before) {
        while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.pop_back();
      }
      add_text(out, body, pos);
      return k + 2;
    }
    fail(tag, "raw block without endraw");
  }

  // Tokens of one {{ }} / {% %} tag up to its closing delimiter (outside brackets).
  size_t lex_tag(size_t pos, char close, std::vector<Token>& tokens, bool* strip_after, size_t tag) {
    int depth = 0;
    const size_t n = src_.size();
    auto closes_at = [&](size_t i) { return i + 1 < n && src_[i] == close && src_[i + 1] == '}'; };
    while (true) {
      while (pos < n && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
      if (pos >= n) fail(tag, std::string("unclosed tag, expected '") + close + "}'");
      if (depth == 0) {
        if (src_[pos] == '-' && closes_at(pos + 1)) {
          *strip_after = true;
          return pos + 3;
        }
        if (src_[pos] == '+' && close == '%' && closes_at(pos + 1)) return pos + 3;
        if (closes_at(pos)) return pos + 2;
      }
      char c = src_[pos];
      Token t;
      t.pos = pos;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos;
        while (pos < n && (std::isalnum(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_')) ++pos;
        t.type = Token::Type::Name;
        t.text = src_.substr(b, pos - b);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t b = pos;
        while (pos < n && (std::isdigit(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_')) ++pos;
        bool is_float = false;
        if (pos + 1 < n && src_[pos] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos + 1]))) {
          is_float = true;
          ++pos;
          while (pos < n && (std::isdigit(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_')) ++pos;
        }
        if (pos < n && (src_[pos] == 'e' || src_[pos] == 'E')) {
          size_t k = pos + 1;
          if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < n && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            pos = k;
            while (pos < n && std::isdigit(static_cast<unsigned char>(src_[pos]))) ++pos;
          }
        }
        std::string digits;
        for (size_t i = b; i < pos; ++i)
          if (src_[i] != '_') digits.push_back(src_[i]);
        if (is_float) {
          t.type = Token::Type::Float;
          t.number = std::strtod(digits.c_str(), nullptr);
        } else {
          t.type = Token::Type::Int;
          t.integer = std::strtoll(digits.c_str(), nullptr, 10);
        }
      } else if (c == '\'' || c == '"') {
        t.type = Token::Type::String;
        pos = lex_string(pos, t.text);
      } else {
        static const char* two_char[] = {"**", "//", "==", "!=", "<=", ">="};
        t.type = Token::Type::Op;
        for (const char* op : two_char)
          if (src_.compare(pos, 2, op) == 0) t.text = op;
        if (t.text.empty()) {
          if (!std::strchr("+-*/%~<>=()[]{}.,:|!", c)) fail(pos, std::string("unexpected character '") + c + "'");
          t.text = std::string(1, c);
        }
        pos += t.text.size();
        if (c == '(' || c == '[' || c == '{') ++depth;
        if (c == ')' || c == ']' || c == '}') --depth;
      }
      tokens.push_back(std::move(t));
    }
  }

  size_t lex_string(size_t pos, std::string& out) {
    char quote = src_[pos++];
    const size_t n = src_.size();
    while (true) {
      if (pos >= n) fail(pos, "unterminated string literal");
      char c = src_[pos++];
      if (c == quote) return pos;
      if (c == '\r') {
        out.push_back('\n');
        if (pos < n && src_[pos] == '\n') ++pos;
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos >= n) fail(pos, "unterminated string literal");
      char e = src_[pos++];
      auto hex = [&](int digits) {
        if (pos + digits > n) fail(pos, "bad escape in string literal");
        uint32_t cp = static_cast<uint32_t>(std::stoul(src_.substr(pos, digits), nullptr, 16));
        pos += digits;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
        utf8::append(out, cp);
      };
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '0': out.push_back('\0'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case '\n': break;  // line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
  }

  const std::string& src_;
};

// =============================================================================================
// AST

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal, Name, List, Dict, Attr, Item, Slice, Call, Filter, Test, Negate, Plus, Not, And, Or, Binary, Compare,
    Conditional
  };
  Kind kind;
  size_t pos = 0;
  Value literal;
  std::string name;                  // Name, Attr, Filter, Test, Binary operator
  std::vector<ExprPtr> children;     // operands; for Call/Filter/Test: [object, args...]
  std::vector<std::string> arg_names;  // per argument: keyword name or ""
  std::vector<std::string> ops;      // Compare operators
  bool negated = false;              // Test: `is not`
};

struct Node;
using NodePtr = std::shared_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, With, FilterBlock, Scope };
  Kind kind;
  size_t pos = 0;
  std::string text;                  // Text; Set/SetBlock/Macro name
  std::string attribute;             // Set on a namespace attribute
  ExprPtr expr;                      // Output, For iterable, Set value, FilterBlock filter
  ExprPtr condition;                 // For filter condition
  std::vector<std::string> targets;  // For / Set tuple targets; Macro parameter names; With names
  std::vector<ExprPtr> values;       // Macro defaults (nullptr if none); With values
  std::vector<std::pair<ExprPtr, Body>> branches;  // If
  Body body, else_body;
};

// =============================================================================================
// Parser

class Parser {
 public:
  Parser(const std::string& source, std::vector<Segment> segments) : src_(source), segs_(std::move(segments)) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw ChatTemplateError("chat template " + position_of(src_, pos) + ": " + what);
  }

  // ---- statements

  // Parses nodes until a statement whose keyword is in `ends`; returns that keyword in *end and
  // leaves the segment index on it (its tokens in toks_). An empty `ends` means end of input.
  Body parse_body(const std::vector<std::string>& ends, std::string* end) {
    Body body;
    while (seg_ < segs_.size()) {
      Segment& s = segs_[seg_];
      if (s.type == Segment::Type::Text) {
        auto node = std::make_shared<Node>();
        node->kind = Node::Kind::Text;
        node->text = s.text;
        node->pos = s.pos;
        body.push_back(node);
        ++seg_;
        continue;
      }
      begin_tokens(s);
      if (s.type == Segment::Type::Output) {
        auto node = std::make_shared<Node>();
        node->kind = Node::Kind::Output;
        node->pos = s.pos;
        node->expr = parse_expression();
        expect_end();
        body.push_back(node);
        ++seg_;
        continue;
      }
      const Token& keyword = peek();
      if (keyword.type != Token::Type::Name) fail(keyword.pos, "expected a statement keyword");
      if (std::find(ends.begin(), ends.end(), keyword.text) != ends.end()) {
        *end = keyword.text;
        ++tok_;
        return body;
      }
      ++seg_;
      body.push_back(parse_statement());
    }
    if (!ends.empty()) fail(src_.size(), "unexpected end of template, expected '" + ends.back() + "'");
    return body;
  }

  NodePtr parse_statement() {
    const Token keyword = next();
    auto node = std::make_shared<Node>();
    node->pos = keyword.pos;
    const std::string& k = keyword.text;
    if (k == "if") {
      node->kind = Node::Kind::If;
      ExprPtr cond = parse_expression();
      expect_end();
      while (true) {
        std::string end;
        Body body = parse_body({"elif", "else", "endif"}, &end);
        node->branches.emplace_back(cond, std::move(body));
        if (end == "elif") {
          cond = parse_expression();
          expect_end();
          ++seg_;
          continue;
        }
        expect_end();
        ++seg_;
        if (end == "else") {
          node->else_body = parse_body({"endif"}, &end);
          expect_end();
          ++seg_;
        }
        break;
      }
    } else if (k == "for") {
      node->kind = Node::Kind::For;
      node->targets = parse_targets();
      expect_name("in");
      node->expr = parse_or(/*allow_conditional=*/false);
      if (peek_name("if")) {
        ++tok_;
        node->condition = parse_expression();
      }
      if (peek_name("recursive")) fail(peek().pos, "unsupported construct 'recursive' loop");
      expect_end();
      std::string end;
      node->body = parse_body({"else", "endfor"}, &end);
      expect_end();
      ++seg_;
      if (end == "else") {
        node->else_body = parse_body({"endfor"}, &end);
        expect_end();
        ++seg_;
      }
    } else if (k == "set") {
      std::vector<std::string> targets = parse_targets();
      if (targets.size() == 1 && peek_op(".")) {
        ++tok_;
        node->attribute = expect_identifier();
      }
      if (peek_op("=")) {
        ++tok_;
        node->kind = Node::Kind::Set;
        node->targets = targets;
        node->expr = parse_tuple_or_expression();
        expect_end();
      } else {
        if (targets.size() != 1 || !node->attribute.empty()) fail(keyword.pos, "block set needs one plain name");
        node->kind = Node::Kind::SetBlock;
        node->text = targets[0];
        if (peek_op("|")) fail(peek().pos, "unsupported construct: filter on a block set");
        expect_end();
        std::string end;
        node->body = parse_body({"endset"}, &end);
        expect_end();
        ++seg_;
      }
    } else if (k == "macro") {
      node->kind = Node::Kind::Macro;
      node->text = expect_identifier();
      expect_op("(");
      while (!peek_op(")")) {
        node->targets.push_back(expect_identifier());
        if (peek_op("=")) {
          ++tok_;
          node->values.push_back(parse_expression());
        } else {
          node->values.push_back(nullptr);
        }
        if (!peek_op(")")) expect_op(",");
      }
      expect_op(")");
      expect_end();
      std::string end;
      node->body = parse_body({"endmacro"}, &end);
      if (!at_end() && peek().type == Token::Type::Name) ++tok_;  // {% endmacro name %}
      expect_end();
      ++seg_;
    } else if (k == "break" || k == "continue") {
      node->kind = k == "break" ? Node::Kind::Break : Node::Kind::Continue;
      expect_end();
    } else if (k == "with") {
      node->kind = Node::Kind::With;
      while (!at_end()) {
        node->targets.push_back(expect_identifier());
        expect_op("=");
        node->values.push_back(parse_expression());
        if (!at_end()) expect_op(",");
      }
      std::string end;
      node->body = parse_body({"endwith"}, &end);
      expect_end();
      ++seg_;
    } else if (k == "filter") {
      node->kind = Node::Kind::FilterBlock;
      node->expr = parse_filter_chain(nullptr);
      expect_end();
      std::string end;
      node->body = parse_body({"endfilter"}, &end);
      expect_end();
      ++seg_;
    } else if (k == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      node->kind = Node::Kind::Scope;
      expect_end();
      std::string end;
      node->body = parse_body({"endgeneration"}, &end);
      expect_end();
      ++seg_;
    } else if (k.rfind("end", 0) == 0 || k == "elif" || k == "else") {
      fail(keyword.pos, "unexpected '" + k + "'");
    } else {
      fail(keyword.pos, "unsupported construct '" + k + "'");
    }
    return node;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = peek_op("(");
    if (paren) ++tok_;
    names.push_back(expect_identifier());
    while (peek_op(",")) {
      ++tok_;
      names.push_back(expect_identifier());
    }
    if (paren) expect_op(")");
    return names;
  }

  // ---- token helpers

  void begin_tokens(Segment& s) {
    toks_ = &s.tokens;
    tok_ = 0;
    tag_pos_ = s.pos;
  }
  bool at_end() const { return tok_ >= toks_->size(); }
  const Token& peek() const {
    if (at_end()) {
      end_token_.pos = tag_pos_;
      return end_token_;
    }
    return (*toks_)[tok_];
  }
  Token next() {
    if (at_end()) fail(tag_pos_, "unexpected end of tag");
    return (*toks_)[tok_++];
  }
  bool peek_op(const char* op) const {
    return !at_end() && peek().type == Token::Type::Op && peek().text == op;
  }
  bool peek_name(const char* name) const {
    return !at_end() && peek().type == Token::Type::Name && peek().text == name;
  }
  void expect_op(const char* op) {
    if (!peek_op(op)) fail(peek().pos, std::string("expected '") + op + "', found '" + peek().text + "'");
    ++tok_;
  }
  void expect_name(const char* name) {
    if (!peek_name(name)) fail(peek().pos, std::string("expected '") + name + "', found '" + peek().text + "'");
    ++tok_;
  }
  std::string expect_identifier() {
    if (at_end() || peek().type != Token::Type::Name) fail(peek().pos, "expected a name, found '" + peek().text + "'");
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(peek().pos, "unexpected '" + peek().text + "' at the end of the tag");
  }

  ExprPtr make(Expr::Kind kind, size_t pos) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // ---- expressions (precedence as Jinja's parser)

  ExprPtr parse_tuple_or_expression() {
    size_t pos = peek().pos;
    ExprPtr first = parse_expression();
    if (!peek_op(",")) return first;
    auto list = make(Expr::Kind::List, pos);
    list->children.push_back(first);
    while (peek_op(",")) {
      ++tok_;
      if (at_end()) break;
      list->children.push_back(parse_expression());
    }
    return list;
  }

  ExprPtr parse_expression() { return parse_or(true); }

  ExprPtr parse_or(bool allow_conditional) {
    ExprPtr left = parse_and();
    while (peek_name("or")) {
      auto e = make(Expr::Kind::Or, next().pos);
      e->children = {left, parse_and()};
      left = e;
    }
    if (allow_conditional && peek_name("if")) {
      auto e = make(Expr::Kind::Conditional, next().pos);
      ExprPtr cond = parse_or(false);
      ExprPtr otherwise;
      if (peek_name("else")) {
        ++tok_;
        otherwise = parse_or(true);
      }
      e->children = {left, cond, otherwise};
      return e;
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (peek_name("and")) {
      auto e = make(Expr::Kind::And, next().pos);
      e->children = {left, parse_not()};
      left = e;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (peek_name("not")) {
      auto e = make(Expr::Kind::Not, next().pos);
      e->children = {parse_not()};
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    size_t pos = peek().pos;
    ExprPtr left = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands{left};
    while (true) {
      std::string op;
      if (!at_end() && peek().type == Token::Type::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (peek_name("in")) {
        ++tok_;
        op = "in";
      } else if (peek_name("not") && tok_ + 1 < toks_->size() && (*toks_)[tok_ + 1].type == Token::Type::Name &&
                 (*toks_)[tok_ + 1].text == "in") {
        tok_ += 2;
        op = "not in";
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return left;
    auto e = make(Expr::Kind::Compare, pos);
    e->children = std::move(operands);
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, size_t pos) {
    auto e = make(Expr::Kind::Binary, pos);
    e->name = op;
    e->children = {std::move(l), std::move(r)};
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (peek_op("+") || peek_op("-")) {
      Token op = next();
      left = binary(op.text, left, parse_concat(), op.pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (peek_op("~")) {
      Token op = next();
      left = binary("~", left, parse_math2(), op.pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      Token op = next();
      left = binary(op.text, left, parse_pow(), op.pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary();
    while (peek_op("**")) {
      Token op = next();
      left = binary("**", left, parse_unary(), op.pos);
    }
    return left;
  }

  ExprPtr parse_unary() {
    if (peek_op("-") || peek_op("+")) {
      Token op = next();
      auto e = make(op.text == "-" ? Expr::Kind::Negate : Expr::Kind::Plus, op.pos);
      e->children = {parse_unary()};
      return e;
    }
    ExprPtr node = parse_postfix(parse_primary());
    return parse_filter_and_test(node);
  }

  ExprPtr parse_primary() {
    if (at_end()) fail(tag_pos_, "expected an expression");
    Token t = next();
    switch (t.type) {
      case Token::Type::String: {
        auto e = make(Expr::Kind::Literal, t.pos);
        std::string text = t.text;
        while (!at_end() && peek().type == Token::Type::String) text += next().text;  // 'a' 'b'
        e->literal = Value::from(text);
        return e;
      }
      case Token::Type::Int: {
        auto e = make(Expr::Kind::Literal, t.pos);
        e->literal = Value::from(t.integer);
        return e;
      }
      case Token::Type::Float: {
        auto e = make(Expr::Kind::Literal, t.pos);
        e->literal = Value::from(t.number);
        return e;
      }
      case Token::Type::Name: {
        auto e = make(Expr::Kind::Literal, t.pos);
        if (t.text == "true" || t.text == "True") e->literal = Value::from(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value::from(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = t.text;
        }
        return e;
      }
      case Token::Type::Op:
        break;
    }
    if (t.text == "(") {
      if (peek_op(")")) {
        ++tok_;
        auto e = make(Expr::Kind::List, t.pos);  // empty tuple
        return e;
      }
      ExprPtr inner = parse_expression();
      if (peek_op(",")) {  // tuple, represented as a list
        auto list = make(Expr::Kind::List, t.pos);
        list->children.push_back(inner);
        while (peek_op(",")) {
          ++tok_;
          if (peek_op(")")) break;
          list->children.push_back(parse_expression());
        }
        inner = list;
      }
      expect_op(")");
      return inner;
    }
    if (t.text == "[") {
      auto e = make(Expr::Kind::List, t.pos);
      while (!peek_op("]")) {
        e->children.push_back(parse_expression());
        if (!peek_op("]")) expect_op(",");
      }
      expect_op("]");
      return e;
    }
    if (t.text == "{") {
      auto e = make(Expr::Kind::Dict, t.pos);
      while (!peek_op("}")) {
        e->children.push_back(parse_expression());
        expect_op(":");
        e->children.push_back(parse_expression());
        if (!peek_op("}")) expect_op(",");
      }
      expect_op("}");
      return e;
    }
    fail(t.pos, "unexpected '" + t.text + "' in expression");
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!peek_op(")")) {
      if (peek_op("*") || peek_op("**")) fail(peek().pos, "unsupported construct: *args / **kwargs in a call");
      if (!at_end() && peek().type == Token::Type::Name && tok_ + 1 < toks_->size() &&
          (*toks_)[tok_ + 1].type == Token::Type::Op && (*toks_)[tok_ + 1].text == "=") {
        std::string name = next().text;
        ++tok_;
        e.arg_names.push_back(name);
      } else {
        e.arg_names.push_back("");
      }
      e.children.push_back(parse_expression());
      if (!peek_op(")")) expect_op(",");
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (peek_op(".")) {
        Token dot = next();
        if (at_end()) fail(dot.pos, "expected an attribute name after '.'");
        Token name = next();
        if (name.type == Token::Type::Int) {  // x.0 means x[0]
          auto e = make(Expr::Kind::Item, dot.pos);
          auto index = make(Expr::Kind::Literal, name.pos);
          index->literal = Value::from(name.integer);
          e->children = {node, index};
          node = e;
          continue;
        }
        if (name.type != Token::Type::Name) fail(name.pos, "expected an attribute name after '.'");
        auto e = make(Expr::Kind::Attr, dot.pos);
        e->name = name.text;
        e->children = {node};
        node = e;
      } else if (peek_op("[")) {
        Token open = next();
        ExprPtr parts[3];
        bool is_slice = false;
        for (int part = 0; part < 3; ++part) {
          if (!peek_op(":") && !peek_op("]")) parts[part] = parse_expression();
          if (peek_op(":") && part < 2) {
            ++tok_;
            is_slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        if (is_slice) {
          auto e = make(Expr::Kind::Slice, open.pos);
          e->children = {node, parts[0], parts[1], parts[2]};
          node = e;
        } else {
          if (!parts[0]) fail(open.pos, "empty subscript");
          auto e = make(Expr::Kind::Item, open.pos);
          e->children = {node, parts[0]};
          node = e;
        }
      } else if (peek_op("(")) {
        auto e = make(Expr::Kind::Call, peek().pos);
        e->children.push_back(node);
        e->arg_names.push_back("");
        parse_call_args(*e);
        node = e;
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_chain(ExprPtr node) {
    do {
      size_t pos = peek().pos;
      auto e = make(Expr::Kind::Filter, pos);
      e->name = expect_identifier();
      while (peek_op(".")) {  // dotted filter names are not used by chat templates
        fail(peek().pos, "unsupported construct: dotted filter name");
      }
      e->children.push_back(node);
      e->arg_names.push_back("");
      if (peek_op("(")) parse_call_args(*e);
      node = e;
    } while (peek_op("|") && (++tok_, true));
    return node;
  }

  ExprPtr parse_filter_and_test(ExprPtr node) {
    while (true) {
      if (peek_op("|")) {
        ++tok_;
        node = parse_postfix(parse_filter_chain_one(node));
      } else if (peek_name("is")) {
        Token is = next();
        auto e = make(Expr::Kind::Test, is.pos);
        if (peek_name("not")) {
          ++tok_;
          e->negated = true;
        }
        if (at_end()) fail(is.pos, "expected a test name after 'is'");
        Token name = next();
        if (name.type == Token::Type::Name) e->name = name.text;
        else if (name.type == Token::Type::Op && (name.text == "==" || name.text == "!=" || name.text == "<" ||
                                                  name.text == ">" || name.text == "<=" || name.text == ">="))
          e->name = name.text;
        else fail(name.pos, "expected a test name after 'is'");
        e->children.push_back(node);
        e->arg_names.push_back("");
        if (peek_op("(")) {
          parse_call_args(*e);
        } else if (!at_end()) {
          const Token& t = peek();
          bool starts_argument =
              t.type == Token::Type::String || t.type == Token::Type::Int || t.type == Token::Type::Float ||
              (t.type == Token::Type::Name && t.text != "else" && t.text != "or" && t.text != "and" &&
               t.text != "if" && t.text != "is" && t.text != "in" && t.text != "not") ||
              (t.type == Token::Type::Op && (t.text == "[" || t.text == "{"));
          if (starts_argument) {
            e->children.push_back(parse_postfix(parse_primary()));
            e->arg_names.push_back("");
          }
        }
        node = e;
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_chain_one(ExprPtr node) {
    size_t pos = peek().pos;
    auto e = make(Expr::Kind::Filter, pos);
    e->name = expect_identifier();
    e->children.push_back(node);
    e->arg_names.push_back("");
    if (peek_op("(")) parse_call_args(*e);
    return e;
  }

  const std::string& src_;
  std::vector<Segment> segs_;
  size_t seg_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  size_t tag_pos_ = 0;
  mutable Token end_token_{Token::Type::Op, "<end of tag>", 0, 0, 0};
};

// =============================================================================================
// Renderer

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const std::string& source, std::shared_ptr<Dict> globals) : src_(source) {
    frames_.push_back(std::move(globals));
  }

  Flow render(const Body& body, std::string& out) {
    for (const NodePtr& node : body) {
      Flow flow = render_node(*node, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw ChatTemplateError("chat template " + position_of(src_, pos) + ": " + what);
  }

  // ---- variables

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (const Value* v = (*it)->find(name)) return *v;
    if (const Value* v = builtins().find(name)) return *v;
    return Value::undefined(name);
  }
  void assign(const std::string& name, Value value) { frames_.back()->set(name, std::move(value)); }

  struct FrameGuard {
    Renderer& r;
    explicit FrameGuard(Renderer& renderer) : r(renderer) { r.frames_.push_back(std::make_shared<Dict>()); }
    ~FrameGuard() { r.frames_.pop_back(); }
  };

  static const Dict& builtins() {
    static const Dict table = [] {
      Dict d;
      d.set("range", Value::from_function([](Args& a) {
        int64_t start = 0, stop = 0, step = 1;
        if (a.positional.size() == 1) {
          stop = a.positional[0].as_int();
        } else if (a.positional.size() >= 2) {
          start = a.positional[0].as_int();
          stop = a.positional[1].as_int();
          if (a.positional.size() >= 3) step = a.positional[2].as_int();
        } else {
          throw ChatTemplateError("range() needs 1 to 3 arguments");
        }
        if (step == 0) throw ChatTemplateError("range() step must not be zero");
        List items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          items.push_back(Value::from(i));
          if (items.size() > 10'000'000) throw ChatTemplateError("range() too large");
        }
        return Value::from(std::move(items));
      }));
      d.set("namespace", Value::from_function([](Args& a) {
        auto ns = std::make_shared<Dict>();
        ns->is_namespace = true;
        for (const Value& p : a.positional)
          if (p.is_dict())
            for (const auto& [k, v] : p.dict->entries) ns->set(k, v);
        for (auto& [k, v] : a.keyword) ns->set(k, v);
        return Value::from_dict(ns);
      }));
      d.set("dict", Value::from_function([](Args& a) {
        auto dict = std::make_shared<Dict>();
        for (const Value& p : a.positional)
          if (p.is_dict())
            for (const auto& [k, v] : p.dict->entries) dict->set(k, v);
        for (auto& [k, v] : a.keyword) dict->set(k, v);
        return Value::from_dict(dict);
      }));
      d.set("raise_exception", Value::from_function([](Args& a) -> Value {
        std::string message = a.positional.empty() ? "" : to_str(a.positional[0]);
        throw ChatTemplateError("chat template raised an exception: " + message);
      }));
      d.set("strftime_now", Value::from_function([](Args& a) {
        std::string format = a.positional.empty() ? "%Y-%m-%d" : to_str(a.positional[0]);
        std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[256];
        size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
        return Value::from(std::string(buf, n));
      }));
      return d;
    }();
    return table;
  }

  // ---- statements

  Flow render_node(const Node& node, std::string& out) {
    switch (node.kind) {
      case Node::Kind::Text: out += node.text; return Flow::Normal;
      case Node::Kind::Output: out += to_str(eval(*node.expr)); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : node.branches)
          if (truthy(eval(*cond))) return render(body, out);
        return render(node.else_body, out);
      case Node::Kind::For: return render_for(node, out);
      case Node::Kind::Set: {
        Value value = eval(*node.expr);
        if (!node.attribute.empty()) {
          Value target = lookup(node.targets[0]);
          if (!target.is_dict() || !target.dict->is_namespace)
            fail(node.pos, "can only set attributes of a namespace, '" + node.targets[0] + "' is " + type_name(target));
          target.dict->set(node.attribute, std::move(value));
        } else if (node.targets.size() == 1) {
          assign(node.targets[0], std::move(value));
        } else {
          unpack(node.targets, value, node.pos);
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        std::string captured;
        render(node.body, captured);
        assign(node.text, Value::from(captured));
        return Flow::Normal;
      }
      case Node::Kind::Macro: define_macro(node); return Flow::Normal;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::With: {
        std::vector<Value> values;
        for (const ExprPtr& e : node.values) values.push_back(eval(*e));
        FrameGuard frame(*this);
        for (size_t i = 0; i < node.targets.size(); ++i) assign(node.targets[i], values[i]);
        return render(node.body, out);
      }
      case Node::Kind::FilterBlock: {
        std::string captured;
        Flow flow = render(node.body, captured);
        block_text_ = Value::from(captured);
        out += to_str(eval(*node.expr));
        return flow;
      }
      case Node::Kind::Scope: return render(node.body, out);
    }
    return Flow::Normal;
  }

  void unpack(const std::vector<std::string>& targets, const Value& value, size_t pos) {
    List items = iterate(value, pos);
    if (items.size() != targets.size())
      fail(pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                    " names");
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
  }

  List iterate(const Value& v, size_t pos) {
    switch (v.kind) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::List: return *v.list;
      case Value::Kind::Dict: {
        List keys;
        for (const auto& [k, e] : v.dict->entries) keys.push_back(Value::from(k));
        return keys;
      }
      case Value::Kind::String: {
        List chars;
        for (char32_t c : to_u32(v.text)) {
          std::string s;
          utf8::append(s, c);
          chars.push_back(Value::from(s));
        }
        return chars;
      }
      default: fail(pos, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  Flow render_for(const Node& node, std::string& out) {
    List items = iterate(eval(*node.expr), node.expr->pos);
    if (node.condition) {
      List kept;
      FrameGuard frame(*this);
      for (const Value& item : items) {
        bind_targets(node, item);
        if (truthy(eval(*node.condition))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return render(node.else_body, out);
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      FrameGuard frame(*this);
      auto loop = std::make_shared<Dict>();
      loop->set("index", Value::from(i + 1));
      loop->set("index0", Value::from(i));
      loop->set("revindex", Value::from(length - i));
      loop->set("revindex0", Value::from(length - i - 1));
      loop->set("first", Value::from(i == 0));
      loop->set("last", Value::from(i == length - 1));
      loop->set("length", Value::from(length));
      loop->set("depth", Value::from(int64_t{1}));
      loop->set("depth0", Value::from(int64_t{0}));
      loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("previtem"));
      loop->set("nextitem", i + 1 < length ? items[i + 1] : Value::undefined("nextitem"));
      loop->set("cycle", Value::from_function([i](Args& a) {
        if (a.positional.empty()) throw ChatTemplateError("loop.cycle() needs arguments");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      }));
      assign("loop", Value::from_dict(loop));
      bind_targets(node, items[i]);
      Flow flow = render(node.body, out);
      if (flow == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void bind_targets(const Node& node, const Value& item) {
    if (node.targets.size() == 1) assign(node.targets[0], item);
    else unpack(node.targets, item, node.pos);
  }

  void define_macro(const Node& node) {
    const Node* macro = &node;
    Value fn = Value::from_function([this, macro](Args& args) {
      // Macros see the template's top-level variables and their own arguments.
      std::vector<std::shared_ptr<Dict>> saved;
      saved.swap(frames_);
      frames_.push_back(saved.front());
      frames_.push_back(std::make_shared<Dict>());
      std::string out;
      try {
        for (size_t p = 0; p < macro->targets.size(); ++p) {
          const Value* given = args.get(p, macro->targets[p]);
          if (given) assign(macro->targets[p], *given);
          else if (macro->values[p]) assign(macro->targets[p], eval(*macro->values[p]));
          else assign(macro->targets[p], Value::undefined(macro->targets[p]));
        }
        if (args.positional.size() > macro->targets.size())
          fail(macro->pos, "macro '" + macro->text + "' takes " + std::to_string(macro->targets.size()) + " arguments");
        render(macro->body, out);
      } catch (...) {
        frames_.swap(saved);
        throw;
      }
      frames_.swap(saved);
      return Value::from(out);
    });
    assign(node.text, fn);
  }

  // ---- expressions

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::List: {
        List items;
        for (const ExprPtr& c : e.children) items.push_back(eval(*c));
        return Value::from(std::move(items));
      }
      case Expr::Kind::Dict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value key = eval(*e.children[i]);
          if (!key.is_string()) fail(e.children[i]->pos, "dict keys must be strings");
          d->set(key.text, eval(*e.children[i + 1]));
        }
        return Value::from_dict(d);
      }
      case Expr::Kind::Attr: return get_attr(eval(*e.children[0]), e.name, e);
      case Expr::Kind::Item: return get_item(eval(*e.children[0]), eval(*e.children[1]), e);
      case Expr::Kind::Slice: return slice(e);
      case Expr::Kind::Call: {
        Value callee = eval(*e.children[0]);
        if (callee.kind != Value::Kind::Function) {
          std::string what = e.children[0]->kind == Expr::Kind::Name ? "'" + e.children[0]->name + "'"
                             : e.children[0]->kind == Expr::Kind::Attr ? "'" + e.children[0]->name + "'"
                                                                       : "expression";
          if (callee.is_undefined()) fail(e.pos, what + " is undefined");
          fail(e.pos, what + " is not callable");
        }
        Args args = eval_args(e);
        try {
          return (*callee.function)(args);
        } catch (const ChatTemplateError& err) {
          if (std::string(err.what()).rfind("chat template", 0) == 0) throw;
          fail(e.pos, err.what());
        }
      }
      case Expr::Kind::Filter: {
        Value subject = e.children[0] ? eval(*e.children[0]) : block_text_;
        Args args = eval_args(e);
        try {
          return apply_filter(e.name, subject, args, e);
        } catch (const ChatTemplateError& err) {
          if (std::string(err.what()).rfind("chat template", 0) == 0) throw;
          fail(e.pos, err.what());
        }
      }
      case Expr::Kind::Test: {
        bool result;
        if (e.name == "defined" || e.name == "undefined") {
          bool defined = !eval(*e.children[0]).is_undefined();
          result = e.name == "defined" ? defined : !defined;
        } else {
          Value subject = eval(*e.children[0]);
          Args args = eval_args(e);
          result = apply_test(e.name, subject, args, e);
        }
        return Value::from(e.negated ? !result : result);
      }
      case Expr::Kind::Negate: {
        Value v = eval(*e.children[0]);
        if (v.kind == Value::Kind::Float) return Value::from(-v.number);
        if (v.is_number()) return Value::from(-v.as_int());
        fail(e.pos, std::string("bad operand type for unary -: ") + type_name(v));
      }
      case Expr::Kind::Plus: {
        Value v = eval(*e.children[0]);
        if (!v.is_number()) fail(e.pos, std::string("bad operand type for unary +: ") + type_name(v));
        return v;
      }
      case Expr::Kind::Not: return Value::from(!truthy(eval(*e.children[0])));
      case Expr::Kind::And: {
        Value left = eval(*e.children[0]);
        return truthy(left) ? eval(*e.children[1]) : left;
      }
      case Expr::Kind::Or: {
        Value left = eval(*e.children[0]);
        return truthy(left) ? left : eval(*e.children[1]);
      }
      case Expr::Kind::Binary: return binary(e.name, eval(*e.children[0]), eval(*e.children[1]), e.pos);
      case Expr::Kind::Compare: {
        Value left = eval(*e.children[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1]);
          if (!compare_op(e.ops[i], left, right, e.pos)) return Value::from(false);
          left = std::move(right);
        }
        return Value::from(true);
      }
      case Expr::Kind::Conditional:
        if (truthy(eval(*e.children[1]))) return eval(*e.children[0]);
        return e.children[2] ? eval(*e.children[2]) : Value::undefined();
    }
    return Value::undefined();
  }

  Args eval_args(const Expr& e) {
    Args args;
    for (size_t i = 1; i < e.children.size(); ++i) {
      Value v = eval(*e.children[i]);
      if (e.arg_names[i].empty()) args.positional.push_back(std::move(v));
      else args.keyword.emplace_back(e.arg_names[i], std::move(v));
    }
    return args;
  }

  bool compare_op(const std::string& op, const Value& a, const Value& b, size_t pos) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in" || op == "not in") {
      bool found = contains(b, a, pos);
      return op == "in" ? found : !found;
    }
    int c;
    try {
      c = compare(a, b);
    } catch (const ChatTemplateError& err) {
      fail(pos, err.what());
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  bool contains(const Value& container, const Value& item, size_t pos) {
    switch (container.kind) {
      case Value::Kind::String:
        if (!item.is_string()) fail(pos, std::string("'in <string>' requires a string, not ") + type_name(item));
        return container.text.find(item.text) != std::string::npos;
      case Value::Kind::List:
        for (const Value& v : *container.list)
          if (equals(v, item)) return true;
        return false;
      case Value::Kind::Dict: return item.is_string() && container.dict->find(item.text) != nullptr;
      case Value::Kind::Undefined: return false;
      default: fail(pos, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  Value binary(const std::string& op, const Value& a, const Value& b, size_t pos) {
    if (op == "~") return Value::from(to_str(a) + to_str(b));
    auto type_error = [&]() -> Value {
      fail(pos, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::from(a.text + b.text);
      if (a.is_list() && b.is_list()) {
        List items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::from(std::move(items));
      }
    }
    if (op == "*") {
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* count = seq == &a ? &b : &a;
      if (seq && count->is_integral()) {
        int64_t n = std::max<int64_t>(0, count->as_int());
        if (seq->is_string()) {
          std::string s;
          for (int64_t i = 0; i < n; ++i) s += seq->text;
          return Value::from(s);
        }
        List items;
        for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::from(std::move(items));
      }
    }
    if (!a.is_number() || !b.is_number()) return type_error();
    bool integral = a.is_integral() && b.is_integral();
    if (op == "/") {
      if (b.as_double() == 0) fail(pos, "division by zero");
      return Value::from(a.as_double() / b.as_double());
    }
    if (integral) {
      int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value::from(x + y);
      if (op == "-") return Value::from(x - y);
      if (op == "*") return Value::from(x * y);
      if (op == "//" || op == "%") {
        if (y == 0) fail(pos, "integer division or modulo by zero");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::from(op == "//" ? q : r);
      }
      if (op == "**") {
        if (y >= 0) {
          int64_t result = 1;
          for (int64_t i = 0; i < y; ++i) result *= x;
          return Value::from(result);
        }
        return Value::from(std::pow(static_cast<double>(x), static_cast<double>(y)));
      }
    } else {
      double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::from(x + y);
      if (op == "-") return Value::from(x - y);
      if (op == "*") return Value::from(x * y);
      if (op == "//" || op == "%") {
        if (y == 0) fail(pos, "float division or modulo by zero");
        double q = std::floor(x / y);
        return Value::from(op == "//" ? q : x - q * y);
      }
      if (op == "**") return Value::from(std::pow(x, y));
    }
    return type_error();
  }

  Value slice(const Expr& e) {
    Value subject = eval(*e.children[0]);
    auto bound = [&](const ExprPtr& p) -> std::optional<int64_t> {
      if (!p) return std::nullopt;
      Value v = eval(*p);
      if (v.is_none()) return std::nullopt;
      if (!v.is_integral()) fail(p->pos, "slice indices must be integers");
      return v.as_int();
    };
    std::optional<int64_t> start = bound(e.children[1]), stop = bound(e.children[2]), step_opt = bound(e.children[3]);
    int64_t step = step_opt.value_or(1);
    if (step == 0) fail(e.pos, "slice step cannot be zero");
    auto indices = [&](int64_t length) {
      std::vector<int64_t> out;
      auto clamp = [&](std::optional<int64_t> v, int64_t dflt, bool is_start) {
        if (!v) return dflt;
        int64_t x = *v;
        if (x < 0) x += length;
        if (step > 0) return std::clamp<int64_t>(x, 0, length);
        (void)is_start;
        return std::clamp<int64_t>(x, -1, length - 1);
      };
      int64_t b = clamp(start, step > 0 ? 0 : length - 1, true);
      int64_t s = clamp(stop, step > 0 ? length : -1, false);
      for (int64_t i = b; step > 0 ? i < s : i > s; i += step) out.push_back(i);
      return out;
    };
    if (subject.is_string()) {
      std::u32string u = to_u32(subject.text);
      std::u32string r;
      for (int64_t i : indices(static_cast<int64_t>(u.size()))) r.push_back(u[i]);
      return Value::from(from_u32(r));
    }
    if (subject.is_list()) {
      List r;
      for (int64_t i : indices(static_cast<int64_t>(subject.list->size()))) r.push_back((*subject.list)[i]);
      return Value::from(std::move(r));
    }
    if (subject.is_undefined()) fail(e.pos, "'" + subject.text + "' is undefined");
    fail(e.pos, std::string("'") + type_name(subject) + "' object is not subscriptable");
  }

  Value get_item(const Value& subject, const Value& key, const Expr& e) {
    switch (subject.kind) {
      case Value::Kind::Undefined: fail(e.pos, "'" + subject.text + "' is undefined");
      case Value::Kind::List: {
        if (!key.is_integral()) return Value::undefined();
        int64_t i = key.as_int(), n = static_cast<int64_t>(subject.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined();
        return (*subject.list)[i];
      }
      case Value::Kind::String: {
        if (!key.is_integral()) return Value::undefined();
        std::u32string u = to_u32(subject.text);
        int64_t i = key.as_int(), n = static_cast<int64_t>(u.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined();
        std::string s;
        utf8::append(s, u[i]);
        return Value::from(s);
      }
      case Value::Kind::Dict: {
        if (key.is_string()) {
          if (const Value* v = subject.dict->find(key.text)) return *v;
          return Value::undefined(key.text);
        }
        if (key.is_integral()) {
          if (const Value* v = subject.dict->find(std::to_string(key.as_int()))) return *v;
        }
        return Value::undefined();
      }
      default: return Value::undefined();
    }
  }

  Value get_attr(const Value& subject, const std::string& name, const Expr& e) {
    switch (subject.kind) {
      case Value::Kind::Undefined:
        fail(e.pos, "'" + (subject.text.empty() ? std::string("value") : subject.text) + "' is undefined");
      case Value::Kind::Dict: {
        if (!subject.dict->is_namespace) {
          static const char* methods[] = {"items", "keys", "values", "get", "update", "copy", "pop", "setdefault"};
          for (const char* m : methods)
            if (name == m) return method(subject, name);
        }
        if (const Value* v = subject.dict->find(name)) return *v;
        return Value::undefined(name);
      }
      case Value::Kind::String:
      case Value::Kind::List: return method(subject, name);
      default: return Value::undefined(name);
    }
  }

  // ---- Python methods of str, list and dict

  Value method(const Value& self, const std::string& name) {
    auto bind = [&](std::function<Value(const Value&, Args&)> fn) {
      Value captured = self;
      return Value::from_function([captured, fn](Args& a) { return fn(captured, a); });
    };
    auto arg_string = [](Args& a, size_t i, const char* n) -> std::string {
      const Value* v = a.get(i, n);
      if (!v || !v->is_string()) throw ChatTemplateError(std::string("expected a string argument '") + n + "'");
      return v->text;
    };
    if (self.is_string()) {
      if (name == "startswith" || name == "endswith") {
        bool starts = name == "startswith";
        return bind([starts](const Value& s, Args& a) {
          const Value* p = a.get(0, "prefix");
          if (!p) throw ChatTemplateError("startswith/endswith needs an argument");
          std::vector<std::string> options;
          if (p->is_list())
            for (const Value& v : *p->list) options.push_back(v.text);
          else options.push_back(p->text);
          for (const std::string& o : options) {
            if (o.size() > s.text.size()) continue;
            if (starts ? s.text.compare(0, o.size(), o) == 0 : s.text.compare(s.text.size() - o.size(), o.size(), o) == 0)
              return Value::from(true);
          }
          return Value::from(false);
        });
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        bool left = name != "rstrip", right = name != "lstrip";
        return bind([left, right](const Value& s, Args& a) {
          return Value::from(strip_chars(s.text, a.get(0, "chars"), left, right));
        });
      }
      if (name == "split" || name == "rsplit") {
        bool reverse = name == "rsplit";
        return bind([reverse](const Value& s, Args& a) {
          const Value* max = a.get(1, "maxsplit");
          int64_t maxsplit = max ? max->as_int() : -1;
          if (reverse && maxsplit >= 0) {
            // rsplit with a limit: split fully, then re-join the leading parts.
            List parts = split(s.text, a.get(0, "sep"), -1);
            const Value* sep = a.get(0, "sep");
            if (static_cast<int64_t>(parts.size()) <= maxsplit + 1) return Value::from(std::move(parts));
            std::string joiner = sep && sep->is_string() ? sep->text : " ";
            size_t keep = parts.size() - static_cast<size_t>(maxsplit);
            std::string head;
            for (size_t i = 0; i < keep; ++i) head += (i ? joiner : "") + parts[i].text;
            List out{Value::from(head)};
            out.insert(out.end(), parts.begin() + keep, parts.end());
            return Value::from(std::move(out));
          }
          return Value::from(split(s.text, a.get(0, "sep"), maxsplit));
        });
      }
      if (name == "splitlines") {
        return bind([](const Value& s, Args&) {
          List out;
          size_t start = 0;
          const std::string& t = s.text;
          for (size_t i = 0; i < t.size(); ++i) {
            if (t[i] == '\n' || t[i] == '\r') {
              out.push_back(Value::from(t.substr(start, i - start)));
              if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
              start = i + 1;
            }
          }
          if (start < t.size()) out.push_back(Value::from(t.substr(start)));
          return Value::from(std::move(out));
        });
      }
      if (name == "lower") return bind([](const Value& s, Args&) { return Value::from(lower(s.text)); });
      if (name == "upper") return bind([](const Value& s, Args&) { return Value::from(upper(s.text)); });
      if (name == "title") return bind([](const Value& s, Args&) { return Value::from(title(s.text)); });
      if (name == "capitalize") return bind([](const Value& s, Args&) { return Value::from(capitalize(s.text)); });
      if (name == "replace") {
        return bind([arg_string](const Value& s, Args& a) {
          const Value* count = a.get(2, "count");
          return Value::from(replace_all(s.text, arg_string(a, 0, "old"), arg_string(a, 1, "new"),
                                         count ? count->as_int() : -1));
        });
      }
      if (name == "find" || name == "rfind" || name == "index" || name == "count") {
        return bind([name, arg_string](const Value& s, Args& a) {
          std::string sub = arg_string(a, 0, "sub");
          if (name == "count") {
            if (sub.empty()) return Value::from(static_cast<int64_t>(to_u32(s.text).size() + 1));
            int64_t n = 0;
            for (size_t at = s.text.find(sub); at != std::string::npos; at = s.text.find(sub, at + sub.size())) ++n;
            return Value::from(n);
          }
          size_t at = name == "rfind" ? s.text.rfind(sub) : s.text.find(sub);
          if (at == std::string::npos) {
            if (name == "index") throw ChatTemplateError("substring not found");
            return Value::from(int64_t{-1});
          }
          return Value::from(static_cast<int64_t>(to_u32(s.text.substr(0, at)).size()));
        });
      }
      if (name == "join") {
        return bind([this](const Value& s, Args& a) {
          const Value* items = a.get(0, "iterable");
          if (!items) throw ChatTemplateError("join needs an argument");
          std::string out;
          bool first = true;
          for (const Value& v : iterate(*items, 0)) {
            if (!first) out += s.text;
            out += to_str(v);
            first = false;
          }
          return Value::from(out);
        });
      }
      if (name == "format") {
        return bind([](const Value& s, Args& a) {
          std::string out;
          size_t next_arg = 0;
          const std::string& t = s.text;
          for (size_t i = 0; i < t.size(); ++i) {
            if (t[i] == '{' && i + 1 < t.size() && t[i + 1] == '{') {
              out += '{';
              ++i;
            } else if (t[i] == '}' && i + 1 < t.size() && t[i + 1] == '}') {
              out += '}';
              ++i;
            } else if (t[i] == '{') {
              size_t close = t.find('}', i);
              if (close == std::string::npos) throw ChatTemplateError("format: unmatched '{'");
              std::string field = t.substr(i + 1, close - i - 1);
              const Value* v = nullptr;
              if (field.empty()) v = a.get(next_arg++, "");
              else if (std::isdigit(static_cast<unsigned char>(field[0]))) v = a.get(std::stoul(field), "");
              else v = a.get(SIZE_MAX, field);
              if (!v) throw ChatTemplateError("format: missing argument for {" + field + "}");
              out += to_str(*v);
              i = close;
            } else {
              out += t[i];
            }
          }
          return Value::from(out);
        });
      }
      if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" ||
          name == "isupper") {
        return bind([name](const Value& s, Args&) {
          std::u32string u = to_u32(s.text);
          if (u.empty()) return Value::from(false);
          bool cased = false;
          for (char32_t c : u) {
            bool ok;
            if (name == "isdigit") ok = c >= '0' && c <= '9';
            else if (name == "isalpha") ok = is_alpha(c);
            else if (name == "isspace") ok = is_unicode_space(c);
            else if (name == "isalnum") ok = is_alpha(c) || (c >= '0' && c <= '9');
            else if (name == "islower") {
              ok = to_upper(c) == c || to_lower(c) == c;
              if (to_upper(c) != c) cased = true;
              if (to_lower(c) != c) ok = false;
            } else {
              ok = to_upper(c) == c || to_lower(c) == c;
              if (to_lower(c) != c) cased = true;
              if (to_upper(c) != c) ok = false;
            }
            if (!ok) return Value::from(false);
          }
          if (name == "islower" || name == "isupper") return Value::from(cased);
          return Value::from(true);
        });
      }
      return Value::undefined(name);
    }
    if (self.is_list()) {
      if (name == "append") {
        return bind([](const Value& l, Args& a) {
          if (a.positional.size() != 1) throw ChatTemplateError("append takes one argument");
          l.list->push_back(a.positional[0]);
          return Value::none();
        });
      }
      if (name == "pop") {
        return bind([](const Value& l, Args& a) {
          if (l.list->empty()) throw ChatTemplateError("pop from empty list");
          int64_t n = static_cast<int64_t>(l.list->size());
          int64_t i = a.positional.empty() ? n - 1 : a.positional[0].as_int();
          if (i < 0) i += n;
          if (i < 0 || i >= n) throw ChatTemplateError("pop index out of range");
          Value v = (*l.list)[i];
          l.list->erase(l.list->begin() + i);
          return v;
        });
      }
      if (name == "index" || name == "count") {
        return bind([name](const Value& l, Args& a) {
          if (a.positional.empty()) throw ChatTemplateError(name + " needs an argument");
          int64_t n = 0;
          for (size_t i = 0; i < l.list->size(); ++i) {
            if (!equals((*l.list)[i], a.positional[0])) continue;
            if (name == "index") return Value::from(static_cast<int64_t>(i));
            ++n;
          }
          if (name == "index") throw ChatTemplateError("value is not in list");
          return Value::from(n);
        });
      }
      return Value::undefined(name);
    }
    // dict
    if (name == "items" || name == "keys" || name == "values") {
      return bind([name](const Value& d, Args&) {
        List out;
        for (const auto& [k, v] : d.dict->entries) {
          if (name == "items") out.push_back(Value::from(List{Value::from(k), v}));
          else if (name == "keys") out.push_back(Value::from(k));
          else out.push_back(v);
        }
        return Value::from(std::move(out));
      });
    }
    if (name == "get" || name == "pop" || name == "setdefault") {
      return bind([name](const Value& d, Args& a) {
        const Value* key = a.get(0, "key");
        const Value* dflt = a.get(1, "default");
        if (!key || !key->is_string()) throw ChatTemplateError(name + " needs a string key");
        if (const Value* v = d.dict->find(key->text)) {
          Value found = *v;
          if (name == "pop") {
            auto& entries = d.dict->entries;
            entries.erase(std::find_if(entries.begin(), entries.end(), [&](auto& e) { return e.first == key->text; }));
          }
          return found;
        }
        Value fallback = dflt ? *dflt : Value::none();
        if (name == "setdefault") d.dict->set(key->text, fallback);
        return fallback;
      });
    }
    if (name == "update") {
      return bind([](const Value& d, Args& a) {
        for (const Value& p : a.positional)
          if (p.is_dict())
            for (const auto& [k, v] : p.dict->entries) d.dict->set(k, v);
        for (auto& [k, v] : a.keyword) d.dict->set(k, v);
        return Value::none();
      });
    }
    if (name == "copy") {
      return bind([](const Value& d, Args&) { return Value::from_dict(std::make_shared<Dict>(*d.dict)); });
    }
    return Value::undefined(name);
  }

  static std::string title(const std::string& s) {
    std::u32string u = to_u32(s);
    bool previous_cased = false;
    for (auto& c : u) {
      bool cased = is_alpha(c);
      c = cased ? (previous_cased ? to_lower(c) : to_upper(c)) : c;
      previous_cased = cased;
    }
    return from_u32(u);
  }
  static std::string capitalize(const std::string& s) {
    std::u32string u = to_u32(s);
    for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper(u[i]) : to_lower(u[i]);
    return from_u32(u);
  }

  // ---- filters

  Value attribute_of(const Value& item, const std::string& path, const Expr& e) {
    Value v = item;
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      if (v.is_undefined()) return v;
      v = numeric ? get_item(v, Value::from(static_cast<int64_t>(std::stoll(part))), e) : get_attr(v, part, e);
      if (dot == std::string::npos) return v;
      start = dot + 1;
    }
  }

  Value apply_filter(const std::string& name, const Value& v, Args& a, const Expr& e) {
    auto arg = [&](size_t i, const char* n) { return a.get(i, n); };
    auto int_arg = [&](size_t i, const char* n, int64_t dflt) {
      const Value* x = arg(i, n);
      return x && x->is_number() ? x->as_int() : dflt;
    };
    auto bool_arg = [&](size_t i, const char* n, bool dflt) {
      const Value* x = arg(i, n);
      return x ? truthy(*x) : dflt;
    };
    if (name == "trim") return Value::from(strip_chars(to_str(v), arg(0, "chars"), true, true));
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Value::Kind::String: return Value::from(static_cast<int64_t>(to_u32(v.text).size()));
        case Value::Kind::List: return Value::from(static_cast<int64_t>(v.list->size()));
        case Value::Kind::Dict: return Value::from(static_cast<int64_t>(v.dict->entries.size()));
        case Value::Kind::Undefined: return Value::from(int64_t{0});
        default: fail(e.pos, std::string("object of type '") + type_name(v) + "' has no len()");
      }
    }
    if (name == "tojson") {
      const Value* indent = arg(0, "indent");
      std::string out;
      to_json(out, v, indent && indent->is_number() ? static_cast<int>(indent->as_int()) : -1, 0,
              bool_arg(99, "sort_keys", false));
      return Value::from(out);
    }
    if (name == "string") return Value::from(to_str(v));
    if (name == "lower") return Value::from(lower(to_str(v)));
    if (name == "upper") return Value::from(upper(to_str(v)));
    if (name == "title") return Value::from(title(to_str(v)));
    if (name == "capitalize") return Value::from(capitalize(to_str(v)));
    if (name == "safe" || name == "forceescape") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : to_str(v)) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value::from(out);
    }
    if (name == "join") {
      const Value* sep = arg(0, "d");
      const Value* attribute = arg(1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& item : iterate(v, e.pos)) {
        if (!first) out += sep ? to_str(*sep) : "";
        out += to_str(attribute ? attribute_of(item, to_str(*attribute), e) : item);
        first = false;
      }
      return Value::from(out);
    }
    if (name == "first" || name == "last") {
      List items = iterate(v, e.pos);
      if (items.empty()) return Value::undefined();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "default" || name == "d") {
      const Value* fallback = arg(0, "default_value");
      bool boolean = bool_arg(1, "boolean", false);
      if (v.is_undefined() || (boolean && !truthy(v))) return fallback ? *fallback : Value::from("");
      return v;
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::from(List{});
      if (!v.is_dict()) fail(e.pos, std::string("items filter needs a mapping, got ") + type_name(v));
      List out;
      for (const auto& [k, x] : v.dict->entries) out.push_back(Value::from(List{Value::from(k), x}));
      return Value::from(std::move(out));
    }
    if (name == "list") return Value::from(iterate(v, e.pos));
    if (name == "reverse") {
      if (v.is_string()) {
        std::u32string u = to_u32(v.text);
        std::reverse(u.begin(), u.end());
        return Value::from(from_u32(u));
      }
      List items = iterate(v, e.pos);
      std::reverse(items.begin(), items.end());
      return Value::from(std::move(items));
    }
    if (name == "sort" || name == "dictsort") {
      bool reverse = bool_arg(name == "sort" ? 0 : 2, "reverse", false);
      bool case_sensitive = bool_arg(name == "sort" ? 1 : 0, "case_sensitive", false);
      const Value* attribute = name == "sort" ? arg(2, "attribute") : nullptr;
      List items;
      if (name == "dictsort") {
        if (!v.is_dict()) fail(e.pos, "dictsort needs a mapping");
        for (const auto& [k, x] : v.dict->entries) items.push_back(Value::from(List{Value::from(k), x}));
      } else {
        items = iterate(v, e.pos);
      }
      auto key = [&](const Value& item) {
        Value k = name == "dictsort" ? (*item.list)[0] : attribute ? attribute_of(item, to_str(*attribute), e) : item;
        if (!case_sensitive && k.is_string()) k.text = lower(k.text);
        return k;
      };
      try {
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          int c = compare(key(x), key(y));
          return reverse ? c > 0 : c < 0;
        });
      } catch (const ChatTemplateError& err) {
        fail(e.pos, err.what());
      }
      return Value::from(std::move(items));
    }
    if (name == "unique") {
      List out;
      for (const Value& item : iterate(v, e.pos)) {
        bool seen = false;
        for (const Value& o : out) seen = seen || equals(o, item);
        if (!seen) out.push_back(item);
      }
      return Value::from(std::move(out));
    }
    if (name == "min" || name == "max") {
      List items = iterate(v, e.pos);
      if (items.empty()) return Value::undefined();
      Value best = items[0];
      for (const Value& item : items) {
        int c = compare(item, best);
        if (name == "min" ? c < 0 : c > 0) best = item;
      }
      return best;
    }
    if (name == "sum") {
      const Value* attribute = arg(0, "attribute");
      const Value* start = arg(1, "start");
      Value total = start ? *start : Value::from(int64_t{0});
      for (const Value& item : iterate(v, e.pos))
        total = binary("+", total, attribute ? attribute_of(item, to_str(*attribute), e) : item, e.pos);
      return total;
    }
    if (name == "int") {
      if (v.is_number()) return Value::from(v.as_int());
      if (v.is_string()) {
        std::string s = strip_chars(v.text, nullptr, true, true);
        char* end = nullptr;
        long long x = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == '\0') return Value::from(static_cast<int64_t>(x));
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value::from(static_cast<int64_t>(d));
      }
      return Value::from(int_arg(0, "default", 0));
    }
    if (name == "float") {
      if (v.is_number()) return Value::from(v.as_double());
      if (v.is_string()) {
        std::string s = strip_chars(v.text, nullptr, true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value::from(d);
      }
      const Value* dflt = arg(0, "default");
      return dflt ? Value::from(dflt->as_double()) : Value::from(0.0);
    }
    if (name == "abs") {
      if (v.kind == Value::Kind::Float) return Value::from(std::fabs(v.number));
      if (v.is_number()) return Value::from(static_cast<int64_t>(std::llabs(v.as_int())));
      fail(e.pos, "abs needs a number");
    }
    if (name == "round") {
      int64_t precision = int_arg(0, "precision", 0);
      const Value* method_arg = arg(1, "method");
      std::string how = method_arg ? to_str(*method_arg) : "common";
      double scale = std::pow(10.0, static_cast<double>(precision));
      double x = v.as_double() * scale;
      x = how == "floor" ? std::floor(x) : how == "ceil" ? std::ceil(x) : std::round(x);
      return Value::from(x / scale);
    }
    if (name == "replace") {
      const Value* from = arg(0, "old");
      const Value* to = arg(1, "new");
      if (!from || !to) fail(e.pos, "replace needs two arguments");
      return Value::from(replace_all(to_str(v), to_str(*from), to_str(*to), int_arg(2, "count", -1)));
    }
    if (name == "indent") {
      const Value* width_arg = arg(0, "width");
      std::string pad = width_arg && width_arg->is_string() ? width_arg->text
                                                            : std::string(static_cast<size_t>(int_arg(0, "width", 4)), ' ');
      bool first = bool_arg(1, "first", false), blank = bool_arg(2, "blank", false);
      std::string s = to_str(v), out;
      size_t start = 0;
      bool is_first = true;
      while (start <= s.size()) {
        size_t nl = s.find('\n', start);
        std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        bool pad_line = (is_first ? first : true) && (blank || !line.empty());
        out += (pad_line ? pad : "") + line;
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        is_first = false;
      }
      return Value::from(out);
    }
    if (name == "wordcount") return Value::from(static_cast<int64_t>(split(to_str(v), nullptr, -1).size()));
    if (name == "truncate") {
      int64_t length = int_arg(0, "length", 255);
      std::u32string u = to_u32(to_str(v));
      if (static_cast<int64_t>(u.size()) <= length) return Value::from(to_str(v));
      const Value* end_arg = arg(2, "end");
      std::string end = end_arg ? to_str(*end_arg) : "...";
      int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(to_u32(end).size()));
      return Value::from(from_u32(u.substr(0, static_cast<size_t>(keep))) + end);
    }
    if (name == "attr") {
      const Value* n = arg(0, "name");
      if (!n) fail(e.pos, "attr needs a name");
      return get_attr(v, to_str(*n), e);
    }
    if (name == "map") {
      const Value* attribute = nullptr;
      for (auto& [k, x] : a.keyword)
        if (k == "attribute") attribute = &x;
      List out;
      for (const Value& item : iterate(v, e.pos)) {
        if (attribute) {
          Value got = attribute_of(item, to_str(*attribute), e);
          if (got.is_undefined()) {
            for (auto& [k, x] : a.keyword)
              if (k == "default") got = x;
          }
          out.push_back(got);
        } else {
          if (a.positional.empty()) fail(e.pos, "map needs a filter name or attribute=");
          Args rest;
          rest.positional.assign(a.positional.begin() + 1, a.positional.end());
          out.push_back(apply_filter(to_str(a.positional[0]), item, rest, e));
        }
      }
      return Value::from(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      bool by_attribute = name == "selectattr" || name == "rejectattr";
      bool keep_when = name == "select" || name == "selectattr";
      size_t test_index = by_attribute ? 1 : 0;
      List out;
      for (const Value& item : iterate(v, e.pos)) {
        Value subject = by_attribute ? attribute_of(item, to_str(a.positional.at(0)), e) : item;
        bool passed;
        if (a.positional.size() <= test_index) {
          passed = truthy(subject);
        } else {
          Args rest;
          rest.positional.assign(a.positional.begin() + test_index + 1, a.positional.end());
          std::string test = to_str(a.positional[test_index]);
          passed = test == "defined" ? !subject.is_undefined()
                   : test == "undefined" ? subject.is_undefined()
                                         : apply_test(test, subject, rest, e);
        }
        if (passed == keep_when) out.push_back(item);
      }
      return Value::from(std::move(out));
    }
    fail(e.pos, "unsupported filter '" + name + "'");
  }

  // ---- tests

  bool apply_test(const std::string& name, const Value& v, Args& a, const Expr& e) {
    auto other = [&]() -> const Value& {
      if (a.positional.empty()) fail(e.pos, "test '" + name + "' needs an argument");
      return a.positional[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind == Value::Kind::Bool;
    if (name == "true") return v.kind == Value::Kind::Bool && v.boolean;
    if (name == "false") return v.kind == Value::Kind::Bool && !v.boolean;
    if (name == "integer") return v.kind == Value::Kind::Int;
    if (name == "float") return v.kind == Value::Kind::Float;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "sequence" || name == "iterable") return v.is_list() || v.is_string() || v.is_dict();
    if (name == "callable") return v.kind == Value::Kind::Function;
    if (name == "odd" || name == "even") {
      if (!v.is_integral()) fail(e.pos, "test '" + name + "' needs an integer");
      bool odd = (v.as_int() % 2) != 0;
      return name == "odd" ? odd : !odd;
    }
    if (name == "divisibleby") {
      int64_t d = other().as_int();
      if (d == 0) fail(e.pos, "divisibleby 0");
      return v.as_int() % d == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, other());
    if (name == "ne" || name == "!=") return !equals(v, other());
    if (name == "lt" || name == "lessthan" || name == "<") return compare_op("<", v, other(), e.pos);
    if (name == "le" || name == "<=") return compare_op("<=", v, other(), e.pos);
    if (name == "gt" || name == "greaterthan" || name == ">") return compare_op(">", v, other(), e.pos);
    if (name == "ge" || name == ">=") return compare_op(">=", v, other(), e.pos);
    if (name == "in") return contains(other(), v, e.pos);
    if (name == "sameas") {
      const Value& o = other();
      if (v.kind != o.kind) return false;
      if (v.is_dict()) return v.dict == o.dict;
      if (v.is_list()) return v.list == o.list;
      return equals(v, o);
    }
    if (name == "lower") return v.is_string() && lower(v.text) == v.text;
    if (name == "upper") return v.is_string() && upper(v.text) == v.text;
    fail(e.pos, "unsupported test '" + name + "'");
  }

  const std::string& src_;
  std::vector<std::shared_ptr<Dict>> frames_;
  Value block_text_;  // subject of a {% filter %} block
};

}  // namespace

// =============================================================================================

struct ChatTemplate::Impl {
  std::string source;
  Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  // Jinja's default keep_trailing_newline=False drops one trailing newline of the template.
  std::string& s = impl_->source;
  if (s.size() >= 2 && s.compare(s.size() - 2, 2, "\r\n") == 0) s.resize(s.size() - 2);
  else if (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  Lexer lexer(impl_->source);
  Parser parser(impl_->source, lexer.run());
  impl_->body = parser.parse_template();
}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

namespace {
template <class Json>
std::string render_with(const ChatTemplate::Impl& impl, const Json& context) {
  if (!context.is_object()) throw ChatTemplateError("chat template context must be a JSON object");
  auto globals = std::make_shared<Dict>();
  for (auto it = context.begin(); it != context.end(); ++it) globals->set(it.key(), from_json(it.value()));
  Renderer renderer(impl.source, globals);
  std::string out;
  Flow flow = renderer.render(impl.body, out);
  if (flow != Flow::Normal) throw ChatTemplateError("chat template: break or continue outside a loop");
  return out;
}

template <class Json>
std::string render_messages(const std::string& tmpl, const Json& messages, bool add_generation_prompt,
                            const Json& extra) {
  if (!messages.is_array()) throw ChatTemplateError("chat template: messages must be a JSON array");
  if (!extra.is_object() && !extra.is_null()) throw ChatTemplateError("chat template: extra must be a JSON object");
  Json context = Json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  return ChatTemplate(tmpl).render(context);
}
}  // namespace

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const { return render_with(*impl_, context); }
std::string ChatTemplate::render(const nlohmann::json& context) const { return render_with(*impl_, context); }

std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) {
  return render_messages(tmpl, messages, add_generation_prompt, extra);
}

std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra) {
  return render_messages(tmpl, messages, add_generation_prompt, extra);
}

}  // namespace mla
