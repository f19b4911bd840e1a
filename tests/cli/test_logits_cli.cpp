// `mla logits` end to end: the file it writes, and its errors.
#include <gtest/gtest.h>

#include "test_util.h"

namespace mla {
namespace {

using test::CommandResult;

CommandResult sh(const std::string& cmd) { return test::run_command(cmd, true); }

TEST(CliLogits, WritesTheGoldenLogitsInEveryMode) {
  const std::string dir = test::fixture("deepseek-v2-lite-tiny");
  SafetensorsFile golden(dir + "/golden.safetensors");
  auto ids = test::read_ids(*golden.find("seq1_ids"));
  auto want = test::read_f32(*golden.find("seq1_logits"));
  std::string list;
  for (auto id : ids) {
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  test::TempDir tmp("cli");
  for (std::string extra : {"", "--mode decode", "--mode extend:4 --attn absorb", "--mode extend:4 --attn chunked --prefix-chunk 3",
                            "--attn expand --threads 1 --kv-dtype f32"}) {
    auto r = sh(std::string(MLA_BINARY) + " logits -m " + dir + " --ids " + list + " --out " + (tmp / "l.safetensors") + " " + extra);
    ASSERT_EQ(r.status, 0) << r.output;
    SafetensorsFile out(tmp / "l.safetensors");
    const TensorInfo* t = out.find("logits");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, DType::F32);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{int64_t(ids.size()), 512}));
    EXPECT_LE(test::max_abs_diff(test::read_f32(*t), want), 1e-3f) << extra;
  }
}

TEST(CliLogits, ErrorsExitNonZeroWithAMessage) {
  const std::string m = test::fixture("deepseek-v3-tiny"), bin = MLA_BINARY;
  test::TempDir tmp("cli");
  const std::string out = " --out " + (tmp / "x.safetensors");
  for (auto [args, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"logits -m " + m + " --ids 1,2,x" + out, "not an integer"},
           {"logits -m " + m + " --ids 1,99999" + out, "outside the vocabulary"},
           {"logits -m " + m + " --ids 1,2 --mode sideways" + out, "unknown mode"},
           {"logits -m " + m + " --ids 1,2 --mode extend:5" + out, "longer than"},
           {"logits -m " + m + " --ids 1,2 --attn fast" + out, "unknown attention path"},
           {"logits -m " + m + " --ids 1,2 --kv-dtype int3" + out, "unknown KV cache dtype"},
           {"logits -m /nonexistent --ids 1" + out, "/nonexistent"},
           {"logits -m " + m + out, "--ids"},
           {"frobnicate", "unknown command"},
       }) {
    auto r = sh(bin + " " + args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace mla
