// Chat templates over the Jinja interpreter of src/jinja/ (see chat_template.h).
#include "chat/chat_template.h"

#include "jinja/template.h"
#include "chat/encoding_dsv32.h"

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

std::string_view ChatFormat::name() const {
  switch (kind) {
    case Kind::Jinja: return "jinja";
    case Kind::DeepSeekV32: return "deepseek_v32";
    default: return "none";
  }
}

ChatFormat chat_format_for(std::string_view model_type, const std::string& chat_template) {
  ChatFormat f;
  if (!chat_template.empty()) {
    f.kind = ChatFormat::Kind::Jinja;
    f.jinja = chat_template;
  } else if (model_type == "deepseek_v32") {
    f.kind = ChatFormat::Kind::DeepSeekV32;
  }
  return f;
}

bool template_reads_tools(std::string_view t) {
  auto ident = [](char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  for (size_t i = 0; (i = t.find('{', i)) != std::string_view::npos;) {
    if (i + 1 >= t.size() || (t[i + 1] != '{' && t[i + 1] != '%')) {
      ++i;
      continue;
    }
    const std::string_view close = t[i + 1] == '{' ? "}}" : "%}";
    size_t j = i + 2;
    char quote = 0;
    for (; j < t.size() && !(quote == 0 && t.substr(j, 2) == close); ++j) {
      const char c = t[j];
      if (quote) {
        if (c == '\\') ++j;
        else if (c == quote) quote = 0;
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (ident(c) && !ident(t[j - 1])) {
        size_t k = j;
        while (k < t.size() && ident(t[k])) ++k;
        if (t.substr(j, k - j) == "tools" && t[j - 1] != '.') return true;
        j = k - 1;
      }
    }
    i = j + 2;
  }
  return false;
}

std::string render_chat(const ChatFormat& format, const nlohmann::ordered_json& messages, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra) {
  switch (format.kind) {
    case ChatFormat::Kind::Jinja: return render_chat_template(format.jinja, messages, add_generation_prompt, extra);
    case ChatFormat::Kind::DeepSeekV32:
      if (!extra.is_object() && !extra.is_null()) throw ChatTemplateError("chat template: extra must be a JSON object");
      return render_dsv32_chat(messages, extra.is_object() ? extra : nlohmann::ordered_json::object());
    default: throw ChatTemplateError("the model has no chat template");
  }
}

}  // namespace mla
