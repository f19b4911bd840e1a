// Chat-template tests: every case of the DeepSeek-V3 chat fixture (rendered text and ids), and
// one or more unit tests per Jinja construct the interpreter supports.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "tokenizer/deepseek_fixture.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

const std::string kFixtureDir = mla::test::deepseek_v3_dir();

// Renders a template with the given variables (an ordered JSON object).
std::string render(const std::string& tmpl, const ojson& vars = ojson::object()) {
  return mla::ChatTemplate(tmpl).render(vars);
}

// The error message of rendering (or parsing) tmpl, or "" if it succeeds.
std::string error_of(const std::string& tmpl, const ojson& vars = ojson::object()) {
  try {
    render(tmpl, vars);
  } catch (const mla::ChatTemplateError& e) {
    return e.what();
  }
  return "";
}

class ChatTemplateDeepSeekV3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { mla::test::deepseek_v3_tokenizer(); }
  static const mla::Tokenizer& tok() { return mla::test::deepseek_v3_tokenizer(); }
};

TEST_F(ChatTemplateDeepSeekV3, AllFixtureCases) {
  std::ifstream in(kFixtureDir + "/chat_cases.jsonl");
  ASSERT_TRUE(in) << "missing chat_cases.jsonl";
  std::string line;
  int count = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ojson c = ojson::parse(line);
    std::string id = c["id"];
    ojson extra = {{"bos_token", tok().bos_token()}, {"eos_token", tok().eos_token()}};
    std::string rendered;
    try {
      rendered = mla::render_chat_template(tok().chat_template(), c["messages"], c["add_generation_prompt"].get<bool>(), extra);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << id << ": " << e.what();
      continue;
    }
    EXPECT_EQ(rendered, c["rendered"].get<std::string>()) << "case " << id;
    EXPECT_EQ(tok().encode(rendered, false), c["ids"].get<std::vector<int32_t>>()) << "case " << id;
    ++count;
  }
  EXPECT_GE(count, 7);
}

// Whether a template reads `tools`: the variable in a tag, not text, strings, comments,
// attributes or longer names. DeepSeek-V3's reads none (the server then writes the tools into
// the system prompt: server/chat_request.h); GLM-4.7's does.
TEST_F(ChatTemplateDeepSeekV3, TemplateReadsTools) {
  EXPECT_FALSE(mla::template_reads_tools(tok().chat_template()));
  std::ifstream glm(std::string(MLA_SOURCE_DIR) + "/tests/tokenizer/data/glm/GLM-4.7-Flash.jinja");
  ASSERT_TRUE(glm);
  EXPECT_TRUE(mla::template_reads_tools(std::string(std::istreambuf_iterator<char>(glm), {})));
  for (const char* yes : {"{% if tools %}x{% endif %}", "{{- tools | tojson -}}", "{%- for t in tools %}{% endfor %}",
                          "a {{ x }} b {{ (tools or [])|length }}", "{{ 'a }}' }}{{ tools }}"})
    EXPECT_TRUE(mla::template_reads_tools(yes)) << yes;
  for (const char* no : {"tools", "{# tools #}", "{{ 'tools' }}", "{{ \"say \\\" tools\" }}", "{{ m.tools }}",
                         "{{ my_tools }}{{ tools2 }}{{ tool_calls }}", "{{ m['tools'] }}", "{ tools }", "{{ x"})
    EXPECT_FALSE(mla::template_reads_tools(no)) << no;
}

TEST_F(ChatTemplateDeepSeekV3, PlainJsonOverloadAndNoGenerationPrompt) {
  json messages = json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}});
  json extra = {{"bos_token", "<B>"}};
  std::string text = mla::render_chat_template(tok().chat_template(), messages, false, extra);
  EXPECT_EQ(text, "<B><｜User｜>hi<｜Assistant｜>yo<｜end▁of▁sentence｜>");
}

TEST(ChatTemplate, TextOutputAndComments) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("a{# comment #}b"), "ab");
  EXPECT_EQ(render("{{ 'x' }}{{ \"y\" }}{{ 3 }}{{ 2.5 }}{{ none }}{{ true }}"), "xy32.5NoneTrue");
  EXPECT_EQ(render("{{ undefined_thing }}|"), "|");
  EXPECT_EQ(render("{{ 'a\\n\\tb\\u00e9' }}"), "a\n\tbé");
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
  // One trailing newline of the template is dropped (keep_trailing_newline=False).
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
}

TEST(ChatTemplate, Literals) {
  EXPECT_EQ(render("{{ [1, 'a', none] }}"), "[1, 'a', None]");
  EXPECT_EQ(render("{{ {'k': 'v', 'n': 1} }}"), "{'k': 'v', 'n': 1}");
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
  EXPECT_EQ(render("{{ (1, 2)[1] }}"), "2");
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-7 }}"), "1.0 1e+20 0.30000000000000004 1e-07");
}

