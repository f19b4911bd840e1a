// End-to-end tests of `mla run`, `mla chat` and `mla demo` through the built program
// (MLA_BINARY): the deepseek-v3-tiny fixture with a byte-level tokenizer, greedy output that is
// deterministic and equal to the greedy continuation computed through the library, seeded
// sampling, stop strings, piped chat, and the demo's figures.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "backend/cpu/context.h"
#include "engine/generation_config.h"
#include "model/model.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kFixture = std::string(MLA_SHARED_DIR) + "/fixtures/models/deepseek-v3-tiny";

// Runs a shell command, returning its stdout and exit status.
mla::test::CommandResult sh(const std::string& cmd) { return mla::test::run_command(cmd); }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class RunCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One thread (one_thread_): these tiny models gain nothing from two, and a busy machine
    // makes OpenMP's waiting threads slow.
    one_thread_.threads = 1;
    dir_ = new fs::path(fs::temp_directory_path() / ("mla_run_cli_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_ / "model");
    fs::copy_file(kFixture + "/config.json", *dir_ / "model/config.json");
    fs::copy_file(kFixture + "/model.safetensors", *dir_ / "model/model.safetensors");
    mla::Tokenizer::write_byte_level_tokenizer((*dir_ / "model").string(), 512);  // the fixture's vocab
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string model() { return (*dir_ / "model").string(); }
  static std::string mla(const std::string& args) {
    return std::string(MLA_BINARY) + " " + args + " --threads 1";
  }

  // The greedy continuation through the library alone: Model::forward on a bf16 latent pool
  // (as `mla run` uses), argmax, stopping at the EOS ids of config.json and the tokenizer.
  static std::string library_greedy(const std::vector<int32_t>& prompt, int n) {
    auto m = mla::Model::load(model(), one_thread_);
    auto tok = mla::Tokenizer::load(model());
    auto eos = m->config().eos_token_ids;
    eos.push_back(tok.eos_id());
    mla::LatentPool pool = m->make_pool(4, 64, mla::KvDType::BF16);
    mla::PageTable seq;
    mla::ForwardOptions fo;
    fo.last_logits_only = true;
    std::vector<float> logits;
    std::vector<int32_t> next = prompt, out;
    for (int i = 0; i < n; ++i) {
      mla::SeqSlice s{&seq, next};
      m->forward(std::span<mla::SeqSlice>(&s, 1), pool, fo, logits);
      int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (std::find(eos.begin(), eos.end(), id) != eos.end()) break;
      out.push_back(id);
      next = {id};
    }
    return tok.decode(out, true);
  }

  static inline fs::path* dir_ = nullptr;
  static inline mla::cpu::Context one_thread_;
};

TEST_F(RunCli, GreedyIsDeterministicAndMatchesTheLibrary) {
  const std::string cmd = mla("run -m " + model() + " -p 'The quick brown fox' -n 16 --temperature 0 -q");
  auto a = sh(cmd), b = sh(cmd);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  auto tok = mla::Tokenizer::load(model());
  EXPECT_EQ(a.output, library_greedy(tok.encode("The quick brown fox", true), 16));
  EXPECT_FALSE(a.output.empty());
}

TEST_F(RunCli, ChatFlagAppliesTheTemplate) {
  auto r = sh(mla("run -m " + model() + " -p 'Hello' --chat -n 12 --temperature 0 -q"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto tok = mla::Tokenizer::load(model());
  nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", "Hello"}}});
  std::string text = mla::render_chat_template(tok.chat_template(), messages, true,
                                               {{"bos_token", tok.bos_token()}, {"eos_token", tok.eos_token()}});
  EXPECT_EQ(r.output, library_greedy(tok.encode(text, false), 12));
}

TEST_F(RunCli, PrintsFiguresToStderr) {
  const fs::path err = *dir_ / "stderr.txt";
  auto r = sh(mla("run -m " + model() + " -p 'Hi' -n 4 --seed 9") + " 2> " + err.string());
  ASSERT_EQ(r.status, 0);
  std::string e = read_file(err);
  EXPECT_NE(e.find("prompt"), std::string::npos) << e;
  EXPECT_NE(e.find("generated"), std::string::npos) << e;
  EXPECT_NE(e.find("tokens/s"), e.rfind("tokens/s")) << "prompt and generated tokens/s\n" << e;
  // bf16 latent: 3 layers x (64 + 16) values x 2 bytes.
  EXPECT_NE(e.find(" 480 bytes per token"), std::string::npos) << e;
  auto fp8 = sh(mla("run -m " + model() + " -p 'Hi' -n 2 --kv-dtype fp8") + " 2>&1 >/dev/null");
  // fp8: 64 e4m3 + one float scale + 16 bf16 = 100 bytes per layer.
  EXPECT_NE(fp8.output.find(" 300 bytes per token"), std::string::npos) << fp8.output;
}

TEST_F(RunCli, SeedReproducesSampling) {
  const std::string cmd = mla("run -m " + model() + " -p 'Once' -n 24 --temperature 1.0 --top-p 0.9 --seed 42 -q");
  auto a = sh(cmd), b = sh(cmd);
  ASSERT_EQ(a.status, 0);
  EXPECT_EQ(a.output, b.output);
  EXPECT_FALSE(a.output.empty());
}

TEST_F(RunCli, StopStringEndsTheOutput) {
  auto free_run = sh(mla("run -m " + model() + " -p 'Attention' -n 24 --temperature 0 -q"));
  ASSERT_EQ(free_run.status, 0);
  // Two ASCII characters from the middle of the greedy text.
  const std::string& t = free_run.output;
  std::string stop;
  for (size_t i = t.size() / 3; i + 1 < t.size() && stop.empty(); ++i)
    if (std::isalnum(static_cast<unsigned char>(t[i])) && std::isalnum(static_cast<unsigned char>(t[i + 1])))
      stop = t.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << "no two letters in: " << t;
  auto r = sh(mla("run -m " + model() + " -p 'Attention' -n 24 --temperature 0 -q --stop " + stop));
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.output, t.substr(0, t.find(stop))) << "stop '" << stop << "'";
}

TEST_F(RunCli, ChatReadsPipedLines) {
  auto r = sh("printf 'Hello\\nAnd then?\\n/exit\\nnever read\\n' | " +
              mla("chat -m " + model() + " -n 6 --temperature 0 -q"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n') >= 2, true) << "one reply line per user line:\n" << r.output;
  // The first reply is the greedy continuation of the rendered first turn.
  auto tok = mla::Tokenizer::load(model());
  nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", "Hello"}}});
  std::string text = mla::render_chat_template(tok.chat_template(), messages, true,
                                               {{"bos_token", tok.bos_token()}, {"eos_token", tok.eos_token()}});
  std::string first = library_greedy(tok.encode(text, false), 6);
  EXPECT_EQ(r.output.substr(0, first.size() + 1), first + "\n");
  // Turn statistics: the second turn takes the first turn's full pages (64 tokens each) from
  // the prefix cache and computes only the rest: its new tokens and at most a partial page. A
  // long system message makes the first turn span more than one page.
  std::string system;
  for (int i = 0; i < 100; ++i) system += char('a' + (i * 7 + i / 26) % 26);
  nlohmann::json with_system = nlohmann::json::array({{{"role", "system"}, {"content", system}},
                                                      {{"role", "user"}, {"content", "Hello"}}});
  const int64_t first_len = int64_t(tok.encode(mla::render_chat_template(tok.chat_template(), with_system, true,
                                                                          {{"bos_token", tok.bos_token()},
                                                                           {"eos_token", tok.eos_token()}}),
                                               false)
                                        .size());
  ASSERT_GT(first_len, 64);
  const fs::path err = *dir_ / "chat_err.txt";
  auto s = sh("printf 'Hello\\nAnd then?\\n' | " +
              mla("chat -m " + model() + " --system " + system + " -n 6 --temperature 0") + " 2> " + err.string());
  ASSERT_EQ(s.status, 0);
  std::string e = read_file(err);
  std::smatch m;
  std::string::const_iterator from = e.begin();
  std::vector<int> fresh, cached;
  std::regex turn(R"(\[prompt (\d+) new \+ (\d+) cached tokens)");
  while (std::regex_search(from, e.cend(), m, turn)) {
    fresh.push_back(std::stoi(m[1]));
    cached.push_back(std::stoi(m[2]));
    from = m[0].second;
  }
  ASSERT_EQ(cached.size(), 2u) << e;
  EXPECT_EQ(cached[0], 0);
  EXPECT_EQ(fresh[0], first_len);
  EXPECT_GE(cached[1], first_len / 64 * 64) << "the first turn's full pages are reused\n" << e;
  EXPECT_GT(cached[1], 0);
  EXPECT_EQ(cached[1] % 64, 0) << "whole pages";
  // The second prompt repeats the first turn (prompt and up to 6 reply tokens) before its new
  // text; what is computed is what follows the reused pages.
  EXPECT_LT(fresh[1], 64 + 40) << "a partial page and the new turn's tokens\n" << e;
}

TEST_F(RunCli, BadInputIsAnErrorNotACrash) {
  auto r = sh(mla("run -m " + model() + " -p x --top-p 0") + " 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("top_p"), std::string::npos) << r.output;
  auto k = sh(mla("run -m " + model() + " -p 'a long prompt' --kv-cache-gb 0.00000001") + " 2>&1");
  EXPECT_EQ(k.status, 1);
  EXPECT_NE(k.output.find("KV cache"), std::string::npos) << k.output;
  auto d = sh(mla("run -m " + (*dir_ / "missing").string() + " -p x") + " 2>&1");
  EXPECT_EQ(d.status, 1);
  EXPECT_NE(d.output.find("missing"), std::string::npos) << d.output;
}

TEST_F(RunCli, DemoPrintsItsFigures) {
  const std::string demo_dir = (*dir_ / "demo").string();
  auto r = sh(std::string(MLA_BINARY) + " demo --threads 1 --dir " + demo_dir + " -n 8 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("written"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(demo_dir + "/config.json"));
  EXPECT_TRUE(fs::exists(demo_dir + "/tokenizer.json"));
  EXPECT_NE(r.output.find("RANDOM weights"), std::string::npos);
  // demo_config: 4 layers, 16 heads x (64 + 64 + 64), kv_lora_rank 256 + rope 64.
  EXPECT_NE(r.output.find("24,576 bytes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2,560 bytes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("9.6x smaller"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(max \|logit difference\|[^:]*: ([0-9.e+-]+))"))) << r.output;
  EXPECT_LT(std::stod(m[1]), 1e-3) << "the two paths are the same function";
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(generated\s+(\d+) tokens\s+([0-9.]+) tokens/s)"))) << r.output;
  EXPECT_GE(std::stoi(m[1]), 1);
  EXPECT_LE(std::stoi(m[1]), 8);
  EXPECT_GT(std::stod(m[2]), 0.0);
  // Run again: the checkpoint is reused.
  auto again = sh(std::string(MLA_BINARY) + " demo --threads 1 --dir " + demo_dir + " -n 2 2>&1");
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("reused"), std::string::npos) << again.output;
  // A folder holding another checkpoint is never overwritten.
  auto other = sh(std::string(MLA_BINARY) + " demo --dir " + model() + " -n 2 2>&1");
  EXPECT_EQ(other.status, 1);
  EXPECT_NE(other.output.find("not the demo's"), std::string::npos) << other.output;
}

// Without --dir the demo finds the trained checkpoint of the source tree (models/mla-tiny-en),
// generates greedily from it, and still prints the latent cache and the paths' agreement.
TEST_F(RunCli, DemoUsesTheTrainedModel) {
  auto r = sh(std::string(MLA_BINARY) + " demo --threads 1 -n 8 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("TRAINED weights"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("models/mla-tiny-en"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("output (greedy)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("latent, bf16"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(max \|logit difference\|[^:]*: ([0-9.e+-]+))"))) << r.output;
  EXPECT_LT(std::stod(m[1]), 1e-3) << "the two paths are the same function";
  // Greedy: a second run prints the same text.
  auto again = sh(std::string(MLA_BINARY) + " demo --threads 1 -n 8 2>&1");
  ASSERT_EQ(again.status, 0) << again.output;
  auto text = [](const std::string& out) {
    const size_t a = out.find("output (greedy): ");
    return a == std::string::npos ? std::string() : out.substr(a, out.find('\n', a) - a);
  };
  EXPECT_FALSE(text(r.output).empty());
  EXPECT_EQ(text(r.output), text(again.output));
}

}  // namespace
