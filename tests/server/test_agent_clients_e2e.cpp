// The coding agents and official SDKs against `mla serve` (tests/e2e): three servers on a
// random-weight checkpoint of the deepseek-v3-tiny fixture's shape with DeepSeek-V3's real
// vocabulary, tokenizer and chat template (the agents' prompts are 10k-20k tokens of DeepSeek's
// BPE; byte by byte they would be five times longer): one behind --api-key for the SDKs, one
// whose template opens <think> when `thinking` is set, and one for the agents whose replies end
// within a few tokens (make_model). Then:
//   - OfficialSdks: tests/e2e/protocols.mjs with @anthropic-ai/sdk (Messages) and openai
//     (Responses);
//   - ClaudeCode: `claude -p` (@anthropic-ai/claude-code) with ANTHROPIC_BASE_URL on the server;
//   - Codex: `codex exec` (@openai/codex) with a model provider whose wire_api is "responses".
// Each is skipped, saying why, when node or its npm package is missing (`npm ci --prefix
// tests/e2e` installs them). The model is random: an agent completing its turn with the
// server's answer, exit status 0, is what is checked.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/serve_process.h"
#include "test_util.h"
#include "tools/checkpoint_writer.h"

namespace mla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_all;

fs::path e2e_dir() { return test::source_dir() / "tests/e2e"; }

bool have_package(const std::string& name) { return fs::exists(e2e_dir() / "node_modules" / name / "package.json"); }

