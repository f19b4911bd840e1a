// The Jinja parser: a recursive-descent parser (precedence as Jinja's own) from the lexer's
// segments to a small tree of statements (Node) and expressions (Expr).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "jinja/lexer.h"
#include "jinja/limits.h"
#include "jinja/value.h"

namespace mla::jinja {

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
  size_t depth = 1;                  // of the tree below, this node included
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

// The tree of a template. Throws Error naming the line and column of a syntax error or an
// unsupported construct, LimitError past limits.max_depth of nesting.
Body parse(const std::string& source, std::vector<Segment> segments, const Limits& limits);

}  // namespace mla::jinja
