// Chat templates: an interpreter for the subset of Jinja2 that HuggingFace chat templates use,
// rendering with the settings of transformers' apply_chat_template (trim_blocks and
// lstrip_blocks on, a single trailing newline of the template dropped, loop controls enabled).
//
// Supported: {{ }}, {% %}, {# #} with whitespace control (-, +); statements if/elif/else,
// for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/
// previtem/nextitem/cycle, break/continue), set (plain, tuple, namespace attribute, block set),
// macro and calls, with, filter blocks, raw, generation (rendered as its body); expressions with
// literals, lists, dicts, attribute/index access, slicing, arithmetic, ~, comparisons,
// and/or/not, in / not in, `is` tests, inline if/else, filters and Python string/dict/list
// methods; globals range, namespace, dict, raise_exception, strftime_now.
// Anything else (include, extends, block, import, call blocks, recursive loops ...) throws
// ChatTemplateError naming the construct and its line and column.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace mla {

class ChatTemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A parsed template, reusable across renders.
class ChatTemplate {
 public:
  explicit ChatTemplate(const std::string& source);  // throws ChatTemplateError on syntax errors
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Renders with the top-level variables of `context` (a JSON object: messages, bos_token ...).
  // Key order of ordered_json objects is kept, as Python dicts keep it (it shows in tojson).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// apply_chat_template(messages, add_generation_prompt, tokenize=False) as transformers does it:
// the variables are messages, add_generation_prompt, tools and documents (None unless given in
// extra) and every key of extra (bos_token, eos_token, tools, ...). Messages carry role,
// content (string or null) and whatever else the template reads (tool_calls ...).
std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra = nlohmann::json::object());
std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

}  // namespace mla
