// What `mla bench` and the bench programs measure, and the limits they compare against: the
// machine's memory read bandwidth (an AVX-512 read loop over a buffer far larger than the
// caches), the weight bytes a decoded token must read, and the model benchmark itself (decode,
// prompt processing, batched decode on a random-weight checkpoint).
//
// Under `mpirun -np N` (expert parallelism, parallel/expert_parallel.h) run() runs on every rank:
// rank 0 writes the checkpoint when it is missing while the others wait; every rank then runs the
// same model passes in the same order (fixed counts, the same random ids: no rank decides
// anything from its own timings), and each timed run starts with a barrier, so no rank's timer or
// combine counter holds another rank's work outside the run. The per-machine probes (the read
// loop, the token read, the GEMM and compute-peak loops) run on rank 0 only, between the timed
// runs, while the others wait at that barrier: on one host, probes on every rank at once would
// share its memory bus and cores and measure neither rank's limit; on hosts of one kind rank 0's
// figure stands for each. The report is rank 0's, with every rank's RankFigures. What cannot run
// in step (the speculative rows: the adaptive gate decides from each rank's own timings) is
// skipped, saying why (Report::skipped).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/probe.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "parallel/expert_parallel.h"

namespace mla::bench {

// Best-of-`runs` read bandwidth in GB/s (1e9 bytes/s) of a loop of 64-byte AVX-512 loads over a
// `bytes` buffer (huge pages where the system allows), split over `threads` threads (0: all
// cores, as cpu::Context::threads).
double read_bandwidth_gbps(size_t bytes = size_t(2) << 30, int runs = 5, int threads = 0);

// The same loop over a buffer kept between measurements.
class ReadLoop {
 public:
  explicit ReadLoop(size_t bytes, int threads = 0) : buffer_(bytes, threads) {}
  double measure(int passes);  // best of `passes`, GB/s

 private:
  cpu::ReadBuffer buffer_;
};

// The same loop over the bytes one decoded token reads, where the model holds them (see
// ActiveWeights): every weight but the routed experts, plus num_experts_per_tok routed experts
// per MoE layer and one embedding row drawn afresh for each pass, as a router's choice and a new
// token are. The limit a decode step can reach on this machine for exactly its own weights.
// Expert-parallel, of the experts drawn it reads those this rank holds, as the rank's step does.
class TokenRead {
 public:
  TokenRead(const ModelWeights& w, const ModelConfig& c, uint32_t seed = 7, int threads = 0);
  double measure(int passes);  // best of `passes`, GB/s
  double bytes_per_pass() const { return bytes_; }

 private:
  static void add(std::vector<cpu::ReadSpan>& to, const MatrixView& m);  // m's weights and scales
  void draw();  // this pass's spans
  const ModelWeights& w_;
  int64_t experts_per_token_;
  uint32_t rng_state_;
  int threads_;
  std::vector<cpu::ReadSpan> fixed_, spans_;
  double bytes_ = 0;
};

struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> v);

// The weights one decoded token reads (one sequence, batch 1): every attention projection,
// the dense MLP or the shared experts, the router, num_experts_per_tok routed experts, lm_head
// and one embedding row. Bytes as stored (scales included), parameters as counted.
struct ActiveWeights {
  double bytes = 0;
  double params = 0;
  std::map<std::string, double> bytes_by_part;  // attention, dense, shared, routed, router, lm_head, embed
  std::map<std::string, double> params_by_part;
};

// Floating-point operations of a T-token prompt (logits of its last token only): two per
// weight per token through the active weights, lm_head once, and the causal attention products
// (QK^T and PV, T(T+1)/2 query-key pairs per head and layer).
double prompt_flops(const ActiveWeights& a, const ModelConfig& c, int64_t T);

// GFLOPS of oneDNN's bf16 matmul (n x n x n, AMX where the CPU has it) on this machine now: the
// compute reference prompt processing is set against; on ctx's threads.
class GemmProbe {
 public:
  explicit GemmProbe(int64_t n = 2048, const cpu::Context& ctx = {});
  double measure(int passes);  // best of `passes`
  int64_t n() const { return n_; }

 private:
  int64_t n_;
  cpu::Context ctx_;
  std::vector<uint16_t> a_, b_;
  std::vector<float> c_;
};
ActiveWeights active_weights(const ModelWeights& w, const ModelConfig& c);

