// The agent end-to-end suite (tests/e2e/agent.mjs) under ctest: two `mla serve` processes on the
// deepseek-v3-tiny fixture with a byte-level tokenizer and DeepSeek-V3's chat template (one
// behind --api-key, one whose template opens <think> when `thinking` is set, with
// --chat-template-kwargs and --reasoning-parser), then node runs the suite with the official
// `openai` npm client against them. Skipped, saying why, when node or the package is missing
// (install it with `npm ci --prefix tests/e2e`).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/serve_process.h"
#include "test_util.h"

namespace mla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::read_all;

// A model folder: the fixture, a byte-level tokenizer, the given chat template.
void make_model(const fs::path& dir, const std::string& chat_template) {
  test::make_served_model(dir);
  json cfg = json::parse(read_all((dir / "tokenizer_config.json").string()));
  cfg["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
}

// `mla serve` of the model in dir under the served name, with the extra options.
// --tool-prompt off: DeepSeek-V3's template writes no tools, and the section the server would
// write in their place (some 500 bytes a tool list) does not fit the fixture's 256 positions of
// a byte-level tokenizer; AgentClientsE2E serves it to the real agents on a 32k context.
std::vector<std::string> serve_args(const fs::path& dir, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> args = {"-m", dir.string(), "--threads", "1", "--kv-cache-gb", "0.002",
                                   "--page-size", "16", "--served-model-name", name, "--tool-prompt", "off"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(AgentE2E, OfficialOpenAiClient) {
  const fs::path src = test::source_dir();
  if (test::run_command("command -v node >/dev/null 2>&1").status != 0)
    GTEST_SKIP() << "node is not installed: the agent end-to-end suite did not run";
  if (!fs::exists(src / "tests/e2e/node_modules/openai/package.json"))
    GTEST_SKIP() << "the openai npm package is missing: run `npm ci --prefix tests/e2e` (the agent end-to-end suite "
                    "did not run)";
  const std::string v3 = test::deepseek_v3_template();
  const std::string thinking = test::deepseek_v3_thinking_template("thinking");
  ASSERT_FALSE(thinking.empty()) << "DeepSeek-V3's generation prompt";

  test::TempDir agent_dir("e2e-agent"), think_dir("e2e-think");
  make_model(agent_dir.path, v3);
  make_model(think_dir.path, thinking);
  test::ServeProcess agent((agent_dir.path / "serve.log").string(), serve_args(agent_dir.path, "agent", {"--api-key", "sk-e2e"}));
  ASSERT_NE(agent.port, 0) << read_all(agent.log);
  test::ServeProcess think(
      (think_dir.path / "serve.log").string(),
      serve_args(think_dir.path, "think",
                 {"--reasoning-parser", "deepseek_r1", "--chat-template-kwargs", R"({"thinking": true})"}));
  ASSERT_NE(think.port, 0) << read_all(think.log);

  const std::string cmd = "cd '" + src.string() + "' && MLA_URL=" + agent.url() + " MLA_THINK_URL=" + think.url() +
                          " MLA_API_KEY=sk-e2e node tests/e2e/agent.mjs";
  auto r = test::run_command(cmd, true);
  EXPECT_EQ(r.status, 0) << r.output << "\nagent server:\n" << read_all(agent.log) << "\nthink server:\n"
                         << read_all(think.log);
  EXPECT_NE(r.output.find(" passed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not ok"), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());
}

}  // namespace
}  // namespace mla
