// JSON Schema -> grammar, checked at the byte level: documents accepted and rejected.
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar_test_util.h"

namespace mla::test {
namespace {

using J = nlohmann::ordered_json;
using grammar::SchemaError;

struct Case {
  const char* schema;
  std::vector<const char*> valid;
  std::vector<const char*> invalid;
  bool strict = false;
};

void check(const Case& c) {
  const J schema = J::parse(c.schema);
  auto g = byte_grammar(grammar::json_schema_grammar(schema, {c.strict}));
  for (const char* v : c.valid) {
    EXPECT_TRUE(grammar_accepts(g, v)) << c.schema << "\nshould accept: " << v << "\n"
                                       << grammar::json_schema_to_gbnf(schema, {c.strict});
    // Every accepted document is valid JSON that the test's validator accepts too.
    EXPECT_TRUE(validate(J::parse(v), schema, schema, c.strict)) << v;
  }
  for (const char* v : c.invalid)
    EXPECT_FALSE(grammar_accepts(g, v)) << c.schema << "\nshould reject: " << v << "\n"
                                        << grammar::json_schema_to_gbnf(schema, {c.strict});
}

TEST(JsonSchema, Scalars) {
  check({R"({"type":"string"})", {R"("")", R"("abc")", R"("a\"b\\c\n\u00e9")", "\"caf\xC3\xA9 \xF0\x9F\x98\x80\""},
         {R"(abc)", R"("a)", "\"a\nb\"", R"("\x")", R"("\u12")", "\"\xC3\"", R"("a" )", R"("\ud800")",
          R"("\udc00x")", R"("\ud83dx")"}});
  check({R"({"type":"string"})", {R"("\ud83d\ude00")", R"("\uD83D\uDE00\u20ac\uffff")"}, {R"("\ud83d\u0041")"}});
  check({R"({"type":"string","maxLength":1})", {R"("\ud83d\ude00")", R"("\u00e9")"}, {R"("\u00e9\u00e9")"}});
  check({R"({"type":"integer"})", {"0", "-7", "1234567890123456"}, {"01", "--0", "1.5", "1e3", "+1", "12345678901234567", ""}});
  check({R"({"type":"number"})", {"0", "-0.5", "3.25", "1e10", "2.5E-3", "-12e+2"}, {".5", "1.", "01", "1e", "--1", "1.5.2"}});
  check({R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"}});
  check({R"({"type":"null"})", {"null"}, {"nul", "{}"}});
  check({R"({"type":["string","null"]})", {"null", R"("x")"}, {"1"}});
}

TEST(JsonSchema, Objects) {
  const char* schema = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
                          "tags":{"type":"array","items":{"type":"string"}}},"required":["name"]})";
  check({schema,
         {R"({"name":"a"})", R"({"name":"a","age":3})", R"({"name":"a","tags":["x","y"]})",
          R"({"name":"a","age":3,"tags":[]})", R"({ "name": "a", "age": 3 })",
          "{\n  \"name\": \"a\",\n  \"age\": 3\n}"},
         {R"({})", R"({"age":3})", R"({"age":3,"name":"a"})",  // order of "properties"
          R"({"name":"a","extra":1})", R"({"name":1})", R"({"name":"a",})", R"({"name":"a" , "age":3})",
          R"({"name" :"a"})", R"( {"name":"a"})", R"({"name":"a"} )", R"({"name":"a","name":"b"})"}});
  // Everything optional.
  check({R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}})",
         {"{}", "{ }", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"},
         {R"({"b":2,"a":1})", R"({,"b":2})", R"({"a":1,})"}});
  // Required in the middle.
  check({R"({"properties":{"a":{"const":1},"b":{"const":2},"c":{"const":3}},"required":["b"]})",
         {R"({"b":2})", R"({"a":1,"b":2})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"},
         {R"({})", R"({"a":1})", R"({"a":1,"c":3})", R"({"c":3})"}});
}

