// Tokenizer tests: every case of the DeepSeek-V3 fixture (ids, ids with BOS, decoded text),
// streaming decode, invalid UTF-8, error messages, and the demo byte-level tokenizer writer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "deepseek_fixture.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kFixtureDir = mla::test::deepseek_v3_dir();

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? " " : "") << ids[i];
  return s.str();
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("mla_tok_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

class TokenizerDeepSeekV3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { mla::test::deepseek_v3_tokenizer(); }
  static const mla::Tokenizer& tok() { return mla::test::deepseek_v3_tokenizer(); }
};

TEST_F(TokenizerDeepSeekV3, Basics) {
  EXPECT_EQ(tok().bos_id(), 0);
  EXPECT_EQ(tok().eos_id(), 1);
  EXPECT_EQ(tok().bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok().eos_token(), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(tok().vocab_size(), 128815u);
  EXPECT_EQ(tok().token_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok().token_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok().token_id("Ġthe").has_value(), true);
  EXPECT_EQ(tok().token_id("no such token here"), std::nullopt);
  EXPECT_EQ(tok().token_text(128803), "<｜User｜>");
  EXPECT_EQ(tok().token_text(*tok().token_id("Ġthe")), "Ġthe");
  EXPECT_EQ(tok().token_bytes(*tok().token_id("Ġthe")), " the");
  EXPECT_TRUE(tok().is_special(0));
  EXPECT_FALSE(tok().chat_template().empty());
  EXPECT_THROW(tok().token_text(-1), std::out_of_range);
  EXPECT_THROW(tok().token_text(10'000'000), std::out_of_range);
  EXPECT_THROW(tok().decode({5, 999'999}), std::out_of_range);
}

TEST_F(TokenizerDeepSeekV3, AllFixtureCases) {
  auto cases = mla::test::deepseek_v3_jsonl("cases.jsonl");
  ASSERT_GE(cases.size(), 100u);
  for (const json& c : cases) {
    std::string id = c["id"];
    std::string text = c["text"];
    auto expected = c["ids"].get<std::vector<int32_t>>();
    auto expected_special = c["ids_with_special"].get<std::vector<int32_t>>();
    auto ids = tok().encode(text, false);
    EXPECT_EQ(ids_to_string(ids), ids_to_string(expected)) << "case " << id;
    EXPECT_EQ(ids_to_string(tok().encode(text, true)), ids_to_string(expected_special)) << "case " << id;
    EXPECT_EQ(tok().decode(expected), c["decoded"].get<std::string>()) << "case " << id;
  }
}

TEST_F(TokenizerDeepSeekV3, SkipSpecialTokens) {
  auto ids = tok().encode("<｜User｜>hi<｜Assistant｜>", true);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(tok().decode(ids, false), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>");
  // <｜User｜> and <｜Assistant｜> are added tokens but not marked special in this tokenizer.
  EXPECT_EQ(tok().decode(ids, true), "<｜User｜>hi<｜Assistant｜>");
}

TEST_F(TokenizerDeepSeekV3, StreamDecoderHoldsIncompleteCharacters) {
  // Emoji and rare CJK are split into byte tokens across several ids.
  std::string text = "Hi 😀👨‍👩‍👧 𠀀𠀁 日本語 Привет! 🇨🇳 end";
  auto ids = tok().encode(text, false);
  mla::StreamDecoder stream(tok());
  std::string joined;
  int partial_pushes = 0;
  for (int32_t id : ids) {
    std::string piece = stream.push(id);
    if (piece.empty()) ++partial_pushes;
    // Every emitted piece is valid UTF-8 on its own: re-sanitizing changes nothing.
    EXPECT_EQ(mla::sanitize_utf8(piece), piece);
    joined += piece;
  }
  joined += stream.flush();
  EXPECT_EQ(joined, text);
  EXPECT_GT(partial_pushes, 0) << "the text should contain characters split over tokens";

  // A character cut off at the end comes out of flush() as U+FFFD.
  mla::StreamDecoder cut(tok());
  auto emoji = tok().encode("😀", false);
  ASSERT_GE(emoji.size(), 2u);
  EXPECT_EQ(cut.push(emoji[0]), "");
  EXPECT_EQ(cut.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(cut.flush(), "");
}

TEST_F(TokenizerDeepSeekV3, InvalidUtf8IsReplacedByReplacementCharacter) {
  // Each maximal ill-formed subsequence becomes one U+FFFD before encoding.
  std::string bad = std::string("ab\xFF") + "cd\xE4\xB8" + "e\xC0\xAF" + "\xED\xA0\x80" + "z\xF0\x9F\x98";
  std::string expected_clean =
      "ab\xEF\xBF\xBD" "cd\xEF\xBF\xBD" "e\xEF\xBF\xBD\xEF\xBF\xBD" "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
      "z\xEF\xBF\xBD";
  EXPECT_EQ(mla::sanitize_utf8(bad), expected_clean);
  EXPECT_EQ(tok().encode(bad, false), tok().encode(expected_clean, false));
  EXPECT_EQ(tok().decode(tok().encode(bad, false)), expected_clean);
  // Random byte soup never crashes and decodes to valid UTF-8.
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string soup(rng() % 64, '\0');
    for (char& ch : soup) ch = static_cast<char>(rng() & 0xFF);
    auto ids = tok().encode(soup, false);
    std::string back = tok().decode(ids);
    EXPECT_EQ(back, mla::sanitize_utf8(soup));
  }
  // decode() of ids cutting a character in half yields U+FFFD, as HuggingFace does.
  auto emoji = tok().encode("😀", false);
  EXPECT_EQ(tok().decode({emoji[0]}), "\xEF\xBF\xBD");
}

TEST_F(TokenizerDeepSeekV3, LongInputsRoundTrip) {
  // A 200 KB single "word" and a long mixed text go through the heap path and the cache.
  std::string word(200'000, 'a');
  auto ids = tok().encode(word, false);
  EXPECT_EQ(tok().decode(ids), word);
  std::string mixed;
  for (int i = 0; i < 2000; ++i) mixed += "int x" + std::to_string(i) + " = 中文测试 " + std::to_string(i * 7919) + ";\n";
  EXPECT_EQ(tok().decode(tok().encode(mixed, false)), mixed);
  // Encoding a concatenation by lines equals encoding line by line here (each line ends in \n
  // followed by a letter, which the pre-tokenizer always splits).
  std::vector<int32_t> by_line;
  std::istringstream lines(mixed);
  std::string line;
  while (std::getline(lines, line)) {
    auto part = tok().encode(line + "\n", false);
    by_line.insert(by_line.end(), part.begin(), part.end());
  }
  EXPECT_EQ(by_line, tok().encode(mixed, false));
}

TEST(TokenizerLoad, ErrorsNameTheFileAndTheProblem) {
  auto dir = temp_dir("errors");
  auto expect_error = [&](const std::string& content, const std::string& needle) {
    std::ofstream(dir / "tokenizer.json") << content;
    try {
      mla::Tokenizer::load(dir.string());
      ADD_FAILURE() << "no error for: " << content;
    } catch (const std::runtime_error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("tokenizer.json"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  try {
    mla::Tokenizer::load((dir / "missing").string());
    ADD_FAILURE() << "no error for a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos);
  }
  expect_error("{ not json", "bad JSON");
  expect_error(R"({"model": {"type": "Unigram", "vocab": []}})", "Unigram");
  expect_error(R"({"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})",
               "vocabulary lacks");
  fs::remove_all(dir);
}

TEST(TokenizerLoad, UnsupportedConstructsAreNamed) {
  auto dir = temp_dir("unsupported");
  mla::Tokenizer::write_byte_level_tokenizer(dir.string(), 300);
  json tj;
  std::ifstream(dir / "tokenizer.json") >> tj;
  auto expect_named = [&](const json& variant, const std::string& needle) {
    std::ofstream(dir / "tokenizer.json") << variant.dump();
    try {
      mla::Tokenizer::load(dir.string());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  json v = tj;
  v["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", ""}};
  expect_named(v, "Precompiled");
  v = tj;
  v["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_named(v, "Metaspace");
  v = tj;
  v["decoder"] = {{"type", "WordPiece"}};
  expect_named(v, "WordPiece");
  v = tj;
  v["model"]["merges"][0] = "x y z";
  expect_named(v, "merge 0");
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::ofstream(dir / "tokenizer_config.json") << "[1, 2";
  try {
    mla::Tokenizer::load(dir.string());
    ADD_FAILURE() << "no error for a bad tokenizer_config.json";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(TokenizerVariants, MergePairsDigitsAndStringBosToken) {
  // A hand-written tokenizer with merges as [a, b] pairs, a Digits pre-tokenizer and a plain
  // string bos_token in tokenizer_config.json.
  auto dir = temp_dir("variants");
  mla::Tokenizer::write_byte_level_tokenizer(dir.string(), 300);
  json tj;
  std::ifstream(dir / "tokenizer.json") >> tj;
  json merges = json::array();
  for (const auto& m : tj["model"]["merges"]) {
    std::string s = m;
    auto space = s.find(' ');
    merges.push_back(json::array({s.substr(0, space), s.substr(space + 1)}));
  }
  tj["model"]["merges"] = merges;
  tj["pre_tokenizer"] = {{"type", "Sequence"},
                         {"pretokenizers",
                          json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "add_bos_token": true, "add_eos_token": true})";
  auto tok = mla::Tokenizer::load(dir.string());
  auto ids = tok.encode("the 2024 theorem", true);
  EXPECT_EQ(ids.front(), tok.bos_id());
  EXPECT_EQ(ids.back(), tok.eos_id());
  EXPECT_EQ(tok.decode(ids, true), "the 2024 theorem");
  // Individual digits: "2024" is four byte tokens even though the writer may have merges for digits.
  auto digits = tok.encode("2024", false);
  EXPECT_EQ(digits.size(), 4u);
  fs::remove_all(dir);
}

TEST(TokenizerWriter, WritesLoadableByteLevelTokenizerThatRoundTrips) {
  auto dir = temp_dir("writer");
  for (int vocab_size : {260, 512, 4096}) {
    mla::Tokenizer::write_byte_level_tokenizer(dir.string(), vocab_size);
    auto tok = mla::Tokenizer::load(dir.string());
    EXPECT_EQ(tok.vocab_size(), static_cast<size_t>(vocab_size));
    EXPECT_EQ(tok.token_id("<｜begin▁of▁sentence｜>"), tok.bos_id());
    EXPECT_GE(tok.bos_id(), 0);
    EXPECT_GE(tok.eos_id(), 0);
    EXPECT_TRUE(tok.token_id("<｜User｜>").has_value());
    EXPECT_TRUE(tok.token_id("<｜Assistant｜>").has_value());
    EXPECT_FALSE(tok.chat_template().empty());
    std::mt19937 rng(vocab_size);
    std::vector<std::string> texts = {"", "Hello, world! The quick brown fox.", "def f(x):\n    return x * 2\n",
                                      "数字 12345 and 中文 ünïcödé 😀", "<｜User｜>hi<｜Assistant｜>"};
    for (int round = 0; round < 50; ++round) {
      std::string random_text;
      int len = rng() % 200;
      for (int k = 0; k < len; ++k) random_text.push_back(static_cast<char>(rng() & 0xFF));
      texts.push_back(mla::sanitize_utf8(random_text));
    }
    for (const auto& text : texts) {
      auto ids = tok.encode(text, false);
      for (int32_t id : ids) ASSERT_LT(static_cast<size_t>(id), static_cast<size_t>(vocab_size));
      EXPECT_EQ(tok.decode(ids), text) << "vocab " << vocab_size;
    }
    auto with_bos = tok.encode("hi", true);
    EXPECT_EQ(with_bos.front(), tok.bos_id());
    if (vocab_size >= 512) {
      // Merges do something: ordinary English takes fewer tokens than bytes.
      std::string english = "the quick brown fox jumps over the lazy dog and the cat";
      EXPECT_LT(tok.encode(english, false).size(), english.size());
    }
  }
  EXPECT_THROW(mla::Tokenizer::write_byte_level_tokenizer(dir.string(), 100), std::invalid_argument);

  // Without a chat_template in tokenizer_config.json, chat_template.jinja beside it is used.
  mla::Tokenizer::write_byte_level_tokenizer(dir.string(), 300);
  json config;
  std::ifstream(dir / "tokenizer_config.json") >> config;
  config.erase("chat_template");
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  EXPECT_EQ(mla::Tokenizer::load(dir.string()).chat_template(), "");
  std::ofstream(dir / "chat_template.jinja") << "{{ bos_token }}";
  EXPECT_EQ(mla::Tokenizer::load(dir.string()).chat_template(), "{{ bos_token }}");
  fs::remove_all(dir);
}

}  // namespace
