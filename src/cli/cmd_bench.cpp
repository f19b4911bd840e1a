// `mla bench`: decode, prompt-processing and batched-decode throughput on a random-weight
// checkpoint of DeepSeek-V2-Lite's shape, against the memory bandwidth measured in the same run.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/options.h"
#include "tools/bench.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"CPU throughput on a random-weight checkpoint of DeepSeek-V2-Lite's shape (written on first use)",
               "mla bench"};
  mla::bench::Options o;
  app.add_option("--dir", o.dir, "checkpoint folder (default: <tmp>/mla-bench-v2lite-<L>L-<weights>); reused when present");
  app.add_option("--layers", o.layers, "layers (the first dense, the rest MoE)");
  app.add_option("--weights", o.weights, "bf16 | fp8 (block-128 FP8 projections) | int4 (INT4 routed experts) | int4-fp8 (INT4 routed experts, FP8 "
                 "projections: mla quantize's layout)");
  app.add_option("--threads", o.threads, "CPU threads (default: all)");
  app.add_option("--runs", o.runs, "timed runs per figure, after one warm-up run");
  app.add_option("--decode-tokens", o.decode_tokens, "tokens per decode run (0: skip)");
  app.add_option("--context", o.context, "tokens in the cache before decoding (a prompt of that length)");
  app.add_option("--prompt-tokens", o.prompt_tokens, "tokens of the prompt-processing run (0: skip)");
  app.add_option("--batches", o.batches, "batch sizes of the batched decode (0: skip)")->delimiter(',');
  app.add_option("--batch-steps", o.batch_steps, "decode steps per batched run");
  app.add_option("--precision", o.precision,
                 "fast (bf16 AMX GEMMs for prompt-sized products) | precise (float32 everywhere)");
  app.add_option("--huge-pages", o.huge_pages,
                 "auto | on | off: copy the weights onto transparent huge pages at load (auto: when they take "
                 "under half the available memory)");
  mla::cli::QuantizeOptions quantize;
  mla::cli::add_quantize_options(app, quantize);
  CLI11_PARSE(app, argc, argv);
  o.quantize = quantize.parsed();
  std::erase(o.batches, 0);
  auto rep = mla::bench::run(o);
  std::fputs(mla::bench::format_report(rep).c_str(), stdout);
  return 0;
}

mla::cli::Command reg("bench", "CPU decode / prompt / batched throughput against the memory-bandwidth limit", run);

}  // namespace