TEST(ChatTemplate, AttributeIndexAndSlice) {
  ojson vars = {{"m", {{"role", "user"}, {"content", "héllo"}}}, {"xs", {1, 2, 3, 4, 5}}};
  EXPECT_EQ(render("{{ m.role }} {{ m['content'] }} {{ m.missing }}|", vars), "user héllo |");
  EXPECT_EQ(render("{{ xs[0] }} {{ xs[-1] }} {{ xs[1:3] }} {{ xs[::-1] }} {{ xs[:-2] }} {{ xs[10] }}|", vars),
            "1 5 [2, 3] [5, 4, 3, 2, 1] [1, 2, 3] |");
  EXPECT_EQ(render("{{ m.content[1] }} {{ m.content[1:3] }} {{ m.content[::-1] }}", vars), "é él olléh");
  EXPECT_NE(error_of("{{ nothing.attr }}").find("'nothing' is undefined"), std::string::npos);
}

TEST(ChatTemplate, ArithmeticAndConcatenation) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}"),
            "7 9 3 -4 1 2");
  EXPECT_EQ(render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ -3 }} {{ 1.5 * 2 }}"), "3.5 2.0 1024 -3 3.0");
  EXPECT_EQ(render("{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }}"), "ab a1None ababab [1, 2]");
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
}

TEST(ChatTemplate, ComparisonsLogicAndMembership) {
  EXPECT_EQ(render("{{ 1 < 2 }} {{ 2 <= 1 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "True False True True True False");
  EXPECT_EQ(render("{{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ 0 or '' or 'z' }}"), "x y True z");
  EXPECT_EQ(render("{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"),
            "True True True True");
  EXPECT_EQ(render("{{ not 1 in [1] }}"), "False");
}

TEST(ChatTemplate, Tests) {
  ojson vars = {{"s", "x"}, {"n", nullptr}, {"i", 4}, {"f", 1.5}, {"l", {1}}, {"d", {{"a", 1}}}, {"b", true}};
  EXPECT_EQ(render("{{ s is defined }}{{ zz is defined }}{{ zz is undefined }}{{ n is none }}{{ s is not none }}", vars),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ s is string }}{{ i is string }}{{ i is number }}{{ i is integer }}{{ f is float }}", vars),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ d is mapping }}{{ l is sequence }}{{ l is iterable }}{{ b is boolean }}{{ b is true }}", vars),
            "TrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ i is even }}{{ i is odd }}{{ i is divisibleby 2 }}{{ i is divisibleby(3) }}", vars),
            "TrueFalseTrueFalse");
  EXPECT_EQ(render("{{ i is eq 4 }}{{ i is equalto(5) }}{{ s is in ['x'] }}{{ b is sameas true }}", vars),
            "TrueFalseTrueTrue");
  EXPECT_EQ(render("{{ 'yes' if s is string and i is number else 'no' }}", vars), "yes");
}

TEST(ChatTemplate, InlineIf) {
  EXPECT_EQ(render("{{ 'a' if true else 'b' }}{{ 'a' if false else 'b' }}{{ 'a' if false }}|"), "ab|");
  EXPECT_EQ(render("{{ 1 if false else 2 if false else 3 }}"), "3");
}

TEST(ChatTemplate, IfElifElse) {
  const std::string t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(t, {{"x", 1}}), "one");
  EXPECT_EQ(render(t, {{"x", 2}}), "two");
  EXPECT_EQ(render(t, {{"x", 9}}), "many");
  EXPECT_EQ(render("{% if missing %}x{% endif %}|"), "|");
}

TEST(ChatTemplate, ForLoopVariables) {
  ojson vars = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}"
                   "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}{{ loop.length }},{% endfor %}",
                   vars),
            "10aF3,21b3,32cL3,");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", vars),
            "32b;21ac;10b;");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", vars), "odd even odd ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in missing %}x{% else %}none{% endfor %}"), "none");
  // Filter condition: loop variables count the kept items only.
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ x }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}"),
            "1/3,3/3,5/3");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"), "ab");
  EXPECT_EQ(render("{% for c in 'hé' %}[{{ c }}]{% endfor %}"), "[h][é]");
  EXPECT_EQ(render("{% for i in range(3) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}"),
            "001 012 1|101 112 2|201 212 3|");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "013");
}

