// `mla bench` under `mpirun -np 2`: a random checkpoint of the deepseek-v3-tiny fixture's config
// (hidden 128, 16 routed experts, top-4; --config), written by rank 0 while rank 1 waits, the
// shortest runs and the smallest probes; then the same bench in one process on that checkpoint.
// Rank 0's report must hold each rank's line, and the figures must add up to one process's:
// the two ranks' weights to one process's plus its replicated part once more, their routed
// experts run per decode step to top_k, the combine to the bytes the MoE layers exchange.
// About 3 s on 2 shared cores. Skips, saying why, when the build has no MPI or mpirun is not
// installed.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/comm.h"
#include "test_util.h"

namespace mla {
namespace {

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

// The number after `label` in `text` (the first match), or -1.
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + label.size()));
}

TEST(MpiBench, EachRanksWeightsAndCombineAddUpToOneProcess) {
  if (auto why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir tmp("mpi-bench");
  const std::string config = test::fixture("deepseek-v3-tiny") + "/config.json";
  nlohmann::json c;
  std::ifstream(config) >> c;
  const int64_t layers = c["num_hidden_layers"], dense = c["first_k_dense_replace"], E = c["n_routed_experts"],
                top_k = c["num_experts_per_tok"], H = c["hidden_size"], I = c["moe_intermediate_size"];
  const int64_t prompt = 32;
  const std::string args = " bench --config " + config + " --dir " + tmp.str() + "/ckpt --layers " +
                           std::to_string(layers) + " --threads 1 --runs 1 --decode-tokens 4 --context 8 --prompt-tokens " +
                           std::to_string(prompt) + " --batches 1 --batch-steps 1 --bandwidth-mib 1 --gemm-n 128 "
                           "--huge-pages off";
  // Two ranks first: rank 0 writes the checkpoint. The speculative rows (on by default) are skipped.
  const std::string mla = std::string("'") + MLA_BINARY + "'";
  auto two = test::run_command(mpirun(2) + mla + args + " 2>" + (tmp / "err"));
  std::ifstream err(tmp / "err");
  const std::string log((std::istreambuf_iterator<char>(err)), {});
  ASSERT_EQ(two.status, 0) << two.output << log;
  const std::string& out = two.output;
  auto one = test::run_command(mla + args + " --spec-tokens 0 2>/dev/null");
  ASSERT_EQ(one.status, 0) << one.output;

  // The report once (rank 1's standard output goes to /dev/null), with the skipped part named.
  EXPECT_EQ(out.find("mla bench:"), out.rfind("mla bench:")) << out;
  EXPECT_NE(out.find("2 ranks (expert-parallel"), std::string::npos) << out;
  EXPECT_NE(out.find("skipped under mpirun: the speculative decoding rows"), std::string::npos) << out;
  EXPECT_EQ(log.find("writing a random"), log.rfind("writing a random")) << log;  // rank 0 alone wrote it

  // Routed experts in one process, from the config: every MoE layer's and the MTP module's (the
  // bench adds one MoE layer), gate, up and down of H x I in bf16.
  const double routed = double(layers - dense + 1) * double(E) * 3 * double(H) * double(I) * 2 / 1e6;
  const double held_one = number_after(one.output, "weights held: ");
  EXPECT_NEAR(number_after(one.output, "of which routed experts "), routed, 0.002) << one.output;
  double held_sum = 0, experts_sum = 0;
  for (int k = 0; k < 2; ++k) {
    char name[32], range[80];
    std::snprintf(name, sizeof name, "rank %d", k);
    std::snprintf(range, sizeof range, "rank %d: routed experts [%lld, %lld)", k, (long long)(E * k / 2),
                  (long long)(E * (k + 1) / 2));
    const std::string r = name;
    EXPECT_NE(out.find(range), std::string::npos) << out;
    const std::string line = out.substr(out.find(r + ": routed experts"));
    held_sum += number_after(line, "weights held ");
    EXPECT_NEAR(number_after(line, "(routed experts "), routed / 2, 0.002) << line;
    // "a decode step reads X MB (Y routed experts per MoE layer)": the experts this rank ran.
    experts_sum += number_after(line.substr(line.find("a decode step reads")), " MB (");
    // The combine: each MoE layer's [T, H] float partial sums from the other rank, per token.
    const double per_token = double(layers - dense) * double(H) * 4 / 1e6;
    EXPECT_NEAR(number_after(out, r + " per decode step: combine "), per_token, 0.001) << out;
    EXPECT_NEAR(number_after(out, r + " per prompt of " + std::to_string(prompt) + " tokens: combine "),
                per_token * double(prompt), 0.001)
        << out;
  }
  // Each rank holds the replicated weights and half the routed experts.
  EXPECT_NEAR(held_sum, 2 * held_one - routed, 0.004) << out << one.output;
  // A decode step's top_k experts per MoE layer, each run by the one rank that holds it.
  EXPECT_NEAR(experts_sum, double(top_k), 0.02) << out;
}

}  // namespace
}  // namespace mla
