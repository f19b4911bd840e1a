// The tokenizer of a GGUF file (Tokenizer::from_gguf) against the hub folder it was converted
// from: the real DeepSeek-V3 vocabulary as llama.cpp's converter writes it (gguf_vocab_fixture.h)
// must encode every case of the fixture to the expected ids, decode them back, carry the same
// special tokens and chat template as the folder; GenerationConfig's GGUF defaults; the choice
// between a --tokenizer folder, the GGUF metadata and the model folder; Kimi's tiktoken vocabulary
// and the other pre-tokenizers on small vocabularies; FormatErrors naming the key for bad
// metadata; and the metadata's parts written out as a hub folder (write_tokenizer_folder) that
// loads as the same tokenizer. The metadata is read without GgufFile (test_gguf_vocab_file.cpp reads it through it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "chat/chat_template.h"
#include "deepseek_fixture.h"
#include "engine/generation_config.h"
#include "format/error.h"
#include "gguf_vocab_fixture.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_parts.h"
#include "tokenizer/unicode_util.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;
using Metadata = std::map<std::string, mla::GgufValue>;
using Kind = mla::GgufValue::Kind;

const std::string kSource = "vocab.gguf";

mla::GgufValue str(const std::string& s) {
  mla::GgufValue v;
  v.kind = Kind::String;
  v.s = s;
  return v;
}
mla::GgufValue integer(int64_t i) {
  mla::GgufValue v;
  v.kind = Kind::Int;
  v.i = i;
  return v;
}
mla::GgufValue boolean(bool b) {
  mla::GgufValue v;
  v.kind = Kind::Bool;
  v.b = b;
  return v;
}
mla::GgufValue floating(double f) {
  mla::GgufValue v;
  v.kind = Kind::Float;
  v.f = f;
  return v;
}
mla::GgufValue strings(std::vector<std::string> s) {
  mla::GgufValue v;
  v.kind = Kind::Array;
  v.elem = Kind::String;
  v.strings = std::move(s);
  return v;
}
mla::GgufValue ints(std::vector<int64_t> i) {
  mla::GgufValue v;
  v.kind = Kind::Array;
  v.elem = Kind::Int;
  v.ints = std::move(i);
  return v;
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("mla_gguf_vocab_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Expects a FormatError whose message names the source and every needle.
template <class F>
void expect_format_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needles.front();
  } catch (const mla::FormatError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(kSource), std::string::npos) << what;
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a FormatError: " << e.what();
  }
}

// ---- The DeepSeek-V3 vocabulary of a llama.cpp GGUF file ----

class GgufVocabDeepSeekV3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    meta_ = new Metadata(mla::test::read_gguf_metadata(mla::test::gunzip_file(mla::test::deepseek_v3_vocab_gguf_gz())));
    tok_ = new mla::Tokenizer(mla::Tokenizer::from_gguf(*meta_, kSource));
    mla::test::deepseek_v3_tokenizer();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete meta_;
  }
  static const Metadata& meta() { return *meta_; }
  static const mla::Tokenizer& tok() { return *tok_; }
  static const mla::Tokenizer& folder() { return mla::test::deepseek_v3_tokenizer(); }

  static inline Metadata* meta_ = nullptr;
  static inline mla::Tokenizer* tok_ = nullptr;
};

TEST_F(GgufVocabDeepSeekV3, MetadataIsWhatTheConverterWrites) {
  EXPECT_EQ(meta().at("tokenizer.ggml.model").s, "gpt2");
  EXPECT_EQ(meta().at("tokenizer.ggml.pre").s, "deepseek-v3");
  const auto& tokens = meta().at("tokenizer.ggml.tokens").strings;
  const auto& types = meta().at("tokenizer.ggml.token_type").ints;
  ASSERT_EQ(tokens.size(), 129280u);  // config.json's vocab_size
  ASSERT_EQ(types.size(), tokens.size());
  EXPECT_EQ(meta().at("tokenizer.ggml.merges").strings.size(), 127741u);
  EXPECT_EQ(types[0], 3);  // <｜begin▁of▁sentence｜>: control
  EXPECT_EQ(types[128803], 3);  // <｜User｜>: not special, but looks special: control
  EXPECT_EQ(types[1000], 1);
  EXPECT_EQ(tokens[128815], "[PAD128815]");
  EXPECT_EQ(types[128815], 5);  // unused
  EXPECT_EQ(meta().at("tokenizer.ggml.bos_token_id").i, 0);
  EXPECT_EQ(meta().at("tokenizer.ggml.eos_token_id").i, 1);
  EXPECT_TRUE(meta().at("tokenizer.ggml.add_bos_token").b);
  EXPECT_FALSE(meta().at("tokenizer.chat_template").s.empty());
}

