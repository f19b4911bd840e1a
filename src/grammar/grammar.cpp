#include "grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <functional>
#include <map>
#include <utility>

namespace mla::grammar {

int ByteSet::count() const {
  int n = 0;
  for (uint64_t w : bits) n += std::popcount(w);
  return n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

using Range = std::pair<uint32_t, uint32_t>;  // inclusive
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// Splits [lo, hi] (no surrogates, one encoded length) into pieces whose UTF-8 encodings are a
// sequence of independent byte ranges (the standard construction of UTF-8 automata).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  if (lo > hi) return;
  static const uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int i = 0; i < 3; ++i) {
    if (lo <= kMax[i] && hi > kMax[i]) {
      utf8_sequences(lo, kMax[i], out);
      utf8_sequences(kMax[i] + 1, hi, out);
      return;
    }
  }
  const int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  ByteRangeSeq seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out.push_back(std::move(seq));
}

std::vector<Range> normalize(std::vector<Range> r) {
  std::sort(r.begin(), r.end());
  std::vector<Range> out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

// Removes the surrogates U+D800..U+DFFF (they have no UTF-8 encoding).
std::vector<Range> without_surrogates(const std::vector<Range>& r) {
  std::vector<Range> out;
  for (auto [lo, hi] : r) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) out.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) out.push_back({0xE000, hi});
  }
  return out;
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

}  // namespace

class GrammarBuilder {
 public:
  using Seq = std::vector<Element>;

