// The agent end-to-end suite (tests/e2e/agent.mjs) under ctest: two `mla serve` processes on the
// deepseek-v3-tiny fixture with a byte-level tokenizer and DeepSeek-V3's chat template (one
// behind --api-key, one whose template opens <think> when `thinking` is set, with
// --chat-template-kwargs and --reasoning-parser), then node runs the suite with the official
// `openai` npm client against them. Skipped, saying why, when node or the package is missing
// (install it with `npm ci --prefix tests/e2e`).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

extern char** environ;

namespace mla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The checkout: MLA_SHARED_DIR is "<source>/../shared".
fs::path source_dir() {
  std::string s = MLA_SHARED_DIR;
  const std::string tail = "/../shared";
  if (s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0)
    return fs::path(s.substr(0, s.size() - tail.size()));
  return fs::path(s).parent_path();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A model folder: the fixture, a byte-level tokenizer, the given chat template.
void make_model(const fs::path& dir, const std::string& chat_template) {
  for (auto& e : fs::directory_iterator(test::fixture("deepseek-v3-tiny")))
    if (e.path().filename() != "golden.safetensors") fs::copy(e.path(), dir / e.path().filename());
  Tokenizer::write_byte_level_tokenizer(dir.string(), 512);
  json cfg = json::parse(read_all((dir / "tokenizer_config.json").string()));
  cfg["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
}

// `mla serve` on a free port, killed when the object goes.
struct Served {
  pid_t pid = 0;
  int port = 0;
  std::string log;
  Served(const fs::path& dir, const std::string& name, std::vector<std::string> extra) {
    log = (dir / "serve.log").string();
    std::vector<std::string> args = {MLA_BINARY, "serve", "-m", dir.string(), "--port", "0", "--threads", "1",
                                     "--kv-cache-gb", "0.002", "--page-size", "16", "--served-model-name", name};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid, MLA_BINARY, &fa, nullptr, argv.data(), environ) != 0) pid = 0;
    posix_spawn_file_actions_destroy(&fa);
    std::regex re(R"(http://127\.0\.0\.1:([0-9]+))");
    for (int i = 0; pid > 0 && i < 600 && port == 0; ++i) {
      std::smatch m;
      std::string text = read_all(log);
      if (std::regex_search(text, m, re)) port = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int st;
      if (port == 0 && waitpid(pid, &st, WNOHANG) == pid) pid = 0;
    }
  }
  ~Served() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

TEST(AgentE2E, OfficialOpenAiClient) {
  const fs::path src = source_dir();
  if (test::run_command("command -v node >/dev/null 2>&1").status != 0)
    GTEST_SKIP() << "node is not installed: the agent end-to-end suite did not run";
  if (!fs::exists(src / "tests/e2e/node_modules/openai/package.json"))
    GTEST_SKIP() << "the openai npm package is missing: run `npm ci --prefix tests/e2e` (the agent end-to-end suite "
                    "did not run)";
  const json tok_cfg = json::parse(read_all(test::shared_dir() + "/fixtures/tokenizer/deepseek-v3/tokenizer_config.json"));
  const std::string v3 = tok_cfg["chat_template"].get<std::string>();
  const std::string gen = "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";
  ASSERT_NE(v3.find(gen), std::string::npos) << "DeepSeek-V3's generation prompt";
  std::string thinking = v3;
  thinking.replace(thinking.find(gen), gen.size(),
                   "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}"
                   "{% if thinking %}{{'<think>\\n'}}{% endif %}{% endif %}");

  test::TempDir agent_dir("e2e-agent"), think_dir("e2e-think");
  make_model(agent_dir.path, v3);
  make_model(think_dir.path, thinking);
  Served agent(agent_dir.path, "agent", {"--api-key", "sk-e2e"});
  ASSERT_NE(agent.port, 0) << read_all(agent.log);
  Served think(think_dir.path, "think",
               {"--reasoning-parser", "deepseek_r1", "--chat-template-kwargs", R"({"thinking": true})"});
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