TEST_F(GgufVocabDeepSeekV3, EncodesEveryFixtureCaseToTheExpectedIds) {
  auto cases = mla::test::deepseek_v3_jsonl("cases.jsonl");
  ASSERT_GE(cases.size(), 100u);
  for (const json& c : cases) {
    const std::string id = c["id"];
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok().encode(text, false), expected) << "case " << id;
    EXPECT_EQ(tok().encode(text, true), c["ids_with_special"].get<std::vector<int32_t>>()) << "case " << id;
    EXPECT_EQ(tok().decode(expected), c["decoded"].get<std::string>()) << "case " << id;
  }
}

TEST_F(GgufVocabDeepSeekV3, VocabularyAndSpecialTokensMatchTheFolder) {
  EXPECT_EQ(tok().bos_id(), 0);
  EXPECT_EQ(tok().eos_id(), 1);
  EXPECT_EQ(tok().bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok().eos_token(), "<｜end▁of▁sentence｜>");
  // The unused "[PAD<id>]" ids are left out, as the folder has no token there.
  ASSERT_EQ(tok().vocab_size(), folder().vocab_size());
  EXPECT_THROW(tok().token_bytes(128815), std::out_of_range);
  EXPECT_EQ(tok().token_id("[PAD128815]"), std::nullopt);
  for (int32_t id = 0; id < static_cast<int32_t>(folder().vocab_size()); ++id) {
    ASSERT_EQ(tok().token_text(id), folder().token_text(id)) << "id " << id;
    ASSERT_EQ(tok().token_bytes(id), folder().token_bytes(id)) << "id " << id;
  }
  EXPECT_EQ(tok().token_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok().encode("<｜User｜>hi<｜Assistant｜>", false), folder().encode("<｜User｜>hi<｜Assistant｜>", false));
  EXPECT_TRUE(tok().is_special(0));
  EXPECT_FALSE(tok().is_special(1000));
  // What a GGUF file cannot say: <｜User｜> is not special in the folder, but control here.
  EXPECT_FALSE(folder().is_special(128803));
  EXPECT_TRUE(tok().is_special(128803));
}

