// A Jinja template: lexer, parser and renderer put together (see template.h).
#include "jinja/template.h"

#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/render.h"
#include "jinja/value.h"

namespace mla::jinja {

struct Template::Impl {
  std::string source;
  Limits limits;
  Body body;
};

Template::Template(const std::string& source, const Limits& limits) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->limits = limits;
  // Jinja's default keep_trailing_newline=False drops one trailing newline of the template.
  std::string& s = impl_->source;
  if (s.size() >= 2 && s.compare(s.size() - 2, 2, "\r\n") == 0) s.resize(s.size() - 2);
  else if (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  impl_->body = parse(impl_->source, lex(impl_->source), impl_->limits);
}

Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

const Limits& Template::limits() const { return impl_->limits; }

namespace {
template <class Json>
std::string render_with(const std::string& source, const Body& body, const Limits& limits, const Json& context) {
  if (!context.is_object()) throw Error("chat template context must be a JSON object");
  auto globals = std::make_shared<Dict>();
  for (auto it = context.begin(); it != context.end(); ++it) globals->set(it.key(), from_json(it.value()));
  Renderer renderer(source, globals, limits);
  std::string out;
  Flow flow = renderer.render(body, out);
  if (flow != Flow::Normal) throw Error("chat template: break or continue outside a loop");
  return out;
}
}  // namespace

std::string Template::render(const nlohmann::ordered_json& context) const {
  return render_with(impl_->source, impl_->body, impl_->limits, context);
}
std::string Template::render(const nlohmann::json& context) const {
  return render_with(impl_->source, impl_->body, impl_->limits, context);
}

}  // namespace mla::jinja
