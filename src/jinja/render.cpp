// The Jinja renderer: statements and expressions (see render.h).
#include "jinja/render.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "jinja/error.h"
#include "tokenizer/unicode_util.h"

namespace mla::jinja {

Renderer::Renderer(const std::string& source, std::shared_ptr<Dict> globals, const Limits& limits)
    : src_(source), limits_(limits) {
  frames_.push_back(std::move(globals));
}

Flow Renderer::render(const Body& body, std::string& out) {
  for (const NodePtr& node : body) {
    Flow flow = render_node(*node, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

void Renderer::fail(size_t pos, const std::string& what) const {
  throw Error("chat template " + position_of(src_, pos) + ": " + what);
}

void Renderer::exceeded(Limit limit, size_t value, size_t pos, const std::string& what) const {
  throw LimitError(limit, value, what + " at " + position_of(src_, pos));
}

void Renderer::step(size_t pos) {
  if (++steps_ > limits_.max_steps) exceeded(Limit::Steps, limits_.max_steps, pos, "rendering");
}

void Renderer::check_string(size_t bytes, size_t pos, const char* what) const {
  if (bytes > limits_.max_string_bytes) exceeded(Limit::StringBytes, limits_.max_string_bytes, pos, what);
}

void Renderer::check_items(size_t items, size_t pos, const char* what) const {
  if (items > limits_.max_list_items) exceeded(Limit::ListItems, limits_.max_list_items, pos, what);
}

void Renderer::append(std::string& out, const std::string& text, size_t pos) const {
  if (out.size() + text.size() > limits_.max_output_bytes)
    exceeded(Limit::OutputBytes, limits_.max_output_bytes, pos, "output");
  out += text;
}

Renderer::DepthGuard::DepthGuard(Renderer& renderer, size_t pos) : r(renderer) {
  if (++r.depth_ > r.limits_.max_depth) {
    --r.depth_;
    r.exceeded(Limit::Depth, r.limits_.max_depth, pos, "nesting");
  }
}

Value Renderer::lookup(const std::string& name) {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
    if (const Value* v = (*it)->find(name)) return *v;
  if (const Value* v = builtins().find(name)) return *v;
  return Value::undefined(name);
}

Flow Renderer::render_node(const Node& node, std::string& out) {
  DepthGuard depth(*this, node.pos);
  step(node.pos);
  switch (node.kind) {
    case Node::Kind::Text: append(out, node.text, node.pos); return Flow::Normal;
    case Node::Kind::Output: append(out, to_str(eval(*node.expr), limits_.max_string_bytes), node.pos); return Flow::Normal;
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
      append(out, to_str(eval(*node.expr), limits_.max_string_bytes), node.pos);
      return flow;
    }
    case Node::Kind::Scope: return render(node.body, out);
  }
  return Flow::Normal;
}

void Renderer::unpack(const std::vector<std::string>& targets, const Value& value, size_t pos) {
  List items = iterate(value, pos);
  if (items.size() != targets.size())
    fail(pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                  " names");
  for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
}

List Renderer::iterate(const Value& v, size_t pos) {
  // Each item a loop or filter goes over is a step.
  const size_t items = v.is_list() ? v.list->size() : v.is_dict() ? v.dict->entries.size() : v.is_string() ? v.text.size() : 0;
  steps_ += items;
  if (steps_ > limits_.max_steps) exceeded(Limit::Steps, limits_.max_steps, pos, "iterating");
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

Flow Renderer::render_for(const Node& node, std::string& out) {
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
    steps_ += kLoopIterationSteps - 1;
    step(node.pos);
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
      if (a.positional.empty()) throw Error("loop.cycle() needs arguments");
      return a.positional[static_cast<size_t>(i) % a.positional.size()];
    }));
    assign("loop", Value::from_dict(loop));
    bind_targets(node, items[i]);
    Flow flow = render(node.body, out);
    if (flow == Flow::Break) break;
  }
  return Flow::Normal;
}

void Renderer::bind_targets(const Node& node, const Value& item) {
  if (node.targets.size() == 1) assign(node.targets[0], item);
  else unpack(node.targets, item, node.pos);
}

