// Resident weight bytes by storage format: the INT4 experts of the Kimi K2.5 fixture stay packed
// (4 bits and a bf16 scale per 32 weights), counted as exactly the bytes of their tensors.
#include <gtest/gtest.h>

#include <string>

#include "format/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "test_util.h"

namespace mla {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

TEST(WeightBytes, Int4ExpertsStayPacked) {
  const std::string dir = test::fixture("kimi-k2.5-int4-tiny");
  Checkpoint ckpt(dir);
  const ModelWeights w = load_weights(ckpt, ModelConfig::load(dir));
  size_t packed = 0;
  for (const auto& name : ckpt.names())
    if (ends_with(name, ".weight_packed") || ends_with(name, ".weight_scale")) packed += ckpt.get(name).nbytes;
  ASSERT_GT(packed, 0u);
  ASSERT_TRUE(w.bytes_by_format.count("int4-group"));
  EXPECT_EQ(w.bytes_by_format.at("int4-group"), packed);
  const std::string summary = weight_bytes_summary(w);
  EXPECT_NE(summary.find("int4-group"), std::string::npos) << summary;
  EXPECT_NE(summary.find("bf16"), std::string::npos) << summary;  // attention, shared experts, lm_head
}

}  // namespace
}  // namespace mla
