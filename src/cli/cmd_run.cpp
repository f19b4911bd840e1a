// `mla run`: text in, text out. Streams the model's continuation of a prompt to stdout and
// prints the throughput and the KV cache bytes per token to stderr.
// `mla chat`: an interactive conversation through the model's chat template; lines from stdin
// (a terminal or a pipe) until EOF or /exit.
// Both are one-sequence clients of the Engine, stepped on this thread (submit, then
// run_until_idle; the text streams from the event callback). The chat keeps its cache across
// turns through the engine's prefix cache: a finished turn leaves its full pages there, so the
// next turn computes only its new tokens plus at most one partial page (the last page the
// previous turn did not fill, kv page size 64).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <random>

#include "cli/load_model.h"
#include "cli/command.h"
#include "engine/lockstep.h"
#include "parallel/comm.h"
#include "cli/options.h"
#include "engine/generation_config.h"
#include "engine/engine.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

struct RunOptions {
  std::string model_dir, tokenizer_dir, prompt, system, kv_dtype = "bf16";
  int64_t max_new_tokens = 256;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  float repeat_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  double kv_cache_gb = 0;
  mla::cli::CpuOptions cpu{.precision = "fast"};
  mla::cli::SpeculativeCliOptions spec;
  mla::cli::QuantizeOptions quantize;
  bool chat = false, ignore_eos = false, quiet = false;
  // Options given on the command line (they override generation_config.json).
  std::map<std::string, CLI::Option*> given;
  bool was_given(const std::string& name) const { return given.at(name)->count() > 0; }
};

void add_options(CLI::App& app, RunOptions& o, bool chat_command) {
  mla::cli::add_model_option(app, o.model_dir);
  mla::cli::add_tokenizer_option(app, o.tokenizer_dir);
  if (!chat_command) {
    app.add_option("-p,--prompt", o.prompt, "the prompt text")->required();
    app.add_flag("--chat", o.chat, "apply the model's chat template to the prompt, as one user message");
  }
  app.add_option("--system", o.system, "a system message (chat template)");
  o.given["n"] = app.add_option("-n,--max-tokens", o.max_new_tokens,
                                "most tokens to generate; -1: no limit (default: generation_config.json, else 256)");
  o.given["temperature"] =
      app.add_option("--temperature", o.temperature, "sampling temperature; 0: greedy (default: generation_config.json, else 1)");
  o.given["top_k"] = app.add_option("--top-k", o.top_k, "keep the k most likely tokens; 0: off");
  o.given["top_p"] = app.add_option("--top-p", o.top_p, "nucleus: keep the smallest set of mass >= p; 1: off");
  o.given["min_p"] = app.add_option("--min-p", o.min_p, "keep tokens of probability >= min_p x the largest; 0: off");
  o.given["repeat"] = app.add_option("--repeat-penalty", o.repeat_penalty,
                                     "divide positive / multiply negative logits of prompt and output tokens; 1: off");
  app.add_option("--presence-penalty", o.presence_penalty, "subtract from logits of tokens in the output; 0: off");
  app.add_option("--frequency-penalty", o.frequency_penalty, "subtract per occurrence in the output; 0: off");
  o.given["seed"] = app.add_option("--seed", o.seed, "RNG seed (default: random, printed at the end)");
  app.add_option("--stop", o.stop, "stop string (repeatable); the output ends before it");
  app.add_flag("--ignore-eos", o.ignore_eos, "do not stop at EOS tokens");
  app.add_option("--kv-dtype", o.kv_dtype, "latent cache storage: bf16 | fp8 | f32");
  app.add_option("--kv-cache-gb", o.kv_cache_gb, "KV cache budget in GB (default: the context length, at most 1 GiB)");
  mla::cli::add_cpu_options(app, o.cpu,
                            "fast (bf16 activations in the matrix products, AMX for prompts; `mla verify` reports its error) | "
                            "precise (float32 throughout, the precision of `mla logits`)");
  mla::cli::add_speculative_options(app, o.spec);
  app.add_flag("-q,--quiet", o.quiet, "no statistics on stderr");
  mla::cli::add_quantize_options(app, o.quantize);
}

// Everything a run or a chat session needs, loaded from the model folder. Under mpirun a run
// steps the same engine on every rank (the same prompt, the same seed), while a chat's input
// reaches rank 0 only: there rank 0 alone has the engine and its leader, and the other ranks
// replay its passes over follower_pool (engine/lockstep.h).
struct Session {
  std::unique_ptr<mla::Model> model;
  std::unique_ptr<mla::Tokenizer> tokenizer;
  std::unique_ptr<mla::Engine> engine;            // null on a follower
  std::shared_ptr<mla::Leader> leader;            // rank 0 of a lockstep session
  std::unique_ptr<mla::LatentPool> follower_pool; // the other ranks of one
  mla::Request params;  // everything but the prompt
  std::string kv_dtype;
};

