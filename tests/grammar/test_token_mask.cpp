// Token masks: the precomputed per-position sets against a brute-force check of every token,
// on a small hand-made vocabulary and on the real DeepSeek-V3 tokenizer (documents tokenized
// and checked step by step, random walks validated against their schema).
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "engine/sampler.h"
#include "grammar/grammar_test_util.h"

namespace mla::test {
namespace {

using J = nlohmann::ordered_json;
using grammar::CompiledGrammar;
using grammar::Matcher;
using grammar::TokenTable;

bool bit(const std::vector<uint32_t>& mask, int32_t id) { return (mask[size_t(id) >> 5] >> (id & 31)) & 1; }

// The allowed set by brute force: each token's bytes tried on the matcher, then undone.
std::vector<uint32_t> brute_force_mask(Matcher& m, const TokenTable& t) {
  std::vector<uint32_t> mask(t.mask_words(), 0);
  for (size_t id = 0; id < t.vocab_size(); ++id) {
    bool ok = false;
    if (t.is_stop(int32_t(id))) {
      ok = m.can_end();
    } else if (t.allowed(int32_t(id)) && m.accept_bytes(t.bytes(int32_t(id)))) {
      m.rollback(1);
      ok = true;
    }
    if (ok) mask[id >> 5] |= uint32_t(1) << (id & 31);
  }
  return mask;
}

std::shared_ptr<const TokenTable> small_table() {
  std::vector<std::optional<std::string>> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  for (const char* s : {"{\"", "\":", "\",", "\"}", " \"", "abc", "ab\"", "\n  ", "true", "1.5", "}}", "\":\"", "\xC3\xA9",
                        "\xC3", "a\xC3", "\",\"", "\"]", "],", "null", "12", "-1", "e+", " {\"", "\"\n", "\"},{\"", ":[",
                        "[{\"", "\\\"", "\\u00", "xyz\":", "  ", "\":{\"", "0,", "true}", "n", "fal", "se"})
    bytes.push_back(std::string(s));
  bytes.push_back(std::nullopt);        // a special token
  bytes.push_back(std::string("EOS"));  // the stop id: its bytes never count
  const int32_t eos = int32_t(bytes.size() - 1);
  return std::make_shared<const TokenTable>(std::move(bytes), std::vector<int32_t>{eos});
}

const char* kSchemas[] = {
    R"({"type":"object"})",
    R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer","minimum":-5,"maximum":300},
        "xs":{"type":"array","items":{"type":"number"},"maxItems":4},"ok":{"type":"boolean"}},"required":["name","ok"]})",
    R"({"type":"object","properties":{"s":{"type":"string","minLength":1,"maxLength":5},
        "e":{"enum":["abc","ab\"",null,12]}},"required":["s","e"],"additionalProperties":false})",
    R"({"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["v"]}}})",
};

// Random walk: picks random allowed tokens; after `patience` steps prefers the stop id and tokens
// that close things, so the walk ends. Checks every mask against invariants on the way.
struct WalkResult {
  std::string text;
  bool ended = false;
  int steps = 0;
};

WalkResult random_walk(const std::shared_ptr<const CompiledGrammar>& g, const TokenTable& t, std::mt19937& rng,
                       int patience, int max_steps, const std::vector<int32_t>& never,
                       std::vector<int32_t> closers) {
  Matcher m(g);
  std::vector<uint32_t> mask(t.mask_words());
  WalkResult r;
  for (; r.steps < max_steps; ++r.steps) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (size_t id = 0; id < t.vocab_size(); ++id)
      if (bit(mask, int32_t(id))) allowed.push_back(int32_t(id));
    EXPECT_FALSE(allowed.empty()) << "no token allowed after: " << r.text;
    if (allowed.empty()) return r;
    for (int32_t s : t.stop_ids()) EXPECT_EQ(bit(mask, s), m.can_end()) << r.text;
    for (int32_t id : never) EXPECT_FALSE(bit(mask, id)) << "special id " << id << " allowed after: " << r.text;
    int32_t pick = allowed[rng() % allowed.size()];
    if (r.steps >= patience) {
      bool found = false;
      for (int32_t s : t.stop_ids())
        if (bit(mask, s)) pick = s, found = true;
      for (size_t k = 0; k < closers.size() && !found; ++k)
        if (bit(mask, closers[k])) pick = closers[k], found = true;
    }
    EXPECT_TRUE(m.accept_token(pick)) << pick;
    if (t.is_stop(pick)) {
      EXPECT_TRUE(m.is_done());
      r.ended = true;
      return r;
    }
    r.text += t.bytes(pick);
  }
  return r;
}