  int32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int32_t id = int32_t(names_.size());
    ids_[name] = id;
    names_.push_back(name);
    alts_.emplace_back();
    defined_.push_back(false);
    return id;
  }

  int32_t helper(const std::string& base, std::vector<Seq> alts) {
    std::string name;
    do {
      name = base + "_" + std::to_string(++helper_count_);
    } while (ids_.count(name));
    const int32_t id = rule_id(name);
    alts_[size_t(id)] = std::move(alts);
    defined_[size_t(id)] = true;
    return id;
  }

  void define(int32_t id, std::vector<Seq> alts, size_t offset) {
    if (defined_[size_t(id)])
      throw GrammarError("grammar: rule '" + names_[size_t(id)] + "' defined twice (offset " +
                         std::to_string(offset) + ")");
    alts_[size_t(id)] = std::move(alts);
    defined_[size_t(id)] = true;
  }

  int32_t byte_set(const ByteSet& s) {
    for (size_t i = 0; i < sets_.size(); ++i)
      if (sets_[i] == s) return int32_t(i);
    sets_.push_back(s);
    return int32_t(sets_.size() - 1);
  }

  Element bytes_elem(const ByteSet& s) { return Element{Element::kBytes, byte_set(s)}; }
  Element byte_elem(uint8_t b) {
    ByteSet s;
    s.set(b);
    return bytes_elem(s);
  }
  static Element ref(int32_t id) { return Element{Element::kRef, id}; }

  // The element of a class: a byte set, or a reference to a helper of UTF-8 sequences.
  Element class_elem(const std::string& base, ByteSet bytes, const std::vector<Range>& multibyte) {
    if (multibyte.empty()) {
      if (bytes.count() == 0) throw GrammarError("grammar: empty character class in rule '" + base + "'");
      return bytes_elem(bytes);
    }
    std::vector<Seq> alts;
    if (bytes.count() > 0) alts.push_back({bytes_elem(bytes)});
    std::vector<ByteRangeSeq> seqs;
    for (auto [lo, hi] : multibyte) utf8_sequences(lo, hi, seqs);
    for (const auto& s : seqs) {
      Seq seq;
      for (auto [a, b] : s) {
        ByteSet bs;
        bs.set_range(a, b);
        seq.push_back(bytes_elem(bs));
      }
      alts.push_back(std::move(seq));
    }
    return ref(helper(base, std::move(alts)));
  }

  // x repeated min..max times (max < 0: unbounded), as elements appended to out.
  void repeat(const std::string& base, Seq x, int min, int max, Seq& out) {
    if (x.empty()) return;
    Element e = x.size() == 1 ? x[0] : ref(helper(base, {x}));
    for (int i = 0; i < min; ++i) out.push_back(e);
    if (max < 0) {
      const int32_t id = rule_id(unique(base));
      alts_[size_t(id)] = {{e, ref(id)}, {}};
      defined_[size_t(id)] = true;
      out.push_back(ref(id));
      return;
    }
    // Nested optionals, innermost first: o_k ::= e | ε, o_j ::= e o_{j+1} | ε.
    int32_t inner = -1;
    for (int k = max - min; k >= 1; --k) {
      Seq first{e};
      if (inner >= 0) first.push_back(ref(inner));
      inner = helper(base, {first, {}});
    }
    if (inner >= 0) out.push_back(ref(inner));
  }

  std::string unique(const std::string& base) {
    std::string name;
    do {
      name = base + "_" + std::to_string(++helper_count_);
    } while (ids_.count(name));
    return name;
  }

  Grammar finish(const std::string& root) {
    auto it = ids_.find(root);
    if (it == ids_.end() || !defined_[size_t(it->second)])
      throw GrammarError("grammar: no rule '" + root + "' (the start rule)");
    for (size_t r = 0; r < names_.size(); ++r)
      if (!defined_[r]) throw GrammarError("grammar: undefined rule '" + names_[r] + "'");
    Grammar g;
    g.root_ = it->second;
    g.byte_sets_ = sets_;
    for (size_t r = 0; r < names_.size(); ++r) {
      Rule rule{names_[r], {}};
      for (const Seq& alt : alts_[r]) {
        rule.alts.push_back(int32_t(g.elements_.size()));
        for (const Element& e : alt) {
          g.elements_.push_back(e);
          g.rule_of_.push_back(int32_t(r));
        }
        g.elements_.push_back(Element{Element::kEnd, int32_t(r)});
        g.rule_of_.push_back(int32_t(r));
      }
      if (rule.alts.empty()) throw GrammarError("grammar: rule '" + names_[r] + "' has no alternatives");
      g.rules_.push_back(std::move(rule));
    }
    check_left_recursion(g);
    return g;
  }

 private:
  static void check_left_recursion(const Grammar& g) {
    const size_t n = g.rules().size();
    const auto& el = g.elements();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (int32_t p : g.rules()[r].alts) {
          bool all = true;
          for (; el[size_t(p)].kind != Element::kEnd; ++p) {
            const Element& e = el[size_t(p)];
            if (e.kind != Element::kRef || !nullable[size_t(e.arg)]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Left-corner graph: r -> s when s can start an alternative of r.
    std::vector<std::vector<int32_t>> edges(n);
    for (size_t r = 0; r < n; ++r)
      for (int32_t p : g.rules()[r].alts)
        for (; el[size_t(p)].kind == Element::kRef; ++p) {
          edges[r].push_back(el[size_t(p)].arg);
          if (!nullable[size_t(el[size_t(p)].arg)]) break;
        }
    std::vector<char> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::function<void(size_t)> visit = [&](size_t r) {
      state[r] = 1;
      for (int32_t s : edges[r]) {
        if (state[size_t(s)] == 1)
          throw GrammarError("grammar: left recursion through rule '" + g.rules()[size_t(s)].name + "'");
        if (state[size_t(s)] == 0) visit(size_t(s));
      }
      state[r] = 2;
    };
    for (size_t r = 0; r < n; ++r)
      if (state[r] == 0) visit(r);
  }

  std::map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<std::vector<Seq>> alts_;
  std::vector<bool> defined_;
  std::vector<ByteSet> sets_;
  int helper_count_ = 0;
};

namespace {

class Parser {
 public:
  Parser(std::string_view text, GrammarBuilder& b) : s_(text), b_(b) {}

  void parse_all() {
    skip_space(true);
    while (pos_ < s_.size()) {
      const size_t start = pos_;
      const std::string name = parse_name();
      if (name.empty()) fail("expected a rule name");
      skip_space(false);
      if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after '" + name + "'");
      pos_ += 3;
      rule_ = name;
      auto alts = parse_alternatives(0);
      b_.define(b_.rule_id(name), std::move(alts), start);
      skip_space(true);
    }
  }

 private:
  using Seq = GrammarBuilder::Seq;

  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError("grammar: " + what + " at offset " + std::to_string(pos_));
  }

  void skip_space(bool newlines) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  // Whether a new rule (`name ::=`) starts at pos_.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < s_.size() && is_name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  std::vector<Seq> parse_alternatives(int depth) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(depth));
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      alts.push_back(parse_sequence(depth));
    }
    return alts;
  }

  Seq parse_sequence(int depth) {
    Seq seq;
    for (;;) {
      skip_space(true);
      if (pos_ >= s_.size()) break;
      const char c = s_[pos_];
      if (c == '|' || c == ')') break;
      if (at_rule_start()) break;
      Seq item = parse_primary(depth);
      skip_space(false);
      if (pos_ < s_.size() && (s_[pos_] == '*' || s_[pos_] == '+' || s_[pos_] == '?' || s_[pos_] == '{')) {
        int min = 0, max = -1;
        const char op = s_[pos_++];
        if (op == '+') {
          min = 1;
        } else if (op == '?') {
          max = 1;
        } else if (op == '{') {
          min = parse_int();
          max = min;
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            skip_space(false);
            max = (pos_ < s_.size() && s_[pos_] == '}') ? -1 : parse_int();
          }
          skip_space(false);
          if (pos_ >= s_.size() || s_[pos_] != '}') fail("expected '}' in a repetition");
          ++pos_;
          if (max >= 0 && max < min) fail("repetition {m,n} with n < m");
        }
        b_.repeat(rule_, std::move(item), min, max, seq);
      } else {
        seq.insert(seq.end(), item.begin(), item.end());
      }
    }
    if (depth > 0 && (pos_ >= s_.size() || s_[pos_] != ')') && !(pos_ < s_.size() && s_[pos_] == '|'))
      fail("expected ')'");
    return seq;
  }

  int parse_int() {
    skip_space(false);
    const size_t start = pos_;
    long v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + (s_[pos_++] - '0');
      if (v > 1000000) fail("repetition count too large");
    }
    if (pos_ == start) fail("expected a number");
    skip_space(false);
    return int(v);
  }

  Seq parse_primary(int depth) {
    const char c = s_[pos_];
    if (c == '"') return parse_literal();
    if (c == '[') return {parse_class()};
    if (c == '.') {
      ++pos_;
      return {b_.class_elem(rule_, ByteSet{}, without_surrogates({{0, 0x10FFFF}}))};
    }
    if (c == '(') {
      ++pos_;
      auto alts = parse_alternatives(depth + 1);
      if (pos_ >= s_.size() || s_[pos_] != ')') fail("expected ')'");
      ++pos_;
      if (alts.size() == 1) return alts[0];
      return {GrammarBuilder::ref(b_.helper(rule_, std::move(alts)))};
    }
    if (c == '<' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '[') {
      pos_ += 2;
      const size_t start = pos_;
      long id = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        id = id * 10 + (s_[pos_++] - '0');
        if (id > INT32_MAX) fail("token id too large");
      }
      if (pos_ == start || s_.substr(pos_, 2) != "]>") fail("expected <[token id]>");
      pos_ += 2;
      return {Element{Element::kToken, int32_t(id)}};
    }
    if (is_name_char(c)) return {GrammarBuilder::ref(b_.rule_id(parse_name()))};
    fail(std::string("unexpected character '") + c + "'");
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) fail("truncated escape");
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else fail("bad hex digit in escape");
    }
    return v;
  }

  // One character of a literal or class: a code point, or (is_byte) a raw byte from \xHH.
  uint32_t parse_char(bool& is_byte) {
    is_byte = false;
    if (pos_ >= s_.size()) fail("unterminated literal or class");
    const auto c = uint8_t(s_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) fail("truncated escape");
      const char e = s_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': is_byte = true; return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^': return uint32_t(e);
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
    // A UTF-8 encoded code point of the text.
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + size_t(n) > s_.size()) fail("invalid UTF-8 in the grammar text");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) cp = (cp << 6) | (uint8_t(s_[pos_ + size_t(i)]) & 0x3F);
    pos_ += size_t(n);
    return cp;
  }

  Seq parse_literal() {
    ++pos_;
    Seq seq;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      bool is_byte;
      const uint32_t cp = parse_char(is_byte);
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("code point outside Unicode scalar values");
      if (is_byte) {
        seq.push_back(b_.byte_elem(uint8_t(cp)));
      } else {
        std::string u;
        append_utf8(u, cp);
        for (char ch : u) seq.push_back(b_.byte_elem(uint8_t(ch)));
      }
    }
    if (pos_ >= s_.size()) fail("unterminated literal");
    ++pos_;
    return seq;
  }

  Element parse_class() {
    ++pos_;
    bool negated = false;
    if (pos_ < s_.size() && s_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    ByteSet raw;
    std::vector<Range> cps;
    while (pos_ < s_.size() && s_[pos_] != ']') {
      bool b1, b2 = false;
      const uint32_t lo = parse_char(b1);
      uint32_t hi = lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char(b2);
      } else {
        b2 = b1;
      }
      if (lo < 0x80) b1 = false;  // a raw byte below 0x80 is the same as the code point
      if (hi < 0x80) b2 = false;
      if (b1 && !b2) fail("a class range from a raw byte to a code point");
      if (hi < lo) fail("class range out of order");
      if (b2) {
        if (negated) fail("raw bytes >= 0x80 in a negated class");
        raw.set_range(uint8_t(std::max<uint32_t>(lo, 0x80)), uint8_t(hi));
        if (lo < 0x80) cps.push_back({lo, 0x7F});
      } else {
        if (hi > 0x10FFFF) fail("code point above U+10FFFF");
        cps.push_back({lo, hi});
      }
    }
    if (pos_ >= s_.size()) fail("unterminated class");
    ++pos_;
    cps = normalize(cps);
    if (negated) {
      std::vector<Range> comp;
      uint32_t next = 0;
      for (auto [lo, hi] : cps) {
        if (lo > next) comp.push_back({next, lo - 1});
        next = hi + 1;
      }
      if (next <= 0x10FFFF) comp.push_back({next, 0x10FFFF});
      cps = comp;
    }
    cps = without_surrogates(cps);
    ByteSet bytes = raw;
    std::vector<Range> multi;
    for (auto [lo, hi] : cps) {
      if (lo < 0x80) bytes.set_range(uint8_t(lo), uint8_t(std::min<uint32_t>(hi, 0x7F)));
      if (hi >= 0x80) multi.push_back({std::max<uint32_t>(lo, 0x80), hi});
    }
    return b_.class_elem(rule_, bytes, multi);
  }

  std::string_view s_;
  GrammarBuilder& b_;
  size_t pos_ = 0;
  std::string rule_ = "root";
};

