// The Jinja renderer as untrusted code runs it: each limit of limits.h stops a template that
// would crash (recursion), stall (loops, huge strings) or exhaust memory, with a LimitError
// naming the limit; real templates stay far inside the defaults.
#include <gtest/gtest.h>

#include <chrono>

#include "jinja/error.h"
#include "jinja/template.h"
#include "tokenizer/deepseek_fixture.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace mla::jinja;
using ojson = nlohmann::ordered_json;

std::string render(const std::string& source, const Limits& limits = {}, const ojson& vars = ojson::object()) {
  return Template(source, limits).render(vars);
}

// The limit rendering source runs into (failing the test if it renders).
LimitError limit_error(const std::string& source, const Limits& limits = {}) {
  try {
    render(source, limits);
  } catch (const LimitError& e) {
    return e;
  }
  throw std::runtime_error("rendered within its limits: " + source.substr(0, 80));
}

TEST(JinjaRender, RecursiveMacroStopsAtCallDepth) {
  LimitError e = limit_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(e.limit(), Limit::CallDepth);
  EXPECT_EQ(e.value(), Limits{}.max_call_depth);
  EXPECT_NE(std::string(e.what()).find("max_call_depth"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("'f'"), std::string::npos) << e.what();
  // Bounded recursion still works, up to the limit.
  Limits limits;
  limits.max_call_depth = 10;
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(9) }}", limits),
            "987654321");
  EXPECT_EQ(limit_error("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(10) }}", limits).limit(),
            Limit::CallDepth);
}

TEST(JinjaRender, MutualRecursionThroughAVariableStopsToo) {
  // A macro reached through a namespace (not by its own name) recursing with the other.
  LimitError e = limit_error(
      "{% set ns = namespace() %}{% macro a() %}{{ ns.b() }}{% endmacro %}"
      "{% macro b() %}{{ a() }}{% endmacro %}{% set ns.b = b %}{{ a() }}");
  EXPECT_EQ(e.limit(), Limit::CallDepth);
}

TEST(JinjaRender, HugeStringRepetitionFailsAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  LimitError e = limit_error(R"({{ "a" * 1000000000 }})");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(e.limit(), Limit::StringBytes);
  EXPECT_NE(std::string(e.what()).find("max_string_bytes"), std::string::npos) << e.what();
  EXPECT_LT(seconds, 1.0) << "the limit must be checked before the string is built";
  EXPECT_EQ(limit_error(R"({{ 1000000000 * "ab" }})").limit(), Limit::StringBytes);
  EXPECT_EQ(render(R"({{ "ab" * 3 }}|{{ "x" * -2 }})"), "ababab|");
}

TEST(JinjaRender, DoublingConcatenationStopsAtStringBytes) {
  Limits limits;
  limits.max_string_bytes = 1 << 16;
  for (const char* op : {"~", "+"}) {
    const std::string source = std::string("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ") +
                               op + " ns.s %}{% endfor %}{{ ns.s | length }}";
    EXPECT_EQ(limit_error(source, limits).limit(), Limit::StringBytes) << op;
  }
  EXPECT_EQ(limit_error("{{ range(100000) | join('x') }}", limits).limit(), Limit::StringBytes);
  EXPECT_EQ(limit_error("{{ 'abcd' | replace('', 'yyyyyyyyyyyyyyyyyyyyyyyy' * 2000) }}", limits).limit(),
            Limit::StringBytes);
  EXPECT_EQ(limit_error("{{ 'a\nb' | indent(100000) }}", limits).limit(), Limit::StringBytes);
}

