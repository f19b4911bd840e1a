// Values of the Jinja interpreter: conversions, comparisons and Python str operations.
#include "jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja/error.h"
#include "jinja/limits.h"
#include "tokenizer/unicode_util.h"

namespace mla::jinja {

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

namespace {

// repr of lists and dicts, appended to out: at most max_bytes and kMaxValueDepth deep (a list
// holding itself prints until one of the two stops it).
void repr_into(std::string& out, const Value& v, size_t depth, size_t max_bytes) {
  if (depth > kMaxValueDepth) throw LimitError(Limit::Depth, kMaxValueDepth, "printing a nested value");
  if (out.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, "printing a value");
  switch (v.kind) {
    case Value::Kind::String: out += python_repr_string(v.text); return;
    case Value::Kind::List:
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        repr_into(out, (*v.list)[i], depth + 1, max_bytes);
      }
      out += ']';
      return;
    case Value::Kind::Dict: {
      if (v.dict->is_namespace) {
        out += "<Namespace>";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict->entries) {
        out += (first ? "" : ", ") + python_repr_string(k) + ": ";
        repr_into(out, e, depth + 1, max_bytes);
        first = false;
      }
      out += '}';
      return;
    }
    case Value::Kind::Function: out += "<function>"; return;
    default: out += to_str(v);
  }
}

}  // namespace

std::string to_str(const Value& v, size_t max_bytes) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.boolean ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.integer);
    case Value::Kind::Float: return python_float(v.number);
    case Value::Kind::String: return v.text;
    default: return repr(v, max_bytes);
  }
}

std::string repr(const Value& v, size_t max_bytes) {
  std::string out;
  repr_into(out, v, 0, max_bytes);
  if (out.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, "printing a value");
  return out;
}

namespace {

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

void json_value(std::string& out, const Value& v, int indent, int depth, bool sort_keys, size_t max_bytes) {
  if (static_cast<size_t>(depth) > kMaxValueDepth) throw LimitError(Limit::Depth, kMaxValueDepth, "tojson of a nested value");
  if (out.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, "tojson");
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
        json_value(out, (*v.list)[i], indent, depth + 1, sort_keys, max_bytes);
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
        json_value(out, entries[i]->second, indent, depth + 1, sort_keys, max_bytes);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    case Value::Kind::Undefined: throw Error("tojson: value is undefined");
    case Value::Kind::Function: throw Error("tojson: a function is not JSON serializable");
  }
}

}  // namespace

void to_json(std::string& out, const Value& v, int indent, bool sort_keys, size_t max_bytes) {
  json_value(out, v, indent, 0, sort_keys, max_bytes);
  if (out.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, "tojson");
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

namespace {

// Comparisons follow nested lists and dicts at most kMaxValueDepth deep and kMaxComparisons
// element comparisons in all (lists that hold themselves would recurse without end).
constexpr uint64_t kMaxComparisons = 10'000'000;

struct CompareBudget {
  uint64_t used = 0;
  void enter(size_t depth) {
    if (depth > kMaxValueDepth) throw LimitError(Limit::Depth, kMaxValueDepth, "comparing nested values");
    if (++used > kMaxComparisons) throw LimitError(Limit::Steps, kMaxComparisons, "comparing nested values");
  }
};

bool equals_at(const Value& a, const Value& b, size_t depth, CompareBudget& budget) {
  budget.enter(depth);
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
      if (a.list == b.list) return true;
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals_at((*a.list)[i], (*b.list)[i], depth + 1, budget)) return false;
      return true;
    }
    case Value::Kind::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, v] : a.dict->entries) {
        const Value* other = b.dict->find(k);
        if (!other || !equals_at(v, *other, depth + 1, budget)) return false;
      }
      return true;
    }
    case Value::Kind::Function: return a.function == b.function;
    default: return false;
  }
}

int compare_at(const Value& a, const Value& b, size_t depth, CompareBudget& budget) {
  budget.enter(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.text < b.text ? -1 : a.text > b.text ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i)
      if (int c = compare_at((*a.list)[i], (*b.list)[i], depth + 1, budget)) return c;
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw Error(std::string("cannot compare ") + type_name(a) + " with " + type_name(b));
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  CompareBudget budget;
  return equals_at(a, b, 0, budget);
}

int compare(const Value& a, const Value& b) {
  CompareBudget budget;
  return compare_at(a, b, 0, budget);
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
  if (d.empty()) throw Error("split: empty separator");
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

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                        size_t max_bytes) {
  auto check = [max_bytes](const std::string& out) {
    if (out.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, "replace");
  };
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
      check(out);
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
    check(out);
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  check(out);
  return out;
}

std::string title(const std::string& s) {
  std::u32string u = to_u32(s);
  bool previous_cased = false;
  for (auto& c : u) {
    bool cased = is_alpha(c);
    c = cased ? (previous_cased ? to_lower(c) : to_upper(c)) : c;
    previous_cased = cased;
  }
  return from_u32(u);
}

std::string capitalize(const std::string& s) {
  std::u32string u = to_u32(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper(u[i]) : to_lower(u[i]);
  return from_u32(u);
}

const char* limit_name(Limit limit) {
  switch (limit) {
    case Limit::Depth: return "max_depth";
    case Limit::CallDepth: return "max_call_depth";
    case Limit::OutputBytes: return "max_output_bytes";
    case Limit::StringBytes: return "max_string_bytes";
    case Limit::ListItems: return "max_list_items";
    case Limit::Steps: return "max_steps";
  }
  return "?";
}

LimitError::LimitError(Limit limit, size_t value, const std::string& where)
    : Error("chat template exceeds its limit " + std::string(limit_name(limit)) + " (" + std::to_string(value) +
            ")" + (where.empty() ? "" : ": " + where)),
      limit_(limit),
      value_(value) {}

}  // namespace mla::jinja
