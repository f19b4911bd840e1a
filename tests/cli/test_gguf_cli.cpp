// The commands on a GGUF file through the built program (MLA_BINARY): `mla run` takes the
// tokenizer and chat template from the file's metadata (or from --tokenizer DIR), `mla tokenize`
// and `mla detokenize` round-trip through the file's vocabulary, `mla logits` reads the file as
// the folder it was converted from, `mla analyze -m` its config, and `mla quantize` makes a folder
// that runs with the file's tokenizer. The file is llama.cpp's BF16
// conversion of the golden fixture deepseek-v3-tiny (tests/fixtures/gguf/make_models.sh), whose
// vocabulary is the first 512 ids of DeepSeek-V3's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "format/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace mla {
namespace {

const std::string kGguf = (test::source_dir() / "tests/fixtures/gguf/deepseek-v3-tiny-bf16.gguf").string();

std::string mla_cmd(const std::string& args) { return std::string("'") + MLA_BINARY + "' " + args; }

TEST(GgufCli, TokenizeAndDetokenizeRoundTripThroughTheFilesVocabulary) {
  const auto ids = test::run_command("printf 'the latent' | " + mla_cmd("tokenize -m " + kGguf));
  ASSERT_EQ(ids.status, 0) << ids.output;
  EXPECT_FALSE(ids.output.empty());
  const auto text = test::run_command("echo '" + ids.output + "' | " + mla_cmd("detokenize -m " + kGguf));
  ASSERT_EQ(text.status, 0) << text.output;
  EXPECT_EQ(text.output, "the latent");
}

// Greedy output is deterministic, and --tokenizer DIR swaps the vocabulary the text goes through:
// a byte-level tokenizer of the same 512 ids gives other ids for the prompt, so other text.
TEST(GgufCli, RunUsesTheFilesTokenizerOrTheOneGiven) {
  const std::string args = "run -m " + kGguf + " -p 'the latent' -n 8 --temperature 0 --ignore-eos --threads 1";
  const auto a = test::run_command(mla_cmd(args) + " 2>/dev/null");
  const auto b = test::run_command(mla_cmd(args) + " 2>/dev/null");
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_GT(a.output.size(), std::string("the latent").size());
  test::TempDir tok("gguf-tok");
  Tokenizer::write_byte_level_tokenizer(tok.str(), 512);
  const auto c = test::run_command(mla_cmd(args + " --tokenizer " + tok.str()) + " 2>/dev/null");
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output, a.output);
  const auto bad = test::run_command(mla_cmd(args + " --tokenizer /nonexistent-dir"), true);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--tokenizer"), std::string::npos) << bad.output;
}

// `mla quantize` of the file writes its tokenizer beside the weights: `mla run` on the folder needs
// nothing else, and says what `mla run` on the file says.
TEST(GgufCli, QuantizedFolderRunsWithTheFilesTokenizer) {
  test::TempDir d("gguf-quantize-run");
  const std::string out = d / "folder";
  const auto q =
      test::run_command(mla_cmd("quantize -q -m " + kGguf + " -o " + out + " --experts bf16 --others bf16 --threads 1"), true);
  ASSERT_EQ(q.status, 0) << q.output;
  EXPECT_EQ(q.output.find("note:"), std::string::npos) << q.output;
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(out) / "tokenizer.json"));
  const std::string args = " -p 'the latent' -n 8 --temperature 0 --ignore-eos --threads 1 2>/dev/null";
  const auto folder = test::run_command(mla_cmd("run -m " + out + args));
  ASSERT_EQ(folder.status, 0) << folder.output;
  const auto file = test::run_command(mla_cmd("run -m " + kGguf + args));
  ASSERT_EQ(file.status, 0) << file.output;
  EXPECT_EQ(folder.output, file.output);
  const std::string text = "printf 'the latent <｜User｜>' | ";
  const auto ids = test::run_command(text + mla_cmd("tokenize -m " + out));
  ASSERT_EQ(ids.status, 0) << ids.output;
  EXPECT_EQ(ids.output, test::run_command(text + mla_cmd("tokenize -m " + kGguf)).output);
}

// The file's logits through the program equal the golden fixture's HuggingFace logits.
TEST(GgufCli, LogitsOfTheFileAreTheFixturesGolden) {
  SafetensorsFile golden(test::fixture("deepseek-v3-tiny") + "/golden.safetensors");
  const auto ids = test::read_ids(*golden.find("seq1_ids"));
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  test::TempDir d("gguf-logits");
  const auto r = test::run_command(mla_cmd("logits -m " + kGguf + " --ids " + list + " --threads 1 --out " + (d / "l.safetensors")), true);
  ASSERT_EQ(r.status, 0) << r.output;
  SafetensorsFile out(d / "l.safetensors");
  EXPECT_LE(test::max_abs_diff(test::read_f32(*out.find("logits")), test::read_f32(*golden.find("seq1_logits"))), 1e-3f);
}

TEST(GgufCli, AnalyzeReadsTheFilesConfig) {
  const auto r = test::run_command(mla_cmd("analyze -m " + kGguf));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("3 layers, 8 heads, hidden 128; kv_lora_rank 64, q_lora_rank 64"), std::string::npos) << r.output;
}

TEST(GgufCli, BadFileIsOneClearError) {
  test::TempDir d("gguf-bad");
  std::ofstream(d / "broken.gguf") << "GGUF but not really";
  const auto r = test::run_command(mla_cmd("logits -m " + (d / "broken.gguf") + " --ids 1,2 --out " + (d / "x")), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("broken.gguf"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Segmentation"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mla
