// The parts of `mla bench` (tools/bench.h) behind run(): the state its sections share, the
// sections in the order run() calls them, and what two or more of them use. Internal to
// src/tools/bench/.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kv/latent_pool.h"
#include "model/model.h"
#include "model/weights.h"
#include "parallel/comm.h"
#include "tools/bench.h"
#include "tools/checkpoint_writer.h"

namespace mla::bench {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- the job's ranks (ranks.cpp) ----

// The ranks of the job as the benchmark uses them (one process: a world of one rank).
class Ranks {
 public:
  bool lead() const { return comm_.rank() == 0; }  // writes the checkpoint, probes, reports
  bool many() const { return comm_.size() > 1; }
  parallel::Comm& comm() { return comm_; }
  // Before each timed run: every rank has arrived (rank 0 from its probes) before any starts.
  void sync() {
    if (many()) comm_.barrier();
  }

 private:
  parallel::Comm& comm_ = parallel::world();
};

// Adds one timed run to a CombineShare: the combine counters before and after it, its seconds.
void add_combine(CombineShare& to, const parallel::CombineCounters& before, const parallel::CombineCounters& after,
                 double seconds);
// The sums of `n` steps or prompts as the figures of one.
CombineShare per_one(CombineShare c, double n);
// Expert-parallel: every rank's RankFigures gathered on every rank (all must call it).
std::vector<RankFigures> gather_rank_figures(Ranks& ranks, const RankFigures& mine);

// ---- the weights a token reads (weights.cpp) ----

inline double view_bytes(const MatrixView& m) { return double(m.bytes() + m.scale_bytes()); }
// One routed expert's bytes (gate, up, down) in a layer; 0 for a dense layer (or a layer of
// which this rank holds no expert).
double expert_bytes(const LayerWeights& L);
// The routed experts' bytes this process holds, every layer's and the MTP module's.
double held_routed_bytes(const ModelWeights& w);
// Whether the routed experts this process holds are INT4 / INT8 groups (the prompt's VNNI path).
bool held_int_experts(const ModelWeights& w);
// Faults in every page of the weights so timed runs do not pay for first touches.
uint64_t touch_all(const ModelWeights& w);

// Every weight one decoded token reads but its routed experts and its embedding row, with the
// part of the model it belongs to: f(part, view) for each view that holds data. The same for one
// decoder layer.
template <class F>
void each_fixed_layer_weight(const LayerWeights& L, F&& f) {
  auto visit = [&](const char* part, const MatrixView& m) {
    if (m.data) f(part, m);
  };
  auto mlp = [&](const char* part, const Mlp& p) {
    for (const MatrixView* m : {&p.gate, &p.up, &p.down}) visit(part, *m);
  };
  for (const MatrixView* m : {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.kv_b, &L.o}) visit("attention", *m);
  if (L.moe) {
    visit("router", L.router);
    if (L.has_shared) mlp("shared experts", L.shared);
  } else {
    mlp("dense mlp", L.dense);
  }
}

template <class F>
void each_fixed_weight(const ModelWeights& w, F&& f) {
  for (const auto& L : w.layers) each_fixed_layer_weight(L, f);
  if (w.lm_head.data) f("lm_head", w.lm_head);
}

// ---- the profile of the model's passes (profile.cpp) ----

// Profiles the model's passes into `to` while it lives (null: unprofiled): the one place the
// benchmark attaches a profile to the model.
class Profiled {
 public:
  Profiled(Model& model, ForwardProfile* to);
  ~Profiled();
  Profiled(const Profiled&) = delete;
  Profiled& operator=(const Profiled&) = delete;