struct Options {
  std::string dir;                // checkpoint folder: written when it holds no config.json
  // A checkpoint of the user's to measure instead of the random one (its weights as stored,
  // nothing written; the random checkpoint's options --dir, --layers, --weights, --config do not
  // apply). Without an MTP module the MTP rows are skipped, saying so.
  std::string model;
  // A text file: every section feeds consecutive tokens of it (the checkpoint's tokenizer,
  // wrapping at its end) instead of random ids, so a trained model routes, drafts and accepts
  // as on real text. Empty: random ids.
  std::string text;
  int64_t layers = 6;
  std::string weights = "bf16";   // bf16 | fp8 | int4 | int4-fp8 (INT4 experts, FP8 projections)
  int threads = 0;                // 0: all
  int runs = 5;
  int64_t decode_tokens = 16;     // tokens per decode run
  int64_t context = 8;            // tokens in the cache before the decode runs
  int64_t prompt_tokens = 512;
  std::vector<int64_t> batches = {1, 4, 16, 64};
  int64_t batch_steps = 4;        // decode steps per batched run
  std::string precision = "fast";
  std::string huge_pages = "auto";  // auto | on | off: weights copied onto huge pages at load
  size_t bandwidth_bytes = size_t(2) << 30;
  int64_t gemm_n = 2048;          // the GEMM probe's n x n x n (prompt processing's reference)
  // Speculative decoding (batch 1, greedy, through the engine): tokens per run (0: skip) and
  // draft tokens per verify pass.
  int64_t spec_tokens = 64;
  int64_t draft_tokens = 1;
  std::string draft_head = "int4";  // the MTP drafts' head: bf16 (as stored) | fp8 | int4
  bool quiet = false;
  // The checkpoint's config.json with num_hidden_layers replaced by `layers` (and layers + 1 for
  // the MTP module's layer). Null: bench_checkpoint_config, DeepSeek-V2-Lite's shape, the one
  // every recorded figure used. Tests give a small model of the same family so a run takes seconds.
  nlohmann::json checkpoint_config;
  LoadQuantization quantize;  // quantize at load (weights as stored when unset)
  bool amx = true;            // false: the AVX-512 BF16 kernels where the CPU has AMX (cpu::Context::amx)
  cpu::Context::VectorGemm vector_gemm = cpu::Context::VectorGemm::Auto;  // cpu::Context::vector_gemm
  bool int8_activations = true;                                             // cpu::Context::int8_activations
  bool repack = true;                                                       // cpu::Context::repack_weights
  // Decode and prompt on 1 thread against `threads`, alternating runs (skipped on one thread).
  bool scaling = true;
  // When not empty, instead of every section above: at each of these depths (tokens already in
  // the cache, random latent rows), a prompt of prompt_tokens and a decode run of decode_tokens
  // steps after them, in alternating runs (Report::depth_rows), as llama-bench -d measures.
  std::vector<int64_t> depths;
  // The depth rows' batch sizes: at each depth, B sequences of `depth` cached tokens decode
  // together (the prompt runs for B = 1 only).
  std::vector<int64_t> depth_batches = {1};
};

// One depth of the depth rows (Options::depths): tokens/s of the prompt and of the decode run
// after `depth` cached tokens, and where a decode step's time goes.
struct DepthRow {
  int64_t depth = 0;
  int64_t batch = 1;             // sequences per decode step, each after `depth` cached tokens
  Summary prompt_tps, decode_tps;  // decode: tokens/s over all sequences
  double step_ms = 0;            // a decode step, all parts (the profile's sum), mean over the timed runs
  double attention_ms = 0;       // of which the attention over the cache (ForwardProfile::Attention)
  double attn_proj_ms = 0;       // and the attention's projections (AttnProj, OProj)
  double combine_ms = 0;         // expert-parallel: of the step, the MoE combine across the ranks
  double latent_bytes = 0;       // cache rows a decode step attends over, as stored, all layers, mean per step
  std::vector<std::pair<std::string, double>> decode_parts_ms;
};

// One acceptance rate of the speculative-decoding comparison: injected drafts that are right
// with that probability, against plain decode in alternating runs.
struct SpecRow {
  double target_acceptance = 0;
  bool adaptive = true;
  double acceptance = 0, tokens_per_step = 0;  // as measured (Engine::stats)
  Summary plain_tps, spec_tps, ratio;          // ratio: per pair of runs
  bool identical = true;                       // greedy tokens equal plain decode's
};

// One kind of pass of a speculative step, timed at the model level (mla bench): ms per pass by
// part, routed experts read per MoE layer, and the weight bytes it reads (routed experts at the
// measured count, scales included).
struct PassCost {
  std::vector<std::pair<std::string, double>> parts_ms;
  double ms = 0, experts_per_layer = 0, bytes = 0;
};