TEST(TokenMask, MatchesBruteForceOnASmallVocabulary) {
  auto table = small_table();
  std::mt19937 rng(1);
  for (const char* s : kSchemas) {
    const J schema = J::parse(s);
    auto g = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(schema), table);
    for (int walk = 0; walk < 30; ++walk) {
      Matcher m(g);
      std::vector<uint32_t> mask(table->mask_words());
      for (int step = 0; step < 60; ++step) {
        m.fill_mask(mask);
        const auto ref = brute_force_mask(m, *table);
        ASSERT_EQ(mask, ref) << s << " step " << step;
        std::vector<int32_t> allowed;
        for (size_t id = 0; id < table->vocab_size(); ++id)
          if (bit(mask, int32_t(id))) allowed.push_back(int32_t(id));
        ASSERT_FALSE(allowed.empty());
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(pick));
        if (m.is_done()) break;
      }
    }
  }
}

// Grammars beyond JSON and the slow paths (a long string bound, a generic x{0,n}), against
// brute force on the small vocabulary.
TEST(TokenMask, MatchesBruteForceOnOtherGrammars) {
  auto table = small_table();
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {
      std::make_shared<const CompiledGrammar>(
          grammar::json_schema_grammar(J::parse(R"({"type":"object","properties":{"s":{"type":"string","maxLength":300},
              "t":{"type":"string","minLength":2}},"required":["s","t"]})")),
          table),
      std::make_shared<const CompiledGrammar>(grammar::Grammar::parse(R"(root ::= "a"{0,40} "b" | "ab"* "c" x
x ::= [\u00e0-\u00ff]{1,3} | "n" "ull"?)"),
                                              table),
      std::make_shared<const CompiledGrammar>(grammar::Grammar::parse(R"(root ::= ( "{\"" | "[" root "]" | "12" ) root?)"),
                                              table),
  };
  std::mt19937 rng(3);
  for (const auto& g : grammars) {
    for (int walk = 0; walk < 25; ++walk) {
      Matcher m(g);
      std::vector<uint32_t> mask(table->mask_words());
      for (int step = 0; step < 50; ++step) {
        m.fill_mask(mask);
        ASSERT_EQ(mask, brute_force_mask(m, *table)) << g->grammar().to_string() << " step " << step;
        std::vector<int32_t> allowed;
        for (size_t id = 0; id < table->vocab_size(); ++id)
          if (bit(mask, int32_t(id))) allowed.push_back(int32_t(id));
        ASSERT_FALSE(allowed.empty()) << "step " << step;
        ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
        if (m.is_done()) break;
      }
    }
  }
}

TEST(TokenMask, RollbackRestoresTheMask) {
  auto table = small_table();
  auto g = std::make_shared<const CompiledGrammar>(grammar::json_object_grammar(), table);
  Matcher m(g);
  std::vector<uint32_t> a(table->mask_words()), b(table->mask_words());
  ASSERT_TRUE(m.accept_bytes("{\"k\": [1"));
  m.fill_mask(a);
  for (const char* piece : {",", " 2", "]", "}"}) ASSERT_TRUE(m.accept_bytes(piece)) << piece;
  EXPECT_TRUE(m.can_end());
  m.rollback(4);
  m.fill_mask(b);
  EXPECT_EQ(a, b);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_token(int32_t(table->vocab_size() - 1)));  // the stop id, too early
  EXPECT_FALSE(m.accept_token(int32_t(table->vocab_size() - 2)));  // the special id, never
}

