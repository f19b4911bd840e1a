// The Jinja lexer (see lexer.h).
#include "jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "jinja/error.h"
#include "tokenizer/unicode_util.h"

namespace mla::jinja {

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

namespace {

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
    throw Error("chat template " + position_of(src_, pos) + ": " + what);
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
        for (int i = 0; i < digits; ++i)  // std::stoul would throw std::invalid_argument, or skip a sign
          if (!std::isxdigit(static_cast<unsigned char>(src_[pos + size_t(i)])))
            fail(pos, "bad escape in string literal: \\" + std::string(1, e) + " needs " + std::to_string(digits) +
                          " hex digits");
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

}  // namespace

std::vector<Segment> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace mla::jinja