// A speculative step against a plain decode step, from the model-level passes: the plain pass,
// the verify pass (1 + k rows, one-token kernels, draft tokens drawn at random so the rows route
// as unrelated tokens do) and the MTP draft (k passes of the module: the catch-up row, then k - 1
// chained, with its draft head).
struct SpecCosts {
  PassCost plain, verify, draft;
  std::string draft_head;        // the draft head's format
  double draft_head_error = 0;   // its relative RMS error against the head as stored
  // Tokens per second against plain decode at t tokens per step, by bytes (the ceiling a
  // bandwidth-bound machine allows) and by the measured pass times; with_draft: the MTP draft's
  // cost counted (injected drafts cost nothing).
  double bytes_ratio(double t, bool with_draft) const {
    const double step = verify.bytes + (with_draft ? draft.bytes : 0);
    return step > 0 ? t * plain.bytes / step : 0;
  }
  double time_ratio(double t, bool with_draft) const {
    const double step = verify.ms + (with_draft ? draft.ms : 0);
    return step > 0 ? t * plain.ms / step : 0;
  }
};

// The MoE layers' combine across the ranks (CombineCounters) over timed runs, per decode step or
// per prompt: bytes this rank received, seconds it spent in the combine (waiting for the
// slowest rank included), and the seconds of the steps or prompts themselves.
struct CombineShare {
  double bytes = 0, seconds = 0, step_seconds = 0;
  double share() const { return step_seconds > 0 ? seconds / step_seconds : 0; }
};

// Expert-parallel runs: one rank's share of the model and of the work, as that rank measured it.
struct RankFigures {
  parallel::ExpertRange experts;  // the routed experts it holds, of each MoE layer (the MTP module's too)
  double weight_bytes = 0;        // weights held: every format, scales included
  double routed_bytes = 0;        // of which routed experts (the rest is replicated on every rank)
  // A decode step (batch 1): the weights it reads on this rank (every weight the rank computes
  // with: the shared experts on rank 0 only; the routed experts it ran, counted) and the routed
  // experts it ran per MoE layer.
  double decode_read_bytes = 0, decode_experts_per_layer = 0;
  CombineShare decode, prompt;    // per decode step (batch 1), per prompt
};

struct Report {
  std::string dir, weights, precision;
  std::string shape = "DeepSeek-V2-Lite shape";  // the checkpoint's config, in words
  bool own_model = false;                         // Options::model: the user's weights, not random ones
  std::string text;                               // Options::text, and its token count in words
  int threads = 0;
  int64_t prompt_tokens = 0, context = 0;
  double bandwidth_gbps = 0;
  ActiveWeights active;
  std::map<std::string, size_t> bytes_by_format;
  size_t rss_bytes = 0, rss_anon_bytes = 0, rss_file_bytes = 0;
  size_t peak_rss_bytes = 0;  // VmHWM: the most resident at any time (writing, loading, running)
  size_t arena_bytes = 0, arena_huge_bytes = 0;  // weights copied at load, of which on huge pages
  Summary decode_tps, prompt_tps;
  Summary decode_bandwidth, decode_ratio;  // the read loop after each decode run; the ratio per run
  Summary token_bandwidth, token_ratio;    // TokenRead after each decode run; the ratio per run
  // The same decode through the Engine (mla run's and serve's loop: scheduling, greedy sampling
  // over the logits row, stop checks): its tokens/s, and per run its ratio to the model-level
  // decode run just before it.
  Summary engine_decode_tps, engine_ratio;
  double prompt_flops = 0;                  // per prompt
  int64_t gemm_n = 0;
  Summary prompt_gemm_gflops, prompt_ratio;  // the GEMM probe before each prompt run; prompt GFLOPS over it
  // The compute peak of the prompt's path (cpu::peak_gflops, a register-only loop): its name,
  // around each prompt run on `threads` (the better of before and after) and the prompt's ratio
  // to it per run; then on 1, 2, ... threads.
  std::string peak_path;
  Summary prompt_peak_gflops, prompt_peak_ratio;
  std::vector<std::pair<int, double>> peak_by_threads;
  // Scaling: tokens/s on 1 thread and on `threads` in alternating runs, and per pair the ratio.
  Summary scale_decode_1, scale_decode_n, scale_decode_ratio, scale_prompt_1, scale_prompt_n, scale_prompt_ratio;
  size_t bandwidth_bytes = 0;
  std::vector<std::pair<int64_t, Summary>> batched_tps;  // batch size, tokens/s over all sequences
  int64_t draft_tokens = 0;
  std::vector<SpecRow> spec;
  // The MTP module's own drafts (when the checkpoint has one): its cost per verify step against
  // a plain decode step, its acceptance on these random weights, and the tokens/s ratio.
  bool have_mtp = false;
  std::string mtp_missing;  // without it: why (the MTP rows and the draft pass are left out)
  double mtp_draft_ms = 0, mtp_cost_ratio = 0, mtp_acceptance = 0;
  SpecRow mtp;
  SpecCosts spec_costs;
  double load_seconds = 0, write_seconds = 0;
  // Milliseconds per decoded token, and per prompt, in each part of the forward pass (timed runs).
  std::vector<std::pair<std::string, double>> decode_parts_ms, prompt_parts_ms;
  // Options::depths: one row per depth, the cache's format, the decode steps per run.
  std::vector<DepthRow> depth_rows;
  std::string kv_dtype;
  std::string attention_kernels;  // MlaAttention::kernel_names of the depth rows' cache
  int64_t decode_tokens = 0;
  int runs = 0;
  // Weights held by this process (rank 0 under mpirun): all, and the routed experts among them.
  double weight_bytes = 0, routed_bytes = 0;
  // The weights a decode step (batch 1) reads here: active.bytes in one process; expert-parallel,
  // RankFigures::decode_read_bytes. The decode limits are set against it.
  double decode_read_bytes = 0;
  // Expert-parallel (mpirun -np N, N > 1): every rank's figures, and the parts left out.
  int ranks = 1;
  std::vector<RankFigures> rank_rows;
  std::vector<std::string> skipped;
  // decode tokens/s at the bandwidth limit: bandwidth / the bytes a decode step reads here.
  double limit_tps() const { return decode_read_bytes > 0 ? bandwidth_gbps * 1e9 / decode_read_bytes : 0; }
};