Session open_session(RunOptions& o, bool lockstep = false) {
  const mla::cpu::Context ctx = o.cpu.context();
  if (o.kv_cache_gb < 0) throw std::invalid_argument("--kv-cache-gb must not be negative");
  Session s;
  const mla::KvDType kv_dtype = mla::parse_kv_dtype(o.kv_dtype);
  s.kv_dtype = o.kv_dtype;
  const mla::SpeculativeOptions spec = o.spec.options();
  if (mla::parallel::world().rank() != 0) o.quiet = true;  // rank 0 reports for the job
  s.model = mla::cli::load_model(o.model_dir, ctx, ::isatty(STDERR_FILENO) && !o.quiet,  // progress on a terminal
                                  o.quantize.parsed(), /*with_mtp=*/spec.enabled);
  if (spec.enabled && !s.model->has_mtp())
    throw std::invalid_argument("--speculative mtp: " + o.model_dir + " has no MTP module (num_nextn_predict_layers and layer " +
                                std::to_string(s.model->config().num_hidden_layers) + "'s eh_proj)");
  s.tokenizer = std::make_unique<mla::Tokenizer>(mla::cli::load_tokenizer(o.model_dir, o.tokenizer_dir));
  auto gc = mla::cli::load_generation(o.model_dir, o.tokenizer_dir, s.model->config());

  mla::SamplingParams& sp = s.params.sampling;
  sp = gc.apply(sp);  // the file's defaults, then the options given
  if (o.was_given("temperature")) sp.temperature = o.temperature;
  if (o.was_given("top_k")) sp.top_k = o.top_k;
  if (o.was_given("top_p")) sp.top_p = o.top_p;
  if (o.was_given("min_p")) sp.min_p = o.min_p;
  if (o.was_given("repeat")) sp.repetition_penalty = o.repeat_penalty;
  sp.presence_penalty = o.presence_penalty;
  sp.frequency_penalty = o.frequency_penalty;
  sp.seed = o.was_given("seed") ? o.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  // Under mpirun every rank samples the same tokens: rank 0's seed is everyone's.
  mla::parallel::world().broadcast(&sp.seed, sizeof sp.seed, 0);
  o.seed = sp.seed;
  sp.validate();

  s.params.max_new_tokens = o.was_given("n") ? o.max_new_tokens : gc.max_new_tokens.value_or(256);
  s.params.stop = o.stop;
  if (!o.ignore_eos) {
    // config.json's and generation_config.json's EOS ids, and the tokenizer's EOS token (the
    // token chat templates close a turn with), as llama.cpp also stops on it.
    s.params.eos_token_ids = gc.eos_token_ids;
    int64_t tok_eos = s.tokenizer->eos_id();
    if (tok_eos >= 0 && !gc.is_eos(tok_eos)) s.params.eos_token_ids.push_back(tok_eos);
  }
  mla::EngineOptions eo;
  eo.kv_dtype = kv_dtype;
  eo.kv_pages = mla::kv_cache_pages(s.model->config(), o.kv_cache_gb * 1e9, eo.page_size, kv_dtype, 1);
  eo.max_running = 1;
  // One sequence: its whole prompt in one forward pass, as far as the cache holds it.
  eo.max_batch_tokens = eo.kv_pages * eo.page_size;
  eo.speculative = spec;
  auto& world = mla::parallel::world();
  if (lockstep && world.size() > 1) {
    if (world.rank() > 0) {
      s.follower_pool = std::make_unique<mla::LatentPool>(s.model->make_pool(eo.kv_pages, eo.page_size, kv_dtype));
      return s;
    }
    // A failed collective ends the job: the error goes up to main, which aborts every rank.
    s.leader = std::make_shared<mla::Leader>(world, eo.kv_pages, eo.page_size, kv_dtype,
                                             [](const std::string& why) { throw std::runtime_error(why); });
    eo.leader = s.leader;
  }
  s.engine = std::make_unique<mla::Engine>(*s.model, s.tokenizer.get(), eo);
  return s;
}

nlohmann::json template_extra(const mla::Tokenizer& tok) {
  return {{"bos_token", tok.bos_token()}, {"eos_token", tok.eos_token()}};
}

