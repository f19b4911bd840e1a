// The limits `mla bench` sets decode against: the read of a token's own weights covers exactly
// the bytes the benchmark counts as a token's active weights.
#include <gtest/gtest.h>

#include <string>

#include "tools/bench.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/weights.h"
#include "test_util.h"

namespace mla {
namespace {

TEST(Bench, TokenReadCoversTheActiveWeights) {
  // A dense layer then MoE layers (with shared experts) in bf16, and the same with block-FP8
  // projections, whose scales are read too.
  for (const std::string name : {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny"}) {
    const std::string dir = test::fixture(name);
    Checkpoint ckpt(dir);
    const ModelConfig c = ModelConfig::load(dir);
    const ModelWeights w = load_weights(ckpt, c);
    const bench::ActiveWeights a = bench::active_weights(w, c);
    bench::TokenRead read(w, c);
    EXPECT_GT(read.measure(2), 0.0) << name;
    EXPECT_EQ(read.bytes_per_pass(), a.bytes) << name;
    EXPECT_GT(a.bytes_by_part.at("routed experts"), 0.0) << name;
  }
}

// The benchmark's checkpoint config is the one every recorded figure and the peers' GGUFs were
// made of: V2-Lite's layer shapes, DeepSeek-V3's vocabulary, no YaRN. Its config.json, byte for
// byte (the digest of config.dump(2) as the checkpoint writer writes it, for 1, 4 and 27 layers).
TEST(Bench, CheckpointConfigIsTheRecordedOne) {
  std::string dumps;
  for (int64_t layers : {1, 4, 27}) dumps += bench_checkpoint_config(layers).dump(2) + "\n---\n";
  EXPECT_EQ(dumps.size(), 2779u);
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char ch : dumps) h = (h ^ ch) * 1099511628211ull;
  EXPECT_EQ(h, 12728265153903214408ull) << dumps;
  const ModelConfig c = preset_config(kBenchPreset);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_FALSE(c.rope_scaling.yarn);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_FALSE(find_preset(kBenchPreset).released);
  EXPECT_EQ(bench_checkpoint_config(5)["num_hidden_layers"], 5);
}

}  // namespace
}  // namespace mla