std::string byte_text(uint8_t b, bool in_class) {
  static const char* hex = "0123456789abcdef";
  if (b == '\n') return "\\n";
  if (b == '\r') return "\\r";
  if (b == '\t') return "\\t";
  if (b == '\\' || b == '"') return std::string("\\") + char(b);
  if (in_class && (b == ']' || b == '-' || b == '^' || b == '[')) return std::string("\\") + char(b);
  if (b < 0x20 || b >= 0x7F) return std::string("\\x") + hex[b >> 4] + hex[b & 15];
  return std::string(1, char(b));
}

}  // namespace

Grammar Grammar::parse(std::string_view text, std::string_view root) {
  GrammarBuilder b;
  Parser p(text, b);
  p.parse_all();
  return b.finish(std::string(root));
}

std::string Grammar::to_string() const {
  std::string out;
  for (const Rule& r : rules_) {
    out += r.name + " ::=";
    for (size_t a = 0; a < r.alts.size(); ++a) {
      if (a > 0) out += " |";
      std::string lit;
      bool any = false;
      auto flush = [&] {
        if (!lit.empty()) out += " \"" + lit + "\"";
        lit.clear();
      };
      for (int32_t p = r.alts[a]; elements_[size_t(p)].kind != Element::kEnd; ++p) {
        any = true;
        const Element& e = elements_[size_t(p)];
        if (e.kind == Element::kRef) {
          flush();
          out += " " + rules_[size_t(e.arg)].name;
          continue;
        }
        if (e.kind == Element::kToken) {
          flush();
          out += " <[" + std::to_string(e.arg) + "]>";
          continue;
        }
        const ByteSet& s = byte_sets_[size_t(e.arg)];
        if (s.count() == 1) {
          for (unsigned b = 0; b < 256; ++b)
            if (s.test(uint8_t(b))) lit += byte_text(uint8_t(b), false);
          continue;
        }
        flush();
        out += " [";
        for (unsigned b = 0; b < 256;) {
          if (!s.test(uint8_t(b))) {
            ++b;
            continue;
          }
          unsigned e2 = b;
          while (e2 + 1 < 256 && s.test(uint8_t(e2 + 1))) ++e2;
          out += byte_text(uint8_t(b), true);
          if (e2 > b) {
            out += '-';
            out += byte_text(uint8_t(e2), true);
          }
          b = e2 + 1;
        }
        out += "]";
      }
      flush();
      if (!any) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

}  // namespace mla::grammar