void Renderer::define_macro(const Node& node) {
  const Node* macro = &node;
  Value fn = Value::from_function([this, macro](Args& args) {
    // Macros see the template's top-level variables and their own arguments.
    if (calls_ >= limits_.max_call_depth)
      exceeded(Limit::CallDepth, limits_.max_call_depth, macro->pos, "calling macro '" + macro->text + "'");
    ++calls_;
    struct CallCount {
      size_t& n;
      ~CallCount() { --n; }
    } call_count{calls_};
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

Value Renderer::eval(const Expr& e) {
  DepthGuard depth(*this, e.pos);
  step(e.pos);
  return eval_expr(e);
}

template <class F>
Value Renderer::at(const Expr& e, F&& call) {
  try {
    return call();
  } catch (const LimitError&) {
    throw;
  } catch (const Error& err) {
    if (std::string(err.what()).rfind("chat template", 0) == 0) throw;
    fail(e.pos, err.what());
  }
}

Value Renderer::eval_expr(const Expr& e) {
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
      return at(e, [&] { return (*callee.function)(args); });
    }
    case Expr::Kind::Filter: {
      Value subject = e.children[0] ? eval(*e.children[0]) : block_text_;
      Args args = eval_args(e);
      return at(e, [&] { return apply_filter(e.name, subject, args, e); });
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

Args Renderer::eval_args(const Expr& e) {
  Args args;
  for (size_t i = 1; i < e.children.size(); ++i) {
    Value v = eval(*e.children[i]);
    if (e.arg_names[i].empty()) args.positional.push_back(std::move(v));
    else args.keyword.emplace_back(e.arg_names[i], std::move(v));
  }
  return args;
}

bool Renderer::compare_op(const std::string& op, const Value& a, const Value& b, size_t pos) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "not in") {
    bool found = contains(b, a, pos);
    return op == "in" ? found : !found;
  }
  int c;
  try {
    c = compare(a, b);
  } catch (const LimitError&) {
    throw;
  } catch (const Error& err) {
    fail(pos, err.what());
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

bool Renderer::contains(const Value& container, const Value& item, size_t pos) {
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

Value Renderer::binary(const std::string& op, const Value& a, const Value& b, size_t pos) {
  if (op == "~") {
    std::string left = to_str(a, limits_.max_string_bytes), right = to_str(b, limits_.max_string_bytes);
    check_string(left.size() + right.size(), pos, "concatenation");
    return Value::from(left + right);
  }
  auto type_error = [&]() -> Value {
    fail(pos, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_string(a.text.size() + b.text.size(), pos, "concatenation");
      return Value::from(a.text + b.text);
    }
    if (a.is_list() && b.is_list()) {
      check_items(a.list->size() + b.list->size(), pos, "list concatenation");
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
      const size_t unit = seq->is_string() ? seq->text.size() : seq->list->size();
      // unit * n, without overflowing: past the limit as soon as n exceeds limit / unit.
      const size_t limit = seq->is_string() ? limits_.max_string_bytes : limits_.max_list_items;
      if (unit > 0 && static_cast<uint64_t>(n) > limit / unit) {
        if (seq->is_string()) check_string(limit + 1, pos, "string repetition");
        check_items(limit + 1, pos, "list repetition");
      }
      if (seq->is_string()) {
        std::string s;
        s.reserve(unit * static_cast<size_t>(n));
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
    // + - * wrap on overflow (two's complement, as the CPU does) instead of undefined behaviour.
    const uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
    if (op == "+") return Value::from(static_cast<int64_t>(ux + uy));
    if (op == "-") return Value::from(static_cast<int64_t>(ux - uy));
    if (op == "*") return Value::from(static_cast<int64_t>(ux * uy));
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
      if (y >= 0) {  // by squaring, wrapping as the repeated product does
        uint64_t result = 1, base = static_cast<uint64_t>(x);
        for (uint64_t e = static_cast<uint64_t>(y); e; e >>= 1, base *= base)
          if (e & 1) result *= base;
        return Value::from(static_cast<int64_t>(result));
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

Value Renderer::slice(const Expr& e) {
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

Value Renderer::get_item(const Value& subject, const Value& key, const Expr& e) {
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

Value Renderer::get_attr(const Value& subject, const std::string& name, const Expr& e) {
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

}  // namespace mla::jinja