// The parts of the metadata written out as a hub folder: Tokenizer::load of the folder is the
// tokenizer from_gguf gives, id for id and case for case, and the files are in the hub's form.
TEST_F(GgufVocabDeepSeekV3, WrittenFolderLoadsAsTheSameTokenizer) {
  const auto dir = temp_dir("written");
  mla::write_tokenizer_folder(mla::gguf_tokenizer_parts(meta(), kSource), dir.string());
  const auto loaded = mla::Tokenizer::load(dir.string());
  ASSERT_EQ(loaded.vocab_size(), tok().vocab_size());
  EXPECT_EQ(loaded.bos_id(), tok().bos_id());
  EXPECT_EQ(loaded.eos_id(), tok().eos_id());
  EXPECT_EQ(loaded.bos_token(), tok().bos_token());
  EXPECT_EQ(loaded.eos_token(), tok().eos_token());
  EXPECT_EQ(loaded.chat_template(), tok().chat_template());
  for (int32_t id = 0; id < static_cast<int32_t>(tok().vocab_size()); ++id) {
    if (id == 128815) continue;  // unused in both
    ASSERT_EQ(loaded.token_text(id), tok().token_text(id)) << "id " << id;
    ASSERT_EQ(loaded.is_special(id), tok().is_special(id)) << "id " << id;
  }
  EXPECT_THROW(loaded.token_bytes(128815), std::out_of_range);
  for (const json& c : mla::test::deepseek_v3_jsonl("cases.jsonl")) {
    const std::string text = c["text"];
    EXPECT_EQ(loaded.encode(text, false), tok().encode(text, false)) << "case " << c["id"];
    EXPECT_EQ(loaded.encode(text, true), tok().encode(text, true)) << "case " << c["id"];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(loaded.decode(ids, true), tok().decode(ids, true)) << "case " << c["id"];
  }

  // The files: model.vocab an object by id, model.merges [left, right] pairs; the config names
  // bos / eos by text and carries add_bos_token and the template.
  json tj, config;
  std::ifstream(dir / "tokenizer.json") >> tj;
  std::ifstream(dir / "tokenizer_config.json") >> config;
  ASSERT_TRUE(tj["model"]["vocab"].is_object());
  EXPECT_EQ(tj["model"]["vocab"]["<｜User｜>"], 128803);
  EXPECT_EQ(tj["model"]["merges"].size(), meta().at("tokenizer.ggml.merges").strings.size());
  EXPECT_EQ(tj["model"]["merges"][0], (json{"Ġ", "t"}));
  EXPECT_EQ(config["bos_token"], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(config["eos_token"], "<｜end▁of▁sentence｜>");
  EXPECT_EQ(config["add_bos_token"], true);
  EXPECT_EQ(config["chat_template"], meta().at("tokenizer.chat_template").s);
  fs::remove_all(dir);
}

TEST_F(GgufVocabDeepSeekV3, AddBosAndAddEosFollowTheMetadata) {
  const std::vector<int32_t> hi = folder().encode("hi", false);
  ASSERT_EQ(hi.size(), 1u);
  EXPECT_EQ(tok().encode("hi", true), (std::vector<int32_t>{0, hi[0]}));
  Metadata m = meta();
  m["tokenizer.ggml.add_bos_token"] = boolean(false);
  m["tokenizer.ggml.add_eos_token"] = boolean(true);
  auto t = mla::Tokenizer::from_gguf(m, kSource);
  EXPECT_EQ(t.encode("hi", true), (std::vector<int32_t>{hi[0], 1}));
  m.erase("tokenizer.ggml.add_bos_token");
  m.erase("tokenizer.ggml.add_eos_token");
  EXPECT_EQ(mla::Tokenizer::from_gguf(m, kSource).encode("hi", true), hi) << "without the keys nothing is added";
}

TEST_F(GgufVocabDeepSeekV3, ChatTemplateRendersAsTheFolders) {
  ASSERT_EQ(tok().chat_template(), folder().chat_template());
  int count = 0;
  for (const json& row : mla::test::deepseek_v3_jsonl("chat_cases.jsonl")) {
    ordered_json c = ordered_json::parse(row.dump());
    ordered_json extra = {{"bos_token", tok().bos_token()}, {"eos_token", tok().eos_token()}};
    const std::string rendered =
        mla::render_chat_template(tok().chat_template(), c["messages"], c["add_generation_prompt"].get<bool>(), extra);
    EXPECT_EQ(rendered, c["rendered"].get<std::string>()) << c["id"];
    EXPECT_EQ(tok().encode(rendered, false), c["ids"].get<std::vector<int32_t>>()) << c["id"];
    EXPECT_EQ(mla::chat_format_for("deepseek_v3", tok().chat_template()).kind, mla::ChatFormat::Kind::Jinja);
    ++count;
  }
  EXPECT_GE(count, 7);
}

TEST_F(GgufVocabDeepSeekV3, GenerationConfigTakesTheStopIdsAndSamplingDefaults) {
  mla::ModelConfig model;
  auto g = mla::GenerationConfig::from_gguf(meta(), model, kSource);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_FALSE(g.temperature.has_value());
  Metadata m = meta();
  m["tokenizer.ggml.eot_token_id"] = integer(128803);
  m["tokenizer.ggml.eom_token_id"] = integer(128804);
  m["general.sampling.temp"] = floating(0.6);
  m["general.sampling.top_p"] = floating(0.95);
  m["general.sampling.top_k"] = integer(40);
  model.eos_token_ids = {1, 7};
  g = mla::GenerationConfig::from_gguf(m, model, kSource);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 7, 128803, 128804}));
  EXPECT_FLOAT_EQ(*g.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*g.top_p, 0.95f);
  EXPECT_EQ(*g.top_k, 40);
  m["general.sampling.top_k"] = str("forty");
  expect_format_error([&] { mla::GenerationConfig::from_gguf(m, model, kSource); }, {"general.sampling.top_k"});
}