// ---- the real DeepSeek-V3 tokenizer -----------------------------------------------------------

std::vector<int32_t> special_ids() {
  const Tokenizer& tok = deepseek_v3_tokenizer();
  std::vector<int32_t> ids;
  for (size_t id = 0; id < 129280; ++id) {
    bool special = id >= tok.vocab_size();
    if (!special) {
      try {
        special = tok.is_special(int32_t(id));
      } catch (const std::exception&) {
        special = true;
      }
    }
    if (special && int32_t(id) != tok.eos_id()) ids.push_back(int32_t(id));
  }
  return ids;
}

TEST(TokenMaskDeepSeek, TableExcludesSpecialAndGapIds) {
  auto table = deepseek_v3_token_table();
  const Tokenizer& tok = deepseek_v3_tokenizer();
  EXPECT_EQ(table->vocab_size(), 129280u);
  EXPECT_EQ(table->stop_ids(), std::vector<int32_t>{tok.eos_id()});
  const auto never = special_ids();
  EXPECT_GT(never.size(), 400u);  // the added special tokens and the ids past the tokenizer's vocabulary
  for (int32_t id : never) EXPECT_FALSE(table->allowed(id)) << id;
  EXPECT_FALSE(table->allowed(tok.eos_id()));
  EXPECT_EQ(table->sorted_ids().size() + never.size() + 1, 129280u);
}

TEST(TokenMaskDeepSeek, TokenizedDocumentsStayInsideTheMask) {
  auto table = deepseek_v3_token_table();
  const Tokenizer& tok = deepseek_v3_tokenizer();
  const std::vector<std::pair<const char*, std::vector<const char*>>> cases = {
      {kSchemas[0], {R"({"a": 1, "b": [true, null, "x y z"], "c": {"d": -2.5e3}})", "{\n  \"key\": \"value\"\n}", "{}"}},
      {kSchemas[1], {R"({"name": "Ada Lovelace", "n": 299, "xs": [1.5, -2, 3e2], "ok": false})",
                     R"({"name":"\u00e9\"quoted\"","ok":true})"}},
      {kSchemas[2], {R"({"s": "héllo", "e": "ab\""})", R"({"s":"x","e":null})"}},
      {kSchemas[3], {R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"}},
      {R"({"type":"object","properties":{"location":{"type":"string","description":"City"},
          "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location","unit"],
          "additionalProperties":false})",
       {R"({"location": "Paris, France", "unit": "celsius"})", "{\"location\":\"東京\",\"unit\":\"fahrenheit\"}"}},
  };
  for (const auto& [schema, docs] : cases) {
    auto g = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(J::parse(schema)), table);
    for (const char* doc : docs) {
      const auto ids = tok.encode(doc, false);
      Matcher m(g);
      std::vector<uint32_t> mask(table->mask_words());
      for (size_t i = 0; i < ids.size(); ++i) {
        m.fill_mask(mask);
        ASSERT_TRUE(bit(mask, ids[i])) << doc << ": token " << i << " '" << table->bytes(ids[i]) << "'";
        EXPECT_FALSE(bit(mask, tok.eos_id())) << doc << " step " << i;
        ASSERT_TRUE(m.accept_token(ids[i]));
      }
      m.fill_mask(mask);
      EXPECT_TRUE(bit(mask, tok.eos_id())) << doc;
      EXPECT_TRUE(m.can_end());
      EXPECT_TRUE(m.accept_token(tok.eos_id()));
      EXPECT_TRUE(m.is_done());
    }
  }
}

