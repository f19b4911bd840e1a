// The Jinja renderer: filters, tests, globals and the Python methods of str, list and dict
// (see render.h).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>

#include "jinja/error.h"
#include "jinja/render.h"
#include "tokenizer/unicode_util.h"

namespace mla::jinja {

namespace {

// The text of each item joined by sep (str.join and the join filter), within max_bytes.
template <class ItemText>
Value join_items(const List& items, const std::string& sep, size_t max_bytes, ItemText&& item_text) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += item_text(items[i]);
    if (out.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, "join");
  }
  return Value::from(std::move(out));
}

void check_bytes(const std::string& s, size_t max_bytes, const char* what) {
  if (s.size() > max_bytes) throw LimitError(Limit::StringBytes, max_bytes, what);
}

}  // namespace

const Dict& Renderer::builtins() {
  if (builtins_) return *builtins_;
  builtins_ = std::make_unique<Dict>();
  Dict& d = *builtins_;
  {
    d.set("range", Value::from_function([this](Args& a) {
      int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else if (a.positional.size() >= 2) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() >= 3) step = a.positional[2].as_int();
      } else {
        throw Error("range() needs 1 to 3 arguments");
      }
      if (step == 0) throw Error("range() step must not be zero");
      // The count first (in floating point: no overflow), so a huge range fails at once.
      const double span = step > 0 ? static_cast<double>(stop) - static_cast<double>(start)
                                   : static_cast<double>(start) - static_cast<double>(stop);
      const double count = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<double>(step)));
      if (count > static_cast<double>(limits_.max_list_items))
        throw LimitError(Limit::ListItems, limits_.max_list_items, "range()");
      List items;
      items.reserve(static_cast<size_t>(count));
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::from(i));
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
      throw Error("chat template raised an exception: " + message);
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
  }
  return d;
}

Value Renderer::method(const Value& self, const std::string& name) {
  auto bind = [&](std::function<Value(const Value&, Args&)> fn) {
    Value captured = self;
    return Value::from_function([captured, fn](Args& a) { return fn(captured, a); });
  };
  auto arg_string = [](Args& a, size_t i, const char* n) -> std::string {
    const Value* v = a.get(i, n);
    if (!v || !v->is_string()) throw Error(std::string("expected a string argument '") + n + "'");
    return v->text;
  };
  if (self.is_string()) {
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return bind([starts](const Value& s, Args& a) {
        const Value* p = a.get(0, "prefix");
        if (!p) throw Error("startswith/endswith needs an argument");
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
      return bind([this, arg_string](const Value& s, Args& a) {
        const Value* count = a.get(2, "count");
        return Value::from(replace_all(s.text, arg_string(a, 0, "old"), arg_string(a, 1, "new"),
                                       count ? count->as_int() : -1, limits_.max_string_bytes));
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
          if (name == "index") throw Error("substring not found");
          return Value::from(int64_t{-1});
        }
        return Value::from(static_cast<int64_t>(to_u32(s.text.substr(0, at)).size()));
      });
    }
    if (name == "join") {
      return bind([this](const Value& s, Args& a) {
        const Value* items = a.get(0, "iterable");
        if (!items) throw Error("join needs an argument");
        return join_items(iterate(*items, 0), s.text, limits_.max_string_bytes, [](const Value& v) { return to_str(v); });
      });
    }
    if (name == "format") {
      return bind([this](const Value& s, Args& a) {
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
            if (close == std::string::npos) throw Error("format: unmatched '{'");
            std::string field = t.substr(i + 1, close - i - 1);
            const Value* v = nullptr;
            if (field.empty()) v = a.get(next_arg++, "");
            else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
              if (field.size() > 6) throw Error("format: argument index {" + field.substr(0, 12) + "} is too large");
              v = a.get(std::stoul(field), "");  // at most 6 digits: stoul cannot overflow
            }
            else v = a.get(SIZE_MAX, field);
            if (!v) throw Error("format: missing argument for {" + field + "}");
            out += to_str(*v);
            check_bytes(out, limits_.max_string_bytes, "format");
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
        if (a.positional.size() != 1) throw Error("append takes one argument");
        l.list->push_back(a.positional[0]);
        return Value::none();
      });
    }
    if (name == "pop") {
      return bind([](const Value& l, Args& a) {
        if (l.list->empty()) throw Error("pop from empty list");
        int64_t n = static_cast<int64_t>(l.list->size());
        int64_t i = a.positional.empty() ? n - 1 : a.positional[0].as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw Error("pop index out of range");
        Value v = (*l.list)[i];
        l.list->erase(l.list->begin() + i);
        return v;
      });
    }
    if (name == "index" || name == "count") {
      return bind([name](const Value& l, Args& a) {
        if (a.positional.empty()) throw Error(name + " needs an argument");
        int64_t n = 0;
        for (size_t i = 0; i < l.list->size(); ++i) {
          if (!equals((*l.list)[i], a.positional[0])) continue;
          if (name == "index") return Value::from(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") throw Error("value is not in list");
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
      if (!key || !key->is_string()) throw Error(name + " needs a string key");
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

Value Renderer::attribute_of(const Value& item, const std::string& path, const Expr& e) {
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

Value Renderer::apply_filter(const std::string& name, const Value& v, Args& a, const Expr& e) {
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
    to_json(out, v, indent && indent->is_number() ? static_cast<int>(indent->as_int()) : -1,
            bool_arg(99, "sort_keys", false), limits_.max_string_bytes);
    return Value::from(out);
  }
  if (name == "string") return Value::from(to_str(v));
  if (name == "lower") return Value::from(lower(to_str(v)));
  if (name == "upper") return Value::from(upper(to_str(v)));
  if (name == "title") return Value::from(title(to_str(v)));
  if (name == "capitalize") return Value::from(capitalize(to_str(v)));
  if (name == "safe" || name == "forceescape") return v;
  if (name == "e" || name == "escape") {
    // MarkupSafe's entities for the five characters HTML gives meaning to.
    std::string out;
    for (char c : to_str(v)) {
      const char* entity = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : nullptr;
      if (entity) out += entity;
      else out += c;
    }
    return Value::from(out);
  }
  if (name == "join") {
    const Value* sep = arg(0, "d");
    const Value* attribute = arg(1, "attribute");
    return join_items(iterate(v, e.pos), sep ? to_str(*sep) : "", limits_.max_string_bytes, [&](const Value& item) {
      return to_str(attribute ? attribute_of(item, to_str(*attribute), e) : item);
    });
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
        step(e.pos);
        int c = compare(key(x), key(y));
        return reverse ? c > 0 : c < 0;
      });
    } catch (const LimitError&) {
      throw;
    } catch (const Error& err) {
      fail(e.pos, err.what());
    }
    return Value::from(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (const Value& item : iterate(v, e.pos)) {
      bool seen = false;
      for (const Value& o : out) {
        step(e.pos);
        seen = seen || equals(o, item);
      }
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
    return Value::from(
        replace_all(to_str(v), to_str(*from), to_str(*to), int_arg(2, "count", -1), limits_.max_string_bytes));
  }
  if (name == "indent") {
    const Value* width_arg = arg(0, "width");
    if (!(width_arg && width_arg->is_string())) check_string(static_cast<size_t>(std::max<int64_t>(0, int_arg(0, "width", 4))), e.pos, "indent");
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
      check_string(out.size(), e.pos, "indent");
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

bool Renderer::apply_test(const std::string& name, const Value& v, Args& a, const Expr& e) {
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

}  // namespace mla::jinja
