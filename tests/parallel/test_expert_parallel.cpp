// Expert parallelism (parallel/): the expert blocks, the rank-order sum and the start checks
// through a simulated world; then the mla program under `mpirun -np 2` and `-np 3` on
// 127.0.0.1, whose logits must equal one process's on every fixture family, and a job whose
// rank is killed, which must end with an error. The mpirun tests skip, saying why, when the
// build has no MPI or mpirun is not installed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "parallel/comm.h"
#include "parallel/expert_parallel.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace mla {
namespace {

using parallel::ExpertRange;

TEST(ExpertParallel, RangesTileTheExpertsInContiguousBlocks) {
  for (int64_t E : {1, 7, 24, 64, 256, 384}) {
    EXPECT_TRUE(parallel::expert_range(E, 0, 1).all());
    for (int N = 2; N <= 8; ++N) {
      int64_t next = 0;
      for (int r = 0; r < N; ++r) {
        const ExpertRange x = parallel::expert_range(E, r, N);
        EXPECT_EQ(x.begin, next) << E << " experts, rank " << r << " of " << N;
        EXPECT_GE(x.end, x.begin);
        EXPECT_LE(x.end - x.begin, (E + N - 1) / N);  // balanced: no rank more than its share
        EXPECT_GE(x.end - x.begin, E / N);
        for (int64_t e = 0; e < E; ++e) EXPECT_EQ(x.has(e), e >= x.begin && e < x.end);
        next = x.end;
      }
      EXPECT_EQ(next, E);
    }
  }
  EXPECT_THROW(parallel::expert_range(8, 2, 2), std::invalid_argument);
}

// One rank of a simulated world of `parts.size()` ranks: allgather returns the given buffers.
class FakeComm : public parallel::Comm {
 public:
  FakeComm(int rank, std::vector<std::string> parts) : rank_(rank), parts_(std::move(parts)) {}
  int rank() const override { return rank_; }
  int size() const override { return int(parts_.size()); }
  void allgather(const void* mine, size_t bytes, void* all) override {
    EXPECT_EQ(std::memcmp(mine, parts_[size_t(rank_)].data(), bytes), 0);
    for (size_t r = 0; r < parts_.size(); ++r) {
      ASSERT_EQ(parts_[r].size(), bytes);
      std::memcpy(static_cast<char*>(all) + r * bytes, parts_[r].data(), bytes);
    }
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  int rank_;
  std::vector<std::string> parts_;
};

std::string bytes_of(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// Every rank ends with the same sum, added in rank order: values chosen so that another order
// rounds differently.
TEST(ExpertParallel, SumInRankOrderGivesEveryRankTheSameRankOrderSum) {
  const std::vector<std::vector<float>> parts = {{1.0f, 1.0f, -3.5f}, {1e8f, 1e8f, 2.25f}, {-1e8f, -1e8f, 1e-3f}};
  std::vector<float> want(3);
  for (size_t i = 0; i < 3; ++i) want[i] = (parts[0][i] + parts[1][i]) + parts[2][i];
  ASSERT_NE(want[0], parts[0][0] + (parts[1][0] + parts[2][0]));  // the order matters for these values
  std::vector<std::string> raw;
  for (auto& p : parts) raw.push_back(bytes_of(p));
  for (int r = 0; r < 3; ++r) {
    FakeComm comm(r, raw);
    std::vector<float> buf = parts[size_t(r)], scratch;
    parallel::sum_in_rank_order(comm, buf.data(), 3, scratch);
    EXPECT_EQ(bytes_of(buf), bytes_of(want)) << "rank " << r;
  }
}

TEST(ExpertParallel, RanksWithDifferentCheckpointsRefuseToStart) {
  auto pad = [](std::string s) {
    s.resize(128, '\0');
    return s;
  };
  FakeComm same(1, {pad("abc"), pad("abc")});
  EXPECT_NO_THROW(parallel::require_same_on_all_ranks(same, "checkpoint", "abc"));
  FakeComm differ(0, {pad("abc"), pad("abd"), pad("abc")});
  try {
    parallel::require_same_on_all_ranks(differ, "checkpoint", "abc");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("different checkpoints"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 has abd"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("rank 2"), std::string::npos) << msg;
  }
}

// ---- the mla program under mpirun

// Why the mpirun tests cannot run here, or empty.
std::string mpirun_missing() {
  if (!parallel::mpi_built()) return "this build has no MPI layer (libopenmpi-dev not found at configure)";
  if (test::run_command("command -v mpirun >/dev/null").status != 0) return "mpirun is not installed (openmpi-bin)";
  return "";
}

// N ranks of the mla program on this host. OpenMPI refuses to run as root unless told.
std::string mpirun(int n) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 "
         "mpirun --oversubscribe --bind-to none -np " + std::to_string(n) + " -H 127.0.0.1:" + std::to_string(n) + " ";
}

std::string fixture_dir(const std::string& family) {
  if (family == "deepseek-v3.2-tiny" || family == "glm-5-tiny")  // DeepSeek Sparse Attention
    return (test::source_dir() / "tests/fixtures" / family).string();
  return test::fixture(family);
}

std::vector<std::string> families() {
  auto all = test::model_fixtures();
  all.push_back("deepseek-v3.2-tiny");
  all.push_back("glm-5-tiny");
  return all;
}

std::vector<float> logits_of(const std::string& file) {
  SafetensorsFile f(file);
  const TensorInfo* t = f.find("logits");
  if (!t) throw std::runtime_error(file + " has no logits");
  return test::read_f32(*t);
}

class MpiLogits : public ::testing::TestWithParam<std::string> {};

// The expert split changes only the order the experts' outputs are added in (each rank's
// partial sum, then the ranks' sums), so the logits agree with one process's to float32
// rounding: 1e-5.
TEST_P(MpiLogits, EqualOneProcessWithTwoAndThreeRanks) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = fixture_dir(GetParam());
  SafetensorsFile golden(dir + "/golden.safetensors");
  std::string ids;
  for (int32_t id : test::read_ids(*golden.find("seq1_ids"))) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  test::TempDir tmp("mpi");
  const std::string args = "logits -m " + dir + " --ids " + ids + " --threads 1 --out ";
  auto one = test::run_mla(args + (tmp / "one.safetensors"));
  ASSERT_EQ(one.status, 0) << one.output;
  const auto want = logits_of(tmp / "one.safetensors");
  for (int n : {2, 3}) {
    const std::string out = tmp / ("np" + std::to_string(n) + ".safetensors");
    auto r = test::run_command(mpirun(n) + "'" + MLA_BINARY + "' " + args + out, true);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_LE(test::max_abs_diff(logits_of(out), want), 1e-5f) << n << " ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MpiLogits, ::testing::ValuesIn(families()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// Decode (one token per pass, the absorb path) also agrees, and every rank but 0 stays silent.
TEST(MpiRun, DecodeModeEqualsOneProcessAndOnlyRankZeroPrints) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = test::fixture("deepseek-v3-tiny");
  test::TempDir tmp("mpi");
  const std::string args = "logits -m " + dir + " --ids 5,17,300,2,99,41,7,250 --mode decode --threads 1 --out ";
  auto one = test::run_mla(args + (tmp / "one.safetensors"));
  ASSERT_EQ(one.status, 0) << one.output;
  auto r = test::run_command(mpirun(2) + "'" + MLA_BINARY + "' " + args + (tmp / "two.safetensors") + " && " + mpirun(2) +
                             "'" + MLA_BINARY + "' verify -m " + dir + " --random 8 --decode 2 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_LE(test::max_abs_diff(logits_of(tmp / "two.safetensors"), logits_of(tmp / "one.safetensors")), 1e-5f);
  // verify's report, once: rank 1's standard output goes to /dev/null.
  size_t reports = 0;
  for (size_t at = r.output.find("mla verify "); at != std::string::npos; at = r.output.find("mla verify ", at + 1)) ++reports;
  EXPECT_EQ(reports, 1u) << r.output;
}

// A GGUF file, its routed experts one view each into the stacked tensor of a K-quant, splits
// across ranks as a folder does: each rank reads its block of the experts.
TEST(MpiRun, GgufFileEqualsOneProcess) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::string file = (test::source_dir() / "tests/fixtures/gguf/kquant-tiny-q4_k_m.gguf").string();
  test::TempDir tmp("mpi");
  for (const char* mode : {"prefill", "decode"}) {
    const std::string args =
        std::string("logits -m ") + file + " --ids 5,17,300,2,99,41,7,250 --mode " + mode + " --threads 1 --out ";
    auto one = test::run_mla(args + (tmp / "one.safetensors"));
    ASSERT_EQ(one.status, 0) << one.output;
    auto r = test::run_command(mpirun(2) + "'" + MLA_BINARY + "' " + args + (tmp / "two.safetensors"), true);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_LE(test::max_abs_diff(logits_of(tmp / "two.safetensors"), logits_of(tmp / "one.safetensors")), 1e-5f) << mode;
  }
}

// `mla run` with MTP speculative decoding (the MTP module's MoE layer is split too): the same
// greedy text on two ranks as in one process, printed once, and each rank's figures at the end.
TEST(MpiRun, SpeculativeRunGivesOneProcessText) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi");
  const std::string src = test::fixture("deepseek-v3-tiny");  // has an MTP layer
  for (const char* f : {"config.json", "model.safetensors"}) std::filesystem::copy_file(src + "/" + f, tmp / f);
  Tokenizer::write_byte_level_tokenizer(tmp.str(), 512);  // the fixture's vocabulary
  const std::string args = " run -m " + tmp.str() + " -p 'Latent attention' -n 12 --temperature 0 --ignore-eos "
                           "--speculative mtp --no-adaptive-speculation --threads 1";
  auto one = test::run_command("'" + std::string(MLA_BINARY) + "'" + args + " 2>/dev/null");
  ASSERT_EQ(one.status, 0);
  ASSERT_FALSE(one.output.empty());
  auto two = test::run_command(mpirun(2) + "'" + MLA_BINARY + "'" + args + " 2>" + (tmp / "err"));
  std::ifstream err(tmp / "err");
  const std::string log((std::istreambuf_iterator<char>(err)), {});
  ASSERT_EQ(two.status, 0) << log;
  EXPECT_EQ(two.output, one.output);
  EXPECT_NE(log.find("rank 1     experts [8, 16)"), std::string::npos) << log;
  EXPECT_NE(log.find("speculative "), std::string::npos) << log;  // the MTP drafts ran
}

// `mla chat` reads its lines on rank 0 only (mpirun gives standard input to rank 0): the other
// ranks replay rank 0's passes (engine/lockstep.h), and the replies are one process's.
TEST(MpiChat, ThreeRanksReplyAsOneProcess) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::string args = " chat -m '" + (test::source_dir() / "models/mla-tiny-en").string() +
                           "' --threads 1 --temperature 0 -n 16 -q 2>/dev/null";
  const std::string input = "printf 'Tell me about the sea.\\nAnd the sky?\\n' | ";
  auto one = test::run_command(input + "'" + MLA_BINARY + "'" + args);
  ASSERT_EQ(one.status, 0);
  ASSERT_GT(one.output.size(), 10u);
  auto three = test::run_command(input + mpirun(3) + "'" + MLA_BINARY + "'" + args);
  ASSERT_EQ(three.status, 0) << three.output;
  EXPECT_EQ(three.output, one.output);
}

// Ranks started on different checkpoints refuse to run, every one of them, naming the ranks.
TEST(MpiRun, RanksOnDifferentCheckpointsRefuse) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi");
  std::ofstream(tmp / "rank.sh") << "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then m=" << test::fixture("deepseek-v3-yarn-tiny")
                                 << "; else m=" << test::fixture("deepseek-v3-tiny") << "; fi\nexec '" << MLA_BINARY
                                 << "' logits -m $m --ids 1,2,3 --threads 1 --out " << (tmp / "l.safetensors") << "\n";
  auto r = test::run_command(mpirun(2) + "sh " + (tmp / "rank.sh"), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("run on different checkpoints: rank 0 has"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 has"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp / "l.safetensors"));
}

// A rank killed in the middle of a job ends the whole job with a non-zero status, soon, instead
// of leaving the other rank waiting in a collective.
TEST(MpiRun, KilledRankEndsTheJobWithAnError) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi");
  // Each rank writes its process id, then becomes mla (exec keeps the id); verify runs for
  // seconds on two ranks (a 200-token prompt and 48 decode steps, in five modes).
  std::ofstream(tmp / "rank.sh") << "echo $$ > " << tmp.str() << "/pid.$OMPI_COMM_WORLD_RANK\nexec '" << MLA_BINARY
                                 << "' verify -m " << test::fixture("deepseek-v3-tiny") << " --random 200 --decode 48 --threads 1\n";
  const std::string status_file = tmp / "status";
  const std::string job = "( " + mpirun(2) + "sh " + (tmp / "rank.sh") + " > " + (tmp / "log") + " 2>&1; echo $? > " +
                          status_file + " ) &";
  ASSERT_EQ(std::system(job.c_str()), 0);
  auto read_int = [](const std::string& path) {
    std::ifstream f(path);
    long v = -1;
    return (f >> v) ? v : -1L;
  };
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  long pid1 = -1;
  while ((pid1 = read_int(tmp / "pid.1")) <= 0 || read_int(tmp / "pid.0") <= 0) {
    ASSERT_LT(clock::now() - t0, std::chrono::seconds(60)) << "the ranks did not start";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into the model load or the run
  ASSERT_EQ(read_int(status_file), -1) << "the job ended before the kill: make it longer";
  ASSERT_EQ(::kill(pid_t(pid1), SIGKILL), 0);
  const auto killed = clock::now();
  long status = -1;
  while ((status = read_int(status_file)) < 0) {
    ASSERT_LT(clock::now() - killed, std::chrono::seconds(30)) << "the job still runs 30 s after a rank was killed";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double took = std::chrono::duration<double>(clock::now() - killed).count();
  EXPECT_NE(status, 0);
  EXPECT_LT(took, 10.0);
  std::ifstream log(tmp / "log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  std::printf("job ended %.2f s after rank 1 was killed, exit status %ld\n", took, status);
  EXPECT_EQ(text.find("Expand vs absorb"), std::string::npos) << "rank 0 finished its report: the kill came too late";
}

}  // namespace
}  // namespace mla