// Writes the checkpoint if needed (mla::write_random_checkpoint of the preset table's
// bench_checkpoint_config(layers), and beside it an MTP module in mtp.safetensors: the main
// layers' files are what they were without it), loads it and measures. Progress lines go to stderr unless quiet.
// Under mpirun every rank must call it (see the top of this file); rank 0's report is the job's.
Report run(const Options& opt);
std::string format_report(const Report& r);

// DeepSeek Sparse Attention at DeepSeek-V3.2's attention shape (128 heads, kv_lora 512, rope 64,
// indexer 64 heads of 128, top-2048), in two parts, each at every context, timed in one run:
//  one layer: random weights and a pool of `context` random cached tokens; per decoded token the
//    dense absorbed attention over every cached token against the indexer's pass (scores over
//    every cached key, top-k) plus absorbed attention over the top-k; the indexer pass's read of
//    its key cache in GB/s against the machine's read loop (a pass of the loop before each
//    indexer pass, so the keys come from memory as in a model of many layers), for the kernel the
//    context dispatches and for every scoring kernel this CPU runs;
//  model: a random V3.2-shaped checkpoint of `layers` layers (V3.2's attention and indexer, a
//    small MoE and vocabulary so that it fits and writes quickly), its cache filled with
//    `context` random tokens; decode steps with DSA and with the same weights attending densely
//    (ForwardOptions::dense_attention), alternating: tokens/s and the attention's time per token.
struct DsaOptions {
  std::vector<int64_t> contexts = {4096, 16384, 65536};
  int threads = 0;
  int runs = 5;  // timed decode steps per figure, after one warm-up step
  std::string kv_dtype = "bf16";
  std::string precision = "fast";
  std::string dir;         // the model part's checkpoint (default <tmp>/mla-bench-v32-<L>L); reused when present
  int64_t layers = 3;      // 0: no model part
};
struct DsaRow {
  int64_t context = 0;
  Summary dense_ms, sparse_ms, indexer_ms;  // per token: dense attention; indexer + sparse; the indexer alone
  Summary topk_ms;                          // the indexer's top-k selection alone
  double index_read_bytes = 0;              // the indexer cache one pass reads
  double pool_bytes = 0;                    // the whole cache of the layer at this context
  std::vector<std::pair<std::string, Summary>> kernel_ms;  // each scoring kernel's pass alone
};
struct DsaModelRow {
  int64_t context = 0;
  Summary dense_tps, dsa_tps;          // decode tokens/s
  double dense_attn_ms = 0, dsa_attn_ms = 0;  // attention per token, all layers (DSA: indexer included)
};
struct DsaReport {
  int threads = 0;
  std::string kv_dtype, precision, kernel;  // kernel: the scoring kernel the context dispatches
  double bandwidth_gbps = 0;
  Summary loop_gbps;  // the read loop's passes between indexer passes
  std::vector<DsaRow> rows;
  std::string model_dir, model_desc;
  std::vector<DsaModelRow> model_rows;
};
DsaReport run_dsa(const DsaOptions& opt);
std::string format_dsa_report(const DsaReport& r);

}  // namespace mla::bench
