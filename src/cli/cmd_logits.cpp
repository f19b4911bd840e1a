// `mla logits`: the logits of a token sequence at every position, written as safetensors.
// Other tools and checks call this; its options and output are a stable contract.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>

#include "cli/load_model.h"
#include "cli/command.h"
#include "cli/options.h"
#include "tools/run_modes.h"
#include "format/safetensors.h"
#include "parallel/comm.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Compute the logits of a token sequence at every position (float32 [ids, vocab])", "mla logits"};
  std::string model_dir, ids_str, ids_file, out, attn = "", mode = "prefill";
  mla::cli::CpuOptions cpu;
  int64_t prefix_chunk = 1024;
  mla::cli::CacheOptions cache{.kv_dtype = "f32"};
  mla::cli::add_model_option(app, model_dir, mla::cli::kWeightsHelp);
  auto* ids_opt = app.add_option("--ids", ids_str, "comma-separated token ids");
  // One command-line argument is limited to 128 KiB on Linux, about 20k ids: a long sequence
  // comes from a file instead.
  auto* ids_file_opt = app.add_option("--ids-file", ids_file,
                                      "file of token ids separated by whitespace and/or commas; - reads standard input");
  ids_opt->excludes(ids_file_opt);
  ids_file_opt->excludes(ids_opt);
  app.add_option("--out", out, "output .safetensors file (tensor 'logits')")->required();
  app.add_option("--attn", attn, "auto | expand | absorb | chunked (default: absorb for decode, else auto)");
  app.add_option("--mode", mode, "prefill | decode | extend:P");
  app.add_option("--prefix-chunk", prefix_chunk, "tokens of cached prefix expanded at a time (chunked path)");
  mla::cli::add_cache_options(app, cache);
  mla::cli::add_cpu_options(app, cpu);
  CLI11_PARSE(app, argc, argv);
  if (ids_opt->count() == 0 && ids_file_opt->count() == 0)
    throw std::invalid_argument("give the token ids with --ids or --ids-file");
  mla::RunOptions opt;
  opt.mode = mla::RunMode::parse(mode);
  opt.path = attn.empty() ? (opt.mode.kind == mla::RunMode::Decode ? mla::AttnPath::Absorb : mla::AttnPath::Auto)
                          : mla::parse_attn_path(attn);
  if (prefix_chunk <= 0) throw std::invalid_argument("--prefix-chunk must be positive");
  opt.policy.prefix_chunk = prefix_chunk;
  opt.kv_dtype = cache.dtype();
  opt.page_size = cache.page_size;
  auto ids = ids_file_opt->count() ? mla::cli::read_id_file(ids_file) : mla::cli::parse_id_list(ids_str);
  auto model = mla::cli::load_model(model_dir, cpu.context(), isatty(STDERR_FILENO) && mla::parallel::world().rank() == 0);
  auto logits = mla::run_logits(*model, ids, opt);
  // Under mpirun every rank holds the same logits; rank 0 writes them.
  if (mla::parallel::world().rank() == 0)
    mla::write_safetensors(out, {{"logits", mla::tensor_f32({int64_t(ids.size()), model->config().vocab_size}, logits.data())}});
  return 0;
}

mla::cli::Command reg("logits", "logits of token ids at every position, to a safetensors file", run);

}  // namespace
