// A Jinja template: the interpreter for the subset of Jinja2 that HuggingFace chat templates
// use, with the settings of transformers' apply_chat_template (trim_blocks and lstrip_blocks on,
// a single trailing newline of the template dropped, loop controls enabled).
//
// Supported: {{ }}, {% %}, {# #} with whitespace control (-, +); statements if/elif/else,
// for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/
// previtem/nextitem/cycle, break/continue), set (plain, tuple, namespace attribute, block set),
// macro and calls, with, filter blocks, raw, generation (rendered as its body); expressions with
// literals, lists, dicts, attribute/index access, slicing, arithmetic, ~, comparisons,
// and/or/not, in / not in, `is` tests, inline if/else, filters and Python string/dict/list
// methods; globals range, namespace, dict, raise_exception, strftime_now.
// Anything else (include, extends, block, import, call blocks, recursive loops ...) throws
// Error naming the construct and its line and column.
//
// Templates are untrusted code (they come with checkpoints): parsing and each render keep to
// the Limits given (limits.h), throwing LimitError past one.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "jinja/error.h"
#include "jinja/limits.h"

namespace mla::jinja {

class Template {
 public:
  // Parses source; throws Error on syntax errors, LimitError past limits.max_depth of nesting.
  explicit Template(const std::string& source, const Limits& limits = {});
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

  // Renders with the top-level variables of `context` (a JSON object). Key order of
  // ordered_json objects is kept, as Python dicts keep it (it shows in tojson).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  const Limits& limits() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mla::jinja
