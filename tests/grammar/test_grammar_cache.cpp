// The cache of compiled grammars: reuse, eviction, errors.
#include <gtest/gtest.h>

#include "grammar/cache.h"

namespace mla::test {
namespace {

using J = nlohmann::ordered_json;

std::shared_ptr<const grammar::TokenTable> tiny_table() {
  std::vector<std::optional<std::string>> bytes;
  for (int b = 0; b < 128; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back(std::nullopt);
  return std::make_shared<const grammar::TokenTable>(std::move(bytes), std::vector<int32_t>{128});
}

TEST(GrammarCache, ReusesEvictsAndReportsErrors) {
  grammar::GrammarCache cache(tiny_table(), 2);
  const J a = J::parse(R"({"type":"integer"})"), b = J::parse(R"({"type":"string"})");
  auto g1 = cache.json_schema(a, false);
  EXPECT_EQ(cache.json_schema(a, false), g1);
  EXPECT_NE(cache.json_schema(a, true), g1);  // strict is part of the key
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.json_schema(a, false), g1);  // now (a, strict) is the least recently used
  auto strict = cache.json_schema(a, true);
  EXPECT_EQ(cache.json_schema(a, false), g1);
  auto g3 = cache.json_schema(b, false);  // evicts (a, strict)
  EXPECT_NE(cache.json_schema(a, true), strict);  // compiled again
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.json_object(), cache.json_object());
  EXPECT_EQ(cache.size(), 2u);
  grammar::Matcher m(cache.json_schema(a, false));
  EXPECT_TRUE(m.accept_bytes("-12"));
  EXPECT_TRUE(m.can_end());
  EXPECT_THROW(cache.json_schema(J::parse(R"({"pattern":"a+"})"), false), grammar::SchemaError);
  EXPECT_THROW(cache.gbnf("root ::= nothing"), grammar::GrammarError);
  EXPECT_EQ(cache.size(), 2u);  // failures are not stored
}

}  // namespace
}  // namespace mla::test