// The checkpoint's chat template, or the built-in format of a checkpoint that ships none
// (DeepSeek-V3.2).
mla::ChatFormat require_format(const Session& s, const std::string& dir) {
  mla::ChatFormat f = mla::chat_format_for(s.model->config().model_type, s.tokenizer->chat_template());
  if (f.empty()) throw std::runtime_error(dir + "/tokenizer_config.json has no chat_template: chat needs one");
  return f;
}

void stream_to_stdout(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// One turn: the request through the engine, its text streamed to stdout as it comes.
mla::RequestResult generate(Session& s, const std::vector<int32_t>& ids) {
  mla::Request req = s.params;
  req.prompt = ids;
  mla::RequestResult r;
  s.engine->submit(std::move(req), [&r](const mla::RequestEvent& e) {
    r.add(e);
    stream_to_stdout(e.text);
  });
  s.engine->run_until_idle();
  return r;
}

bool ran_out_of_room(const mla::RequestResult& r) {
  return r.reason == mla::FinishReason::KvCacheFull || r.reason == mla::FinishReason::ContextLength;
}

// Prompt tokens/s: the prompt tokens computed (after those reused from the cache) over the time
// to the first token. Generated tokens/s: the forward passes after the first token (one per
// token) over the time from the first token to the end.
void print_stats(const Session& s, const mla::RequestResult& r, uint64_t seed) {
  std::fprintf(stderr, "\n\n");
  std::fprintf(stderr, "prompt     %6lld tokens  %9.1f tokens/s", (long long)r.computed_prompt_tokens(),
               r.prompt_tokens_per_second());
  if (r.cached_tokens) std::fprintf(stderr, "   (%lld more reused from the cache)", (long long)r.cached_tokens);
  std::fprintf(stderr, "\ngenerated  %6zu tokens  %9.1f tokens/s   stopped by: %s\n", r.tokens.size(),
               r.generated_tokens_per_second(), mla::finish_reason_name(r.reason));
  const auto& c = s.model->config();
  std::fprintf(stderr, "KV cache   %6lld bytes per token (%s latent: %lld layers x (%lld + %lld) values)   seed %llu\n",
               (long long)s.engine->pool().bytes_per_token(), s.kv_dtype.c_str(), (long long)c.num_hidden_layers,
               (long long)c.kv_lora_rank, (long long)c.qk_rope_head_dim, (unsigned long long)seed);
  std::fprintf(stderr, "weights    %s\n", mla::weight_bytes_summary(s.model->weights()).c_str());
  const mla::EngineStats st = s.engine->stats();
  if (s.engine->options().speculative.enabled)
    std::fprintf(stderr, "speculative %lld verify steps, acceptance %.3f (%lld of %lld drafts), %.2f tokens per step, "
                 "drafting %.3f s\n",
                 (long long)st.spec_steps, st.spec_acceptance_rate(), (long long)st.spec_accepted_tokens,
                 (long long)st.spec_draft_tokens, st.spec_tokens_per_step(), st.spec_draft_seconds);
}

// Expert-parallel runs: every rank's routed experts, weight bytes and MoE combines (volume
// received, wall time in the combine, waiting for the slowest rank included), gathered from
// every rank (all must call it) and printed by rank 0 unless quiet.
void print_rank_stats(const Session& s, const mla::RequestResult& r, bool quiet) {
  auto& world = mla::parallel::world();
  if (world.size() == 1) return;
  size_t weight_bytes = 0;
  for (auto& [fmt, n] : s.model->weights().bytes_by_format) weight_bytes += n;
  const auto ex = s.model->local_experts();
  const auto& cc = s.model->combine_counters();
  const double mine[6] = {double(ex.begin), double(ex.end), double(weight_bytes), double(cc.calls), cc.bytes_received, cc.seconds};
  std::vector<double> all(6 * size_t(world.size()));
  world.allgather(mine, sizeof mine, all.data());
  if (quiet || world.rank() != 0) return;
  const double tokens = double(r.computed_prompt_tokens()) + double(r.tokens.size());
  for (int k = 0; k < world.size(); ++k) {
    const double* v = all.data() + 6 * k;
    std::fprintf(stderr, "rank %d     experts [%lld, %lld)  weights %.3f GB  combines %lld: %.3f MB received, %.3f s"
                 " (%.4f MB, %.3f ms per prompt or generated token)\n",
                 k, (long long)v[0], (long long)v[1], v[2] / 1e9, (long long)v[3], v[4] / 1e6, v[5],
                 tokens > 0 ? v[4] / 1e6 / tokens : 0.0, tokens > 0 ? v[5] * 1e3 / tokens : 0.0);
  }
}

int run_cmd(int argc, char** argv) {
  CLI::App app{"Generate text: stream the model's continuation of a prompt to stdout", "mla run"};
  RunOptions o;
  add_options(app, o, false);
  CLI11_PARSE(app, argc, argv);
  Session s = open_session(o);
  std::vector<int32_t> ids;
  if (o.chat) {
    nlohmann::json messages = nlohmann::json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", o.prompt}});
    std::string text = mla::render_chat(require_format(s, o.model_dir), nlohmann::ordered_json(messages), true,
                                        nlohmann::ordered_json(template_extra(*s.tokenizer)));
    ids = s.tokenizer->encode(text, false);  // the template writes the BOS itself
  } else {
    ids = s.tokenizer->encode(o.prompt, true);
  }
  auto r = generate(s, ids);  // throws RequestError for a prompt that can never run
  if (r.reason == mla::FinishReason::Error) throw std::runtime_error(r.message);
  if (ran_out_of_room(r)) {
    if (r.tokens.empty()) throw std::runtime_error(r.message);
    std::fprintf(stderr, "\nmla run: %s\n", r.message.c_str());
  }
  if (!o.quiet) print_stats(s, r, o.seed);
  print_rank_stats(s, r, o.quiet);
  return 0;
}

int chat_cmd(int argc, char** argv) {
  CLI::App app{"Chat with the model through its chat template, reading user lines from stdin until EOF or /exit",
               "mla chat"};
  RunOptions o;
  add_options(app, o, true);
  CLI11_PARSE(app, argc, argv);
  Session s = open_session(o, /*lockstep=*/true);
  if (s.follower_pool) {
    mla::follow(mla::parallel::world(), *s.model, *s.follower_pool);
    return 0;
  }
  const mla::ChatFormat format = require_format(s, o.model_dir);
  const bool interactive = ::isatty(STDIN_FILENO);
  if (interactive)
    std::fprintf(stderr, "chat with %s: one line per message; /reset starts over, /exit or Ctrl-D ends\n",
                 o.model_dir.c_str());
  auto start = [&]() {
    nlohmann::json m = nlohmann::json::array();
    if (!o.system.empty()) m.push_back({{"role", "system"}, {"content", o.system}});
    return m;
  };
  nlohmann::json messages = start();
  std::string line;
  uint64_t turn = 0;
  while (true) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") break;
    if (line == "/reset") {
      messages = start();  // the prefix cache may still serve the system message
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::string text = mla::render_chat(format, nlohmann::ordered_json(messages), true,
                                        nlohmann::ordered_json(template_extra(*s.tokenizer)));
    auto ids = s.tokenizer->encode(text, false);
    s.params.sampling.seed = o.seed + turn++;  // reproducible, and not the same draws every turn
    // The prefix cache holds the earlier turns' full pages: only the rest is computed.
    mla::RequestResult r;
    try {
      r = generate(s, ids);
    } catch (const mla::RequestError& e) {
      r.reason = mla::FinishReason::ContextLength;
      r.message = e.what();
    }
    stream_to_stdout("\n");
    if (ran_out_of_room(r) || r.reason == mla::FinishReason::Error)
      std::fprintf(stderr, "mla chat: %s; /reset starts a new conversation\n", r.message.c_str());
    if (!o.quiet)
      std::fprintf(stderr, "[prompt %lld new + %lld cached tokens, %.1f tokens/s | %zu generated, %.1f tokens/s | %s]\n",
                   (long long)r.computed_prompt_tokens(), (long long)r.cached_tokens, r.prompt_tokens_per_second(),
                   r.tokens.size(), r.generated_tokens_per_second(), mla::finish_reason_name(r.reason));
    if (r.tokens.empty() && r.reason != mla::FinishReason::Eos) {
      messages.erase(messages.size() - 1);  // the turn did not happen
      continue;
    }
    messages.push_back({{"role", "assistant"}, {"content", r.text}});
  }
  if (!o.quiet)
    std::fprintf(stderr, "KV cache: %lld bytes per token (%s latent), %lld pages of %lld tokens in the prefix cache   seed %llu\n",
                 (long long)s.engine->pool().bytes_per_token(), s.kv_dtype.c_str(),
                 (long long)(s.engine->stats().kv_pages_total - s.engine->stats().kv_pages_free),
                 (long long)s.engine->pool().page_size(), (unsigned long long)o.seed);
  if (s.leader) s.leader->stop();
  return 0;
}

mla::cli::Command reg_run("run", "generate text from a prompt, streamed to stdout", run_cmd);
mla::cli::Command reg_chat("chat", "chat through the model's chat template (stdin lines)", chat_cmd);

}  // namespace
