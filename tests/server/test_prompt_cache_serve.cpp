// `mla serve` with the prompt cache on disk, as an agent meets it: a server restarted on the
// same --cache-dir answers the next turn from disk with the output a cold server gives and
// reports the cached tokens on chat completions, completions, messages and responses and in
// /metrics; a SIGKILL right after a turn, flipped segment files and another cache format on the
// same directory never change an answer.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "kv/disk_tier.h"
#include "server/serve_process.h"
#include "test_util.h"

namespace mla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_all;

constexpr const char* kTemplate =
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt "
    "%}assistant:{% endif %}";

// An agent's system prompt and tool list: ~1,100 byte-level tokens, the same on every turn.
std::string system_prompt() {
  std::string s = "You are a coding agent. Tools: ";
  for (int i = 0; i < 40; ++i) s += "tool_" + std::to_string(i) + "(path: string, text: string) edits a file; ";
  return s;
}

struct Server {
  std::unique_ptr<test::ServeProcess> proc;
  Server(const fs::path& model, const std::string& log, std::vector<std::string> extra) {
    std::vector<std::string> args = {"-m", model.string(), "--threads", "1", "--kv-cache-gb", "0.05",
                                     "--page-size", "16", "--served-model-name", "tiny"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc = std::make_unique<test::ServeProcess>(log, args);
  }
  json post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", proc->port);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    if (!r) return json{{"error", "no response"}};
    return json::parse(r->body, nullptr, false);
  }
  std::string metrics() const {
    httplib::Client c("127.0.0.1", proc->port);
    auto r = c.Get("/metrics");
    return r ? r->body : "";
  }
  // SIGTERM and the exit status (the disk writes are finished on the way out).
  int stop() {
    ::kill(proc->pid, SIGTERM);
    int st = 0;
    waitpid(proc->pid, &st, 0);
    proc->pid = 0;
    return st;
  }
  void kill9() {
    ::kill(proc->pid, SIGKILL);
    waitpid(proc->pid, nullptr, 0);
    proc->pid = 0;
  }
};

int64_t metric(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stoll(body.substr(at + name.size() + 2));
}

json turn(const std::string& user) {
  return {{"model", "tiny"},
          {"messages", {{{"role", "system"}, {"content", system_prompt()}}, {{"role", "user"}, {"content", user}}}},
          {"max_tokens", 8},
          {"temperature", 0}};
}

std::string content(const json& r) {
  return r.contains("choices") ? r["choices"][0]["message"]["content"].get<std::string>() : r.dump();
}
int64_t cached(const json& r) { return r.value("/usage/prompt_tokens_details/cached_tokens"_json_pointer, int64_t(-1)); }