 private:
  Model& model_;
  std::optional<ForwardProfiler> profiler_;
};
// Milliseconds per pass in each part of a profile, the parts that took any time.
std::vector<std::pair<std::string, double>> per_pass_ms(const ForwardProfile& p, double passes);

// ---- the checkpoint (checkpoint.cpp) ----

// Progress lines to stderr, unless quiet (run.cpp).
struct Say {
  bool quiet = false;
  void operator()(const std::string& s) const;
};

// The random checkpoint's weights of Options::weights; throws on an unknown name.
RandomWeights random_weights(const std::string& weights);
// The checkpoint run() measures, loaded and paged in: Options::model, or the random one, written
// first when missing (rank 0 writes it, the others wait for it). Sets rep.dir, rep.shape,
// rep.own_model, rep.write_seconds and rep.load_seconds.
std::unique_ptr<Model> load_checkpoint(const Options& opt, const cpu::Context& ctx, Ranks& ranks, const Say& say,
                                       Report& rep);
// Whether the prompt's routed experts are INT4 / INT8 groups: quantized so at load, or as the
// user's checkpoint holds them, or as the random checkpoint is written.
bool int_experts(const Options& opt, const Report& rep, const Model& model);
// Whether `dir` holds a checkpoint (a config.json); one whose stamp (mla-bench.json) does not say
// `want` throws, naming `what` ("the benchmark's").
bool holds_checkpoint(const std::string& dir, const nlohmann::json& want, const std::string& what);
// The stamp of a checkpoint just written into `dir`.
void stamp_checkpoint(const std::string& dir, const nlohmann::json& want);

// ---- the cache (depth.cpp) ----

// Fills `seq` with `S` random cached tokens in every layer of the pool: latent rows and indexer
// keys of unit scale (normed c_KV, rotated k_pe, normed and rotated keys). Rows differ by one
// fresh value each, so filling 64k tokens draws no more than it writes.
void fill_random_cache(LatentPool& pool, int64_t kvr, PageTable& seq, int64_t S, std::mt19937& rng);

// ---- what every section shares (run.cpp) ----

// The ids every section feeds: random, or consecutive tokens of Options::text (wrapping at its
// end), drawn in the order the sections ask for them.
class Ids {
 public:
  Ids(int64_t vocab_size, std::vector<int32_t> text);
  std::vector<int32_t> operator()(int64_t n);

 private:
  std::mt19937 rng_{42};
  std::uniform_int_distribution<int32_t> tok_;
  std::vector<int32_t> text_;
  size_t at_ = 0;
};

// What every section works with: the options, the report it fills, the model, the ranks, the
// ids; the timed passes of run()'s own sections share `fo` and `logits` (sized by the first pass,
// so no timed pass allocates them).
struct Bench {
  const Options& opt;
  Report& rep;
  Model& model;
  const cpu::Context& ctx;
  Ranks& ranks;
  Ids& ids;
  Say say;
  RankFigures& mine;  // this rank's figures, gathered into rep.rank_rows at the end
  ReadLoop* loop;     // rank 0's read loop (null on the other ranks)
  ForwardOptions fo;  // logits of the last token only
  std::vector<float> logits;
};

// One pass of the model over `ids` new tokens of one sequence.
void forward_one(Model& model, PageTable& seq, std::span<const int32_t> ids, LatentPool& pool, const ForwardOptions& fo,
                 std::vector<float>& logits);
// `n` decode steps of one sequence, a fresh id each.
void decode_steps(Bench& b, PageTable& seq, int64_t n, LatentPool& pool, const ForwardOptions& fo);
// One decode step of every sequence of `seqs` together, a fresh id each (toks, batch: the step's
// ids and slices, kept between steps).
void batch_step(Bench& b, std::vector<PageTable>& seqs, std::vector<std::vector<int32_t>>& toks,
                std::vector<SeqSlice>& batch, LatentPool& pool);
// An engine of one running sequence of at most `tokens` tokens, without the prefix cache.
EngineOptions one_sequence_engine(int64_t tokens);
// A greedy request of a `prompt`-token prompt and `tokens` decoded after its prompt's pass.
Request greedy_request(Ids& ids, int64_t prompt, int64_t tokens);

// ---- the sections, in run()'s order ----

void measure_depths(Bench& b);       // depth.cpp: Options::depths, instead of every section below
void measure_decode(Bench& b);       // decode.cpp: decode, batch 1, and through the engine
void measure_speculative(Bench& b);  // speculative.cpp
void measure_prompt(Bench& b);       // prompt.cpp
void measure_scaling(Bench& b);      // scaling.cpp: 1 thread against all
void measure_batched(Bench& b);      // batched.cpp
// prompt.cpp: seconds of one prompt of prompt_tokens on a fresh sequence, in the pass context pc
// (null: the model's).
double prompt_seconds(Bench& b, const cpu::Context* pc);

}  // namespace mla::bench
