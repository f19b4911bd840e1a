// `mla serve`: the OpenAI-compatible HTTP server over the continuous-batching Engine.
// Loads the checkpoint and its tokenizer, sizes one latent page pool, runs the engine thread
// and serves /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics.
// SIGINT / SIGTERM: stop admitting (503 for new requests), let the requests in flight finish
// up to --shutdown-timeout seconds, cut the rest (an error event and [DONE] for a stream, a 503
// otherwise), exit 0; a second signal cuts them at once and exits.
//
// Under mpirun (expert-parallel): rank 0 serves and the other ranks replay its forward passes
// (engine/lockstep.h). mpirun sends a signal to every rank, both when it is stopped and when
// one of the ranks died (then it kills the rest about a second later), so the first signal
// cuts the requests in flight at once: they are answered 503 while there is time. A failed
// collective (a rank hung past MLA_RANK_TIMEOUT) does the same, then ends the job with an error.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <mutex>
#include <thread>

#include "cli/load_model.h"
#include "cli/command.h"
#include "cli/options.h"
#include "engine/generation_config.h"
#include "engine/engine.h"
#include "engine/lockstep.h"
#include "model/fingerprint.h"
#include "parallel/comm.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace {

struct ServeOptions {
  std::string model_dir, tokenizer_dir, host = "127.0.0.1", served_model_name;
  int port = 8080;
  double kv_cache_gb = 0;
  int64_t max_batch_tokens = 512, max_num_seqs = 64, chunk_depth = 16384;
  mla::cli::CacheOptions cache;
  mla::cli::CpuOptions cpu{.threads = 0, .precision = "fast"};
  bool no_webui = false;
  bool no_prefix_cache = false;
  mla::cli::SpeculativeCliOptions spec;
  std::string tool_call_parser, reasoning_parser, chat_template_kwargs, api_key, tool_prompt = "auto";
  int64_t max_queued_requests = 128;
  double shutdown_timeout = 30, read_timeout = 10;
  int64_t max_request_bytes = int64_t(16) << 20;
  int max_connections = 1024;
  int64_t max_output_tokens = 0;
  int64_t responses_store = 256;
  double cache_ram_gb = -1;  // -1: a quarter of the memory available once the model is loaded
  std::string cache_dir;
  double cache_disk_gb = -1;  // -1: half the free space of cache_dir's file system
};

// Bytes of memory available (MemAvailable), 0 when unknown.
int64_t memory_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return int64_t(kb) * 1024;
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1e9);
  return buf;
}

// The folder's name; a GGUF file's name without .gguf and a split set's -00001-of-0000N.
std::string default_model_name(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (p.extension() == ".gguf") {
    name = p.stem().string();
    static const std::regex split(R"(-\d{5}-of-\d{5}$)");
    name = std::regex_replace(name, split, "");
  }
  return name.empty() ? "mla" : name;
}

