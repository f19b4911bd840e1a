// Values of the Jinja interpreter: Python's str/repr of numbers and containers, JSON, equality
// and ordering, the str operations, and the nesting bound on printing and comparing.
#include <gtest/gtest.h>

#include "jinja/error.h"
#include "jinja/value.h"

namespace {

using namespace mla::jinja;

TEST(JinjaValue, PythonFloatAndStr) {
  EXPECT_EQ(python_float(1.0), "1.0");
  EXPECT_EQ(python_float(0.1), "0.1");
  EXPECT_EQ(python_float(1e16), "1e+16");
  EXPECT_EQ(python_float(1.5e-5), "1.5e-05");
  EXPECT_EQ(python_float(-0.0), "-0.0");
  EXPECT_EQ(to_str(Value::none()), "None");
  EXPECT_EQ(to_str(Value::from(true)), "True");
  EXPECT_EQ(to_str(Value::undefined("x")), "");
  EXPECT_EQ(to_str(Value::from(List{Value::from("a'b"), Value::from(int64_t{2})})), "[\"a'b\", 2]");
}

TEST(JinjaValue, FromJsonKeepsOrderAndToJsonMatchesPython) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(R"({"b": [1, 2.5, null], "a": "x\n"})");
  Value v = from_json(j);
  ASSERT_TRUE(v.is_dict());
  EXPECT_EQ(v.dict->entries.front().first, "b");
  std::string out;
  to_json(out, v, -1, false, 1 << 20);
  EXPECT_EQ(out, R"({"b": [1, 2.5, null], "a": "x\n"})");
  out.clear();
  to_json(out, v, 2, true, 1 << 20);
  EXPECT_EQ(out, "{\n  \"a\": \"x\\n\",\n  \"b\": [\n    1,\n    2.5,\n    null\n  ]\n}");
  out.clear();
  EXPECT_THROW(to_json(out, v, -1, false, 8), LimitError);
}

TEST(JinjaValue, EqualityAndOrdering) {
  EXPECT_TRUE(equals(Value::from(int64_t{1}), Value::from(1.0)));
  EXPECT_TRUE(equals(Value::from(true), Value::from(int64_t{1})));
  EXPECT_FALSE(equals(Value::from("1"), Value::from(int64_t{1})));
  EXPECT_LT(compare(Value::from(List{Value::from(int64_t{1})}), Value::from(List{Value::from(int64_t{1}), Value::none()})), 0);
  EXPECT_GT(compare(Value::from("b"), Value::from("a")), 0);
  EXPECT_THROW(compare(Value::from("a"), Value::from(int64_t{1})), Error);
}

TEST(JinjaValue, StringOperationsOverCodePoints) {
  EXPECT_EQ(lower("ÀB"), "àb");
  EXPECT_EQ(title("hello wORLD"), "Hello World");
  EXPECT_EQ(capitalize("éCOLE"), "École");
  EXPECT_EQ(strip_chars("  x \n", nullptr, true, true), "x");
  List parts = split(" a  b ", nullptr, -1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].text, "b");
  EXPECT_EQ(replace_all("aXbXc", "X", "--", 1, 100), "a--bXc");
  EXPECT_EQ(replace_all("ab", "", "-", -1, 100), "-a-b-");
  EXPECT_THROW(replace_all("aaaa", "a", "bbbb", -1, 10), LimitError);
}

TEST(JinjaValue, SelfReferenceStopsAtTheNestingBound) {
  Value l = Value::from(List{});
  l.list->push_back(l);  // a list holding itself, as {{ l.append(l) }} makes it
  try {
    repr(l);
    FAIL() << "repr of a self-referencing list returned";
  } catch (const LimitError& e) {
    EXPECT_EQ(e.limit(), Limit::Depth);
  }
  EXPECT_TRUE(equals(l, l));  // the same object: equal without recursing, as in Python
  Value m = Value::from(List{});
  m.list->push_back(m);
  EXPECT_THROW(equals(l, m), LimitError);
  l.list->clear();  // break the cycles so the lists are freed
  m.list->clear();
}

}  // namespace
