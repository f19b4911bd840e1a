// The trained checkpoint that ships with mla (models/mla-tiny-en, written by
// tools/train/train_mla.py) loads through the normal loader and reproduces the numpy reference's
// logits (tests/fixtures/mla-tiny-en/golden.safetensors, from tools/train/make_golden.py) in
// prefill and decode on both attention paths; its tokenizer encodes the demo's prompt to the
// golden prompt ids. Its DeepSeek-V3.2 variant (models/mla-tiny-en-v32: the same weights plus
// the lightning indexer tools/train/train_indexer.py trained) reproduces the DSA reference's
// logits (reference/dsa_reference.py through make_golden.py) on sequences several times its
// index_topk.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

// The model fixtures' tolerance (float32 compute against the float64 reference on the same bf16
// weights). Measured on this checkpoint: 1.3e-5 on logits of magnitude up to 14.
constexpr float kLogitTol = 1e-3f;

std::string model_dir() { return (test::source_dir() / "models" / "mla-tiny-en").string(); }
std::string golden_path() { return (test::source_dir() / "tests" / "fixtures" / "mla-tiny-en" / "golden.safetensors").string(); }
std::string v32_dir() { return (test::source_dir() / "models" / "mla-tiny-en-v32").string(); }
std::string v32_golden_path() {
  return (test::source_dir() / "tests" / "fixtures" / "mla-tiny-en-v32" / "golden.safetensors").string();
}

// Prefill and decode, each through both attention paths, give the golden logits of sequence j.
void expect_logits_every_path(Model& model, const std::vector<int32_t>& ids, const std::vector<float>& want, int j) {
  for (const char* mode : {"prefill", "decode"})
    for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
      RunOptions opt;
      opt.mode = RunMode::parse(mode);
      opt.path = path;
      auto got = run_logits(model, ids, opt);
      EXPECT_LE(test::max_abs_diff(got, want), kLogitTol) << "seq" << j << " " << mode << " " << attn_path_name(path);
    }
}

TEST(TrainedModel, GoldenLogitsPrefillAndDecodeBothPaths) {
  auto model = Model::load(model_dir());
  SafetensorsFile golden(golden_path());
  for (int j = 0; j < 2; ++j) {
    auto ids = test::read_ids(*golden.find("seq" + std::to_string(j) + "_ids"));
    auto want = test::read_f32(*golden.find("seq" + std::to_string(j) + "_logits"));
    ASSERT_EQ(want.size(), ids.size() * size_t(model->config().vocab_size));
    expect_logits_every_path(*model, ids, want, j);
  }
}

// The golden sequence (the start of the held-out validation text, 88 tokens plus 8 greedy ones) is
// six times index_topk long, so most rows attend a selection; the reference breaks exact ties
// (keys that every indexer head's ReLU scores 0) by the lower position first, as the engine does.
TEST(TrainedModel, V32GoldenLogitsSparseAttentionBothPaths) {
  auto model = Model::load(v32_dir());
  ASSERT_TRUE(model->config().dsa());
  SafetensorsFile golden(v32_golden_path());
  ASSERT_NE(golden.find("seq0_ids"), nullptr);
  for (int j = 0; golden.find("seq" + std::to_string(j) + "_ids"); ++j) {
    auto ids = test::read_ids(*golden.find("seq" + std::to_string(j) + "_ids"));
    auto want = test::read_f32(*golden.find("seq" + std::to_string(j) + "_logits"));
    ASSERT_EQ(want.size(), ids.size() * size_t(model->config().vocab_size));
    ASSERT_GT(int64_t(ids.size()), 3 * model->config().index_topk);
    expect_logits_every_path(*model, ids, want, j);
  }
}

TEST(TrainedModel, TokenizerEncodesTheDemoPrompt) {
  auto tok = Tokenizer::load(model_dir());
  SafetensorsFile golden(golden_path());
  auto ids = test::read_ids(*golden.find("seq0_ids"));
  int64_t T;
  std::memcpy(&T, golden.find("seq0_prompt")->data, 8);
  ids.resize(size_t(T));
  // seq0's prompt is `mla demo`'s default prompt, "\"The computer", with the BOS token.
  EXPECT_EQ(tok.encode("\"The computer", true), ids);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), "\"The computer");
}

}  // namespace
}  // namespace mla