TEST(TokenMaskDeepSeek, MatchesBruteForceAtSampledStates) {
  auto table = deepseek_v3_token_table();
  const Tokenizer& tok = deepseek_v3_tokenizer();
  const std::vector<std::pair<const char*, const char*>> cases = {
      {kSchemas[0], R"({"a": [1, {"b": "x)"},
      {kSchemas[1], R"({"name": "Ada", "n": 2)"},
      {kSchemas[2], R"({"s": "ab)"},
      {kSchemas[3], R"({"v": 1, "kids": [{"v": 2}, )"},
  };
  for (const auto& [schema, doc] : cases) {
    auto g = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(J::parse(schema)), table);
    const auto ids = tok.encode(doc, false);
    Matcher m(g);
    std::vector<uint32_t> mask(table->mask_words());
    for (size_t i = 0; i <= ids.size(); ++i) {
      if (i % 3 == 0 || i == ids.size()) {
        m.fill_mask(mask);
        ASSERT_EQ(mask, brute_force_mask(m, *table)) << doc << " after " << i << " tokens";
      }
      if (i < ids.size()) {
        ASSERT_TRUE(m.accept_token(ids[i]));
      }
    }
  }
}

TEST(TokenMaskDeepSeek, RandomWalksProduceValidDocuments) {
  auto table = deepseek_v3_token_table();
  const Tokenizer& tok = deepseek_v3_tokenizer();
  const auto never = special_ids();
  std::vector<int32_t> closers;
  for (const char* s : {"\"}", "\"]", "\"", "}", "]", "\":", ":", "0", "1", "true", "null"}) {
    const auto ids = tok.encode(s, false);
    if (ids.size() == 1) closers.push_back(ids[0]);
  }
  std::mt19937 rng(12345);
  int ended = 0;
  for (const char* s : kSchemas) {
    const J schema = J::parse(s);
    auto g = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(schema), table);
    for (int walk = 0; walk < 6; ++walk) {
      const WalkResult r = random_walk(g, *table, rng, 40, 400, never, closers);
      if (!r.ended) {
        std::printf("walk did not end (%d steps): %s\n", r.steps, J(r.text).dump().c_str());
        continue;
      }
      ++ended;
      J doc;
      ASSERT_NO_THROW(doc = J::parse(r.text)) << r.text;
      EXPECT_TRUE(validate(doc, schema, schema)) << s << "\n" << r.text;
    }
  }
  EXPECT_GE(ended, 18);  // most walks reach the end
}

}  // namespace
}  // namespace mla::test

namespace mla::test {
namespace {

// The engine's order: mask the raw logits (-inf outside the mask), then the sampler's penalties,
// temperature and filters (it drops non-finite logits), then accept the drawn token.
TEST(TokenMaskDeepSeek, SamplerDrawsOnlyAllowedTokens) {
  auto table = deepseek_v3_token_table();
  auto g = std::make_shared<const grammar::CompiledGrammar>(
      grammar::json_schema_grammar(nlohmann::ordered_json::parse(kSchemas[1])), table);
  std::vector<SamplingParams> params(4);
  params[0].temperature = 0;  // greedy
  params[1].temperature = 0.8f, params[1].top_k = 40, params[1].top_p = 0.9f;
  params[2].temperature = 1.5f, params[2].min_p = 0.05f, params[2].repetition_penalty = 1.3f;
  params[3].temperature = 1.0f, params[3].presence_penalty = 1.5f, params[3].frequency_penalty = 0.5f;
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].seed = 100 + k;
    Sampler sampler(params[k]);
    grammar::Matcher m(g);
    std::vector<uint32_t> mask(table->mask_words());
    std::vector<float> logits(table->vocab_size());
    for (int step = 0; step < 60 && !m.is_done(); ++step) {
      for (auto& x : logits) x = noise(rng);
      m.fill_mask(mask);
      grammar::apply_mask(logits, mask);
      const int32_t id = sampler.sample(logits);
      ASSERT_TRUE(bit(mask, id)) << "params " << k << " step " << step << " drew " << id;
      ASSERT_TRUE(m.accept_token(id));
      sampler.add_output_token(id);
    }
  }
}

}  // namespace
}  // namespace mla::test

