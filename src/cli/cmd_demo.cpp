// `mla demo`: the whole engine on a fresh clone with no downloads. Loads the small trained
// DeepSeek-V3-architecture checkpoint that ships in the source tree (models/mla-tiny-en, found
// beside the binary's folder or in the source folder it was built from) through the normal
// loader, generates English text from it, and prints the MLA story: latent against expanded
// cache bytes per token, the agreement of the expand and absorb attention paths, and
// throughput. With --dir (or --random, or when the trained checkpoint is not found) it writes
// (or reuses) a random-weight checkpoint of the same architecture instead.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/load_model.h"
#include "cli/command.h"
#include "cli/options.h"
#include "model/presets.h"
#include "engine/engine.h"
#include "tools/verify.h"
#include "tools/checkpoint_writer.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int kDemoVocab = 1024;
constexpr const char* kTrainedModel = "models/mla-tiny-en";

// The trained checkpoint: beside the binary's folder (build/mla -> models/mla-tiny-en in the
// checkout), else in the source folder the binary was built from. Empty when neither has it.
std::string find_trained_model() {
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / kTrainedModel);
#ifdef MLA_SOURCE_DIR
  candidates.push_back(fs::path(MLA_SOURCE_DIR) / kTrainedModel);
#endif
  for (const auto& c : candidates)
    if (fs::exists(c / "config.json") && fs::exists(c / "model.safetensors")) return c.lexically_normal().string();
  return {};
}