TEST_F(GgufVocabDeepSeekV3, TokenizerFolderStandsInForTheMetadata) {
  // --tokenizer DIR wins over the GGUF's metadata, which here says nothing usable.
  Metadata broken = {{"tokenizer.ggml.model", str("llama")}};
  auto t = mla::Tokenizer::load_for_model("model.gguf", &broken, mla::test::deepseek_v3_dir());
  EXPECT_EQ(t.encode("hi", false), folder().encode("hi", false));
  expect_format_error([&] { mla::Tokenizer::load_for_model(kSource, &broken); }, {"tokenizer.ggml.model", "llama"});
  // Without DIR: the metadata of a GGUF file, else the model's hub folder.
  EXPECT_EQ(mla::Tokenizer::load_for_model(kSource, &meta()).encode("<｜User｜>", false),
            (std::vector<int32_t>{128803}));
  EXPECT_EQ(mla::Tokenizer::load_for_model(mla::test::deepseek_v3_dir(), nullptr).vocab_size(), folder().vocab_size());

  // GenerationConfig: DIR's generation_config.json when it has one, else the metadata.
  auto dir = temp_dir("generation");
  mla::ModelConfig model;
  EXPECT_EQ(mla::GenerationConfig::load_for_model(kSource, &meta(), dir.string(), model).eos_token_ids,
            (std::vector<int64_t>{1}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 5, "temperature": 0.3})";
  auto g = mla::GenerationConfig::load_for_model(kSource, &meta(), dir.string(), model);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{5}));
  EXPECT_FLOAT_EQ(*g.temperature, 0.3f);
  EXPECT_EQ(mla::GenerationConfig::load_for_model(dir.string(), nullptr, "", model).eos_token_ids,
            (std::vector<int64_t>{5}));
  fs::remove_all(dir);
}

// ---- Small vocabularies: the metadata a converter writes for a tokenizer.json ----

// The tokenizer.* keys llama.cpp's converter writes for a byte-level BPE tokenizer.json (tokens by
// id, added tokens as control, merges, bos / eos by name).
Metadata gguf_of_tokenizer_json(const json& tj, const json& config, const std::string& pre) {
  std::map<int64_t, std::pair<std::string, int64_t>> by_id;  // id -> (text, type)
  for (const auto& [text, id] : tj["model"]["vocab"].items()) by_id[id.get<int64_t>()] = {text, 1};
  for (const json& t : tj["added_tokens"]) by_id[t["id"].get<int64_t>()] = {t["content"], 3};
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  Metadata m;
  for (int64_t id = 0; id <= by_id.rbegin()->first; ++id) {
    auto it = by_id.find(id);
    tokens.push_back(it == by_id.end() ? "[PAD" + std::to_string(id) + "]" : it->second.first);
    types.push_back(it == by_id.end() ? 5 : it->second.second);
    if (it != by_id.end() && it->second.first == config["bos_token"]) m["tokenizer.ggml.bos_token_id"] = integer(id);
    if (it != by_id.end() && it->second.first == config["eos_token"]) m["tokenizer.ggml.eos_token_id"] = integer(id);
  }
  m["general.architecture"] = str("deepseek2");
  m["tokenizer.ggml.model"] = str("gpt2");
  m["tokenizer.ggml.pre"] = str(pre);
  m["tokenizer.ggml.tokens"] = strings(tokens);
  m["tokenizer.ggml.token_type"] = ints(types);
  m["tokenizer.ggml.merges"] = strings(tj["model"]["merges"].get<std::vector<std::string>>());
  if (config.contains("add_bos_token")) m["tokenizer.ggml.add_bos_token"] = boolean(config["add_bos_token"]);
  if (config.contains("chat_template")) m["tokenizer.chat_template"] = str(config["chat_template"]);
  return m;
}

class GgufVocabSmall : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("small"));
    mla::Tokenizer::write_byte_level_tokenizer(dir_->string(), 600);
    json tj, config;
    std::ifstream(*dir_ / "tokenizer.json") >> tj;
    std::ifstream(*dir_ / "tokenizer_config.json") >> config;
    meta_ = new Metadata(gguf_of_tokenizer_json(tj, config, "deepseek-v3"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete meta_;
  }
  static inline fs::path* dir_ = nullptr;
  static inline Metadata* meta_ = nullptr;
};

const char* kMixedText =
    "Hello, world! The 2024 theorem: x = 12345 * 6.\n\n  def f(a):\n\treturn a  \r\n"
    "你好，世界。日本語のテキスト。한국어 텍스트. Ünïcödé ﬁ Ωμέγα ῥῆμα Привет!  ";

