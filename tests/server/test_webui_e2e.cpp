// The chat page in a real browser (tests/e2e/webui.mjs) under ctest: two `mla serve` processes on
// the deepseek-v3-tiny fixture with a byte-level tokenizer and DeepSeek-V3's chat template (one
// whose template opens <think>, with --reasoning-parser deepseek_r1; one behind --api-key), then
// node drives headless
// Chromium through puppeteer-core against them. Skipped, saying why, when node, Chromium or the
// package is missing (`apt-get install chromium`, `npm ci --prefix tests/e2e`). WEBUI_SCREENSHOT
// in the environment is passed on: the page is saved there as a PNG.
#include <gtest/gtest.h>

#include <cstdlib>
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

// Positions enough for the Stop check's long reply to still be running when Stop is clicked.
constexpr int kContext = 4096;

// A model folder: the fixture of kContext positions, a byte-level tokenizer, the chat template.
void make_model(const fs::path& dir, const std::string& chat_template) {
  test::make_served_model(dir, kContext);
  json cfg = json::parse(read_all((dir / "tokenizer_config.json").string()));
  cfg["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
}

// `mla serve` of the model in dir, with a cache for a few sequences of kContext tokens at 1 KiB
// a token (the fixture needs less), and the extra options.
std::vector<std::string> serve_args(const fs::path& dir, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> args = {"-m", dir.string(), "--threads", "1", "--kv-cache-gb",
                                   std::to_string(4.0 * kContext * 1024 / 1e9), "--page-size", "16",
                                   "--served-model-name", name};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(WebUiE2E, ChromiumChat) {
  const fs::path src = test::source_dir();
  const char* chromium_env = std::getenv("CHROMIUM");
  const std::string chromium = chromium_env ? chromium_env : "/usr/bin/chromium";
  if (test::run_command("command -v node >/dev/null 2>&1").status != 0)
    GTEST_SKIP() << "node is not installed: the chat page's browser test did not run";
  if (!fs::exists(chromium))
    GTEST_SKIP() << chromium << " is missing (apt-get install chromium): the chat page's browser test did not run";
  if (!fs::exists(src / "tests/e2e/node_modules/puppeteer-core/package.json"))
    GTEST_SKIP() << "the puppeteer-core npm package is missing: run `npm ci --prefix tests/e2e` (the chat page's "
                    "browser test did not run)";
  const std::string v3 = test::deepseek_v3_template();
  const std::string thinking = test::deepseek_v3_thinking_template("true");
  ASSERT_FALSE(thinking.empty()) << "DeepSeek-V3's generation prompt";

  test::TempDir chat_dir("webui-chat"), think_dir("webui-think");
  make_model(chat_dir.path, v3);
  make_model(think_dir.path, thinking);
  test::ServeProcess chat((chat_dir.path / "serve.log").string(), serve_args(chat_dir.path, "tiny-chat", {}));
  ASSERT_NE(chat.port, 0) << read_all(chat.log);
  EXPECT_NE(chat.log_text().find("chat page: " + chat.url() + "/"), std::string::npos) << chat.log_text();
  test::ServeProcess think((think_dir.path / "serve.log").string(),
                           serve_args(think_dir.path, "tiny-think", {"--reasoning-parser", "deepseek_r1"}));
  ASSERT_NE(think.port, 0) << read_all(think.log);
  test::ServeProcess keyed((chat_dir.path / "keyed.log").string(),
                           serve_args(chat_dir.path, "tiny-keyed", {"--api-key", "sk-webui"}));
  ASSERT_NE(keyed.port, 0) << read_all(keyed.log);

  std::string cmd = "cd '" + src.string() + "' && WEBUI_URL=" + chat.url() + " WEBUI_THINK_URL=" + think.url() +
                    " WEBUI_KEY_URL=" + keyed.url() + " WEBUI_API_KEY=sk-webui" +
                    " CHROMIUM='" + chromium + "'";
  if (const char* shot = std::getenv("WEBUI_SCREENSHOT")) cmd += std::string(" WEBUI_SCREENSHOT='") + shot + "'";
  cmd += " timeout 120 node tests/e2e/webui.mjs";
  auto r = test::run_command(cmd, true);
  EXPECT_EQ(r.status, 0) << r.output << "\nchat server:\n" << read_all(chat.log) << "\nthink server:\n"
                         << read_all(think.log) << "\nkeyed server:\n" << read_all(keyed.log);
  EXPECT_NE(r.output.find(" passed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not ok"), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());
}

}  // namespace
}  // namespace mla