struct PromptCacheServe : ::testing::Test {
  test::TempDir dir{"prompt-cache-serve"};
  fs::path model = dir.path / "model", cache = dir.path / "cache";
  void SetUp() override {
    fs::create_directories(model);
    test::make_served_model(model, 4096);
    json cfg = json::parse(read_all((model / "tokenizer_config.json").string()));
    cfg["chat_template"] = kTemplate;
    std::ofstream(model / "tokenizer_config.json") << cfg.dump(1);
  }
  std::vector<std::string> on_disk(std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"--cache-dir", cache.string(), "--cache-ram-gb", "0.01"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // The answer of a server without any prompt cache.
  json cold(const json& body, const std::string& path = "/v1/chat/completions") {
    Server s(model, dir / "cold.log", {"--no-prefix-cache"});
    EXPECT_GT(s.proc->port, 0) << s.proc->log_text();
    return s.post(path, body);
  }
};

TEST_F(PromptCacheServe, ARestartAnswersTheNextTurnFromDiskAndReportsIt) {
  const json first = turn("Read main.cpp."), second = turn("Now fix the bug in main.cpp, line 12.");
  const json cold_second = cold(second);
  ASSERT_TRUE(cold_second.contains("choices")) << cold_second.dump();
  {
    Server s(model, dir / "one.log", on_disk());
    ASSERT_GT(s.proc->port, 0) << s.proc->log_text();
    EXPECT_NE(s.proc->log_text().find("prompt cache: KV cache pages, then RAM"), std::string::npos)
        << "the tiers' sizes are in the start-up lines";
    const json r = s.post("/v1/chat/completions", first);
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    EXPECT_EQ(cached(r), 0);
    EXPECT_EQ(s.stop(), 0) << s.proc->log_text();
  }
  Server s(model, dir / "two.log", on_disk());
  ASSERT_GT(s.proc->port, 0) << s.proc->log_text();
  const json r = s.post("/v1/chat/completions", second);
  EXPECT_EQ(content(r), content(cold_second)) << "the answer from disk is the cold answer";
  const int64_t prompt = r["usage"]["prompt_tokens"];
  // Everything before the new user message (a few dozen tokens, and the page it starts in).
  EXPECT_GE(cached(r), prompt - 80) << "the first turn's pages came from disk";
  EXPECT_LT(cached(r), prompt);
  const std::string m = s.metrics();
  EXPECT_EQ(metric(m, "mla_prompt_cache_hit_tokens_total{tier=\"disk\"}"), cached(r)) << m;
  EXPECT_GT(metric(m, "mla_prompt_cache_bytes{tier=\"disk\"}"), 0);

  // Every endpoint reports what the cache served (now from the pool).
  const json completion = {{"model", "tiny"}, {"prompt", system_prompt()}, {"max_tokens", 2}};
  s.post("/v1/completions", completion);
  const json c = s.post("/v1/completions", completion);
  EXPECT_GT(c.value("/usage/prompt_tokens_details/cached_tokens"_json_pointer, int64_t(0)), 0) << c.dump();
  const json msg = s.post("/v1/messages", {{"model", "tiny"}, {"max_tokens", 4}, {"system", system_prompt()},
                                           {"messages", {{{"role", "user"}, {"content", "Read main.cpp."}}}}});
  EXPECT_GT(msg.value("/usage/cache_read_input_tokens"_json_pointer, int64_t(0)), 0) << msg.dump();
  const json resp = s.post("/v1/responses", {{"model", "tiny"}, {"max_output_tokens", 4}, {"instructions", system_prompt()},
                                             {"input", "Read main.cpp."}});
  EXPECT_GT(resp.value("/usage/input_tokens_details/cached_tokens"_json_pointer, int64_t(0)), 0) << resp.dump();
}

TEST_F(PromptCacheServe, AKillCorruptFilesAndAnotherFormatNeverChangeAnAnswer) {
  const json body = turn("List the files.");
  const json reference = cold(body);
  ASSERT_TRUE(reference.contains("choices")) << reference.dump();
  {
    Server s(model, dir / "killed.log", on_disk());
    ASSERT_GT(s.proc->port, 0) << s.proc->log_text();
    EXPECT_EQ(content(s.post("/v1/chat/completions", body)), content(reference));
    s.kill9();  // whatever the writer had not finished is lost, never half-written
  }
  {
    Server s(model, dir / "after-kill.log", on_disk());
    ASSERT_GT(s.proc->port, 0) << s.proc->log_text();
    EXPECT_EQ(content(s.post("/v1/chat/completions", body)), content(reference)) << "after a SIGKILL";
    EXPECT_EQ(metric(s.metrics(), "mla_prompt_cache_disk_rejected_total"), 0);
    EXPECT_EQ(s.stop(), 0);
  }
  // Every segment file spoiled: one flipped byte in its first page.
  int64_t files = 0;
  for (auto& e : fs::recursive_directory_iterator(cache))
    if (e.path().extension() == ".seg") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      uint32_t page_size = 0;
      uint64_t pages = 0;
      f.seekg(12);  // the header: magic, version, page size, page count (kv/disk_tier.cpp)
      f.read(reinterpret_cast<char*>(&page_size), 4);
      f.read(reinterpret_cast<char*>(&pages), 8);
      const int64_t at = DiskTier::payload_offset(int64_t(pages), page_size) + 5;
      f.seekg(at);
      char ch;
      f.get(ch);
      f.seekp(at);
      f.put(char(ch ^ 1));
      ++files;
    }
  ASSERT_GT(files, 0);
  {
    Server s(model, dir / "corrupt.log", on_disk());
    ASSERT_GT(s.proc->port, 0) << s.proc->log_text();
    const json r = s.post("/v1/chat/completions", body);
    EXPECT_EQ(content(r), content(reference)) << "corrupted pages are recomputed";
    EXPECT_EQ(cached(r), 0);
    EXPECT_GT(metric(s.metrics(), "mla_prompt_cache_disk_rejected_total"), 0);
    EXPECT_NE(s.proc->log_text().find("checksum is wrong"), std::string::npos) << s.proc->log_text();
    EXPECT_EQ(s.stop(), 0);
  }
  // Another cache format on the same directory: its own pages, none of the bf16 ones.
  Server s(model, dir / "f32.log", on_disk({"--kv-dtype", "f32"}));
  ASSERT_GT(s.proc->port, 0) << s.proc->log_text();
  const json r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(cached(r), 0);
  EXPECT_EQ(metric(s.metrics(), "mla_prompt_cache_disk_rejected_total"), 0);
}

TEST_F(PromptCacheServe, BadCacheOptionsAreRefusedClearly) {
  const auto r = test::run_mla("serve -m " + model.string() + " --cache-disk-gb 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--cache-disk-gb needs --cache-dir"), std::string::npos) << r.output;
  const auto neg = test::run_mla("serve -m " + model.string() + " --cache-ram-gb -2");
  EXPECT_NE(neg.status, 0);
  EXPECT_NE(neg.output.find("--cache-ram-gb must not be negative"), std::string::npos) << neg.output;
}

}  // namespace
}  // namespace mla