TEST(JsonSchema, AdditionalProperties) {
  check({R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})",
         {R"({})", R"({"a":1})", R"({"a":1,"x":"y"})", R"({"x":"y","z":"w"})"},
         {R"({"x":1})", R"({"a":1,"x":2})"}});
  check({R"({"type":"object","additionalProperties":true})", {R"({})", R"({"x":[1,{"y":null}]})"}, {R"([])"}});
  check({R"({"type":"object","additionalProperties":false})", {R"({})", R"({ })"}, {R"({"x":1})"}});
  // A bare object is any object, unless strict.
  check({R"({"type":"object"})", {R"({})", R"({"k":"v","n":{"m":[true]}})"}, {R"({"k"})", "[]"}});
  check({R"({"type":"object"})", {R"({})"}, {R"({"k":"v"})"}, true});
  check({R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})"}, {R"({"a":1,"b":2})"}, true});
}

TEST(JsonSchema, EnumConstAnyOf) {
  check({R"({"enum":["red","green",1,null,{"a":[1]}]})", {R"("red")", R"("green")", "1", "null", R"({"a":[1]})"},
         {R"("blue")", "2", R"({"a": [1]})"}});
  check({R"({"const":"x\"y"})", {R"("x\"y")"}, {R"("xy")"}});
  check({R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"12", R"("ab")"}, {R"("abc")", "1.5"}});
  check({R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"0"}});
  check({R"({"allOf":[{"type":"integer","minimum":5}]})", {"5", "99"}, {"4"}});
}

