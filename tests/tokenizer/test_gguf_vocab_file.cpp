// The GGUF vocabulary fixture (tests/fixtures/gguf/deepseek-v3-vocab.gguf.gz) opened through
// GgufFile, the way `mla -m model.gguf` opens a model: its metadata must be what the test reader of
// gguf_vocab_fixture.h reads, and the tokenizer made of it must encode the fixture's cases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "deepseek_fixture.h"
#include "format/gguf.h"
#include "gguf_vocab_fixture.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

// The fixture uncompressed into a temporary file, removed at the end of the suite.
class GgufVocabFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bytes_ = new std::string(mla::test::gunzip_file(mla::test::deepseek_v3_vocab_gguf_gz()));
    path_ = new fs::path(fs::temp_directory_path() / ("mla_gguf_vocab_" + std::to_string(::getpid()) + ".gguf"));
    std::ofstream(*path_, std::ios::binary).write(bytes_->data(), static_cast<std::streamsize>(bytes_->size()));
  }
  static void TearDownTestSuite() {
    fs::remove(*path_);
    delete path_;
    delete bytes_;
  }
  static inline std::string* bytes_ = nullptr;
  static inline fs::path* path_ = nullptr;
};

TEST_F(GgufVocabFile, MetadataMatchesTheTestReader) {
  mla::GgufFile file(path_->string());
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_EQ(mla::gguf_path(path_->string()), path_->string());
  const auto expected = mla::test::read_gguf_metadata(*bytes_);
  for (const auto& [key, want] : expected) {
    const mla::GgufValue* got = file.find(key);
    ASSERT_NE(got, nullptr) << key;
    EXPECT_EQ(got->kind, want.kind) << key;
    EXPECT_EQ(got->i, want.i) << key;
    EXPECT_EQ(got->b, want.b) << key;
    EXPECT_EQ(got->s, want.s) << key;
    EXPECT_EQ(got->ints, want.ints) << key;
    EXPECT_EQ(got->strings, want.strings) << key;
    if (want.kind == mla::GgufValue::Kind::Array) {
      EXPECT_EQ(got->elem, want.elem) << key;
    }
  }
  EXPECT_EQ(file.get_string("tokenizer.ggml.pre"), "deepseek-v3");
}

TEST_F(GgufVocabFile, TokenizerEncodesTheFixtureCases) {
  mla::GgufFile file(path_->string());
  auto tok = mla::Tokenizer::load_for_model(file.path(), &file.metadata());
  const auto& folder = mla::test::deepseek_v3_tokenizer();
  EXPECT_EQ(tok.vocab_size(), folder.vocab_size());
  EXPECT_EQ(tok.chat_template(), folder.chat_template());
  const auto cases = mla::test::deepseek_v3_jsonl("cases.jsonl");
  ASSERT_GE(cases.size(), 100u);
  for (const auto& c : cases)
    EXPECT_EQ(tok.encode(c["text"].get<std::string>(), true), c["ids_with_special"].get<std::vector<int32_t>>())
        << c["id"];
}

}  // namespace
