// End-to-end tests of `mla tokenize`, `mla detokenize` and `mla chat-template`, run through
// popen on the built program (MLA_BINARY).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "deepseek_fixture.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

using RunResult = mla::test::CommandResult;

// Runs `mla ARGS < stdin_path` (stderr folded into the output only when asked).
RunResult run_mla(const std::string& args, const std::string& stdin_path, bool with_stderr = false) {
  return mla::test::run_mla(args + (stdin_path.empty() ? "" : " < '" + stdin_path + "'"), with_stderr);
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::istringstream in(line);
  std::vector<int32_t> ids;
  int32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

class CliTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mla_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  fs::path dir_;
};

TEST_F(CliTokenize, TokenizeAndDetokenizeAreByteExact) {
  const auto& tok = mla::test::deepseek_v3_tokenizer();
  const std::string& model = mla::test::deepseek_v3_dir();
  // Leading/trailing whitespace, CRLF, a NUL byte and a final newline must all survive.
  const std::string text =
      std::string("  Hello, 世界! <｜User｜> x\r\n\tcode();\n") + std::string(1, '\0') + "end\n";
  std::string input = write("input.txt", text);

  RunResult encoded = run_mla("tokenize -m '" + model + "'", input);
  ASSERT_EQ(encoded.status, 0);
  ASSERT_FALSE(encoded.output.empty());
  EXPECT_EQ(encoded.output.back(), '\n');
  std::vector<int32_t> ids = parse_ids(encoded.output);
  EXPECT_EQ(ids, tok.encode(text, false));

  RunResult with_bos = run_mla("tokenize -m '" + model + "' --special", input);
  ASSERT_EQ(with_bos.status, 0);
  std::vector<int32_t> special_ids = parse_ids(with_bos.output);
  ASSERT_FALSE(special_ids.empty());
  EXPECT_EQ(special_ids.front(), 0);
  EXPECT_EQ(std::vector<int32_t>(special_ids.begin() + 1, special_ids.end()), ids);

  std::string ids_file = write("ids.txt", encoded.output);
  RunResult decoded = run_mla("detokenize -m '" + model + "'", ids_file);
  ASSERT_EQ(decoded.status, 0);
  EXPECT_EQ(decoded.output, text);
}

TEST_F(CliTokenize, ChatTemplateTextAndIds) {
  const std::string& model = mla::test::deepseek_v3_dir();
  std::ifstream cases(model + "/chat_cases.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(cases, line));
  ojson c = ojson::parse(line);
  std::string messages = write("messages.json", c["messages"].dump());

  RunResult text = run_mla("chat-template -m '" + model + "' --messages '" + messages + "' --add-generation-prompt", "");
  ASSERT_EQ(text.status, 0);
  EXPECT_EQ(text.output, c["rendered"].get<std::string>()) << "case " << c["id"];

  RunResult ids = run_mla("chat-template -m '" + model + "' --messages '" + messages + "' --add-generation-prompt --ids", "");
  ASSERT_EQ(ids.status, 0);
  EXPECT_EQ(parse_ids(ids.output), c["ids"].get<std::vector<int32_t>>()) << "case " << c["id"];
}

TEST_F(CliTokenize, DemoTokenizerRoundTripAndErrors) {
  // The small written tokenizer keeps this fast; it exercises the same commands.
  std::string model = (dir_ / "demo").string();
  mla::Tokenizer::write_byte_level_tokenizer(model, 512);
  const std::string text = "line one\nline two with trailing spaces   \n\n";
  std::string input = write("demo.txt", text);
  RunResult encoded = run_mla("tokenize -m '" + model + "'", input);
  ASSERT_EQ(encoded.status, 0);
  RunResult decoded = run_mla("detokenize -m '" + model + "'", write("demo_ids.txt", encoded.output));
  ASSERT_EQ(decoded.status, 0);
  EXPECT_EQ(decoded.output, text);

  std::string messages = write("demo_messages.json", R"({"messages": [{"role": "user", "content": "hi"}]})");
  RunResult chat = run_mla("chat-template -m '" + model + "' --messages '" + messages + "'", "");
  ASSERT_EQ(chat.status, 0);
  EXPECT_EQ(chat.output, "<｜begin▁of▁sentence｜><｜User｜>hi");

  // Errors: a missing model folder, a bad id, a bad messages file. Non-zero exit with a message.
  RunResult missing = run_mla("tokenize -m '" + (dir_ / "nope").string() + "'", input, true);
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("tokenizer.json"), std::string::npos) << missing.output;
  RunResult bad_id = run_mla("detokenize -m '" + model + "'", write("bad_ids.txt", "1 2 x3\n"), true);
  EXPECT_NE(bad_id.status, 0);
  EXPECT_NE(bad_id.output.find("x3"), std::string::npos) << bad_id.output;
  RunResult out_of_range = run_mla("detokenize -m '" + model + "'", write("big_ids.txt", "1 99999\n"), true);
  EXPECT_NE(out_of_range.status, 0);
  EXPECT_NE(out_of_range.output.find("99999"), std::string::npos) << out_of_range.output;
  RunResult bad_json = run_mla("chat-template -m '" + model + "' --messages '" + write("bad.json", "[{") + "'", "", true);
  EXPECT_NE(bad_json.status, 0);
  EXPECT_NE(bad_json.output.find("bad.json"), std::string::npos) << bad_json.output;
  RunResult no_model = run_mla("tokenize", input, true);
  EXPECT_NE(no_model.status, 0);
}

}  // namespace
