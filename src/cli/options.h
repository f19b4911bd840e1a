// Option groups the `mla` subcommands share. Each adds its options to a CLI::App in the order
// of the command's --help; the help text is the command's where commands word it differently.
#pragma once
#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>

#include "backend/cpu/context.h"
#include "engine/speculative.h"
#include "kv/latent_pool.h"
#include "model/weights.h"

namespace mla::cli {

// threads: --threads (0: all cores); precision: --precision ("fast" | "precise").
inline cpu::Context cpu_context(int threads, const std::string& precision = "precise") {
  if (threads < 0) throw std::invalid_argument("--threads must not be negative, got " + std::to_string(threads));
  cpu::Context ctx;
  ctx.threads = threads;
  try {
    ctx.precision = cpu::parse_precision(precision);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--precision: ") + e.what());
  }
  return ctx;
}

inline constexpr const char* kCheckpointHelp =
    "checkpoint folder (config.json, *.safetensors, tokenizer.json) or GGUF file (FILE.gguf, the first part "
    "NAME-00001-of-0000N.gguf of a split set, or a folder holding one)";
inline constexpr const char* kWeightsHelp =
    "checkpoint folder (config.json, *.safetensors) or GGUF file (or the first part of a split set)";

// -m,--model: the model folder, required.
inline CLI::Option* add_model_option(CLI::App& app, std::string& dir, const std::string& help = kCheckpointHelp) {
  return app.add_option("-m,--model", dir, help)->required();
}

// --tokenizer DIR: the tokenizer and chat template of a folder instead of the model's own (a GGUF
// file whose metadata is wrong).
inline CLI::Option* add_tokenizer_option(CLI::App& app, std::string& dir) {
  return app
      .add_option("--tokenizer", dir,
                  "folder with tokenizer.json / tokenizer_config.json (and generation_config.json) to use instead of "
                  "the model's own (for a GGUF file whose tokenizer metadata is wrong)")
      ->check(CLI::ExistingDirectory);
}

// --threads, --int8-activations, --indexer-precision, --repack and, where the command offers the choice
// (a help text is given), --precision; context() checks them and builds the cpu::Context the
// command hands to Model::load.
struct CpuOptions {
  int threads = 0;
  std::string precision = "precise";
  std::string int8_activations = "on";
  std::string indexer_precision = "float";
  std::string repack = "on";
  cpu::Context context() const {
    cpu::Context ctx = cpu_context(threads, precision);
    ctx.int8_activations = int8_activations == "on";
    ctx.repack_weights = repack == "on";
    ctx.fp8_indexer = indexer_precision == "fp8";
    return ctx;
  }
};

inline void add_cpu_options(CLI::App& app, CpuOptions& o, const std::string& precision_help = "") {
  app.add_option("--threads", o.threads, "CPU threads (default: all)");
  if (!precision_help.empty()) app.add_option("--precision", o.precision, precision_help);
  app.add_option("--int8-activations", o.int8_activations,
                 "on | off: in the fast precision without AMX, the prompt's INT4 / INT8 weight products on int8 "
                 "activations (VNNI's VPDPBUSD; off: on the bf16 / float32 GEMMs), and with --repack on decode's "
                 "INT4 / INT8 products too")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--indexer-precision", o.indexer_precision,
                 "float | fp8: DeepSeek-V3.2 / GLM-5's sparse-attention indexer scores float values (default) or, "
                 "as DeepSeek's own inference code, queries and keys rounded to FP8 (e4m3, a scale per 128)")
      ->check(CLI::IsMember({"float", "fp8"}));
  app.add_option("--repack", o.repack,
                 "on | off: in the fast precision without AMX, rewrite the weights that only matrix products read "
                 "(MLPs, experts, attention projections but kv_b, lm_head) at load into the order the prompt's GEMMs "
                 "compute in: bf16 as column pairs, INT4 and INT8 in blocks of 16 rows (when the weights are copied "
                 "onto huge pages)")
      ->check(CLI::IsMember({"on", "off"}));
}

// --kv-dtype and --page-size: the latent cache's storage and tokens per page (mla logits, serve);
// dtype() checks both.
struct CacheOptions {
  std::string kv_dtype = "bf16";
  int64_t page_size = 64;
  KvDType dtype() const {
    if (page_size <= 0) throw std::invalid_argument("--page-size must be positive");
    return parse_kv_dtype(kv_dtype);
  }
};

inline void add_cache_options(CLI::App& app, CacheOptions& o) {
  app.add_option("--kv-dtype", o.kv_dtype, "latent cache storage: bf16 | fp8 | f32 (default " + o.kv_dtype + ")");
  app.add_option("--page-size", o.page_size, "tokens per cache page");
}

// --speculative and --draft-tokens (mla run, chat, serve): speculative decoding with the
// checkpoint's MTP module; options() checks them (the model is then loaded with its MTP).
struct SpeculativeCliOptions {
  std::string method = "none";
  int64_t draft_tokens = 1;
  bool fixed = false;  // --no-adaptive-speculation
  std::string draft_head = "int4";  // --draft-head
  SpeculativeOptions options() const {
    SpeculativeOptions o;
    try {
      o.enabled = parse_speculative_method(method);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--speculative: ") + e.what());
    }
    if (o.enabled && (draft_tokens < 1 || draft_tokens > 16))
      throw std::invalid_argument("--draft-tokens must be in [1, 16], got " + std::to_string(draft_tokens));
    o.draft_tokens = draft_tokens;
    o.adaptive = !fixed;
    o.draft_head = quant::parse_quant_format(draft_head, "--draft-head");
    return o;
  }
};

inline void add_speculative_options(CLI::App& app, SpeculativeCliOptions& o) {
  app.add_option("--speculative", o.method,
                 "speculative decoding: mtp (the checkpoint's multi-token prediction layer drafts, the model verifies; "
                 "greedy output unchanged) | none");
  app.add_option("--draft-tokens", o.draft_tokens, "draft tokens per verify pass with --speculative (default 1)");
  app.add_flag("--no-adaptive-speculation", o.fixed,
               "speculate on every step (default: only while it is faster than plain decoding)");
  app.add_option("--draft-head", o.draft_head,
                 "format of the MTP drafts' output head: int4 (a copy made at load, default), fp8, or bf16 (the "
                 "head as stored); verification always uses the head as stored");
}

// --quantize experts=int4,others=fp8[,embed=fp8]: convert the weights as they are loaded (the
// formats of `mla quantize`: model/weights.h, LoadQuantization); parsed() checks the value.
struct QuantizeOptions {
  std::string spec;
  LoadQuantization parsed() const { return spec.empty() ? LoadQuantization{} : LoadQuantization::parse(spec); }
};

inline void add_quantize_options(CLI::App& app, QuantizeOptions& o) {
  app.add_option("--quantize", o.spec,
                 "quantize at load: experts=int4|int8|fp8|bf16,others=int8|fp8|bf16[,embed=int8|fp8|bf16] (the formats of mla "
                 "quantize; classes left out stay as stored)");
}

}  // namespace mla::cli