TEST_F(GgufVocabSmall, SameTokenizerAsTheFolder) {
  // write_byte_level_tokenizer's pre-tokenizer is DeepSeek-V3's: "deepseek-v3" gives the same ids.
  auto folder = mla::Tokenizer::load(dir_->string());
  auto tok = mla::Tokenizer::from_gguf(*meta_, kSource);
  EXPECT_EQ(tok.encode(kMixedText, true), folder.encode(kMixedText, true));
  EXPECT_EQ(tok.chat_template(), folder.chat_template());
  EXPECT_EQ(tok.bos_id(), folder.bos_id());
  EXPECT_EQ(tok.eos_id(), folder.eos_id());
}

TEST_F(GgufVocabSmall, WrittenFolderKeepsAddFlagsAndRefusesAnAmbiguousName) {
  // add_bos_token / add_eos_token as the metadata says them, and no template where it has none.
  Metadata m = *meta_;
  m["tokenizer.ggml.add_bos_token"] = boolean(false);
  m["tokenizer.ggml.add_eos_token"] = boolean(true);
  m.erase("tokenizer.chat_template");
  const auto dir = temp_dir("written_small");
  mla::write_tokenizer_folder(mla::gguf_tokenizer_parts(m, kSource), dir.string());
  const auto tok = mla::Tokenizer::from_gguf(m, kSource);
  const auto loaded = mla::Tokenizer::load(dir.string());
  EXPECT_EQ(loaded.encode(kMixedText, true), tok.encode(kMixedText, true));
  EXPECT_EQ(loaded.encode("hi", true).back(), tok.eos_id());
  EXPECT_EQ(loaded.chat_template(), "");

  // A bos id whose text a later token repeats: the folder's name would give the later id.
  auto& tokens = m["tokenizer.ggml.tokens"].strings;
  auto& types = m["tokenizer.ggml.token_type"].ints;
  const int64_t bos = m["tokenizer.ggml.bos_token_id"].i;
  tokens.push_back(tokens[static_cast<size_t>(bos)]);
  types.push_back(3);
  try {
    mla::write_tokenizer_folder(mla::gguf_tokenizer_parts(m, kSource), dir.string());
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    for (const std::string& want : {std::string("tokenizer_config.json"), std::string("bos_token"),
                                    "also token " + std::to_string(tokens.size() - 1)})
      EXPECT_NE(what.find(want), std::string::npos) << what;
  }
  fs::remove_all(dir);
}

TEST_F(GgufVocabSmall, EverySupportedPreTokenizerRoundTrips) {
  // Each family's regexes compile and cover the text: decoding the ids gives it back.
  for (const char* pre : {"deepseek-v3", "deepseek-llm", "glm4", "chatglm-bpe"}) {
    Metadata m = *meta_;
    m["tokenizer.ggml.pre"] = str(pre);
    auto tok = mla::Tokenizer::from_gguf(m, kSource);
    EXPECT_EQ(tok.decode(tok.encode(kMixedText, false)), kMixedText) << pre;
  }
  // Where the families differ: DeepSeek-V3 and GLM cut numbers in threes, DeepSeek-LLM keeps a
  // number whole. With tokens "12", "123", "1234" and their merges first, "1234" is two ids
  // ("123", "4") or one.
  auto count_ids = [&](const char* pre, const std::string& text) {
    Metadata m = *meta_;
    m["tokenizer.ggml.pre"] = str(pre);
    auto& tokens = m["tokenizer.ggml.tokens"].strings;
    auto& types = m["tokenizer.ggml.token_type"].ints;
    auto& merges = m["tokenizer.ggml.merges"].strings;
    for (const char* t : {"12", "123", "1234"}) {
      tokens.push_back(t);
      types.push_back(1);
    }
    merges.insert(merges.begin(), {"1 2", "12 3", "123 4"});
    return mla::Tokenizer::from_gguf(m, kSource).encode(text, false).size();
  };
  EXPECT_EQ(count_ids("deepseek-v3", "1234"), 2u);
  EXPECT_EQ(count_ids("glm4", "1234"), 2u);
  EXPECT_EQ(count_ids("deepseek-llm", "1234"), 1u);
}

