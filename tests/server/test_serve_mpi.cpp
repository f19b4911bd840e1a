// `mla serve` under `mpirun -np 2` and `-np 3` on 127.0.0.1 (engine/lockstep.h): the same
// greedy text as one process for concurrent requests (chunked prompts, a shared prefix), and
// the job's failures: a killed rank, a hung rank (stopped: MLA_RANK_TIMEOUT), each answered
// 503 or an error event and ending the whole job with an error, never a hang; a SIGTERM to
// mpirun ends an idle job. Skipped, saying why, without MPI or mpirun.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/comm.h"
#include "server/serve_process.h"
#include "test_util.h"

namespace mla {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string mpirun_missing() {
  if (!parallel::mpi_built()) return "this build has no MPI layer (libopenmpi-dev not found at configure)";
  if (test::run_command("command -v mpirun >/dev/null").status != 0) return "mpirun is not installed (openmpi-bin)";
  return "";
}

// mpirun for n ranks on this host; extra: "-x NAME=VALUE" options. OpenMPI refuses to run as
// root unless told (CI runs as root).
std::vector<std::string> mpirun(int n, std::vector<std::string> extra = {}) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::vector<std::string> l = {"mpirun", "--oversubscribe", "--bind-to", "none", "-np", std::to_string(n),
                                "-H", "127.0.0.1:" + std::to_string(n)};
  l.insert(l.end(), extra.begin(), extra.end());
  return l;
}

