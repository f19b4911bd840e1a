// `mla verify`: the expand-vs-absorb equivalence experiment on a checkpoint (prefill, then
// greedy decode steps; f32, bf16 and fp8 latent cache, float32 and fast precision; each against a
// reference that reads the same cache), as a table or JSON.
#include <CLI/CLI.hpp>
#include <iostream>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "cli/options.h"
#include "tools/verify.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Run a token sequence on both MLA paths (expand, absorb), prefill then K decode steps, in float32 "
               "with an f32, a bf16 and an fp8 latent cache and in the fast precision, and report how far apart their "
               "outputs are, how far each is from a naive reference attention over the same cache, and the cache bytes",
               "mla verify"};
  std::string model_dir, ids_str;
  int64_t random_n = 0, decode = 8, page_size = 64;
  uint64_t seed = 1;
  mla::cli::CpuOptions cpu;
  bool json_out = false;
  mla::cli::add_model_option(app, model_dir, mla::cli::kWeightsHelp);
  auto* ids_opt = app.add_option("--ids", ids_str, "comma-separated prompt token ids");
  auto* rnd_opt = app.add_option("--random", random_n, "a prompt of N random token ids (default 32)");
  ids_opt->excludes(rnd_opt);
  rnd_opt->excludes(ids_opt);
  app.add_option("--seed", seed, "seed of --random");
  app.add_option("--decode", decode, "greedy decode steps after the prompt");
  app.add_option("--page-size", page_size, "tokens per cache page");
  mla::cli::add_cpu_options(app, cpu);
  app.add_flag("--json", json_out, "write the report as one JSON object");
  CLI11_PARSE(app, argc, argv);
  if (decode < 0) throw std::invalid_argument("--decode must be >= 0");
  if (page_size <= 0) throw std::invalid_argument("--page-size must be positive");
  if (*rnd_opt && random_n <= 0) throw std::invalid_argument("--random must be positive");

  auto model = mla::Model::load(model_dir, cpu.context());
  mla::VerifyOptions opt;
  opt.decode_steps = decode;
  opt.page_size = page_size;
  if (*ids_opt) {
    opt.ids = mla::cli::parse_id_list(ids_str);
  } else {
    std::mt19937_64 rng(seed);
    const int64_t V = model->config().vocab_size;
    for (int64_t i = 0; i < (random_n > 0 ? random_n : 32); ++i) opt.ids.push_back(int32_t(rng() % uint64_t(V)));
  }
  auto report = mla::verify_paths(*model, opt, model_dir);
  if (json_out) std::cout << mla::verify_json(report).dump(2) << "\n";
  else std::cout << mla::verify_text(report);
  return 0;
}

mla::cli::Command reg("verify", "expand vs absorb on a checkpoint: output errors and cache bytes", run);

}  // namespace
