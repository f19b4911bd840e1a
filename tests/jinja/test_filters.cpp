// Filters, tests, globals and Python methods of the Jinja renderer.
#include <gtest/gtest.h>

#include "jinja/error.h"
#include "jinja/template.h"

namespace {

using namespace mla::jinja;
using ojson = nlohmann::ordered_json;

std::string render(const std::string& source, const ojson& vars = ojson::object()) {
  return Template(source).render(vars);
}

TEST(JinjaFilters, StringFilters) {
  EXPECT_EQ(render("{{ '  Hi  ' | trim | upper }}"), "HI");
  EXPECT_EQ(render("{{ 'a<b' | e }}"), "a&lt;b");
  EXPECT_EQ(render("{{ 'x\ny' | indent(2, first=true) }}"), "  x\n  y");
  EXPECT_EQ(render("{{ 'hello world' | truncate(8) }}"), "hello...");
  EXPECT_EQ(render("{{ 'aXbX' | replace('X', '-') }}"), "a-b-");
}

TEST(JinjaFilters, SequenceFilters) {
  ojson vars = {{"xs", {3, 1, 2}}, {"ms", {{{"r", "u"}}, {{"r", "a"}}, {{"r", "u"}}}}};
  EXPECT_EQ(render("{{ xs | sort | join(',') }}", vars), "1,2,3");
  EXPECT_EQ(render("{{ xs | sort(reverse=true) | first }}", vars), "3");
  EXPECT_EQ(render("{{ ms | map(attribute='r') | unique | join }}", vars), "ua");
  EXPECT_EQ(render("{{ ms | selectattr('r', 'equalto', 'u') | list | length }}", vars), "2");
  EXPECT_EQ(render("{{ xs | sum }} {{ xs | max }} {{ xs | min }}", vars), "6 3 1");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | dictsort | first | first }}"), "a");
}

TEST(JinjaFilters, TestsAndGlobals) {
  EXPECT_EQ(render("{{ x is defined }} {{ 3 is odd }} {{ 'a' is string }} {{ none is none }}"), "False True True True");
  EXPECT_EQ(render("{{ range(1, 7, 2) | list }}"), "[1, 3, 5]");
  EXPECT_EQ(render("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}"), "2");
  EXPECT_THROW(render("{{ raise_exception('bad') }}"), Error);
  EXPECT_THROW(render("{{ x | no_such_filter }}"), Error);
}

TEST(JinjaFilters, PythonMethods) {
  EXPECT_EQ(render("{{ 'a,b,c'.split(',', 1) }}"), "['a', 'b,c']");
  EXPECT_EQ(render("{{ 'a,b,c'.rsplit(',', 1) }}"), "['a,b', 'c']");
  EXPECT_EQ(render("{{ '{}-{x}'.format(1, x=2) }}"), "1-2");
  EXPECT_EQ(render("{{ '{1}{0}'.format('a', 'b') }}"), "ba");
  // An index past any argument list is the renderer's Error (std::stoul threw out_of_range).
  EXPECT_THROW(render("{{ '{99999999999999999999999}'.format(1) }}"), Error);
  EXPECT_THROW(render("{{ '{7}'.format(1) }}"), Error);
  EXPECT_EQ(render("{{ '-'.join(['a', 'b']) }}"), "a-b");
  EXPECT_EQ(render("{% set d = {'a': 1} %}{{ d.get('b', 5) }} {{ d.items() | list }}"), "5 [['a', 1]]");
  EXPECT_EQ(render("{% set l = [1] %}{{ l.append(2) }}{{ l }}"), "None[1, 2]");
}

}  // namespace
