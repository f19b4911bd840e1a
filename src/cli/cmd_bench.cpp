// `mla bench`: decode, prompt-processing and batched-decode throughput on a random-weight
// checkpoint of DeepSeek-V2-Lite's shape, against the memory bandwidth measured in the same run.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/bench.h"

namespace {

// libgomp's default wait policy spins each idle thread for about 300,000 iterations after every
// parallel region. On a machine whose cores are shared (virtual CPUs, other jobs) the spinning
// thread takes the core from the one doing the work: decode measured 2-3x slower here. The
// policy is read once at startup, so `mla bench` re-executes itself with a short spin
// (GOMP_SPINCOUNT=10000, then sleep) unless the environment already chose one.
void choose_wait_policy() {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv("MLA_BENCH_REEXEC")) return;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t i = 0; i < all.size();) {
    size_t j = all.find('\0', i);
    if (j == std::string::npos) j = all.size();
    args.push_back(all.substr(i, j - i));
    i = j + 1;
  }
  if (args.empty()) return;
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  setenv("GOMP_SPINCOUNT", "10000", 0);
  setenv("MLA_BENCH_REEXEC", "1", 1);
  execv("/proc/self/exe", av.data());  // returns only on failure: carry on with the default
}

int run(int argc, char** argv) {
  CLI::App app{"CPU throughput on a random-weight checkpoint of DeepSeek-V2-Lite's shape (written on first use)",
               "mla bench"};
  mla::bench::Options o;
  app.add_option("--dir", o.dir, "checkpoint folder (default: <tmp>/mla-bench-v2lite-<L>L-<weights>); reused when present");
  app.add_option("--layers", o.layers, "layers (the first dense, the rest MoE)");
  app.add_option("--weights", o.weights, "bf16 | fp8 (block-128 FP8 projections) | int4 (INT4 routed experts)");
  app.add_option("--threads", o.threads, "CPU threads (default: all)");
  app.add_option("--runs", o.runs, "timed runs per figure, after one warm-up run");
  app.add_option("--decode-tokens", o.decode_tokens, "tokens per decode run (0: skip)");
  app.add_option("--prompt-tokens", o.prompt_tokens, "tokens of the prompt-processing run (0: skip)");
  app.add_option("--batches", o.batches, "batch sizes of the batched decode (0: skip)")->delimiter(',');
  app.add_option("--batch-steps", o.batch_steps, "decode steps per batched run");
  app.add_option("--precision", o.precision,
                 "fast (bf16 AMX GEMMs for prompt-sized products) | precise (float32 everywhere)");
  app.add_option("--huge-pages", o.huge_pages,
                 "auto | on | off: copy the weights onto transparent huge pages at load (auto: when they take "
                 "under half the available memory)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::erase(o.batches, 0);
  choose_wait_policy();
  auto rep = mla::bench::run(o);
  std::fputs(mla::bench::format_report(rep).c_str(), stdout);
  return 0;
}

mla::cli::Command reg("bench", "CPU decode / prompt / batched throughput against the memory-bandwidth limit", run);

}  // namespace