TEST(JinjaRender, OutputPastTheLimitStops) {
  Limits limits;
  limits.max_output_bytes = 100'000;
  LimitError e = limit_error("{% for i in range(100000) %}0123456789{% endfor %}", limits);
  EXPECT_EQ(e.limit(), Limit::OutputBytes);
  EXPECT_EQ(e.value(), 100'000u);
  // Exactly at the limit is fine.
  EXPECT_EQ(render("{% for i in range(10000) %}0123456789{% endfor %}", limits).size(), 100'000u);
  // Captured blocks are output too.
  EXPECT_EQ(limit_error("{% set x %}{% for i in range(100000) %}0123456789{% endfor %}{% endset %}", limits).limit(),
            Limit::OutputBytes);
}

TEST(JinjaRender, LoopsStopAtTheStepLimit) {
  Limits limits;
  limits.max_steps = 100'000;
  LimitError e = limit_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", limits);
  EXPECT_EQ(e.limit(), Limit::Steps);
  EXPECT_NE(std::string(e.what()).find("max_steps"), std::string::npos);
  // The default stops a loop of a million million iterations within the step budget.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(limit_error("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}").limit(),
            Limit::Steps);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  // Quadratic filters count their comparisons.
  EXPECT_EQ(limit_error("{{ range(1000) | unique | length }}", limits).limit(), Limit::Steps);
  EXPECT_EQ(render("{{ range(100) | unique | length }}", limits), "100");
}

TEST(JinjaRender, LargeListsStopAtListItems) {
  EXPECT_EQ(limit_error("{{ range(1000000000) | length }}").limit(), Limit::ListItems);
  EXPECT_EQ(limit_error("{{ ([1, 2] * 1000000000) | length }}").limit(), Limit::ListItems);
  Limits limits;
  limits.max_list_items = 1000;
  EXPECT_EQ(limit_error("{% set ns = namespace(l=[1]) %}{% for i in range(20) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
                        limits)
                .limit(),
            Limit::ListItems);
  EXPECT_EQ(render("{{ range(1000) | length }}", limits), "1000");
}

TEST(JinjaRender, SelfReferencingListPrintsToALimit) {
  LimitError e = limit_error("{% set l = [] %}{{ l.append(l) }}{{ l }}");
  EXPECT_TRUE(e.limit() == Limit::Depth || e.limit() == Limit::StringBytes) << e.what();
  EXPECT_EQ(limit_error("{% set l = [] %}{{ l.append(l) }}{{ l | tojson }}").limit(), Limit::Depth);
}

TEST(JinjaRender, RuntimeDepthCoversMacroBodies) {
  Limits limits;
  limits.max_depth = 16;
  limits.max_call_depth = 1000;
  // Each call nests its body inside the caller's expression: the depth runs out before the calls.
  LimitError e = limit_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", limits);
  EXPECT_EQ(e.limit(), Limit::Depth);
  // At the default depth, the deepest evaluation the limits allow fits the stack.
  Limits deep;
  deep.max_call_depth = 100'000;
  EXPECT_EQ(limit_error("{% macro f(n) %}{% if n is number %}{{ [f(n + 1)] | join }}{% endif %}{% endmacro %}{{ f(0) }}",
                        deep)
                .limit(),
            Limit::Depth);
}

TEST(JinjaRender, IntegerPowerOfAHugeExponentIsFast) {
  // 3 ** (2**62) wraps as the repeated product would, computed by squaring.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(render("{{ 1 ** 4611686018427387904 }} {{ 2 ** 10 }} {{ 2 ** 64 }}"), "1 1024 0");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

TEST(JinjaRender, DeepSeekV3TemplateStaysFarInsideTheLimits) {
  const mla::Tokenizer& tok = mla::test::deepseek_v3_tokenizer();
  ojson messages = ojson::array();
  messages.push_back({{"role", "system"}, {"content", "You are helpful."}});
  for (int i = 0; i < 50; ++i) {
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(i)}});
    messages.push_back({{"role", "assistant"}, {"content", "answer " + std::to_string(i)}});
  }
  ojson context = {{"messages", messages},        {"add_generation_prompt", true},
                   {"bos_token", tok.bos_token()}, {"eos_token", tok.eos_token()},
                   {"tools", nullptr},             {"documents", nullptr}};
  const std::string full = Template(tok.chat_template()).render(context);
  EXPECT_NE(full.find("answer 49"), std::string::npos);
  // A tenth of every default (a hundredth of the steps) still renders the same text.
  Limits tight;
  tight.max_depth = Limits{}.max_depth / 10;
  tight.max_call_depth = Limits{}.max_call_depth / 10;
  tight.max_output_bytes = Limits{}.max_output_bytes / 1000;
  tight.max_string_bytes = Limits{}.max_string_bytes / 1000;
  tight.max_list_items = Limits{}.max_list_items / 1000;
  tight.max_steps = Limits{}.max_steps / 100;
  EXPECT_EQ(Template(tok.chat_template(), tight).render(context), full);
}

TEST(JinjaRender, MacroPerMessageTemplateStaysInsideTightLimits) {
  // The shape of Kimi K2's and GLM-4.7-Flash's templates: a macro rendering each message's
  // content, namespace state across the loop, tools and tool calls as JSON.
  const std::string source =
      "{%- macro visible_text(content) -%}"
      "{%- if content is string -%}{{ content }}"
      "{%- elif content is iterable -%}{%- for item in content if item.type == 'text' -%}{{ item.text }}{%- endfor -%}"
      "{%- else -%}{{ content }}{%- endif -%}"
      "{%- endmacro -%}"
      "{%- set ns = namespace(last_user=-1) -%}"
      "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
      "{%- if tools -%}<tools>{% for t in tools %}{{ t | tojson(ensure_ascii=False) }}{% endfor %}</tools>{%- endif -%}"
      "{%- for m in messages -%}"
      "<|{{ m.role }}|>{{ visible_text(m.content) }}"
      "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}<call>{{ tc.function.name }}:"
      "{{ tc.function.arguments | tojson }}</call>{%- endfor -%}{%- endif -%}"
      "{%- if loop.index0 == ns.last_user -%}[last user]{%- endif -%}"
      "{%- endfor -%}"
      "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}";
  ojson messages = ojson::array();
  for (int i = 0; i < 500; ++i) {
    messages.push_back({{"role", "user"}, {"content", ojson::array({{{"type", "text"}, {"text", "q" + std::to_string(i)}}})}});
    messages.push_back({{"role", "assistant"},
                        {"content", "a" + std::to_string(i)},
                        {"tool_calls", ojson::array({{{"function", {{"name", "f"}, {"arguments", {{"x", i}}}}}}})}});
  }
  ojson context = {{"messages", messages},
                   {"add_generation_prompt", true},
                   {"tools", ojson::array({{{"name", "f"}, {"parameters", {{"type", "object"}}}}})}};
  const std::string full = Template(source).render(context);
  EXPECT_NE(full.find("<|user|>q499[last user]<|assistant|>a499<call>f:{\"x\": 499}</call><|assistant|>"), std::string::npos);
  Limits tight;
  tight.max_depth = 32;
  tight.max_call_depth = 2;
  tight.max_output_bytes = full.size() * 2;
  tight.max_steps = 200'000;
  EXPECT_EQ(Template(source, tight).render(context), full);
}

}  // namespace