// The fixture's shape with DeepSeek-V3's vocabulary (129,280 ids) and a 32k context, random
// weights, the real tokenizer; chat_template replaces the tokenizer's. short_replies: the
// generation config lists every other id as an end of sequence, so that the random model ends
// its replies within a few tokens as a trained one would (an agent reads a reply cut at
// max_tokens as a failure).
void make_model(const fs::path& dir, const std::string& chat_template, bool short_replies) {
  json config = json::parse(read_all(test::fixture("deepseek-v3-tiny") + "/config.json"));
  config["vocab_size"] = 129280;
  config["max_position_embeddings"] = 32768;
  config["num_nextn_predict_layers"] = 0;
  config["bos_token_id"] = 0;
  config["eos_token_id"] = 1;
  RandomCheckpointOptions opt;
  write_random_checkpoint(dir.string(), config, opt);
  const fs::path tok = fs::path(test::shared_dir()) / "fixtures/tokenizer/deepseek-v3";
  fs::copy_file(tok / "tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  json cfg = json::parse(read_all((tok / "tokenizer_config.json").string()));
  cfg["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  json eos = json::array({1});
  if (short_replies)
    for (int64_t id = 2; id < 129280; id += 2) eos.push_back(id);
  std::ofstream(dir / "generation_config.json") << json({{"bos_token_id", 0}, {"eos_token_id", eos}}).dump();
}

std::vector<std::string> serve_args(const fs::path& dir, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> args = {"-m", dir.string(), "--threads", "2", "--kv-cache-gb", "0.1",
                                   "--page-size", "16", "--max-batch-tokens", "2048",
                                   "--served-model-name", name, "--max-output-tokens", "64"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The servers every test of the suite uses, started once.
struct Servers {
  test::TempDir sdk_dir{"e2e-clients-sdk"}, think_dir{"e2e-clients-think"}, agent_dir{"e2e-clients-agent"};
  std::unique_ptr<test::ServeProcess> sdk, think, agent;
  std::string error;
  Servers() {
    const std::string thinking = test::deepseek_v3_thinking_template("thinking");
    if (thinking.empty()) {
      error = "DeepSeek-V3's generation prompt was not found in its template";
      return;
    }
    make_model(sdk_dir.path, test::deepseek_v3_template(), /*short_replies=*/false);
    make_model(think_dir.path, thinking, /*short_replies=*/false);
    make_model(agent_dir.path, test::deepseek_v3_template(), /*short_replies=*/true);
    sdk = std::make_unique<test::ServeProcess>((sdk_dir.path / "serve.log").string(),
                                               serve_args(sdk_dir.path, "sdk", {"--api-key", "sk-e2e"}));
    agent = std::make_unique<test::ServeProcess>((agent_dir.path / "serve.log").string(),
                                                 serve_args(agent_dir.path, "agent", {"--api-key", "sk-e2e"}));
    think = std::make_unique<test::ServeProcess>(
        (think_dir.path / "serve.log").string(),
        serve_args(think_dir.path, "think", {"--reasoning-parser", "deepseek_r1"}));
    if (sdk->port == 0) error = "the SDK server did not start:\n" + read_all(sdk->log);
    else if (agent->port == 0) error = "the agent server did not start:\n" + read_all(agent->log);
    else if (think->port == 0) error = "the thinking server did not start:\n" + read_all(think->log);
  }
  std::string logs() const {
    return "\nSDK server:\n" + read_all(sdk->log) + "\nthink server:\n" + read_all(think->log) +
           "\nagent server:\n" + read_all(agent->log);
  }
};

Servers& servers() {
  static Servers s;
  return s;
}

#define REQUIRE_NODE_AND(package)                                                                   \
  if (test::run_command("command -v node >/dev/null 2>&1").status != 0)                             \
    GTEST_SKIP() << "node is not installed: the agent-client suite did not run";                    \
  if (!have_package(package))                                                                       \
    GTEST_SKIP() << "the npm package " << package << " is missing: run `npm ci --prefix tests/e2e`"; \
  ASSERT_TRUE(servers().error.empty()) << servers().error

TEST(AgentClientsE2E, OfficialSdks) {
  REQUIRE_NODE_AND("@anthropic-ai/sdk");
  ASSERT_TRUE(have_package("openai"));
  Servers& s = servers();
  const std::string cmd = "cd '" + test::source_dir().string() + "' && MLA_URL=" + s.sdk->url() +
                          " MLA_THINK_URL=" + s.think->url() + " MLA_API_KEY=sk-e2e node tests/e2e/protocols.mjs";
  auto r = test::run_command(cmd, true);
  EXPECT_EQ(r.status, 0) << r.output << s.logs();
  EXPECT_NE(r.output.find(" passed, 0 failed"), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());
}

TEST(AgentClientsE2E, ClaudeCodePrint) {
  REQUIRE_NODE_AND("@anthropic-ai/claude-code");
  Servers& s = servers();
  test::TempDir home("e2e-claude-home");
  // Claude Code's own prompt with its full tool list (about 20k tokens of DeepSeek's BPE).
  const std::string cmd = "cd '" + home.path.string() + "' && HOME='" + home.path.string() +
                          "' ANTHROPIC_BASE_URL=" + s.agent->url() +
                          " ANTHROPIC_AUTH_TOKEN=sk-e2e ANTHROPIC_MODEL=agent ANTHROPIC_SMALL_FAST_MODEL=agent"
                          " CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 timeout 300 '" +
                          (e2e_dir() / "node_modules/.bin/claude").string() + "' -p 'Say hello' --model agent < /dev/null";
  auto r = test::run_command(cmd, true);
  EXPECT_EQ(r.status, 0) << r.output << s.logs();
  EXPECT_EQ(r.output.find("API Error"), std::string::npos) << r.output;
  std::printf("claude -p:\n%s\n", r.output.c_str());
}

TEST(AgentClientsE2E, CodexExec) {
  REQUIRE_NODE_AND("@openai/codex");
  Servers& s = servers();
  test::TempDir codex_home("e2e-codex-home"), work("e2e-codex-work");
  std::ofstream(codex_home.path / "config.toml")
      << "model = \"agent\"\nmodel_provider = \"mla\"\n[model_providers.mla]\nname = \"mla\"\nbase_url = \"" +
             s.agent->url() + "/v1\"\nwire_api = \"responses\"\nenv_key = \"MLA_KEY\"\n";
  const std::string cmd = "cd '" + work.path.string() + "' && HOME='" + work.path.string() + "' CODEX_HOME='" +
                          codex_home.path.string() + "' MLA_KEY=sk-e2e timeout 300 '" +
                          (e2e_dir() / "node_modules/.bin/codex").string() +
                          "' exec --skip-git-repo-check 'Say hello' < /dev/null";
  auto r = test::run_command(cmd, true);
  EXPECT_EQ(r.status, 0) << r.output << s.logs();
  EXPECT_EQ(r.output.find("ERROR"), std::string::npos) << r.output;
  std::printf("codex exec:\n%s\n", r.output.c_str());
}

}  // namespace
}  // namespace mla