TEST(JsonSchema, Arrays) {
  check({R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})",
         {"[1,2]", "[1, 2, 3]", "[\n  1,\n  2\n]"}, {"[]", "[1]", "[1,2,3,4]", "[1,,2]", "[1,2,]", R"([1,"a"])"}});
  check({R"({"type":"array","items":{"type":"integer"},"minItems":1})", {"[1]", "[1,2,3,4,5]"}, {"[]"}});
  check({R"({"type":"array","maxItems":1})", {"[]", R"([{"a":1}])"}, {"[1,2]"}});
  check({R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"}});
  check({R"({"type":"array"})", {"[]", R"([1,"a",[null],{}])"}, {"[", "[1 2]"}});
}

TEST(JsonSchema, StringLengths) {
  check({R"({"type":"string","minLength":2,"maxLength":4})",
         {R"("ab")", R"("abcd")", "\"\xC3\xA9\xC3\xA9\"", R"("\n\t")"}, {R"("a")", R"("abcde")", "\"\xC3\xA9\""}});
  check({R"({"type":"string","minLength":3})", {R"("abc")", R"("abcdefghij")"}, {R"("ab")"}});
  check({R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"}});
}

TEST(JsonSchema, IntegerRangesAreExact) {
  const std::vector<std::pair<const char*, std::pair<int, int>>> cases = {
      {R"({"type":"integer","minimum":0})", {0, INT32_MAX}},
      {R"({"type":"integer","minimum":1,"maximum":12})", {1, 12}},
      {R"({"type":"integer","minimum":-40,"maximum":125})", {-40, 125}},
      {R"({"type":"integer","minimum":-1234,"maximum":-17})", {-1234, -17}},
      {R"({"type":"integer","minimum":7,"maximum":7})", {7, 7}},
      {R"({"type":"integer","minimum":99,"maximum":1001})", {99, 1001}},
      {R"({"type":"integer","exclusiveMinimum":10,"exclusiveMaximum":200})", {11, 199}},
      {R"({"type":"integer","maximum":-5})", {INT32_MIN, -5}},
      {R"({"type":"integer","minimum":2.5,"maximum":9.5})", {3, 9}},
      {R"({"type":"integer","minimum":380,"maximum":1520})", {380, 1520}},
  };
  for (const auto& [schema, range] : cases) {
    auto g = byte_grammar(grammar::json_schema_grammar(J::parse(schema)));
    for (int v = -1600; v <= 1600; ++v) {
      const bool in = v >= range.first && v <= range.second;
      ASSERT_EQ(grammar_accepts(g, std::to_string(v)), in) << schema << " value " << v;
    }
  }
  // Bounds far from zero.
  auto g = byte_grammar(grammar::json_schema_grammar(J::parse(R"({"type":"integer","minimum":1000000007})")));
  EXPECT_TRUE(grammar_accepts(g, "1000000007"));
  EXPECT_TRUE(grammar_accepts(g, "99999999999"));
  EXPECT_FALSE(grammar_accepts(g, "1000000006"));
  EXPECT_FALSE(grammar_accepts(g, "-1000000008"));
}

TEST(JsonSchema, NumberBoundsAreSound) {
  const std::vector<std::tuple<const char*, double, double, bool, bool>> cases = {
      {R"({"type":"number","minimum":0,"maximum":1})", 0, 1, false, false},
      {R"({"type":"number","minimum":-2.5,"maximum":10})", -2.5, 10, false, false},
      {R"({"type":"number","exclusiveMinimum":0,"maximum":5})", 0, 5, true, false},
      {R"({"type":"number","minimum":-10,"exclusiveMaximum":-1})", -10, -1, false, true},
      {R"({"type":"number","minimum":3})", 3, 1e300, false, false},
  };
  std::mt19937 rng(7);
  for (const auto& [schema, lo, hi, lo_ex, hi_ex] : cases) {
    auto g = byte_grammar(grammar::json_schema_grammar(J::parse(schema)));
    int accepted = 0;
    for (int i = 0; i < 4000; ++i) {
      const int whole = int(rng() % 30) - 15;
      const int frac = int(rng() % 1000);
      std::string text = whole < 0 ? "-" : "";
      text += std::to_string(std::abs(whole));
      if (rng() % 2) {
        text += '.';
        text += std::to_string(frac);
      }
      const double x = std::stod(text);
      if (grammar_accepts(g, text)) {
        ++accepted;
        EXPECT_TRUE((lo_ex ? x > lo : x >= lo) && (hi_ex ? x < hi : x <= hi)) << schema << " accepted " << text;
      }
    }
    EXPECT_GT(accepted, 20) << schema;
  }
  auto g = byte_grammar(grammar::json_schema_grammar(J::parse(R"({"type":"number","minimum":0,"maximum":1})")));
  EXPECT_TRUE(grammar_accepts(g, "0.75"));
  EXPECT_TRUE(grammar_accepts(g, "1.000"));
  EXPECT_FALSE(grammar_accepts(g, "1.5"));
  EXPECT_FALSE(grammar_accepts(g, "-0.5"));
  auto h = byte_grammar(grammar::json_schema_grammar(J::parse(R"({"type":"number","exclusiveMinimum":0})")));
  EXPECT_TRUE(grammar_accepts(h, "0.5"));
  EXPECT_FALSE(grammar_accepts(h, "0"));
  EXPECT_FALSE(grammar_accepts(h, "0.000"));
}

TEST(JsonSchema, RefsAndRecursion) {
  const char* tree = R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{
      "value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["value"]}}})";
  check({tree, {R"({"value":1})", R"({"value":1,"children":[{"value":2,"children":[{"value":3}]},{"value":4}]})"},
         {R"({"value":1,"children":[{}]})", R"({"children":[]})"}});
  const char* linked = R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},
                          "required":["next"]})";
  check({linked, {R"({"next":null})", R"({"next":{"next":{"next":null}}})"}, {R"({"next":{}})"}});
  check({R"({"definitions":{"p":{"type":"integer","minimum":0}},"type":"array","items":{"$ref":"#/definitions/p"}})",
         {"[0,5]"}, {"[-1]"}});
}

TEST(JsonSchema, JsonObjectMode) {
  auto g = byte_grammar(grammar::json_object_grammar());
  for (const char* v : {R"({})", R"({"a":1})", R"({"a":[1,2.5,-3e2,"x",true,false,null,{"b":{}}]})",
                        "{\n  \"a\": {\n    \"b\": [\n      1\n    ]\n  }\n}"})
    EXPECT_TRUE(grammar_accepts(g, v)) << v;
  for (const char* v : {R"([])", R"("a")", "1", R"({"a"})", R"({a:1})", R"({"a":1,})", R"({"a":01})", R"({"a":1}})",
                        "{\t\"a\":1}", "{          \n}"})
    EXPECT_FALSE(grammar_accepts(g, v)) << v;
}

TEST(JsonSchema, WhitespaceIsBounded) {
  auto g = byte_grammar(grammar::json_object_grammar());
  EXPECT_TRUE(grammar_accepts(g, "{\n" + std::string(16, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(grammar_accepts(g, "{\n" + std::string(17, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(grammar_accepts(g, "{  \"a\": 1}"));
  EXPECT_FALSE(grammar_accepts(g, "{\n\n\"a\": 1}"));
}

std::string error_of(const char* schema, bool strict = false) {
  try {
    grammar::json_schema_grammar(J::parse(schema), {strict});
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "no error";
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  const std::string e = error_of(R"({"type":"object","properties":{"a":{"type":"string","pattern":"^a+$"},
      "b":{"not":{"type":"null"}}},"minProperties":1})");
  EXPECT_NE(e.find("unsupported JSON Schema keywords"), std::string::npos) << e;
  EXPECT_NE(e.find("pattern"), std::string::npos) << e;
  EXPECT_NE(e.find("not"), std::string::npos) << e;
  EXPECT_NE(e.find("minProperties"), std::string::npos) << e;
  EXPECT_NE(error_of(R"({"allOf":[{"type":"integer"},{"minimum":1}]})").find("allOf"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"array","prefixItems":[{"type":"integer"}]})").find("prefixItems"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"https://example.com/s.json"})").find("$ref"), std::string::npos);
  // Annotations are not errors.
  EXPECT_EQ(error_of(R"({"title":"t","description":"d","type":"string","format":"date-time","default":"x"})"), "no error");
}

TEST(JsonSchema, MalformedSchemas) {
  EXPECT_NE(error_of(R"({"type":"strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":3})").find("type must be"), std::string::npos);
  EXPECT_NE(error_of(R"({"enum":[]})").find("enum"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/missing"})").find("unresolvable"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","minLength":-1})").find("minLength"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","minLength":5,"maxLength":2})").find("maxLength"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"integer","minimum":5,"maximum":2})").find("empty"), std::string::npos);
  EXPECT_NE(error_of(R"({"properties":[]})").find("properties must be"), std::string::npos);
  EXPECT_NE(error_of(R"({"properties":{"a":{}},"required":["b"]})").find("'b'"), std::string::npos);
  EXPECT_NE(error_of(R"([1])").find("malformed"), std::string::npos);
  EXPECT_NE(error_of(R"(false)").find("malformed"), std::string::npos);
}

TEST(JsonSchema, PropertyOrderFollowsOrderedJson) {
  const J schema = J::parse(R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}},
                               "required":["zeta","alpha"]})");
  EXPECT_TRUE(schema_accepts(schema, R"({"zeta":1,"alpha":2})"));
  EXPECT_FALSE(schema_accepts(schema, R"({"alpha":2,"zeta":1})"));
  // nlohmann::json sorts keys: the documented consequence.
  auto g = byte_grammar(grammar::json_schema_grammar(nlohmann::json::parse(schema.dump())));
  EXPECT_TRUE(grammar_accepts(g, R"({"alpha":2,"zeta":1})"));
}

}  // namespace
}  // namespace mla::test
