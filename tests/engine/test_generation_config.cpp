// What shapes a generation apart from the model: generation_config.json and config.json
// defaults and EOS ids, stop strings over streamed text (also across token boundaries), and the
// output stream that joins the incremental decoder, the stop strings and the end flush.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/generation_config.h"
#include "engine/output_stream.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("mla_gen_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// ---- generation_config.json ----

TEST(GenerationConfig, EosIdsFromBothFiles) {
  auto dir = temp_dir("eos");
  mla::ModelConfig mc;
  mc.eos_token_ids = {1};
  EXPECT_EQ(mla::GenerationConfig::load(dir.string(), mc).eos_token_ids, (std::vector<int64_t>{1}))
      << "no generation_config.json: config.json's ids";
  write_file(dir / "generation_config.json", R"({"eos_token_id": [1, 7, 9], "temperature": 0.6})");
  auto g = mla::GenerationConfig::load(dir.string(), mc);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 7, 9}));
  EXPECT_TRUE(g.is_eos(7));
  EXPECT_FALSE(g.is_eos(2));
  write_file(dir / "generation_config.json", R"({"eos_token_id": 5})");
  EXPECT_EQ(mla::GenerationConfig::load(dir.string(), mc).eos_token_ids, (std::vector<int64_t>{1, 5}));
  fs::remove_all(dir);
}

TEST(GenerationConfig, SamplingDefaults) {
  auto g = mla::GenerationConfig::from_json(
      json::parse(R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                      "repetition_penalty": 1.1, "max_new_tokens": 77})"));
  mla::SamplingParams base;
  base.seed = 42;
  auto p = g.apply(base);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.seed, 42u);
  EXPECT_EQ(g.max_new_tokens, 77);
  // Keys it does not set keep the base; do_sample false is greedy.
  auto greedy = mla::GenerationConfig::from_json(json::parse(R"({"do_sample": false, "temperature": 0.7})"));
  auto q = greedy.apply(base);
  EXPECT_TRUE(q.greedy());
  EXPECT_FLOAT_EQ(q.top_p, base.top_p);
}

TEST(GenerationConfig, BadValuesNameTheKey) {
  try {
    mla::GenerationConfig::from_json(json::parse(R"({"temperature": "hot"})"), "gc.json");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("gc.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mla::GenerationConfig::from_json(json::parse(R"({"eos_token_id": [1, "x"]})")), std::runtime_error);
}

// ---- stop strings ----

std::string feed_all(mla::StopStrings& s, const std::vector<std::string>& pieces) {
  std::string out;
  for (auto& p : pieces) out += s.push(p);
  return out + s.flush();
}

TEST(StopStrings, EndsBeforeTheStopAcrossPieces) {
  mla::StopStrings s({"lo w"});
  EXPECT_EQ(s.push("Hel"), "He") << "'l' may start the stop string: held back";
  EXPECT_EQ(s.push("l"), "l") << "'ll' cannot start it: the first 'l' goes out";
  EXPECT_EQ(s.push("o"), "");
  EXPECT_EQ(s.push(" wor"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched(), "lo w");
  EXPECT_EQ(s.push("ld"), "");
  EXPECT_EQ(s.flush(), "");
}

TEST(StopStrings, HeldTextIsReleasedWhenItStopsMatching) {
  mla::StopStrings s({"</end>"});
  EXPECT_EQ(feed_all(s, {"a <", "/e", "nx", "t"}), "a </enxt");
  EXPECT_FALSE(s.stopped());
  mla::StopStrings t({"</end>"});
  EXPECT_EQ(feed_all(t, {"tail </en"}), "tail </en") << "flush releases an unfinished match";
}

TEST(StopStrings, EarliestOfSeveral) {
  mla::StopStrings s({"world", "o w", "\n\n"});
  EXPECT_EQ(feed_all(s, {"hello", " world\n\n"}), "hell");
  EXPECT_EQ(s.matched(), "o w");
  mla::StopStrings none;
  EXPECT_EQ(feed_all(none, {"a", "b"}), "ab");
}

// ---- the output stream: decoder, stop strings and the end flush in one place ----

class OutputStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("stream_tok"));
    mla::Tokenizer::write_byte_level_tokenizer(dir_->string(), 300);
    tok_ = new mla::Tokenizer(mla::Tokenizer::load(dir_->string()));
  }
  static void TearDownTestSuite() {
    delete tok_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static inline fs::path* dir_ = nullptr;
  static inline mla::Tokenizer* tok_ = nullptr;
};

TEST_F(OutputStreamTest, HoldsIncompleteCharactersAndFlushesAtTheEnd) {
  // "é" is two bytes: the first alone is held back; the end flush gives the rest.
  auto ids = tok_->encode("a\xc3\xa9" "b", false);
  mla::OutputStream out(tok_, true, {});
  std::string text;
  for (int32_t id : ids) text += out.push(id);
  text += out.finish();
  EXPECT_EQ(text, "a\xc3\xa9" "b");
  EXPECT_EQ(out.finish(), "") << "a second finish gives nothing";
  // Cut inside the character: the lone first byte (byte-level token "\xc3\x83", U+00C3, stands
  // for the byte 0xC3) waits, and the end flush turns it into U+FFFD.
  auto lone = tok_->token_id("\xc3\x83");
  ASSERT_TRUE(lone.has_value());
  mla::OutputStream cut(tok_, true, {});
  EXPECT_EQ(cut.push(tok_->encode("a", false).at(0)), "a");
  EXPECT_EQ(cut.push(*lone), "") << "an incomplete character is held back";
  EXPECT_EQ(cut.finish(), "\xef\xbf\xbd");
}

TEST_F(OutputStreamTest, StopStringAcrossTokensAndNothingAfter) {
  mla::OutputStream out(tok_, true, {"lo w"});
  std::string text;
  for (int32_t id : tok_->encode("Hello world", false)) text += out.push(id);
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(text, "Hel");
  EXPECT_EQ(out.finish(), "") << "after a stop the held text is dropped";
  // Held text that never completes a stop string comes out at the end.
  mla::OutputStream held(tok_, true, {"</end>"});
  std::string h;
  for (int32_t id : tok_->encode("tail </en", false)) h += held.push(id);
  EXPECT_FALSE(held.stopped());
  EXPECT_EQ(h + held.finish(), "tail </en");
  mla::OutputStream none(nullptr, true, {});
  EXPECT_EQ(none.push(65), "") << "no tokenizer: no text";
  EXPECT_EQ(none.finish(), "");
}

}  // namespace