TEST_F(GgufVocabSmall, BadMetadataNamesTheKey) {
  auto load = [](const Metadata& m) { return [m] { mla::Tokenizer::from_gguf(m, kSource); }; };
  Metadata m = *meta_;
  m.erase("tokenizer.ggml.tokens");
  expect_format_error(load(m), {"tokenizer.ggml.tokens", "missing"});
  m = *meta_;
  m["tokenizer.ggml.tokens"] = ints({1, 2});
  expect_format_error(load(m), {"tokenizer.ggml.tokens", "not an array of strings"});
  m = *meta_;
  m.erase("tokenizer.ggml.model");
  expect_format_error(load(m), {"tokenizer.ggml.model", "missing"});
  m["tokenizer.ggml.model"] = str("llama");
  expect_format_error(load(m), {"tokenizer.ggml.model", "'llama'", "SentencePiece", "--tokenizer"});
  m = *meta_;
  m["tokenizer.ggml.pre"] = str("qwen2");
  expect_format_error(load(m), {"tokenizer.ggml.pre", "qwen2", "deepseek-v3"});
  m.erase("tokenizer.ggml.pre");
  expect_format_error(load(m), {"tokenizer.ggml.pre", "missing"});

  m = *meta_;
  auto merges = m["tokenizer.ggml.merges"].strings;
  merges[3] = "Ġthe zzzunknown";
  m["tokenizer.ggml.merges"] = strings(merges);
  expect_format_error(load(m), {"tokenizer.ggml.merges[3]", "zzzunknown", "missing from the vocabulary"});
  merges[3] = "nospace";
  m["tokenizer.ggml.merges"] = strings(merges);
  expect_format_error(load(m), {"tokenizer.ggml.merges", "merge 3", "nospace"});
  m.erase("tokenizer.ggml.merges");
  expect_format_error(load(m), {"tokenizer.ggml.merges", "missing"});

  const int64_t n = static_cast<int64_t>(meta_->at("tokenizer.ggml.tokens").strings.size());
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"}) {
    m = *meta_;
    m[key] = integer(n);
    expect_format_error(load(m), {key, "out of range"});
    m[key] = integer(-1);
    expect_format_error(load(m), {key, "out of range"});
    m[key] = str("1");
    expect_format_error(load(m), {key, "not an integer"});
  }
  m = *meta_;
  auto types = m["tokenizer.ggml.token_type"].ints;
  types.pop_back();
  m["tokenizer.ggml.token_type"] = ints(types);
  expect_format_error(load(m), {"tokenizer.ggml.token_type", "entries"});
  types = meta_->at("tokenizer.ggml.token_type").ints;
  types[7] = 9;
  m["tokenizer.ggml.token_type"] = ints(types);
  expect_format_error(load(m), {"tokenizer.ggml.token_type", "token 7"});
  types[7] = 5;  // a byte token unused: the vocabulary lacks it
  m["tokenizer.ggml.token_type"] = ints(types);
  expect_format_error(load(m), {"tokenizer.ggml.tokens", "byte-level token for byte"});
  m = *meta_;
  m.erase("tokenizer.ggml.bos_token_id");
  expect_format_error(load(m), {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"});
  m["tokenizer.ggml.add_bos_token"] = integer(1);
  expect_format_error(load(m), {"tokenizer.ggml.add_bos_token", "not a bool"});
  m = *meta_;
  m["tokenizer.chat_template"] = integer(3);
  expect_format_error(load(m), {"tokenizer.chat_template"});
}

// ---- Kimi K2: a tiktoken vocabulary as the converter writes it ----

TEST(GgufVocabKimi, SameTokenizerAsTheTiktokenFolder) {
  // A small tiktoken.model: the 256 bytes, then merged tokens; specials after the ranks.
  const std::vector<std::string> merged = {"th", "the", " the", "in", "ing", "\xE4\xBD", "\xE4\xBD\xA0", "12", "123",
                                           "\n\n", "'s", " a", "an", " an"};
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.insert(bytes.end(), merged.begin(), merged.end());
  auto base64 = [](const std::string& s) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < s.size(); i += 3) {
      uint32_t v = uint8_t(s[i]) << 16 | (i + 1 < s.size() ? uint8_t(s[i + 1]) << 8 : 0) |
                   (i + 2 < s.size() ? uint8_t(s[i + 2]) : 0);
      for (size_t k = 0; k < 4; ++k) out.push_back(k <= s.size() - i ? a[(v >> (18 - 6 * k)) & 63] : '=');
    }
    return out;
  };
  auto dir = temp_dir("kimi");
  {
    std::ofstream model(dir / "tiktoken.model", std::ios::binary);
    for (size_t r = 0; r < bytes.size(); ++r) model << base64(bytes[r]) << ' ' << r << '\n';
  }
  const int32_t base = static_cast<int32_t>(bytes.size());
  json config = {{"bos_token", "[BOS]"},
                 {"eos_token", "[EOS]"},
                 {"added_tokens_decoder",
                  {{std::to_string(base), {{"content", "[BOS]"}, {"special", true}}},
                   {std::to_string(base + 1), {{"content", "[EOS]"}, {"special", true}}},
                   {std::to_string(base + 2), {{"content", "<|im_end|>"}, {"special", true}}}}}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  auto folder = mla::Tokenizer::load(dir.string());

  // The converter: token_bytes_to_string for the ranks, the special tokens as control, "[PAD<id>]"
  // up to vocab_size; its merges (from tiktoken's bpe) are implied by the ranks and not needed.
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  const auto& alphabet = mla::utf8::byte_to_char();
  for (const std::string& b : bytes) {
    std::string shown;
    for (unsigned char c : b) mla::utf8::append(shown, alphabet[c]);
    tokens.push_back(shown);
    types.push_back(1);
  }
  for (const char* special : {"[BOS]", "[EOS]", "<|im_end|>"}) {
    tokens.push_back(special);
    types.push_back(3);
  }
  for (int32_t id = base + 3; id < base + 300; ++id) {
    tokens.push_back("[PAD" + std::to_string(id) + "]");
    types.push_back(5);
  }
  Metadata m = {{"tokenizer.ggml.model", str("gpt2")},
                {"tokenizer.ggml.pre", str("kimi-k2")},
                {"tokenizer.ggml.tokens", strings(tokens)},
                {"tokenizer.ggml.token_type", ints(types)},
                {"tokenizer.ggml.bos_token_id", integer(base)},
                {"tokenizer.ggml.eos_token_id", integer(base + 1)},
                {"tokenizer.ggml.eot_token_id", integer(base + 2)}};
  auto tok = mla::Tokenizer::from_gguf(m, kSource);
  EXPECT_EQ(tok.vocab_size(), folder.vocab_size());
  EXPECT_EQ(tok.bos_id(), base);
  EXPECT_EQ(tok.eos_token(), "[EOS]");
  EXPECT_EQ(tok.token_text(base + 100), "<|reserved_token_" + std::to_string(base + 100) + "|>");
  for (const char* text : {"the thing in 12345 it's an ant\n\n\n你好 [BOS]x<|im_end|>", kMixedText})
    EXPECT_EQ(tok.encode(text, false), folder.encode(text, false)) << text;
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::string text;
    const char* pieces[] = {"the", " the", "in", "ing", "a", " an", "12", "3", "\n", " ", "你", "好", "'s", "<|im_end|>"};
    for (int k = 0; k < 12; ++k) text += pieces[rng() % std::size(pieces)];
    ASSERT_EQ(tok.encode(text, false), folder.encode(text, false)) << text;
  }
  EXPECT_EQ(mla::GenerationConfig::from_gguf(m, mla::ModelConfig{}, kSource).eos_token_ids,
            (std::vector<int64_t>{base + 1, base + 2}));

  // The parts written out: tiktoken.model and tokenizer_config.json, loading as the same tokenizer.
  const auto written = temp_dir("kimi_written");
  mla::write_tokenizer_folder(mla::gguf_tokenizer_parts(m, kSource), written.string());
  EXPECT_TRUE(fs::exists(written / "tiktoken.model"));
  EXPECT_FALSE(fs::exists(written / "tokenizer.json"));
  const auto loaded = mla::Tokenizer::load(written.string());
  EXPECT_EQ(loaded.vocab_size(), tok.vocab_size());
  EXPECT_EQ(loaded.bos_id(), base);
  EXPECT_EQ(loaded.eos_id(), base + 1);
  EXPECT_TRUE(loaded.is_special(base + 2));
  for (const char* text : {"the thing in 12345 it's an ant\n\n\n你好 [BOS]x<|im_end|>", kMixedText})
    EXPECT_EQ(loaded.encode(text, true), tok.encode(text, true)) << text;
  fs::remove_all(written);

  tokens[260] = "caf你";  // "你" is not a character of the byte-level alphabet
  m["tokenizer.ggml.tokens"] = strings(tokens);
  expect_format_error([&] { mla::Tokenizer::from_gguf(m, kSource); }, {"tokenizer.ggml.tokens", "token 260"});
  fs::remove_all(dir);
}

}  // namespace