// The rank processes mpirun started (its children), by rank.
std::vector<pid_t> ranks_of(pid_t mpirun_pid, int n) {
  std::vector<pid_t> pids(size_t(n), 0);
  const auto r = test::run_command("pgrep -P " + std::to_string(mpirun_pid));
  std::istringstream in(r.output);
  for (pid_t p; in >> p;) {
    std::ifstream env("/proc/" + std::to_string(p) + "/environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    for (int k = 0; k < n; ++k)
      if (all.find("OMPI_COMM_WORLD_RANK=" + std::to_string(k) + '\0') != std::string::npos) pids[size_t(k)] = p;
  }
  return pids;
}

// A server (one process, or mpirun's job) whose rank processes are killed on every way out.
struct Job {
  std::unique_ptr<test::ServeProcess> proc;
  std::vector<pid_t> ranks;
  Job(const std::string& log, const std::vector<std::string>& args, int n, std::vector<std::string> extra = {}) {
    proc = std::make_unique<test::ServeProcess>(log, args, 0, n > 1 ? mpirun(n, std::move(extra)) : std::vector<std::string>{});
    if (n > 1 && proc->pid > 0) ranks = ranks_of(proc->pid, n);
  }
  ~Job() {
    for (pid_t p : ranks)
      if (p > 0) ::kill(p, SIGKILL);
  }
  int port() const { return proc->port; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", proc->port);
    c.set_read_timeout(120, 0);
    return c;
  }
  // The launcher's wait status once it exits within ms, or -1.
  int wait_exit(int ms) {
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::milliseconds(ms)) {
      int st = 0;
      if (waitpid(proc->pid, &st, WNOHANG) == proc->pid) {
        proc->pid = 0;
        return st;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
};

std::string completion(const Job& job, const std::string& prompt, int max_tokens) {
  auto r = job.client().Post("/v1/completions",
                             json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump(),
                             "application/json");
  if (!r) return "<no answer>";
  if (r->status != 200) return "<" + std::to_string(r->status) + "> " + r->body;
  return json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

// Four requests at once: prompts read in chunks of 16 tokens beside the others' decoding, two
// of them sharing a prefix.
std::vector<std::string> four_answers(const Job& job) {
  const std::vector<std::string> prompts = {
      "The old lighthouse keeper", "Once upon a time, in a small village by the sea, there lived a fisherman who",
      "Once upon a time, in a small village by the sea, there lived a baker who", "Why is the sky"};
  std::vector<std::future<std::string>> f;
  for (const auto& p : prompts) f.push_back(std::async(std::launch::async, [&job, p] { return completion(job, p, 24); }));
  std::vector<std::string> out;
  for (auto& x : f) out.push_back(x.get());
  return out;
}

std::vector<std::string> trained_model_args() {
  return {"-m", (test::source_dir() / "models/mla-tiny-en").string(), "--threads", "1", "--max-batch-tokens", "16",
          "--kv-cache-gb", "0.01"};
}

TEST(MpiServe, SameGreedyTextAsOneProcessWithTwoAndThreeRanks) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi-serve");
  std::vector<std::string> alone;
  {
    Job one(tmp / "one.log", trained_model_args(), 1);
    ASSERT_GT(one.port(), 0) << test::read_all(tmp / "one.log");
    alone = four_answers(one);
  }
  for (const std::string& a : alone) ASSERT_FALSE(a.empty() || a[0] == '<') << a;
  for (int n : {2, 3}) {
    const std::string log = tmp / ("np" + std::to_string(n) + ".log");
    Job job(log, trained_model_args(), n);
    ASSERT_GT(job.port(), 0) << test::read_all(log);
    EXPECT_EQ(four_answers(job), alone) << n << " ranks";
    // Each rank holds its block of the 16 experts only.
    const std::string text = test::read_all(log);
    EXPECT_NE(text.find("rank " + std::to_string(n - 1) + " of " + std::to_string(n) + " holds routed experts"),
              std::string::npos)
        << text;
  }
}

// The prompt cache's disk tier is rank 0's: a job restarted on the same --cache-dir answers
// from disk (the pages rank 0 reads are sent to the other ranks) with one process's text.
TEST(MpiServe, RestartedJobAnswersFromTheDiskTier) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi-serve-disk");
  const std::string prompt =
      "Once upon a time, in a small village by the sea, there lived a fisherman who went out every morning "
      "before the sun rose, and came back every evening with his boat full of fish for the market. His wife "
      "sold the fish in the town, and his children mended the nets on the beach";  // 80-odd tokens: a full page
  std::vector<std::string> args = trained_model_args();
  for (std::string a : {std::string("--cache-dir"), std::string(tmp / "cache"), std::string("--cache-ram-gb"), std::string("0")}) args.push_back(a);
  const std::string alone = [&] {
    Job one(tmp / "one.log", trained_model_args(), 1);
    return completion(one, prompt, 12);
  }();
  ASSERT_FALSE(alone.empty() || alone[0] == '<') << alone;
  for (int run = 0; run < 2; ++run) {
    const std::string log = tmp / ("np2-" + std::to_string(run) + ".log");
    Job job(log, args, 2);
    ASSERT_GT(job.port(), 0) << test::read_all(log);
    auto r = job.client().Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}.dump(),
                               "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    const json body = json::parse(r->body);
    EXPECT_EQ(body["choices"][0]["text"], alone) << "run " << run;
    const int64_t cached = body["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (run == 0) EXPECT_EQ(cached, 0);
    else EXPECT_GE(cached, 64) << "the restarted job should read the prompt's first page from disk";
    ASSERT_EQ(::kill(job.proc->pid, SIGTERM), 0);
    ASSERT_NE(job.wait_exit(20000), -1) << "the job still runs 20 s after SIGTERM";
  }
}

// deepseek-v3-tiny with 4,096 positions: a stream long enough to be in flight when a rank goes.
struct LongModel {
  test::TempDir dir{"mpi-serve-long"};
  LongModel() { test::make_served_model(dir.path, 4096); }
  std::vector<std::string> args() const { return {"-m", dir.str(), "--threads", "1", "--kv-cache-gb", "0.05"}; }
};

// A streamed request of many tokens on its own thread: what came back, until the server closed.
struct LongStream {
  test::RawConnection raw;
  std::string text;
  std::thread reader;
  explicit LongStream(int port) : raw(port) {
    raw.send(test::post_request("/v1/completions",
                                json{{"prompt", "a long story"}, {"max_tokens", 4000}, {"ignore_eos", true},
                                     {"stream", true}, {"temperature", 0}}
                                    .dump(),
                                "Connection: close\r\n"));
    reader = std::thread([this] { text = raw.read_all(60000); });
  }
  ~LongStream() {
    if (reader.joinable()) reader.join();
  }
};

// Waits until the stream has sent tokens (up to 60 s).
bool streaming(const Job& job) {
  for (int i = 0; i < 3000; ++i) {
    auto m = job.client().Get("/metrics");
    if (m && m->body.find("\nmla_generation_tokens_total 0\n") == std::string::npos &&
        m->body.find("\nmla_generation_tokens_total ") != std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(MpiServe, KilledRankAnswersTheRequestsInFlightAndEndsTheJob) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  LongModel model;
  const std::string log = model.dir / "serve.log";
  Job job(log, model.args(), 2);
  ASSERT_GT(job.port(), 0) << test::read_all(log);
  ASSERT_EQ(job.ranks.size(), 2u);
  ASSERT_GT(job.ranks[1], 0);
  LongStream stream(job.port());
  ASSERT_TRUE(streaming(job)) << test::read_all(log);
  ASSERT_EQ(::kill(job.ranks[1], SIGKILL), 0);
  const auto killed = Clock::now();
  const int st = job.wait_exit(30000);
  ASSERT_NE(st, -1) << "the job still runs 30 s after a rank was killed";
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the job ended with status 0";
  stream.reader.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - killed).count(), 30.0);
  // The stream was cut with an error event and its terminator (rank 0 answered before it went).
  EXPECT_NE(stream.text.find("\"error\""), std::string::npos) << stream.text.substr(stream.text.size() > 600 ? stream.text.size() - 600 : 0);
  EXPECT_NE(stream.text.find("data: [DONE]"), std::string::npos);
}

TEST(MpiServe, HungRankEndsTheJobAtTheTimeoutWith503) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  LongModel model;
  const std::string log = model.dir / "serve.log";
  Job job(log, model.args(), 2, {"-x", "MLA_RANK_TIMEOUT=2"});
  ASSERT_GT(job.port(), 0) << test::read_all(log);
  ASSERT_GT(job.ranks.at(1), 0);
  ASSERT_EQ(completion(job, "warm", 4).find('<'), std::string::npos);  // the job works
  ASSERT_EQ(::kill(job.ranks[1], SIGSTOP), 0);
  const auto stopped = Clock::now();
  auto r = job.client().Post("/v1/completions", json{{"prompt", "hello"}, {"max_tokens", 8}}.dump(), "application/json");
  const double waited = std::chrono::duration<double>(Clock::now() - stopped).count();
  ASSERT_TRUE(r) << test::read_all(log);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_GE(waited, 1.5);
  EXPECT_LT(waited, 30.0);
  const int st = job.wait_exit(30000);
  ASSERT_NE(st, -1) << "the job still runs after the timeout";
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_NE(test::read_all(log).find("MLA_RANK_TIMEOUT"), std::string::npos) << test::read_all(log);
}

TEST(MpiServe, SigtermEndsAnIdleJob) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi-serve-term");
  const std::string log = tmp / "serve.log";
  Job job(log, trained_model_args(), 2);
  ASSERT_GT(job.port(), 0) << test::read_all(log);
  ASSERT_EQ(completion(job, "Hello", 4).find('<'), std::string::npos);
  ASSERT_EQ(::kill(job.proc->pid, SIGTERM), 0);
  const int st = job.wait_exit(20000);
  ASSERT_NE(st, -1) << "the job still runs 20 s after SIGTERM";
  EXPECT_NE(test::read_all(log).find("stopped after"), std::string::npos) << test::read_all(log);
}

}  // namespace
}  // namespace mla
