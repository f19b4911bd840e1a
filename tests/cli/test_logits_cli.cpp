// `mla logits` end to end: the file it writes, and its errors.
#include <gtest/gtest.h>

#include <fstream>

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

// --ids-file: the ids of a sequence too long for one argument (Linux caps one at 128 KiB). A file
// of ids split by newlines, commas and spaces, or the same on standard input, gives the logits
// --ids gives.
TEST(CliLogits, IdsFileGivesTheLogitsOfIds) {
  const std::string dir = test::fixture("deepseek-v2-lite-tiny"), bin = MLA_BINARY;
  SafetensorsFile golden(dir + "/golden.safetensors");
  auto ids = test::read_ids(*golden.find("seq1_ids"));
  ASSERT_GE(ids.size(), 3u);
  std::string list, text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) list += ',';
    list += std::to_string(ids[i]);
    // Every separator the file may hold: a newline, a comma, a comma then a newline, spaces and a tab.
    const char* sep[] = {"\n", ",", ",\n", "  \t"};
    text += std::to_string(ids[i]) + sep[i % 4];
  }
  test::TempDir tmp("cli");
  std::ofstream(tmp / "ids.txt") << text;
  auto logits_of = [&](const std::string& how, const std::string& name) {
    auto r = sh(bin + " logits -m " + dir + " --out " + (tmp / name) + " " + how);
    EXPECT_EQ(r.status, 0) << how << "\n" << r.output;
    SafetensorsFile out(tmp / name);
    const TensorInfo* t = out.find("logits");
    EXPECT_NE(t, nullptr) << how;
    if (!t) return std::vector<float>{};
    EXPECT_EQ(t->shape, (std::vector<int64_t>{int64_t(ids.size()), 512})) << how;
    return test::read_f32(*t);
  };
  const auto want = logits_of("--ids " + list, "ids.safetensors");
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(logits_of("--ids-file " + (tmp / "ids.txt"), "file.safetensors"), want);
  EXPECT_EQ(logits_of("--ids-file - < " + (tmp / "ids.txt"), "stdin.safetensors"), want);
}

TEST(CliLogits, IdsFileErrorsNameTheProblem) {
  const std::string m = test::fixture("deepseek-v3-tiny"), bin = MLA_BINARY;
  test::TempDir tmp("cli");
  const std::string out = " --out " + (tmp / "x.safetensors");
  std::ofstream(tmp / "bad.txt") << "1, 2\n3 4x 5\n";
  std::ofstream(tmp / "empty.txt") << " ,\n\n";
  std::ofstream(tmp / "good.txt") << "1 2";
  for (auto [args, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"--ids-file " + (tmp / "missing.txt"), "missing.txt: cannot open"},
           {"--ids-file " + (tmp / "bad.txt"), "token 4 ('4x') is not an integer token id"},
           {"--ids-file " + (tmp / "empty.txt"), "no token ids"},
           {"--ids-file - < " + (tmp / "empty.txt"), "standard input"},
           {"--ids 1,2 --ids-file " + (tmp / "good.txt"), "excludes"},
           {"", "--ids-file"},
       }) {
    auto r = sh(bin + " logits -m " + m + out + " " + args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << args << "\n" << r.output;
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
