// Generation tests: generation_config.json and config.json defaults and EOS ids, stop strings
// over streamed text (also across token boundaries), and the Generator loop on the
// deepseek-v3-tiny fixture with a byte-level tokenizer: greedy tokens equal the fixture's
// HuggingFace greedy continuation, the cache carries across calls, and every stop condition
// (EOS, stop string, max tokens, context, KV cache full) ends the output as defined.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backend/cpu/context.h"
#include "engine/generation_config.h"
#include "engine/generator.h"
#include "engine/run_modes.h"
#include "format/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixture = std::string(MLA_SHARED_DIR) + "/fixtures/models/deepseek-v3-tiny";

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

// ---- the generator on a fixture checkpoint ----

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One thread (one_thread_): these tiny models gain nothing from two, and a busy machine
    // makes OpenMP's waiting threads slow.
    one_thread_.threads = 1;
    dir_ = new fs::path(temp_dir("model"));
    fs::copy_file(kFixture + "/config.json", *dir_ / "config.json");
    fs::copy_file(kFixture + "/model.safetensors", *dir_ / "model.safetensors");
    mla::Tokenizer::write_byte_level_tokenizer(dir_->string(), 512);
    model_ = mla::Model::load(dir_->string(), one_thread_).release();
    tok_ = new mla::Tokenizer(mla::Tokenizer::load(dir_->string()));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static mla::GenerateParams greedy(int64_t n) {
    mla::GenerateParams p;
    p.sampling.temperature = 0;
    p.max_new_tokens = n;
    return p;
  }
  static mla::GeneratorOptions f32() {
    mla::GeneratorOptions o;
    o.kv_dtype = mla::KvDType::F32;
    return o;
  }
  static std::vector<int32_t> golden_ids(int j, int64_t* prompt_len) {
    mla::SafetensorsFile f(kFixture + "/golden.safetensors");
    auto* n = f.find("seq" + std::to_string(j) + "_prompt");
    auto* ids = f.find("seq" + std::to_string(j) + "_ids");
    *prompt_len = reinterpret_cast<const int64_t*>(n->data)[0];
    std::vector<int32_t> out;
    for (int64_t i = 0; i < ids->numel(); ++i) out.push_back(int32_t(reinterpret_cast<const int64_t*>(ids->data)[i]));
    return out;
  }
  static inline fs::path* dir_ = nullptr;
  static inline mla::cpu::Context one_thread_;
  static inline mla::Model* model_ = nullptr;
  static inline mla::Tokenizer* tok_ = nullptr;
};

TEST_F(GeneratorTest, GreedyMatchesHuggingFaceContinuation) {
  for (int j = 0; j < 3; ++j) {
    int64_t T = 0;
    auto ids = golden_ids(j, &T);
    std::vector<int32_t> prompt(ids.begin(), ids.begin() + T), expected(ids.begin() + T, ids.end());
    mla::Generator gen(*model_, *tok_, f32());
    auto r = gen.generate(prompt, greedy(int64_t(expected.size())));  // no EOS ids: HF generated 8 tokens
    EXPECT_EQ(r.tokens, expected) << "sequence " << j;
    EXPECT_EQ(r.reason, mla::StopReason::MaxTokens);
    EXPECT_EQ(r.prompt_tokens, T);
    EXPECT_EQ(r.decode_steps, int64_t(expected.size()) - 1) << "the last token is sampled, not fed";
    EXPECT_EQ(r.text, tok_->decode(expected, true));
  }
}

