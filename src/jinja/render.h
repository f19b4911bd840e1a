// The Jinja renderer: walks the parser's tree over a stack of variable frames, evaluating
// expressions with Python semantics. render.cpp holds statements and expressions; filters.cpp
// the filters, tests, globals (range, namespace, ...) and the Python methods of str, list and
// dict. Every limit of limits.h is enforced here (and the nesting depth also in the parser).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jinja/error.h"
#include "jinja/limits.h"
#include "jinja/parser.h"
#include "jinja/value.h"

namespace mla::jinja {

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  // globals: the template's top-level variables. source: the template text, for positions.
  Renderer(const std::string& source, std::shared_ptr<Dict> globals, const Limits& limits);

  // Appends the rendering of body to out; Break/Continue when a loop control left it.
  Flow render(const Body& body, std::string& out);

 private:
  [[noreturn]] void fail(size_t pos, const std::string& what) const;
  [[noreturn]] void exceeded(Limit limit, size_t value, size_t pos, const std::string& what) const;

  // ---- limits
  void step(size_t pos);                                   // one unit of work against max_steps
  void check_string(size_t bytes, size_t pos, const char* what) const;  // against max_string_bytes
  void check_items(size_t items, size_t pos, const char* what) const;   // against max_list_items
  void append(std::string& out, const std::string& text, size_t pos) const;  // against max_output_bytes

  // One level of evaluation (an expression inside an expression, a statement inside a
  // statement, a macro's body): at most max_depth at once.
  struct DepthGuard {
    Renderer& r;
    DepthGuard(Renderer& renderer, size_t pos);
    ~DepthGuard() { --r.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
  };

  // ---- variables
  Value lookup(const std::string& name);
  void assign(const std::string& name, Value value) { frames_.back()->set(name, std::move(value)); }
  struct FrameGuard {
    Renderer& r;
    explicit FrameGuard(Renderer& renderer) : r(renderer) { r.frames_.push_back(std::make_shared<Dict>()); }
    ~FrameGuard() { r.frames_.pop_back(); }
    FrameGuard(const FrameGuard&) = delete;
    FrameGuard& operator=(const FrameGuard&) = delete;
  };
  const Dict& builtins();  // range, namespace, dict, raise_exception, strftime_now (filters.cpp)

  // ---- statements (render.cpp)
  Flow render_node(const Node& node, std::string& out);
  Flow render_for(const Node& node, std::string& out);
  void unpack(const std::vector<std::string>& targets, const Value& value, size_t pos);
  void bind_targets(const Node& node, const Value& item);
  void define_macro(const Node& node);
  List iterate(const Value& v, size_t pos);  // the items a for loop or a filter goes over

  // ---- expressions (render.cpp)
  Value eval(const Expr& e);
  Value eval_expr(const Expr& e);
  Args eval_args(const Expr& e);
  // Calls a function or filter at e, giving an error without a position the position of e.
  template <class F>
  Value at(const Expr& e, F&& call);
  bool compare_op(const std::string& op, const Value& a, const Value& b, size_t pos);
  bool contains(const Value& container, const Value& item, size_t pos);
  Value binary(const std::string& op, const Value& a, const Value& b, size_t pos);
  Value slice(const Expr& e);
  Value get_item(const Value& subject, const Value& key, const Expr& e);
  Value get_attr(const Value& subject, const std::string& name, const Expr& e);

  // ---- filters, tests and methods (filters.cpp)
  Value method(const Value& self, const std::string& name);
  Value attribute_of(const Value& item, const std::string& path, const Expr& e);
  Value apply_filter(const std::string& name, const Value& v, Args& a, const Expr& e);
  bool apply_test(const std::string& name, const Value& v, Args& a, const Expr& e);

  const std::string& src_;
  const Limits& limits_;
  std::vector<std::shared_ptr<Dict>> frames_;
  std::unique_ptr<Dict> builtins_;
  Value block_text_;  // subject of a {% filter %} block
  size_t depth_ = 0;
  size_t calls_ = 0;  // macro calls in progress
  uint64_t steps_ = 0;
};

}  // namespace mla::jinja