namespace mla::test {
namespace {

// tool_choice "required" in DeepSeek-V3's format: special tokens as whole-token terminals
// (<[id]>) around the arguments of each tool, each tool's schema under its own rule prefix.
TEST(TokenMaskDeepSeek, ToolCallFormatWithSpecialTokens) {
  auto table = deepseek_v3_token_table();
  const Tokenizer& tok = deepseek_v3_tokenizer();
  auto id = [&](const char* s) {
    const auto v = tok.token_id(s);
    EXPECT_TRUE(v.has_value()) << s;
    return std::to_string(v.value_or(0));
  };
  const std::string begin = id("<｜tool▁calls▁begin｜>"), end = id("<｜tool▁calls▁end｜>");
  const std::string call_begin = id("<｜tool▁call▁begin｜>"), call_end = id("<｜tool▁call▁end｜>");
  const std::string sep = id("<｜tool▁sep｜>");
  const J weather = J::parse(R"({"type":"object","properties":{"location":{"type":"string"},
      "unit":{"enum":["celsius","fahrenheit"]}},"required":["location"]})");
  const J time = J::parse(R"({"type":"object","properties":{"tz":{"type":"string","maxLength":40}},"required":["tz"]})");
  const std::string gbnf = "root ::= <[" + begin + "]> call+ <[" + end + "]>\n" + "call ::= <[" + call_begin +
                           "]> \"function\" <[" + sep + "]> ( \"get_weather\\n```json\\n\" w-root | " +
                           "\"get_time\\n```json\\n\" t-root ) \"\\n```\" <[" + call_end + "]>\n" +
                           grammar::json_schema_to_gbnf(weather, {false, "w-"}) +
                           grammar::json_schema_to_gbnf(time, {false, "t-"});
  auto g = std::make_shared<const CompiledGrammar>(grammar::Grammar::parse(gbnf), table);
  const std::string text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                           "{\"location\": \"Paris\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>"
                           "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\":\"CET\"}\n```"
                           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const auto ids = tok.encode(text, false);
  const auto never = special_ids();
  const std::set<int32_t> named = {std::stoi(begin), std::stoi(end), std::stoi(call_begin), std::stoi(call_end),
                                   std::stoi(sep)};
  Matcher m(g);
  std::vector<uint32_t> mask(table->mask_words());
  for (size_t i = 0; i < ids.size(); ++i) {
    m.fill_mask(mask);
    ASSERT_TRUE(bit(mask, ids[i])) << "token " << i << " (" << ids[i] << ")";
    for (int32_t s : never)
      if (!named.count(s)) {
        ASSERT_FALSE(bit(mask, s)) << "special " << s << " at step " << i;
      }
    if (named.count(ids[i])) {
      // Where the grammar names special tokens, nothing else is allowed.
      for (size_t t = 0; t < table->vocab_size(); ++t)
        if (bit(mask, int32_t(t))) {
          EXPECT_TRUE(named.count(int32_t(t))) << "step " << i << " allows " << t;
        }
    }
    ASSERT_TRUE(m.accept_token(ids[i]));
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.accept_token(tok.eos_id()));
  // Special tokens never pass inside the arguments; a special token is refused where not named.
  Matcher m2(g);
  ASSERT_TRUE(m2.accept_token(std::stoi(begin)));
  EXPECT_FALSE(m2.accept_token(std::stoi(sep)));
  EXPECT_FALSE(m2.accept_token(std::stoi(begin)));
  EXPECT_TRUE(m2.accept_token(std::stoi(call_begin)));
  EXPECT_EQ(grammar::Grammar::parse(g->grammar().to_string()).to_string().find("<[" + sep + "]>") != std::string::npos,
            true);
}

}  // namespace
}  // namespace mla::test