TEST(ChatTemplate, SetScopingAndNamespace) {
  EXPECT_EQ(render("{% set x = 1 %}{% set y = x + 1 %}{{ x }}{{ y }}"), "12");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  // A plain set inside a loop does not leak out of it; a namespace attribute does.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in range(3) %}{% set x = i %}{% endfor %}{{ x }}"), "0");
  EXPECT_EQ(render("{% set ns = namespace(total=0, seen=false) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}"
                   "{% endfor %}{{ ns.total }}{{ ns.seen }}"),
            "6False");
  EXPECT_EQ(render("{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]"), "[inner 2]");
  EXPECT_NE(error_of("{% set d = {} %}{% set d.x = 1 %}").find("namespace"), std::string::npos);
}

TEST(ChatTemplate, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(name='Cy', punct='.') }}"),
            "Hi Ann! Hi Bob? Hi Cy.");
  // Macros see top-level variables.
  EXPECT_EQ(render("{% macro show() %}{{ who }}{% endmacro %}{{ show() }}", {{"who", "me"}}), "me");
  EXPECT_EQ(render("{%- macro render_list(xs) -%}{%- for x in xs -%}{{ x }}{{ ', ' if not loop.last }}{%- endfor -%}"
                   "{%- endmacro -%}\n[{{ render_list([1, 2, 3]) }}]"),
            "[1, 2, 3]");
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true -%}\n  b\n  {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(render("{% if true %}\n  x\n{% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("<\n    {% for i in range(2) %}\n    {{ i }}\n    {% endfor %}\n>"), "<\n    0\n    1\n>");
  EXPECT_EQ(render("  {# note #}\nz"), "z");
  // {%+ keeps the indentation.
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  // Expression tags are not affected by trim/lstrip.
  EXPECT_EQ(render("  {{ 'x' }}\n"), "  x");
}

TEST(ChatTemplate, Filters) {
  ojson vars = {{"s", "  Hello World  "}, {"xs", {3, 1, 2}}, {"d", {{"b", 2}, {"a", 1}}},
                {"msgs", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}}};
  EXPECT_EQ(render("[{{ s|trim }}] {{ s|length }} {{ xs|length }} {{ d|count }} {{ s|trim|lower }} {{ s|upper|trim }}", vars),
            "[Hello World] 15 3 2 hello world HELLO WORLD");
  EXPECT_EQ(render("{{ xs|join(', ') }} {{ xs|first }} {{ xs|last }} {{ xs|sort|list }} {{ xs|reverse|list }}", vars),
            "3, 1, 2 3 2 [1, 2, 3] [2, 1, 3]");
  EXPECT_EQ(render("{{ missing|default('dflt') }} {{ ''|default('e', true) }} {{ 'v'|default('x') }}", vars), "dflt e v");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %} {{ d|dictsort }}", vars), "b2a1 [['a', 1], ['b', 2]]");
  EXPECT_EQ(render("{{ 42|string ~ '!' }} {{ '7'|int + 1 }} {{ '2.5'|float }} {{ (-3)|abs }} {{ -3|abs }} {{ 2.567|round(2) }}", vars),
            "42! 8 2.5 3 -3 2.57");
  EXPECT_EQ(render("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join }}"
                   "{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|first }}"
                   "{{ msgs|map(attribute='role')|list }}",
                   vars),
            "US['system', 'user']");
  EXPECT_EQ(render("{{ 'a b'|replace(' ', '_') }} {{ 'hi'|capitalize }} {{ 'x y'|title }} {{ [1, 1, 2]|unique|list }}"),
            "a_b Hi X Y [1, 2]");
  EXPECT_EQ(render("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b|  a\n  b");
  EXPECT_EQ(render("{{ [1, 5, 2]|max }}{{ [1, 5, 2]|min }}{{ [1, 5, 2]|sum }}"), "518");
  EXPECT_NE(error_of("{{ 1|no_such_filter }}").find("unsupported filter 'no_such_filter'"), std::string::npos);
}

TEST(ChatTemplate, ToJson) {
  ojson vars = {{"tool", {{"name", "get_weather"}, {"parameters", {{"city", "Paris"}, {"units", nullptr}}}, {"n", 1.5}}},
                {"text", "line\n\"q\" é"}};
  EXPECT_EQ(render("{{ tool|tojson }}", vars),
            R"({"name": "get_weather", "parameters": {"city": "Paris", "units": null}, "n": 1.5})");
  EXPECT_EQ(render("{{ text|tojson }}", vars), "\"line\\n\\\"q\\\" é\"");
  EXPECT_EQ(render("{{ [1, [true, false], {}] |tojson }}"), "[1, [true, false], {}]");
  EXPECT_EQ(render("{{ {'a': [1, 2]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
}

TEST(ChatTemplate, StringAndDictMethods) {
  ojson vars = {{"s", "  a,b,,c  "}, {"d", {{"k", "v"}}}};
  EXPECT_EQ(render("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'Hi'.lower() }}{{ 'Hi'.upper() }}", vars),
            "TrueTruehiHI");
  EXPECT_EQ(render("[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'.strip('x') }}]", vars),
            "[a,b,,c][a,b,,c  ][  a,b,,c][a]");
  EXPECT_EQ(render("{{ s.strip().split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }}", vars),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b-c']");
  EXPECT_EQ(render("{{ 'aaa'.replace('a', 'b', 2) }} {{ ', '.join(['x', 'y']) }} {{ 'abc'.find('c') }} {{ '{} and {}'.format(1, 'z') }}"),
            "bba x, y 2 1 and z");
  EXPECT_EQ(render("{{ d.get('k') }} {{ d.get('no', 'dflt') }} {{ d.get('no') }} {{ d.keys() }} {{ d.values() }} {{ d.items() }}", vars),
            "v dflt None ['k'] ['v'] [['k', 'v']]");
}

TEST(ChatTemplate, RaiseException) {
  std::string message = error_of("{% if messages|length == 0 %}{{ raise_exception('Need at least one message') }}{% endif %}",
                                 {{"messages", ojson::array()}});
  EXPECT_NE(message.find("Need at least one message"), std::string::npos) << message;
}

TEST(ChatTemplate, UnsupportedConstructsAndSyntaxErrorsNamePosition) {
  std::string message = error_of("line one\n  {% include 'other.jinja' %}");
  EXPECT_NE(message.find("unsupported construct 'include'"), std::string::npos) << message;
  EXPECT_NE(message.find("line 2, column 6"), std::string::npos) << message;
  message = error_of("{% for x in xs recursive %}{% endfor %}");
  EXPECT_NE(message.find("recursive"), std::string::npos) << message;
  message = error_of("{% if x %}no end");
  EXPECT_NE(message.find("endif"), std::string::npos) << message;
  message = error_of("{{ 1 + }}");
  EXPECT_NE(message.find("line 1"), std::string::npos) << message;
  message = error_of("{{ 'unterminated }}");
  EXPECT_NE(message.find("unterminated string"), std::string::npos) << message;
  message = error_of("{% endfor %}");
  EXPECT_NE(message.find("unexpected 'endfor'"), std::string::npos) << message;
  message = error_of("{{ x }");
  EXPECT_NE(message.find("unclosed"), std::string::npos) << message;
  message = error_of("{{ undefined_fn() }}");
  EXPECT_NE(message.find("'undefined_fn' is undefined"), std::string::npos) << message;
}

TEST(ChatTemplate, ToolsAndDocumentsDefaultToNone) {
  json messages = json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(mla::render_chat_template("{{ tools is defined }}{{ tools is none }}{{ add_generation_prompt }}", messages, true),
            "TrueTrueTrue");
  json extra = {{"tools", json::array({{{"name", "f"}}})}};
  EXPECT_EQ(mla::render_chat_template("{{ tools[0].name }}", messages, false, extra), "f");
}

TEST(ChatTemplate, FilterBlockWithAndGeneration) {
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}|"), "3|");
  EXPECT_EQ(render("{% generation %}gen{% endgeneration %}"), "gen");
}

// A template in the style of the ones that use tools, system prompts and tojson (Llama/Qwen/GLM
// shape), to exercise the pieces together.
TEST(ChatTemplate, RealisticToolTemplate) {
  const std::string tmpl = R"({%- if tools %}
{{- '<|system|>\n' }}
{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] + '\n\n' }}
{%- endif %}
{{- '# Tools\n' }}
{%- for tool in tools %}
{{- tool | tojson }}
{{- '\n' }}
{%- endfor %}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|system|>\n' + messages[0]['content'] + '\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
{{- '<|user|>\n' + message.content + '\n' }}
    {%- elif message.role == 'assistant' %}
{{- '<|assistant|>\n' }}
        {%- if message.content %}{{ message.content }}{% endif %}
        {%- for call in message.tool_calls | default([]) %}
{{- '<tool_call>' + call.function.name + ' ' + call.function.arguments | tojson + '</tool_call>' }}
        {%- endfor %}
{{- '\n' }}
    {%- elif message.role == 'tool' %}
{{- '<|observation|>\n' + message.content + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|assistant|>\n' }}
{%- endif %}
)";
  ojson messages = ojson::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "Weather?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", {{{"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}}}},
       {{"role", "tool"}, {"content", "18C"}}});
  ojson extra = {{"tools", {{{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}};
  std::string out = mla::render_chat_template(tmpl, messages, true, extra);
  EXPECT_EQ(out,
            "<|system|>\nBe brief.\n\n# Tools\n{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}\n"
            "<|user|>\nWeather?\n<|assistant|>\n<tool_call>get_weather {\"city\": \"Paris\"}</tool_call>\n"
            "<|observation|>\n18C\n<|assistant|>\n");
}

}  // namespace