// The demo checkpoint in `dir` is there when config.json is exactly the demo's and both the
// model and the tokenizer load. A folder holding another checkpoint is never overwritten.
bool demo_checkpoint_present(const std::string& dir, const nlohmann::json& config) {
  const fs::path cfg = fs::path(dir) / "config.json";
  if (!fs::exists(cfg)) {
    if (fs::exists(dir) && !fs::is_directory(dir)) throw std::runtime_error(dir + " exists and is not a folder");
    return false;
  }
  nlohmann::json have;
  try {
    std::ifstream in(cfg);
    have = nlohmann::json::parse(in);
  } catch (const std::exception&) {
    have = nullptr;
  }
  if (have != config)
    throw std::runtime_error(dir + " holds a config.json that is not the demo's; choose another --dir");
  try {
    mla::Model::load(dir);
    mla::Tokenizer::load(dir);
    return true;
  } catch (const std::exception&) {
    return false;  // incomplete or damaged: written again
  }
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

// Random weights emit arbitrary bytes: show control characters as \xNN so they cannot drive the terminal.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

int demo(int argc, char** argv) {
  CLI::App app{"Load the small trained DeepSeek-V3-architecture model that ships with mla (or write a random-weight "
               "one), generate text, and show what multi-head latent attention saves",
               "mla demo"};
  std::string dir = "./mla-demo-model";
  std::string model_dir;
  bool random = false;
  std::string prompt;
  const std::string trained_prompt = "\"The computer";
  const std::string random_prompt =
      "Multi-head latent attention keeps one small latent vector per token instead of a key and a value for every head.";
  int64_t n = 48;
  float temperature = -1;
  mla::cli::CpuOptions cpu;
  uint64_t seed = 1;
  auto* dir_opt = app.add_option("--dir", dir, "folder of the random-weight demo checkpoint (written if missing, else "
                                               "reused); implies --random");
  app.add_option("--model", model_dir, "the trained checkpoint (default: models/mla-tiny-en beside the binary's "
                                       "folder, else in the source folder)");
  app.add_flag("--random", random, "use a random-weight checkpoint instead of the trained one");
  app.add_option("-n,--max-tokens", n, "tokens to generate");
  app.add_option("--prompt", prompt, "prompt text");
  app.add_option("--temperature", temperature, "sampling temperature (default: 0, greedy, for the trained model; 0.8 "
                                               "for random weights)");
  app.add_option("--seed", seed, "sampling seed");
  mla::cli::add_cpu_options(app, cpu);
  CLI11_PARSE(app, argc, argv);
  if (n < 0) throw std::invalid_argument("--max-tokens must not be negative");
  const mla::cpu::Context ctx = cpu.context();

  // 1. The checkpoint: the trained one when found, else a random-weight one written in the hub
  // layout with a byte-level tokenizer.
  bool trained = !random && dir_opt->count() == 0;
  if (trained && model_dir.empty()) {
    model_dir = find_trained_model();
    if (model_dir.empty()) {
      std::printf("mla demo: the trained checkpoint (%s) is not beside the binary nor in the source folder; using "
                  "random weights\n",
                  kTrainedModel);
      trained = false;
    }
  }
  if (trained) dir = model_dir;
  auto t0 = Clock::now();
  bool reused = true;
  if (!trained) {
    const nlohmann::json config = mla::demo_config(kDemoVocab);
    reused = demo_checkpoint_present(dir, config);
    if (!reused) {
      mla::write_random_checkpoint(dir, config, {});
      mla::Tokenizer::write_byte_level_tokenizer(dir, kDemoVocab);
    }
  }
  if (prompt.empty()) prompt = trained ? trained_prompt : random_prompt;
  if (temperature < 0) temperature = trained ? 0.0f : 0.8f;
  const double write_s = since(t0);
  t0 = Clock::now();
  auto model = mla::cli::load_model(dir, ctx);
  auto tokenizer = mla::Tokenizer::load(dir);
  const double load_s = since(t0);
  const mla::ModelConfig& c = model->config();
  size_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) bytes += e.file_size();

  std::printf("mla demo: a DeepSeek-V3-architecture model with %s (%lld layers, %lld heads, kv_lora_rank "
              "%lld, rope %lld, %lld routed experts, vocab %lld)\n",
              trained ? "TRAINED weights (mla-tiny-en, tools/train)" : "RANDOM weights", (long long)c.num_hidden_layers,
              (long long)c.num_attention_heads, (long long)c.kv_lora_rank, (long long)c.qk_rope_head_dim,
              (long long)c.n_routed_experts, (long long)c.vocab_size);
  if (trained)
    std::printf("  checkpoint  %s (hub layout, %.1f MB); loaded in %.2f s by the normal loader\n", dir.c_str(),
                double(bytes) / 1e6, load_s);
  else
    std::printf("  checkpoint  %s (hub layout, %.1f MB) %s in %.2f s; loaded in %.2f s by the normal loader\n",
                dir.c_str(), double(bytes) / 1e6, reused ? "reused" : "written", write_s, load_s);

  // 2. Text in, text out. Random weights give random text: then the machinery is the point.
  auto ids = tokenizer.encode(prompt, true);
  mla::EngineOptions eo;  // bf16 latent cache, room for one context
  eo.kv_pages = mla::kv_cache_pages(c, 0, eo.page_size, eo.kv_dtype, 1);
  eo.max_running = 1;
  eo.max_batch_tokens = eo.kv_pages * eo.page_size;
  mla::Engine engine(*model, &tokenizer, eo);
  mla::Request params;
  params.sampling.temperature = temperature;
  params.sampling.top_k = 40;
  params.sampling.seed = seed;
  params.max_new_tokens = n;
  params.eos_token_ids = c.eos_token_ids;
  std::printf("\nprompt (%zu tokens): %s\n", ids.size(), printable(prompt).c_str());
  if (trained)
    std::printf("output (%s): ", temperature == 0.0f ? "greedy" : "sampled");
  else
    std::printf("output (random weights, so random text): ");
  std::fflush(stdout);
  params.prompt = ids;
  auto r = engine.generate(params, [](const mla::RequestEvent& e) {
    std::fputs(printable(e.text).c_str(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");

  // 3. The cache: one latent row per token and layer against the expanded K and V of every head.
  const int64_t L = c.num_hidden_layers, H = c.num_attention_heads;
  const mla::CacheShape shape = mla::CacheShape::of(c);
  const int64_t expanded = mla::expanded_bytes_per_token(shape, 2);
  const int64_t latent_bf16 = mla::latent_bytes_per_token(shape, mla::KvDType::BF16);
  const int64_t latent_fp8 = mla::latent_bytes_per_token(shape, mla::KvDType::FP8);
  std::printf("\nKV cache per token, all %lld layers:\n", (long long)L);
  std::printf("  expanded (MHA form)  %8s bytes   %lld heads x (%lld + %lld + %lld) values x 2 bytes (bf16)\n",
              with_commas(expanded).c_str(), (long long)H, (long long)c.qk_nope_head_dim,
              (long long)c.qk_rope_head_dim, (long long)c.v_head_dim);
  std::printf("  latent, bf16         %8s bytes   (%lld c_kv + %lld k_pe) x 2 bytes    %5.1fx smaller\n",
              with_commas(latent_bf16).c_str(), (long long)c.kv_lora_rank, (long long)c.qk_rope_head_dim,
              double(expanded) / double(latent_bf16));
  std::printf("  latent, fp8          %8s bytes   e4m3 c_kv + scales + bf16 k_pe   %5.1fx smaller\n",
              with_commas(latent_fp8).c_str(), double(expanded) / double(latent_fp8));
  {
    // The same arithmetic at the released DeepSeek-V3's shape, where the saving is the point.
    const mla::ModelConfig v3 = mla::preset_config("deepseek-v3");
    const int64_t v3_expanded = mla::expanded_bytes_per_token(mla::CacheShape::of(v3), 2);
    const int64_t v3_latent = mla::latent_bytes_per_token(mla::CacheShape::of(v3), mla::KvDType::BF16);
    std::printf("  DeepSeek-V3 itself (%lld layers, %lld heads, %lld + %lld latent): %s bytes latent (bf16) vs %s "
                "expanded, %.1fx\n",
                (long long)v3.num_hidden_layers, (long long)v3.num_attention_heads, (long long)v3.kv_lora_rank,
                (long long)v3.qk_rope_head_dim, with_commas(v3_latent).c_str(), with_commas(v3_expanded).c_str(),
                double(v3_expanded) / double(v3_latent));
  }

  // 4. The two exact attention algorithms over the same latents (f32 cache, prefill of the
  // prompt), and each against the naive reference attention reading the same cache: the
  // comparison `mla verify` makes.
  const mla::VerifyMode cmp = mla::compare_paths(*model, ids, mla::KvDType::F32, false);
  std::printf("\nattention paths: expand (K/V decompressed per cached token) vs absorb (W_UK, W_UV folded into q "
              "and out)\n");
  std::printf("  max |logit difference| over %zu positions x %lld logits: %.2e (argmax agrees on %lld of %lld)\n",
              ids.size(), (long long)c.vocab_size, cmp.logits.max_abs, (long long)cmp.argmax_agree,
              (long long)cmp.rows);
  std::printf("  against a naive attention in double over the same cache: expand %.2e, absorb %.2e\n",
              cmp.expand_vs_reference.max_abs, cmp.absorb_vs_reference.max_abs);

  // 5. Throughput of the run above.
  std::printf("\nthroughput (CPU threads: %d):\n", ctx.num_threads());
  std::printf("  prompt     %4lld tokens  %8.1f tokens/s  (one pass, path chosen by shape)\n",
              (long long)r.computed_prompt_tokens(), r.prompt_tokens_per_second());
  std::printf("  generated  %4zu tokens  %8.1f tokens/s  (one pass per token on the latent cache)   stopped by: %s\n",
              r.tokens.size(), r.generated_tokens_per_second(), mla::finish_reason_name(r.reason));
  return 0;
}

mla::cli::Command reg("demo", "generate from the small trained MLA model and show the latent cache's savings", demo);

}  // namespace
