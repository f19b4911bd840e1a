// `mla quantize`: writes a quantized copy of a checkpoint (tools/quantize.h) and reports what it
// cost: the relative RMS error per weight class and, with --compare, the distance of the copy's
// logits to the input's over teacher-forced positions.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/options.h"
#include "tools/quantize.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Write a copy of a checkpoint (a hub folder or a GGUF file) with its weights quantized (INT4, INT8 or "
               "FP8 routed experts, INT8 or FP8 projections), in the hub layout with a compressed-tensors "
               "quantization_config",
               "mla quantize"};
  mla::QuantizeOptions o;
  std::string experts = "int4", others = "fp8", embed = "bf16", rule = "search";
  double shard_gb = 4;
  bool compare = false, quiet = false;
  mla::cli::add_model_option(app, o.in, mla::cli::kCheckpointHelp);
  app.add_option("-o,--out", o.out, "output folder (created; its safetensors files are replaced)")->required();
  app.add_option("--experts", experts, "routed experts: int4 (group 32) | int8 (group 32) | fp8 (128x128 blocks) | bf16");
  app.add_option("--others", others, "attention, shared experts, dense MLPs: fp8 | int8 (group 32) | bf16");
  app.add_option("--embed", embed, "token embeddings and lm_head: bf16 | fp8 | int8");
  app.add_option("--scales", rule, "search (the least squared error of a few candidate scales per group) | absmax (plain RTN)");
  app.add_option("--shard-gb", shard_gb, "largest shard, GB");
  app.add_option("--threads", o.threads, "CPU threads (default: all)");
  app.add_flag("--compare", compare,
               "load both models and report the logits' distance (mean KL, mean and max |d|) over the fixture's golden "
               "sequences, or 4 random sequences of 64 tokens");
  app.add_flag("-q,--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);
  o.formats.experts = mla::quant::parse_quant_format(experts, "--experts");
  o.formats.others = mla::quant::parse_quant_format(others, "--others");
  o.formats.embed_head = mla::quant::parse_quant_format(embed, "--embed");
  if (*o.formats.others == mla::quant::QuantFormat::INT4 || *o.formats.embed_head == mla::quant::QuantFormat::INT4)
    throw std::invalid_argument("int4 is for --experts only (--others, --embed: int8, fp8 or bf16)");
  if (rule == "search") o.formats.rule = mla::quant::ScaleRule::Search;
  else if (rule == "absmax") o.formats.rule = mla::quant::ScaleRule::Absmax;
  else throw std::invalid_argument("--scales: unknown '" + rule + "' (search, absmax)");
  if (shard_gb <= 0) throw std::invalid_argument("--shard-gb must be positive");
  o.shard_bytes = size_t(shard_gb * 1e9);
  o.progress = !quiet;
  const auto rep = mla::quantize_checkpoint(o);
  std::cout << mla::quantize_report_text(rep);
  if (compare) {
    mla::cpu::Context ctx = mla::cli::cpu_context(o.threads);
    auto ref = mla::Model::load(o.in, ctx);
    auto q = mla::Model::load(o.out, ctx);
    const auto seqs = mla::comparison_sequences(o.in, ref->config().vocab_size);
    std::cout << mla::logits_distance_text(mla::logits_distance(*ref, *q, seqs));
  }
  return 0;
}

mla::cli::Command reg("quantize", "write a quantized copy of a checkpoint (INT4 / INT8 / FP8) and report its error", run);

}  // namespace
