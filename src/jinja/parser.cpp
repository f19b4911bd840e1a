// The Jinja parser (see parser.h).
#include "jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "jinja/error.h"

namespace mla::jinja {

namespace {

class Parser {
 public:
  Parser(const std::string& source, std::vector<Segment> segments, const Limits& limits)
      : src_(source), segs_(std::move(segments)), limits_(limits) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw Error("chat template " + position_of(src_, pos) + ": " + what);
  }

  // One level of the parser's recursion (a statement inside a statement, an expression inside
  // brackets, not / unary minus over another): at most limits_.max_depth at once, so a template
  // cannot overflow the parser's stack.
  struct Nesting {
    Parser& p;
    Nesting(Parser& parser, size_t pos) : p(parser) {
      if (++p.nesting_ > p.limits_.max_depth)
        throw LimitError(Limit::Depth, p.limits_.max_depth, "nesting at " + position_of(p.src_, pos));
    }
    ~Nesting() { --p.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
  };

  // Sets the depth of a finished expression node from its children: the tree stays at most
  // limits_.max_depth deep (chains such as a+b+c+... are built by loops, not recursion, and the
  // renderer and the destructor walk them recursively).
  ExprPtr seal(ExprPtr e) {
    size_t below = 0;
    for (const ExprPtr& c : e->children)
      if (c) below = std::max(below, c->depth);
    e->depth = below + 1;
    if (e->depth > limits_.max_depth)
      throw LimitError(Limit::Depth, limits_.max_depth, "expression nesting at " + position_of(src_, e->pos));
    return e;
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

  // A statement's body up to one of `ends` and that closing tag; its keyword in *end if given.
  Body parse_block(const std::vector<std::string>& ends, std::string* end = nullptr) {
    std::string found;
    Body body = parse_body(ends, &found);
    expect_end();
    ++seg_;
    if (end) *end = found;
    return body;
  }

  NodePtr parse_statement() {
    const Token keyword = next();
    Nesting nesting(*this, keyword.pos);
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
        if (end == "else") node->else_body = parse_block({"endif"});
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
      node->body = parse_block({"else", "endfor"}, &end);
      if (end == "else") node->else_body = parse_block({"endfor"});
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
        node->body = parse_block({"endset"});
      }
    } else if (k == "macro") {
      node->kind = Node::Kind::Macro;
      node->text = expect_identifier();
      expect_op("(");
      comma_separated(")", [&] {
        node->targets.push_back(expect_identifier());
        if (peek_op("=")) {
          ++tok_;
          node->values.push_back(parse_expression());
        } else {
          node->values.push_back(nullptr);
        }
      });
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
      node->body = parse_block({"endwith"});
    } else if (k == "filter") {
      node->kind = Node::Kind::FilterBlock;
      node->expr = parse_filter_chain(nullptr);
      expect_end();
      node->body = parse_block({"endfilter"});
    } else if (k == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      node->kind = Node::Kind::Scope;
      expect_end();
      node->body = parse_block({"endgeneration"});
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
  // Items separated by commas (a trailing one allowed) up to the closing operator, which it takes.
  template <class Item>
  void comma_separated(const char* close, Item&& item) {
    while (!peek_op(close)) {
      item();
      if (!peek_op(close)) expect_op(",");
    }
    expect_op(close);
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
  ExprPtr make(Expr::Kind kind, size_t pos, std::vector<ExprPtr> children) {
    ExprPtr e = make(kind, pos);
    e->children = std::move(children);
    return seal(e);
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
    return seal(list);
  }

  ExprPtr parse_expression() { return parse_or(true); }

  // One level of left-associative operators: operands from `operand`, joined while the next
  // token is one of `ops` (operator tokens, or the keywords and / or as Kind::And / Kind::Or).
  ExprPtr parse_left_assoc(std::initializer_list<const char*> ops, ExprPtr (Parser::*operand)()) {
    ExprPtr left = (this->*operand)();
    while (true) {
      const char* op = nullptr;
      for (const char* o : ops)
        if (peek_op(o) || peek_name(o)) op = o;
      if (!op) return left;
      Token t = next();
      if (t.type == Token::Type::Name) {
        Expr::Kind kind = t.text == "or" ? Expr::Kind::Or : Expr::Kind::And;
        left = make(kind, t.pos, {left, (this->*operand)()});
      } else {
        left = binary(t.text, left, (this->*operand)(), t.pos);
      }
    }
  }

  ExprPtr parse_or(bool allow_conditional) {
    Nesting nesting(*this, peek().pos);
    ExprPtr left = parse_left_assoc({"or"}, &Parser::parse_and);
    if (allow_conditional && peek_name("if")) {
      size_t pos = next().pos;
      ExprPtr cond = parse_or(false);
      ExprPtr otherwise;
      if (peek_name("else")) {
        ++tok_;
        otherwise = parse_or(true);
      }
      return make(Expr::Kind::Conditional, pos, {left, cond, otherwise});
    }
    return left;
  }

  ExprPtr parse_and() { return parse_left_assoc({"and"}, &Parser::parse_not); }

  ExprPtr parse_not() {
    if (peek_name("not")) {
      size_t pos = next().pos;
      Nesting nesting(*this, pos);
      return make(Expr::Kind::Not, pos, {parse_not()});
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
    auto e = make(Expr::Kind::Compare, pos, std::move(operands));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, size_t pos) {
    auto e = make(Expr::Kind::Binary, pos, {std::move(l), std::move(r)});
    e->name = op;
    return e;
  }

  ExprPtr parse_math1() { return parse_left_assoc({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return parse_left_assoc({"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() { return parse_left_assoc({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return parse_left_assoc({"**"}, &Parser::parse_unary); }

  ExprPtr parse_unary() {
    if (peek_op("-") || peek_op("+")) {
      Token op = next();
      Nesting nesting(*this, op.pos);
      return make(op.text == "-" ? Expr::Kind::Negate : Expr::Kind::Plus, op.pos, {parse_unary()});
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
      return seal(inner);
    }
    if (t.text == "[") {
      auto e = make(Expr::Kind::List, t.pos);
      comma_separated("]", [&] { e->children.push_back(parse_expression()); });
      return seal(e);
    }
    if (t.text == "{") {
      auto e = make(Expr::Kind::Dict, t.pos);
      comma_separated("}", [&] {
        e->children.push_back(parse_expression());
        expect_op(":");
        e->children.push_back(parse_expression());
      });
      return seal(e);
    }
    fail(t.pos, "unexpected '" + t.text + "' in expression");
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    comma_separated(")", [&] {
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
    });
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (peek_op(".")) {
        Token dot = next();
        if (at_end()) fail(dot.pos, "expected an attribute name after '.'");
        Token name = next();
        if (name.type == Token::Type::Int) {  // x.0 means x[0]
          auto index = make(Expr::Kind::Literal, name.pos);
          index->literal = Value::from(name.integer);
          node = make(Expr::Kind::Item, dot.pos, {node, index});
          continue;
        }
        if (name.type != Token::Type::Name) fail(name.pos, "expected an attribute name after '.'");
        auto e = make(Expr::Kind::Attr, dot.pos, {node});
        e->name = name.text;
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
          node = make(Expr::Kind::Slice, open.pos, {node, parts[0], parts[1], parts[2]});
        } else {
          if (!parts[0]) fail(open.pos, "empty subscript");
          node = make(Expr::Kind::Item, open.pos, {node, parts[0]});
        }
      } else if (peek_op("(")) {
        auto e = make(Expr::Kind::Call, peek().pos);
        e->children.push_back(node);
        e->arg_names.push_back("");
        parse_call_args(*e);
        node = seal(e);
      } else {
        return node;
      }
    }
  }

  // The filters of a {% filter %} block: f | g(args) ... applied to the block's text (node null).
  ExprPtr parse_filter_chain(ExprPtr node) {
    do {
      if (!at_end() && peek().type == Token::Type::Name && tok_ + 1 < toks_->size() &&
          (*toks_)[tok_ + 1].type == Token::Type::Op && (*toks_)[tok_ + 1].text == ".")
        fail((*toks_)[tok_ + 1].pos, "unsupported construct: dotted filter name");  // not used by chat templates
      node = parse_filter_chain_one(node);
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
        node = seal(e);
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
    return seal(e);
  }

  const std::string& src_;
  std::vector<Segment> segs_;
  size_t seg_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  size_t tag_pos_ = 0;
  mutable Token end_token_{Token::Type::Op, "<end of tag>", 0, 0, 0};
  const Limits& limits_;
  size_t nesting_ = 0;
};

}  // namespace

Body parse(const std::string& source, std::vector<Segment> segments, const Limits& limits) {
  return Parser(source, std::move(segments), limits).parse_template();
}

}  // namespace mla::jinja
