#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace mla::grammar {

namespace {

using J = nlohmann::ordered_json;

constexpr int64_t kMaxInt16 = 9999999999999999LL;  // 16 digits: the default integer bound
constexpr int64_t kMaxCopiedLength = 256;             // string bounds written out count by count

// The base rules and the rules each one uses.
const std::map<std::string, std::pair<std::string, std::vector<std::string>>>& base_rules() {
  static const std::map<std::string, std::pair<std::string, std::vector<std::string>>> rules = {
      {"ws", {R"(( " " | "\n" " "{0,16} )?)", {}}},
      {"value", {R"(object | array | string | number | "true" | "false" | "null")", {"object", "array", "string", "number"}}},
      {"object", {R"("{" ws ( string ":" ws value ( "," ws string ":" ws value )* ws )? "}")", {"ws", "string", "value"}}},
      {"array", {R"("[" ws ( value ( "," ws value )* ws )? "]")", {"ws", "value"}}},
      {"string", {R"("\"" char* "\"")", {"char"}}},
      // \u escapes: a code point outside the surrogates, or a high and a low surrogate as a pair.
      {"char", {R"([^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2} ) ))", {}}},
      {"integer", {R"("-"? ( "0" | [1-9] [0-9]{0,15} ))", {}}},
      {"number", {R"("-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?)", {}}},
      {"boolean", {R"("true" | "false")", {}}},
      {"null", {R"("null")", {}}},
  };
  return rules;
}

// A GBNF literal of raw text (UTF-8 kept as is).
std::string lit(const std::string& s) {
  std::string out = "\"";
  static const char* hex = "0123456789abcdef";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  return "( " + join(alts, " | ") + " )";
}

// ---- decimal ranges ---------------------------------------------------------------------

std::string digit_class(char lo, char hi) {
  if (lo == hi) return lit(std::string(1, lo));
  return std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(size_t n) {
  if (n == 0) return "";
  return n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}";
}

std::string seq(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// The decimal strings of one length n between x and y (x <= y, both of length n).
std::string same_length_range(const std::string& x, const std::string& y) {
  const size_t n = x.size();
  if (n == 0) return "";
  if (x == y) return lit(x);
  if (x[0] == y[0]) return seq(lit(x.substr(0, 1)), same_length_range(x.substr(1), y.substr(1)));
  const bool tail_zeros = x.find_first_not_of('0', 1) == std::string::npos;
  const bool tail_nines = y.find_first_not_of('9', 1) == std::string::npos;
  std::vector<std::string> alts;
  char start = x[0], end = y[0];
  if (!tail_zeros) {
    alts.push_back(seq(lit(x.substr(0, 1)), same_length_range(x.substr(1), std::string(n - 1, '9'))));
    ++start;
  }
  if (!tail_nines) --end;
  if (start <= end) alts.push_back(seq(digit_class(start, end), any_digits(n - 1)));
  if (!tail_nines) alts.push_back(seq(lit(y.substr(0, 1)), same_length_range(std::string(n - 1, '0'), y.substr(1))));
  return alternatives(alts);
}

int64_t pow10(size_t k) {
  int64_t v = 1;
  for (size_t i = 0; i < k; ++i) v *= 10;
  return v;
}

// Non-negative integers in [a, b], no leading zeros.
std::string nonneg_range(int64_t a, int64_t b) {
  const size_t la = std::to_string(a).size(), lb = std::to_string(b).size();
  std::vector<std::string> alts;
  size_t full_from = 0, full_to = 0;  // a run of lengths that are complete
  auto flush_full = [&] {
    if (full_from == 0) return;
    if (full_from == full_to) {
      alts.push_back(seq("[1-9]", any_digits(full_from - 1)));
    } else {
      alts.push_back("[1-9] [0-9]{" + std::to_string(full_from - 1) + "," + std::to_string(full_to - 1) + "}");
    }
    full_from = 0;
  };
  for (size_t len = la; len <= lb; ++len) {
    const int64_t first = len == 1 ? 0 : pow10(len - 1), last = pow10(len) - 1;
    const int64_t lo = std::max(a, first), hi = std::min(b, last);
    if (len >= 2 && lo == first && hi == last) {
      if (full_from == 0) full_from = len;
      full_to = len;
      continue;
    }
    flush_full();
    alts.push_back(same_length_range(std::to_string(lo), std::to_string(hi)));
  }
  flush_full();
  return alternatives(alts);
}

std::string int_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) alts.push_back(seq("\"-\"", nonneg_range(std::max<int64_t>(1, -std::min<int64_t>(hi, -1)), -lo)));
  if (hi >= 0) alts.push_back(nonneg_range(std::max<int64_t>(lo, 0), hi));
  return alternatives(alts);
}

// ---- the converter ------------------------------------------------------------------------

const std::set<std::string>& known_keywords() {
  static const std::set<std::string> k = {
      "type",      "properties",       "required",         "additionalProperties", "enum",     "const",
      "items",     "minItems",         "maxItems",         "minLength",            "maxLength", "minimum",
      "maximum",   "exclusiveMinimum", "exclusiveMaximum", "anyOf",                "oneOf",    "allOf",
      "$ref",      "$defs",            "definitions",      "title",                "description",
      "default",   "examples",         "$schema",          "$id",                  "$comment", "deprecated",
      "readOnly",  "writeOnly",        "format"};
  return k;
}

class Converter {
 public:
  Converter(const J& root, const JsonSchemaOptions& opt) : root_(root), strict_(opt.strict), prefix_(opt.rule_prefix) {
    for (char c : prefix_)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
        throw std::invalid_argument("json_schema: rule_prefix must be made of [A-Za-z0-9_-]");
    for (const auto& [name, rule] : base_rules()) names_.insert(prefix_ + name);
    names_.insert(prefix_ + "root");
  }

  std::string run() {
    const std::string body = gen(root_, "#", "root");
    if (!unsupported_.empty()) {
      std::vector<std::string> v(unsupported_.begin(), unsupported_.end());
      throw SchemaError("unsupported JSON Schema keyword" + std::string(v.size() > 1 ? "s" : "") + ": " +
                        join(v, ", "));
    }
    std::string out = prefix_ + "root ::= " + body + "\n";
    for (const auto& [name, rule_body] : rules_) out += name + " ::= " + rule_body + "\n";
    // Base rules, with what they use.
    std::vector<std::string> todo(used_.begin(), used_.end());
    std::set<std::string> emitted;
    while (!todo.empty()) {
      const std::string n = todo.back();
      todo.pop_back();
      if (!emitted.insert(n).second) continue;
      const auto& [text, deps] = base_rules().at(n);
      out += prefix_ + n + " ::= " + prefixed(text) + "\n";
      for (const auto& d : deps) todo.push_back(d);
    }
    return out;
  }

 private:
  [[noreturn]] static void malformed(const std::string& path, const std::string& what) {
    throw SchemaError("malformed JSON Schema at " + path + ": " + what);
  }

  std::string use(const std::string& base) {
    used_.insert(base);
    return prefix_ + base;
  }

  // A base rule's body with the prefix on every rule name (literals and classes kept).
  std::string prefixed(const std::string& body) const {
    if (prefix_.empty()) return body;
    std::string out;
    for (size_t i = 0; i < body.size();) {
      const char c = body[i];
      if (c == '"' || c == '[') {
        const char close = c == '"' ? '"' : ']';
        size_t j = i + 1;
        while (j < body.size() && body[j] != close) j += body[j] == '\\' ? 2 : 1;
        out.append(body, i, j + 1 - i);
        i = j + 1;
      } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        size_t j = i;
        while (j < body.size() && ((body[j] >= 'a' && body[j] <= 'z') || (body[j] >= 'A' && body[j] <= 'Z') ||
                                   (body[j] >= '0' && body[j] <= '9') || body[j] == '_' || body[j] == '-'))
          ++j;
        out += prefix_;
        out.append(body, i, j - i);
        i = j;
      } else {
        out += c;
        ++i;
      }
    }
    return out;
  }

  std::string fresh(const std::string& hint) {
    std::string base;
    for (char c : hint)
      base += ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) ? c : '-';
    if (base.empty() || base == "-") base = "r";
    base = prefix_ + base;
    std::string name = base;
    for (int i = 1; names_.count(name); ++i) name = base + "-" + std::to_string(i);
    names_.insert(name);
    return name;
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    const std::string name = fresh(hint);
    rules_.push_back({name, body});
    return name;
  }

