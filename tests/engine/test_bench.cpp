// The limits `mla bench` sets decode against: the read of a token's own weights covers exactly
// the bytes the benchmark counts as a token's active weights.
#include <gtest/gtest.h>

#include <string>

#include "engine/bench.h"
#include "format/safetensors.h"
#include "model/config.h"
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

}  // namespace
}  // namespace mla
