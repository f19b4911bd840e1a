// Chat templates: a checkpoint's Jinja template (tokenizer_config.json's chat_template, or
// chat_template.jinja beside it; see Tokenizer::chat_template) rendered over messages as
// transformers' apply_chat_template does it. The interpreter is in src/jinja/ (template.h lists
// the Jinja supported); its limits (jinja/limits.h) keep an untrusted template from crashing or
// stalling the process.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "jinja/error.h"
#include "jinja/limits.h"

namespace mla {

// Syntax errors, errors a template raises, and jinja::LimitError (derived) past a limit.
using ChatTemplateError = jinja::Error;

// A parsed template, reusable across renders.
class ChatTemplate {
 public:
  // Throws ChatTemplateError on syntax errors.
  explicit ChatTemplate(const std::string& source, const jinja::Limits& limits = {});
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

// A checkpoint's chat format: the Jinja template it ships, or a built-in encoder for a checkpoint
// that ships none (DeepSeek-V3.2: chat/encoding_dsv32.h). Both take the inputs of
// render_chat_template.
struct ChatFormat {
  enum class Kind { None, Jinja, DeepSeekV32 };
  Kind kind = Kind::None;
  std::string jinja;  // Kind::Jinja: the template's source

  bool empty() const { return kind == Kind::None; }
  std::string_view name() const;  // "none", "jinja", "deepseek_v32"
};

// The checkpoint's template when it has one (tokenizer_config.json / chat_template.jinja); else
// the DeepSeek-V3.2 encoder for config.json's model_type deepseek_v32; else none.
ChatFormat chat_format_for(std::string_view model_type, const std::string& chat_template);

// Whether a Jinja template reads the variable `tools` (the request's tool definitions): the
// identifier inside a {{ }} or {% %} tag, outside string literals, not as an attribute (x.tools).
// DeepSeek-V3 / R1's templates do not: they render calls and results but no definitions.
bool template_reads_tools(std::string_view tmpl);

// render_chat_template through either kind (Kind::None throws ChatTemplateError).
std::string render_chat(const ChatFormat& format, const nlohmann::ordered_json& messages, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

}  // namespace mla