  static int64_t get_count(const J& s, const char* key, const std::string& path, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const J& v = s[key];
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))
      return std::min<int64_t>(v.get<int64_t>(), 1000000);
    if (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>())
      return int64_t(v.get<double>());
    malformed(path, std::string(key) + " must be a non-negative integer");
  }

  std::string resolve_ref(const J& s, const std::string& path) {
    if (!s["$ref"].is_string()) malformed(path, "$ref must be a string");
    const std::string ref = s["$ref"].get<std::string>();
    auto it = refs_.find(ref);
    if (it != refs_.end()) return it->second;
    if (ref.empty() || ref[0] != '#') throw SchemaError("unsupported JSON Schema $ref '" + ref + "' (only references into the schema itself, '#...')");
    const J* target = &root_;
    if (ref.size() > 1) {
      try {
        target = &root_.at(J::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        malformed(path, "unresolvable $ref '" + ref + "'");
      }
    }
    const std::string name = fresh("ref-" + ref.substr(ref.find_last_of('/') + 1));
    refs_[ref] = name;
    const size_t slot = rules_.size();
    rules_.push_back({name, ""});
    const std::string body = gen(*target, ref, name);
    rules_[slot].second = body;
    return name;
  }

  std::string gen(const J& s, const std::string& path, const std::string& hint) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return use("value");
      malformed(path, "the schema false allows no value");
    }
    if (!s.is_object()) malformed(path, "a schema must be an object or a boolean");
    for (const auto& [key, val] : s.items()) {
      if (!known_keywords().count(key)) unsupported_.insert(key);
      (void)val;
    }
    if (s.contains("$ref")) return resolve_ref(s, path);
    if (s.contains("const")) return lit(s["const"].dump());
    if (s.contains("enum")) {
      const J& e = s["enum"];
      if (!e.is_array() || e.empty()) malformed(path, "enum must be a non-empty array");
      std::vector<std::string> alts;
      for (const auto& v : e) alts.push_back(lit(v.dump()));
      return alternatives(alts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const J& a = s[key];
      if (!a.is_array() || a.empty()) malformed(path, std::string(key) + " must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < a.size(); ++i)
        alts.push_back(gen(a[i], path + "/" + key + "/" + std::to_string(i), hint + "-" + std::to_string(i)));
      return add_rule(hint, join(alts, " | "));
    }
    if (s.contains("allOf")) {
      const J& a = s["allOf"];
      if (!a.is_array() || a.empty()) malformed(path, "allOf must be a non-empty array");
      if (a.size() > 1) {
        unsupported_.insert("allOf (with more than one schema)");
        return use("value");
      }
      return gen(a[0], path + "/allOf/0", hint);
    }
    if (s.contains("type")) {
      const J& t = s["type"];
      if (t.is_string()) return gen_type(s, t.get<std::string>(), path, hint);
      if (!t.is_array() || t.empty()) malformed(path, "type must be a string or a non-empty array of strings");
      std::vector<std::string> alts;
      for (const auto& x : t) {
        if (!x.is_string()) malformed(path, "type must be a string or a non-empty array of strings");
        alts.push_back(gen_type(s, x.get<std::string>(), path, hint + "-" + x.get<std::string>()));
      }
      return add_rule(hint, join(alts, " | "));
    }
    // No type: from the keywords present.
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
      return gen_type(s, "object", path, hint);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return gen_type(s, "array", path, hint);
    if (s.contains("minLength") || s.contains("maxLength")) return gen_type(s, "string", path, hint);
    if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum"))
      return gen_type(s, "number", path, hint);
    return use("value");
  }

  std::string gen_type(const J& s, const std::string& t, const std::string& path, const std::string& hint) {
    if (t == "object") return gen_object(s, path, hint);
    if (t == "array") return gen_array(s, path, hint);
    if (t == "string") return gen_string(s, path, hint);
    if (t == "integer") return gen_integer(s, path, hint);
    if (t == "number") return gen_number(s, path, hint);
    if (t == "boolean") return use("boolean");
    if (t == "null") return use("null");
    malformed(path, "unknown type '" + t + "'");
  }

  std::string gen_object(const J& s, const std::string& path, const std::string& hint) {
    std::vector<std::string> keys;
    std::vector<std::string> values;
    if (s.contains("properties")) {
      const J& p = s["properties"];
      if (!p.is_object()) malformed(path, "properties must be an object");
      for (const auto& [k, v] : p.items()) {
        keys.push_back(k);
        values.push_back(gen(v, path + "/properties/" + k, hint + "-" + k));
      }
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const J& r = s["required"];
      if (!r.is_array()) malformed(path, "required must be an array of strings");
      for (const auto& x : r) {
        if (!x.is_string()) malformed(path, "required must be an array of strings");
        required.insert(x.get<std::string>());
      }
    }
    std::string additional;  // the value of additional members; empty: none
    if (s.contains("additionalProperties")) {
      const J& a = s["additionalProperties"];
      if (a.is_boolean()) {
        if (a.get<bool>()) additional = use("value");
      } else if (a.is_object()) {
        additional = gen(a, path + "/additionalProperties", hint + "-additional");
      } else {
        malformed(path, "additionalProperties must be a boolean or a schema");
      }
    } else if (!strict_ && !s.contains("properties")) {
      additional = use("value");
    }
    for (const auto& r : required)
      if (std::find(keys.begin(), keys.end(), r) == keys.end() && additional.empty())
        malformed(path, "required property '" + r + "' is not in properties");
    const std::string ws = " " + use("ws") + " ";
    const size_t n = keys.size();
    std::vector<std::string> kv(n);
    std::vector<bool> req(n);
    for (size_t i = 0; i < n; ++i) {
      kv[i] = lit(J(keys[i]).dump()) + " \":\"" + ws + values[i];
      req[i] = required.count(keys[i]) > 0;
    }
    const std::string add_kv = additional.empty() ? "" : use("string") + " \":\"" + ws + additional;
    // a[i]: the members from i on after at least one was written (each preceded by a comma).
    std::vector<std::string> a(n + 1);
    a[n] = additional.empty() ? "" : add_rule(hint + "-rest", "( \",\"" + ws + add_kv + " )*");
    for (size_t i = n; i-- > 0;) {
      const std::string item = "\",\"" + ws + kv[i];
      const std::string body = seq(req[i] ? item : "( " + item + " )?", a[i + 1]);
      a[i] = add_rule(hint + "-a" + std::to_string(i), body);
    }
    // b[i]: the members from i on, at least one of them, none written before ("" if impossible).
    std::vector<std::string> b(n + 1);
    b[n] = additional.empty() ? "" : add_rule(hint + "-b" + std::to_string(n), seq(add_kv, a[n]));
    bool any_required = false;
    for (size_t i = n; i-- > 0;) {
      std::vector<std::string> alts{seq(kv[i], a[i + 1])};
      if (!req[i] && !b[i + 1].empty()) alts.push_back(b[i + 1]);
      any_required |= req[i];
      b[i] = add_rule(hint + "-b" + std::to_string(i), join(alts, " | "));
    }
    if (b[0].empty()) return "\"{\"" + ws + "\"}\"";
    if (any_required) return add_rule(hint, "\"{\"" + ws + b[0] + ws + "\"}\"");
    return add_rule(hint, "\"{\"" + ws + "( " + b[0] + ws + ")? \"}\"");
  }

  std::string gen_array(const J& s, const std::string& path, const std::string& hint) {
    std::string item;
    int64_t max = get_count(s, "maxItems", path, -1);
    if (s.contains("items")) {
      const J& it = s["items"];
      if (it.is_array()) {
        unsupported_.insert("items (array form)");
        item = use("value");
      } else if (it.is_boolean() && !it.get<bool>()) {
        max = 0;
      } else {
        item = gen(it, path + "/items", hint + "-item");
      }
    } else {
      item = use("value");
    }
    const int64_t min = get_count(s, "minItems", path, 0);
    if (max >= 0 && max < min) malformed(path, "maxItems is less than minItems");
    const std::string ws = " " + use("ws") + " ";
    if (max == 0) return "\"[\"" + ws + "\"]\"";
    const std::string lo = std::to_string(std::max<int64_t>(min - 1, 0));
    const std::string hi = max < 0 ? "" : std::to_string(max - 1);
    std::string rest = "( \",\"" + ws + item + " )";
    if (max < 0 && min <= 1) {
      rest += "*";
    } else if (max == 1) {
      rest.clear();
    } else {
      rest += "{" + lo + "," + hi + "}";
    }
    const std::string body = seq(item, rest);
    if (min == 0) return add_rule(hint, "\"[\"" + ws + "( " + body + ws + ")? \"]\"");
    return add_rule(hint, "\"[\"" + ws + body + ws + "\"]\"");
  }

  std::string gen_string(const J& s, const std::string& path, const std::string& hint) {
    if (!s.contains("minLength") && !s.contains("maxLength")) return use("string");
    const int64_t min = get_count(s, "minLength", path, 0);
    const int64_t max = get_count(s, "maxLength", path, -1);
    if (max >= 0 && max < min) malformed(path, "maxLength is less than minLength");
    if (max > kMaxCopiedLength || min > kMaxCopiedLength) {
      // Long bounds: one shared char rule counted by nested optionals. Correct, but a token at
      // such a position depends on the count, so the mask checks most tokens at run time.
      use("char");
      const std::string rep = max < 0 ? "{" + std::to_string(min) + ",}"
                                      : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
      return add_rule(hint, "\"\\\"\" char" + rep + " \"\\\"\"");
    }
    // Each count its own rule and its own copy of the character rule: every position then knows
    // how many characters remain, and the per-position token sets are exact (computed once per
    // count reached).
    const std::string char_body = prefixed(base_rules().at("char").first);
    const std::string name = fresh(hint);
    rules_.push_back({name, ""});
    const size_t slot = rules_.size() - 1;
    std::vector<std::string> level(size_t(max < 0 ? min + 1 : max + 1));
    for (auto& l : level) l = fresh(hint + "-n");
    for (size_t k = 0; k < level.size(); ++k) {
      const bool last = k + 1 == level.size();
      const std::string c = add_rule(hint + "-c", char_body);
      std::string body;
      if (max < 0 && last) {
        body = c + " " + level[k] + " | \"\"";  // unbounded tail: c*
      } else if (last) {
        body = "\"\"";
      } else {
        body = c + " " + level[k + 1] + (int64_t(k) >= min ? " | \"\"" : "");
      }
      rules_.push_back({level[k], body});
    }
    rules_[slot].second = "\"\\\"\" " + level[0] + " \"\\\"\"";
    return name;
  }

  // A bound of minimum/maximum/exclusive*: the value, whether exclusive; nullopt if absent.
  struct Bound {
    bool present = false;
    double value = 0;
    bool exclusive = false;
  };
  static Bound bound(const J& s, const char* inclusive_key, const char* exclusive_key, const std::string& path) {
    Bound b;
    if (s.contains(inclusive_key)) {
      if (!s[inclusive_key].is_number()) malformed(path, std::string(inclusive_key) + " must be a number");
      b = {true, s[inclusive_key].get<double>(), false};
    }
    if (s.contains(exclusive_key)) {
      const J& e = s[exclusive_key];
      if (e.is_boolean()) {  // draft 4: modifies the inclusive bound
        if (e.get<bool>() && b.present) b.exclusive = true;
      } else if (e.is_number()) {
        const double v = e.get<double>();
        const bool tighter = !b.present || (inclusive_key[1] == 'i' ? v >= b.value : v <= b.value);
        if (tighter) b = {true, v, true};
      } else {
        malformed(path, std::string(exclusive_key) + " must be a number");
      }
    }
    if (b.present && !std::isfinite(b.value)) malformed(path, "a bound must be finite");
    if (b.present && std::fabs(b.value) > 9e17) malformed(path, "a bound beyond +-9e17 is not supported");
    return b;
  }

  std::string gen_integer(const J& s, const std::string& path, const std::string& hint) {
    const Bound lo_b = bound(s, "minimum", "exclusiveMinimum", path);
    const Bound hi_b = bound(s, "maximum", "exclusiveMaximum", path);
    if (!lo_b.present && !hi_b.present) return use("integer");
    int64_t lo = -kMaxInt16, hi = kMaxInt16;
    if (lo_b.present) {
      const double c = std::ceil(lo_b.value);
      lo = int64_t(c) + ((lo_b.exclusive && c == lo_b.value) ? 1 : 0);
      if (!hi_b.present) hi = std::max(hi, lo);
    }
    if (hi_b.present) {
      const double f = std::floor(hi_b.value);
      hi = int64_t(f) - ((hi_b.exclusive && f == hi_b.value) ? 1 : 0);
      if (!lo_b.present) lo = std::min(lo, hi);
    }
    if (lo > hi) malformed(path, "the integer range is empty");
    return add_rule(hint, int_range(lo, hi));
  }

  // Magnitudes m in [a, b] (0 <= a), as "integer part, optional fraction": a sound subset.
  static std::string magnitude(double a, bool a_excl, double b, bool b_excl, bool b_open) {
    const std::string frac = "( \".\" [0-9]{1,16} )?";
    const std::string zero_frac = "( \".\" \"0\"{1,16} )?";
    int64_t lo = int64_t(std::ceil(a));
    std::vector<std::string> alts;
    const int64_t top = b_open ? std::max(kMaxInt16, lo) : int64_t(std::floor(b));
    if (a_excl && double(lo) == a) {
      // Just above an integral exclusive bound: that integer with a fraction that is not zero.
      if (lo + 1 <= top) alts.push_back(seq(lit(std::to_string(lo)), "\".\" [0-9]{0,15} [1-9]"));
      ++lo;
    }
    if (b_open) {
      alts.push_back(seq(nonneg_range(lo, top), frac));
      return alternatives(alts);
    }
    const bool top_ok = !(b_excl && double(top) == b);
    if (top - 1 >= lo) alts.push_back(seq(nonneg_range(lo, top - 1), frac));
    if (top_ok && top >= lo) alts.push_back(seq(lit(std::to_string(top)), zero_frac));
    if (alts.empty()) return "";
    return alternatives(alts);
  }

  std::string gen_number(const J& s, const std::string& path, const std::string& hint) {
    const Bound lo = bound(s, "minimum", "exclusiveMinimum", path);
    const Bound hi = bound(s, "maximum", "exclusiveMaximum", path);
    if (!lo.present && !hi.present) return use("number");
    std::vector<std::string> alts;
    // Negative values: magnitudes in [-hi, -lo] (or (0, -lo]).
    if (!lo.present || lo.value < 0) {
      const bool hi_neg = hi.present && hi.value <= 0;
      const double ma = hi_neg ? -hi.value : 0;
      const bool ma_excl = hi_neg ? hi.exclusive : true;
      const std::string m = magnitude(ma, ma_excl, lo.present ? -lo.value : 0, lo.exclusive, !lo.present);
      if (!m.empty()) alts.push_back(seq("\"-\"", m));
    }
    // Non-negative values: [max(lo, 0), hi].
    if (!hi.present || hi.value >= 0) {
      const bool lo_pos = lo.present && lo.value >= 0;
      const std::string m = magnitude(lo_pos ? lo.value : 0, lo_pos && lo.exclusive, hi.present ? hi.value : 0,
                                      hi.exclusive, !hi.present);
      if (!m.empty()) alts.push_back(m);
    }
    if (alts.empty()) malformed(path, "the number range has no value this grammar can write (see json_schema.h)");
    return add_rule(hint, join(alts, " | "));
  }

  const J& root_;
  bool strict_;
  std::string prefix_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> names_;
  std::map<std::string, std::string> refs_;
  std::set<std::string> unsupported_;
  std::set<std::string> used_;
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  Converter c(schema, options);
  return c.run();
}

std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()), options);
}

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return Grammar::parse(json_schema_to_gbnf(schema, options));
}

Grammar json_schema_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return Grammar::parse(json_schema_to_gbnf(schema, options));
}

std::string json_object_gbnf() { return json_schema_to_gbnf(nlohmann::ordered_json{{"type", "object"}}); }

Grammar json_object_grammar() { return Grammar::parse(json_object_gbnf()); }

}  // namespace mla::grammar