TEST_F(GeneratorTest, StreamsTheTextAndReportsFigures) {
  mla::Generator gen(*model_, *tok_);
  std::string streamed;
  int calls = 0;
  auto prompt = tok_->encode("The cache keeps", true);
  auto r = gen.generate(prompt, greedy(12), [&](std::string_view s) {
    streamed += s;
    ++calls;
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_GT(calls, 1) << "text arrives token by token";
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_GT(r.prompt_tokens_per_second(), 0);
  EXPECT_GT(r.generated_tokens_per_second(), 0);
  const auto& c = model_->config();
  EXPECT_EQ(gen.kv_bytes_per_token(), c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 2)
      << "bf16 latent rows, all layers";
}

TEST_F(GeneratorTest, CacheCarriesAcrossCalls) {
  auto prompt = tok_->encode("Attention lets every token", true);
  mla::Generator gen(*model_, *tok_, f32());
  auto first = gen.generate(prompt, greedy(6));
  ASSERT_EQ(first.tokens.size(), 6u);
  // The next turn: everything so far plus new text. Only the tokens after the cache are fed.
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  auto more = tok_->encode(" look at", false);
  next.insert(next.end(), more.begin(), more.end());
  const int64_t cached = int64_t(gen.tokens().size());
  EXPECT_EQ(cached, int64_t(prompt.size() + 5));
  auto second = gen.generate(next, greedy(6));
  EXPECT_EQ(second.reused_tokens, cached);
  EXPECT_EQ(second.prompt_tokens, int64_t(next.size()) - cached);
  mla::Generator fresh(*model_, *tok_, f32());
  auto ref = fresh.generate(next, greedy(6));
  EXPECT_EQ(ref.reused_tokens, 0);
  EXPECT_EQ(second.tokens, ref.tokens) << "an extended cache continues as a fresh prefill";
  // A prompt that diverges inside the cache truncates to the common prefix.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 3);
  other.push_back(prompt[3] == 65 ? 66 : 65);
  auto third = gen.generate(other, greedy(3));
  EXPECT_EQ(third.reused_tokens, 3);
  mla::Generator fresh2(*model_, *tok_, f32());
  EXPECT_EQ(third.tokens, fresh2.generate(other, greedy(3)).tokens);
}

TEST_F(GeneratorTest, StopsOnEos) {
  auto prompt = tok_->encode("Hello", true);
  mla::Generator gen(*model_, *tok_);
  auto free_run = gen.generate(prompt, greedy(8));
  ASSERT_EQ(free_run.tokens.size(), 8u);
  // Make the third greedy token an EOS id: the output stops there and leaves it out.
  auto p = greedy(8);
  p.eos_token_ids = {free_run.tokens[2]};
  mla::Generator gen2(*model_, *tok_);  // a fresh cache: the same prefill as the free run
  auto r = gen2.generate(prompt, p);
  EXPECT_EQ(r.reason, mla::StopReason::Eos);
  size_t first = size_t(std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[2]) -
                        free_run.tokens.begin());
  ASSERT_EQ(r.tokens.size(), first + 1);
  std::vector<int32_t> before(free_run.tokens.begin(), free_run.tokens.begin() + long(first));
  EXPECT_EQ(r.text, tok_->decode(before, true));
}

TEST_F(GeneratorTest, StopStringAcrossTokens) {
  auto prompt = tok_->encode("for (int i = 0;", true);
  mla::Generator gen(*model_, *tok_);
  auto free_run = gen.generate(prompt, greedy(24));
  // Token pieces of the output; a stop string made of the end of one and the start of the next.
  std::vector<std::string> pieces;
  for (int32_t id : free_run.tokens) pieces.push_back(tok_->decode({id}, true));
  // ASCII at the boundary, so the two characters stand as they are in the streamed text.
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  std::string stop;
  for (size_t i = 1; i + 2 < pieces.size() && stop.empty(); ++i)
    if (!pieces[i].empty() && !pieces[i + 1].empty() && ascii(pieces[i].back()) && ascii(pieces[i + 1][0]))
      stop = std::string(1, pieces[i].back()) + pieces[i + 1][0];
  ASSERT_FALSE(stop.empty()) << "the output has two adjacent tokens with ASCII at their boundary";
  const std::string& full = free_run.text;
  ASSERT_NE(full.find(stop), std::string::npos);
  auto p = greedy(24);
  p.stop = {stop};
  std::string streamed;
  mla::Generator gen2(*model_, *tok_);
  auto r = gen2.generate(prompt, p, [&](std::string_view s) { streamed += s; });
  EXPECT_EQ(r.reason, mla::StopReason::StopString);
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(streamed, r.text) << "the stop text never reaches the callback";
  EXPECT_LT(r.tokens.size(), free_run.tokens.size());
}

TEST_F(GeneratorTest, MaxTokensAndContext) {
  auto prompt = tok_->encode("Numbers: 1 2 3", true);
  mla::Generator gen(*model_, *tok_);
  auto r = gen.generate(prompt, greedy(5));
  EXPECT_EQ(r.reason, mla::StopReason::MaxTokens);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(gen.generate(prompt, greedy(0)).tokens.size(), 0u);
  // The fixture's context is max_position_embeddings = 256 tokens.
  const int64_t ctx = model_->config().max_position_embeddings;
  std::vector<int32_t> long_prompt(size_t(ctx - 3), 65);
  auto c = gen.generate(long_prompt, greedy(-1));
  EXPECT_EQ(c.reason, mla::StopReason::ContextLength);
  EXPECT_EQ(int64_t(long_prompt.size() + c.tokens.size()), ctx + 1) << "positions 0..ctx-1 fed, one more sampled";
  std::vector<int32_t> too_long(size_t(ctx + 1), 65);
  auto t = gen.generate(too_long, greedy(4));
  EXPECT_EQ(t.reason, mla::StopReason::ContextLength);
  EXPECT_TRUE(t.tokens.empty());
}

TEST_F(GeneratorTest, FullKvCacheEndsCleanly) {
  mla::GeneratorOptions o;
  o.page_size = 16;
  o.kv_cache_bytes = double(mla::LatentPool::row_bytes(64, 16, mla::KvDType::BF16)) * 3 * 16 * 1.5;  // one page
  mla::Generator gen(*model_, *tok_, o);
  ASSERT_EQ(gen.capacity_tokens(), 16);
  std::vector<int32_t> prompt(10, 70);
  auto r = gen.generate(prompt, greedy(50));
  EXPECT_EQ(r.reason, mla::StopReason::KvCacheFull);
  EXPECT_EQ(r.tokens.size(), 7u) << "16 cached tokens: 10 prompt + 6 fed outputs, a 7th sampled";
  EXPECT_NE(r.message.find("KV cache"), std::string::npos) << r.message;
  std::vector<int32_t> big(40, 70);
  auto b = gen.generate(big, greedy(5));
  EXPECT_EQ(b.reason, mla::StopReason::KvCacheFull);
  EXPECT_TRUE(b.tokens.empty());
  // The cache is still usable after both.
  EXPECT_EQ(gen.generate(prompt, greedy(3)).reason, mla::StopReason::MaxTokens);
}

TEST_F(GeneratorTest, SeededSamplingReproduces) {
  auto prompt = tok_->encode("The sea is", true);
  mla::GenerateParams p;
  p.sampling.temperature = 1.0f;
  p.sampling.top_p = 0.95f;
  p.sampling.seed = 77;
  p.max_new_tokens = 16;
  mla::Generator a(*model_, *tok_), b(*model_, *tok_);
  EXPECT_EQ(a.generate(prompt, p).tokens, b.generate(prompt, p).tokens);
}

TEST_F(GeneratorTest, RejectsBadPrompts) {
  mla::Generator gen(*model_, *tok_);
  EXPECT_THROW(gen.generate({}, greedy(2)), std::invalid_argument);
  EXPECT_THROW(gen.generate({5000}, greedy(2)), std::invalid_argument);
}

}  // namespace
