// `mla bench`: decode, prompt-processing and batched-decode throughput on a random-weight
// checkpoint of DeepSeek-V2-Lite's shape, against the memory bandwidth measured in the same run;
// or (--depth) prompt and decode after many tokens already in the cache. Under `mpirun -np N`
// the same, expert-parallel, with each rank's weights and MoE combine (tools/bench.h); --dsa
// runs in one process only.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/options.h"
#include "parallel/comm.h"
#include "tools/bench.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"CPU throughput on a random-weight checkpoint of DeepSeek-V2-Lite's shape (written on first use)",
               "mla bench"};
  mla::bench::Options o;
  app.add_option("--dir", o.dir, "checkpoint folder (default: <tmp>/mla-bench-v2lite-<L>L-<weights>); reused when present");
  app.add_option("-m,--model", o.model,
                 "instead of the random checkpoint: measure this one, its weights as stored (--dir, --layers, "
                 "--weights and --config describe the random one and do not apply)");
  app.add_option("--text", o.text,
                 "a text file: every section feeds consecutive tokens of it (the checkpoint's tokenizer) instead of "
                 "random ids, so that a trained model routes its experts and its MTP module drafts as on real text")
      ->check(CLI::ExistingFile);
  app.add_option("--layers", o.layers, "layers (the first dense, the rest MoE)");
  std::string config_file;
  app.add_option("--config", config_file,
                 "a config.json to write the random checkpoint of instead of DeepSeek-V2-Lite's shape (its "
                 "num_hidden_layers replaced by --layers; give --dir too: small configs make quick runs)")
      ->check(CLI::ExistingFile);
  app.add_option("--weights", o.weights, "bf16 | fp8 (block-128 FP8 projections) | int4 (INT4 routed experts) | int4-fp8 (INT4 routed experts, FP8 "
                 "projections: mla quantize's layout) | int8 (INT8 projections, group 32: as fp8's)");
  mla::cli::CpuOptions cpu;
  cpu.precision = o.precision;
  mla::cli::add_cpu_options(app, cpu, "fast (bf16 AMX GEMMs for prompt-sized products) | precise (float32 everywhere)");
  app.add_option("--runs", o.runs, "timed runs per figure, after one warm-up run");
  app.add_option("--decode-tokens", o.decode_tokens, "tokens per decode run (0: skip)");
  app.add_option("--context", o.context, "tokens in the cache before decoding (a prompt of that length)");
  app.add_option("--prompt-tokens", o.prompt_tokens, "tokens of the prompt-processing run (0: skip)");
  app.add_option("--batches", o.batches, "batch sizes of the batched decode (0: skip)")->delimiter(',');
  app.add_option("--batch-steps", o.batch_steps, "decode steps per batched run");
  app.add_option("--spec-tokens", o.spec_tokens,
                 "tokens per run of the speculative-decoding comparison (injected drafts at acceptance 1, 0.8, 0.5, 0 "
                 "and the MTP module's own; 0: skip)");
  app.add_option("--draft-tokens", o.draft_tokens, "draft tokens per verify pass in that comparison");
  app.add_option("--draft-head", o.draft_head, "format of the MTP drafts' output head in that comparison: int4, fp8, bf16");
  app.add_option("--huge-pages", o.huge_pages,
                 "auto | on | off: copy the weights onto transparent huge pages at load (auto: when they take "
                 "under half the available memory)");
  std::string amx = "on";
  app.add_option("--amx", amx,
                 "on | off: off runs the AVX-512 BF16 (VDPBF16PS) kernels where the CPU has AMX, the path of a CPU "
                 "without it")
      ->check(CLI::IsMember({"on", "off"}));
  std::string vector_gemm = "auto";
  app.add_option("--vector-gemm", vector_gemm,
                 "auto | vdpbf16ps | fma: the prompt's bf16 products where AMX is not used, on VDPBF16PS or on float32 "
                 "FMAs over bf16 weights (auto: the FMAs where their peak measures at least 1.5x VDPBF16PS's here)")
      ->check(CLI::IsMember({"auto", "vdpbf16ps", "fma"}));
  app.add_option("--depth", o.depths,
                 "instead: at each of these depths (tokens already in the cache, e.g. 0,8192,32768) a prompt of "
                 "--prompt-tokens and --decode-tokens decode steps, as llama-bench -d; a row per depth with the "
                 "attention's share of a decode step and the cache bytes it reads beside the weights'")
      ->delimiter(',');
  app.add_option("--depth-batches", o.depth_batches,
                 "the --depth rows' batch sizes: at each depth, B sequences of DEPTH cached tokens decode together "
                 "(the prompt runs at B = 1)")
      ->delimiter(',');
  app.add_flag("!--no-scaling", o.scaling, "skip decode and prompt on 1 thread against all");
  int64_t bandwidth_mib = int64_t(o.bandwidth_bytes >> 20);
  app.add_option("--bandwidth-mib", bandwidth_mib, "the read loop's buffer in MiB (far larger than the caches)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gemm-n", o.gemm_n, "the n of the n x n x n bf16 GEMM probe beside each prompt run")
      ->check(CLI::PositiveNumber);
  mla::cli::QuantizeOptions quantize;
  mla::cli::add_quantize_options(app, quantize);
  std::vector<int64_t> dsa_contexts;
  app.add_option("--dsa", dsa_contexts,
                 "instead: DeepSeek Sparse Attention against dense attention per decoded token at these contexts "
                 "(e.g. 4096,16384,65536): one layer of DeepSeek-V3.2's attention, then decode on a random V3.2-shaped "
                 "checkpoint")
      ->delimiter(',');
  std::string dsa_kv = "bf16";
  app.add_option("--dsa-kv-dtype", dsa_kv, "the --dsa run's cache: bf16 | fp8 | f32");
  int64_t dsa_layers = 3;
  app.add_option("--dsa-layers", dsa_layers,
                 "layers of the --dsa run's random DeepSeek-V3.2-shaped checkpoint (0: the one-layer rows only; its "
                 "folder: --dir, default <tmp>/mla-bench-v32-<L>L)");
  CLI11_PARSE(app, argc, argv);
  cpu.context();  // checks --threads and --precision
  o.threads = cpu.threads;
  o.precision = cpu.precision;
  o.bandwidth_bytes = size_t(bandwidth_mib) << 20;
  if (!config_file.empty()) {
    std::ifstream f(config_file);
    try {
      f >> o.checkpoint_config;
    } catch (const std::exception& e) {
      throw std::invalid_argument("--config " + config_file + ": not JSON: " + e.what());
    }
  }
  const bool lead = mla::parallel::world().rank() == 0;
  if (!dsa_contexts.empty()) {
    if (mla::parallel::world().size() > 1)
      throw std::invalid_argument("--dsa does not run under mpirun: its rows compare attention kernels within one "
                                  "process; run it without mpirun");
    mla::bench::DsaOptions d;
    d.contexts = dsa_contexts;
    d.threads = o.threads;
    d.runs = o.runs;
    d.kv_dtype = dsa_kv;
    d.layers = dsa_layers;
    d.dir = o.dir;
    d.precision = o.precision;
    std::fputs(mla::bench::format_dsa_report(mla::bench::run_dsa(d)).c_str(), stdout);
    return 0;
  }
  o.quantize = quantize.parsed();
  o.amx = amx == "on";
  o.vector_gemm = vector_gemm == "fma"         ? mla::cpu::Context::VectorGemm::Fma
                  : vector_gemm == "vdpbf16ps" ? mla::cpu::Context::VectorGemm::Vdpbf16ps
                                               : mla::cpu::Context::VectorGemm::Auto;
  o.int8_activations = cpu.context().int8_activations;
  o.repack = cpu.context().repack_weights;
  std::erase(o.batches, 0);
  auto rep = mla::bench::run(o);  // every rank under mpirun; rank 0 reports
  if (lead) std::fputs(mla::bench::format_report(rep).c_str(), stdout);
  return 0;
}

mla::cli::Command reg("bench", "CPU decode / prompt / batched throughput against the memory-bandwidth limit", run);

}  // namespace
