// Chat templates over the Jinja interpreter of src/jinja/ (see chat_template.h).
#include "tokenizer/chat_template.h"

#include "jinja/template.h"

namespace mla {

struct ChatTemplate::Impl {
  jinja::Template tmpl;
};

ChatTemplate::ChatTemplate(const std::string& source, const jinja::Limits& limits)
    : impl_(std::make_unique<Impl>(Impl{jinja::Template(source, limits)})) {}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const { return impl_->tmpl.render(context); }
std::string ChatTemplate::render(const nlohmann::json& context) const { return impl_->tmpl.render(context); }

namespace {
template <class Json>
std::string render_messages(const std::string& tmpl, const Json& messages, bool add_generation_prompt,
                            const Json& extra) {
  if (!messages.is_array()) throw ChatTemplateError("chat template: messages must be a JSON array");
  if (!extra.is_object() && !extra.is_null()) throw ChatTemplateError("chat template: extra must be a JSON object");
  Json context = Json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  return ChatTemplate(tmpl).render(context);
}
}  // namespace

std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) {
  return render_messages(tmpl, messages, add_generation_prompt, extra);
}

std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra) {
  return render_messages(tmpl, messages, add_generation_prompt, extra);
}

}  // namespace mla