int serve_cmd(int argc, char** argv) {
  CLI::App app{"Serve the model over an OpenAI-compatible HTTP API with continuous batching", "mla serve"};
  ServeOptions o;
  mla::cli::add_model_option(app, o.model_dir);
  mla::cli::add_tokenizer_option(app, o.tokenizer_dir);
  app.add_option("--host", o.host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", o.port, "TCP port (default 8080; 0: any free port, printed)");
  app.add_option("--kv-cache-gb", o.kv_cache_gb,
                 "KV cache budget in GB (default: max-num-seqs full contexts, at most 1 GiB)");
  mla::cli::add_cache_options(app, o.cache);
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "new tokens per forward pass: decode tokens + prefill chunks");
  app.add_option("--max-num-seqs", o.max_num_seqs, "sequences running at once");
  app.add_option("--chunk-depth", o.chunk_depth,
                 "while sequences decode, a pass does at most the attention work of max-batch-tokens tokens at this "
                 "depth: deep in a long prompt its chunks shrink, so that decoding sequences keep getting tokens "
                 "(default 16384; 0: no bound)");
  mla::cli::add_speculative_options(app, o.spec);
  mla::cli::add_cpu_options(app, o.cpu,
                            "fast (bf16 activations in the matrix products, AMX for prompts) | precise (float32 throughout)");
  app.add_option("--served-model-name", o.served_model_name, "the model name of the API (default: the folder's name, or the GGUF file's without .gguf)");
  app.add_flag("--no-prefix-cache", o.no_prefix_cache,
               "no prompt cache: prefixes are not shared between requests (nor kept in RAM or on disk)");
  app.add_option("--cache-ram-gb", o.cache_ram_gb,
                 "prompt cache pages kept in host RAM once the KV cache needs their room, GB (default: a quarter of "
                 "the memory available after loading; 0: off)");
  app.add_option("--cache-dir", o.cache_dir,
                 "keep prompt cache pages in files here, across restarts and shared by servers (default: off)");
  app.add_option("--cache-disk-gb", o.cache_disk_gb,
                 "bytes of page files under --cache-dir at most, GB (default: half the free space there)");
  app.add_flag("--no-webui", o.no_webui, "do not serve the chat page at GET /");
  app.add_option("--tool-call-parser", o.tool_call_parser,
                 "tool-call format of the output: deepseek_v3 | deepseek_v31 | kimi_k2 | glm47 | none "
                 "(default: from the checkpoint)");
  app.add_option("--tool-prompt", o.tool_prompt,
                 "auto | off: where the chat template does not read the request's tools (DeepSeek-V3 / R1's), write "
                 "them into the system prompt with the tool-call format (default auto)")
      ->check(CLI::IsMember({"auto", "off"}));
  app.add_option("--reasoning-parser", o.reasoning_parser,
                 "reasoning format of the output: deepseek_r1 | deepseek_v31 | kimi_k2 | glm45 | none "
                 "(default: from the checkpoint)");
  app.add_option("--chat-template-kwargs", o.chat_template_kwargs,
                 "JSON object of chat template variables for every request, e.g. '{\"thinking\": true}'");
  app.add_option("--api-key", o.api_key, "require Authorization: Bearer KEY on /v1/* (default: MLA_API_KEY)");
  app.add_option("--max-queued-requests", o.max_queued_requests,
                 "generation requests admitted beyond --max-num-seqs (waiting); more are answered 429 (default 128)");
  app.add_option("--shutdown-timeout", o.shutdown_timeout,
                 "seconds the first SIGINT/SIGTERM lets the requests in flight finish before cutting them (default 30)");
  app.add_option("--read-timeout", o.read_timeout,
                 "seconds for a whole request to arrive (else 408) and for an idle connection to stay open (default 10)");
  app.add_option("--max-request-bytes", o.max_request_bytes, "largest request body, else 413 (default 16 MiB)");
  app.add_option("--max-connections", o.max_connections, "open client connections at most, else 503 (default 1024)");
  app.add_option("--max-output-tokens", o.max_output_tokens,
                 "tokens one request generates at most, whatever it asks (default 0: the room left in the context)");
  app.add_option("--responses-store", o.responses_store,
                 "responses kept for previous_response_id (/v1/responses), least recently used dropped; 0: none "
                 "(default 256)");
  mla::cli::QuantizeOptions quantize;
  mla::cli::add_quantize_options(app, quantize);
  CLI11_PARSE(app, argc, argv);
  const mla::LoadQuantization load_quantization = quantize.parsed();
  if (o.kv_cache_gb < 0) throw std::invalid_argument("--kv-cache-gb must not be negative");
  if (o.port < 0 || o.port > 65535) throw std::invalid_argument("--port must be in [0, 65535]");
  if (o.max_num_seqs < 1) throw std::invalid_argument("--max-num-seqs must be positive");
  if (o.max_batch_tokens < 1) throw std::invalid_argument("--max-batch-tokens must be positive");
  if (o.chunk_depth < 0) throw std::invalid_argument("--chunk-depth must not be negative");
  if (o.max_queued_requests < 0 || o.max_queued_requests > 100000)
    throw std::invalid_argument("--max-queued-requests must be in [0, 100000]");
  if (!(o.shutdown_timeout >= 0) || o.shutdown_timeout > 86400)
    throw std::invalid_argument("--shutdown-timeout must be in [0, 86400] seconds");
  if (!(o.read_timeout > 0) || o.read_timeout > 3600)
    throw std::invalid_argument("--read-timeout must be in (0, 3600] seconds");
  if (o.max_request_bytes < 1024) throw std::invalid_argument("--max-request-bytes must be at least 1024");
  if (o.max_connections < 1) throw std::invalid_argument("--max-connections must be positive");
  if (o.max_output_tokens < 0) throw std::invalid_argument("--max-output-tokens must not be negative");
  if (o.cache_ram_gb < 0 && o.cache_ram_gb != -1)
    throw std::invalid_argument("--cache-ram-gb must not be negative");
  if (o.cache_disk_gb < 0 && o.cache_disk_gb != -1)
    throw std::invalid_argument("--cache-disk-gb must not be negative");
  if (o.cache_disk_gb >= 0 && o.cache_dir.empty()) throw std::invalid_argument("--cache-disk-gb needs --cache-dir");
  if (o.responses_store < 0 || o.responses_store > 1000000)
    throw std::invalid_argument("--responses-store must be in [0, 1000000]");
  nlohmann::json template_kwargs = nlohmann::json::object();
  if (!o.chat_template_kwargs.empty()) {
    template_kwargs = nlohmann::json::parse(o.chat_template_kwargs, nullptr, false);
    if (!template_kwargs.is_object()) throw std::invalid_argument("--chat-template-kwargs must be a JSON object");
  }
  if (o.api_key.empty())
    if (const char* k = std::getenv("MLA_API_KEY")) o.api_key = k;
  const mla::cpu::Context ctx = o.cpu.context();
  const mla::KvDType kv_dtype = o.cache.dtype();

  // Every thread started from here on inherits the blocked signals; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A file-size limit then fails the prompt cache's disk writes (EFBIG), which turns its disk
  // tier off, instead of ending the process.
  ::signal(SIGXFSZ, SIG_IGN);

  const mla::SpeculativeOptions spec = o.spec.options();
  auto model = mla::cli::load_model(o.model_dir, ctx, ::isatty(STDERR_FILENO), load_quantization, /*with_mtp=*/spec.enabled);
  auto tokenizer = mla::cli::load_tokenizer(o.model_dir, o.tokenizer_dir);
  auto generation = mla::cli::load_generation(o.model_dir, o.tokenizer_dir, model->config());
  const mla::ModelConfig& c = model->config();

  mla::EngineOptions eo;
  eo.page_size = o.cache.page_size;
  eo.kv_dtype = kv_dtype;
  eo.kv_pages = mla::kv_cache_pages(c, o.kv_cache_gb * 1e9, eo.page_size, kv_dtype, std::max<int64_t>(o.max_num_seqs, 1));
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.chunk_depth = o.chunk_depth;
  eo.max_running = o.max_num_seqs;
  eo.prefix_cache = !o.no_prefix_cache;
  if (eo.prefix_cache) {
    eo.prefix_tiers.ram_bytes = o.cache_ram_gb >= 0 ? int64_t(o.cache_ram_gb * 1e9) : memory_available() / 4;
    if (!o.cache_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o.cache_dir, ec);  // a failure turns the tier off with a warning
      const auto space = std::filesystem::space(o.cache_dir, ec);
      eo.prefix_tiers.disk_dir = o.cache_dir;
      eo.prefix_tiers.disk_bytes = o.cache_disk_gb >= 0 ? int64_t(o.cache_disk_gb * 1e9)
                                   : ec                 ? 0
                                                        : int64_t(space.available / 2);
      eo.prefix_tiers.fingerprint =
          mla::compute_fingerprint(mla::checkpoint_fingerprint(o.model_dir), model->context(), load_quantization);
      if (eo.prefix_tiers.disk_bytes == 0)
        std::fprintf(stderr, "mla serve: the prompt cache's disk tier is off: no room under %s\n", o.cache_dir.c_str());
    }
    eo.prefix_tiers.warn = [](const std::string& m) {
      std::fprintf(stderr, "mla serve: %s\n", m.c_str());
      std::fflush(stderr);
    };
  }
  eo.speculative = spec;

  mla::parallel::Comm& world = mla::parallel::world();
  const bool parallel = world.size() > 1;
  if (parallel && spec.enabled) throw std::invalid_argument("--speculative does not run under mpirun yet");
  if (world.rank() > 0) {  // the prompt cache's tiers are rank 0's: it sends the pages it copies in
    mla::LatentPool pool = model->make_pool(eo.kv_pages, eo.page_size, kv_dtype);
    mla::follow(world, *model, pool);
    return 0;
  }
  std::atomic<mla::server::Server*> serving{nullptr};
  std::mutex failure_mu;
  std::string failure;
  std::shared_ptr<mla::Leader> leader;
  if (parallel) {
    leader = std::make_shared<mla::Leader>(world, eo.kv_pages, eo.page_size, kv_dtype, [&](const std::string& why) {
      std::fprintf(stderr, "mla serve: %s: answering the requests in flight 503, then ending the job\n", why.c_str());
      std::fflush(stderr);
      {
        std::lock_guard lk(failure_mu);
        failure = why;
      }
      if (auto* s = serving.load()) s->stop_now();
    });
    eo.leader = leader;
  }
  mla::Engine engine(*model, &tokenizer, eo);
  const int64_t pages = eo.kv_pages;

  mla::server::ServerOptions sopt;
  sopt.host = o.host;
  sopt.port = o.port;
  sopt.model_name = o.served_model_name.empty() ? default_model_name(o.model_dir) : o.served_model_name;
  sopt.tool_call_parser = o.tool_call_parser;
  sopt.reasoning_parser = o.reasoning_parser;
  sopt.tool_prompt = o.tool_prompt == "auto";
  sopt.chat_template_kwargs = template_kwargs;
  sopt.api_key = o.api_key;
  sopt.webui = !o.no_webui;
  sopt.max_queued_requests = o.max_queued_requests;
  sopt.shutdown_timeout = o.shutdown_timeout;
  sopt.read_timeout = o.read_timeout;
  sopt.max_body_bytes = size_t(o.max_request_bytes);
  sopt.max_connections = o.max_connections;
  sopt.max_output_tokens = o.max_output_tokens;
  sopt.responses_store = size_t(o.responses_store);
  mla::server::Server server(engine, tokenizer, generation, c, sopt);
  serving = &server;
  const int port = server.bind();
  engine.start();

  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    int received = 0;
    timespec tick{0, 100 * 1000 * 1000};
    std::chrono::steady_clock::time_point second{};
    while (!done) {
      // The second signal exits at once: if cutting takes longer than an engine step or two
      // (a slow forward pass, a client that does not read), the process ends anyway.
      if (received >= 2 && std::chrono::steady_clock::now() - second > std::chrono::seconds(2)) {
        std::fprintf(stderr, "mla serve: exiting without waiting for the requests in flight\n");
        std::fflush(stderr);
        std::_Exit(1);
      }
      int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig < 0) continue;
      if (parallel && ++received == 1) {
        std::fprintf(stderr, "mla serve: %s: cutting the requests in flight (mpirun)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::fflush(stderr);
        world.interrupt();  // a pass waiting for a dead rank ends now
        server.stop_now();
        engine.cancel_all();
      } else if (parallel) {
        continue;  // the first one cut everything already
      } else if (++received == 1) {
        std::fprintf(stderr,
                     "mla serve: %s: finishing the requests in flight, at most %g s (again to cut them now)\n",
                     sig == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_timeout);
        server.stop();
      } else if (received == 2) {
        std::fprintf(stderr, "mla serve: cutting the requests in flight\n");
        second = std::chrono::steady_clock::now();
        server.stop_now();
        engine.cancel_all();
      }
    }
  });

  std::fprintf(stderr,
               "mla serve: %s on http://%s:%d  (KV cache %lld pages x %lld tokens, %s, %lld bytes per token; "
               "batches of up to %lld tokens, %lld sequences)\n",
               sopt.model_name.c_str(), o.host.c_str(), port, (long long)pages, (long long)eo.page_size,
               o.cache.kv_dtype.c_str(), (long long)engine.pool().bytes_per_token(), (long long)eo.max_batch_tokens,
               (long long)engine.options().max_running);
  if (eo.prefix_cache) {
    const mla::PrefixCacheStats pc = engine.stats().prefix;
    std::string disk = "off";
    if (pc.disk_on)
      disk = o.cache_dir + ", " + gb(double(pc.disk_budget)) + " GB (" + gb(double(pc.disk_bytes)) + " GB in use" +
             (pc.disk_writable ? "" : ", read only") + ")";
    const std::string ram = pc.ram_budget > 0 ? gb(double(pc.ram_budget)) + " GB" : "off";
    std::fprintf(stderr, "mla serve: prompt cache: KV cache pages, then RAM %s, then disk %s\n", ram.c_str(),
                 disk.c_str());
  }
  if (sopt.webui) std::fprintf(stderr, "mla serve: chat page: http://%s:%d/\n", o.host.c_str(), port);
  std::fflush(stderr);
  server.listen();
  engine.stop();
  done = true;
  signal_thread.join();
  if (parallel) {
    std::lock_guard lk(failure_mu);
    if (!failure.empty()) {
      std::fprintf(stderr, "mla serve: error on rank 0 of %d: %s\n", world.size(), failure.c_str());
      std::fflush(stderr);
      world.abort(1);
    }
    world.resume();  // no pass was cut: the followers wait for the stop
    leader->stop();
  }
  auto st = engine.stats();
  std::fprintf(stderr, "mla serve: stopped after %lld requests, %lld tokens generated\n",
               (long long)st.requests_finished, (long long)st.generation_tokens);
  return 0;
}

mla::cli::Command reg_serve("serve", "OpenAI-compatible HTTP server with continuous batching", serve_cmd);

}  // namespace
