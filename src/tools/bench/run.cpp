// `mla bench`'s run (see tools/bench.h): the checkpoint, then the sections in a fixed order, the
// same on every rank under mpirun.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>

#include "backend/cpu/precision.h"
#include "backend/cpu/weight_memory.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// The options that no section checks where it starts, checked before anything runs.
void check_options(const Options& opt) {
  random_weights(opt.weights);
  if (opt.layers < 2) throw std::invalid_argument("--layers must be at least 2 (a dense layer, then MoE)");
  if (opt.runs < 1) throw std::invalid_argument("--runs must be at least 1");
  for (int64_t d : opt.depths)
    if (d < 0) throw std::invalid_argument("--depth: a depth is a count of tokens, not " + std::to_string(d));
  if (!opt.depths.empty() && opt.prompt_tokens <= 0 && opt.decode_tokens <= 0)
    throw std::invalid_argument("--depth needs --prompt-tokens or --decode-tokens above 0");
  for (int64_t b : opt.depth_batches)
    if (b < 1) throw std::invalid_argument("--depth-batches: a batch holds at least one sequence, not " + std::to_string(b));
}

cpu::Context context_of(const Options& opt) {
  cpu::Context ctx;
  ctx.threads = std::max(0, opt.threads);
  if (opt.huge_pages == "auto") ctx.weights = cpu::WeightPlacement::Auto;
  else if (opt.huge_pages == "on") ctx.weights = cpu::WeightPlacement::HugePages;
  else if (opt.huge_pages == "off") ctx.weights = cpu::WeightPlacement::Mapped;
  else throw std::invalid_argument("--huge-pages: unknown '" + opt.huge_pages + "' (auto, on, off)");
  ctx.precision = cpu::parse_precision(opt.precision);
  ctx.amx = opt.amx;
  ctx.vector_gemm = opt.vector_gemm;
  ctx.int8_activations = opt.int8_activations;
  ctx.repack_weights = opt.repack;
  return ctx;
}

// Options::text as the checkpoint's tokenizer encodes it (empty without one); its size in words
// into rep.text.
std::vector<int32_t> text_ids(const Options& opt, const ModelConfig& c, Report& rep) {
  if (opt.text.empty()) return {};
  std::ifstream f(opt.text, std::ios::binary);
  if (!f) throw std::invalid_argument("--text " + opt.text + ": cannot read it");
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<int32_t> text = Tokenizer::load(rep.dir).encode(s, false);
  for (int32_t t : text)
    if (t < 0 || t >= c.vocab_size)
      throw std::invalid_argument("--text: token " + std::to_string(t) + " is outside the model's vocabulary of " +
                                  std::to_string(c.vocab_size) + ": the tokenizer is not the model's");
  if (text.size() < 2) throw std::invalid_argument("--text " + opt.text + ": fewer than 2 tokens");
  rep.text = opt.text + " (" + std::to_string(text.size()) + " tokens)";
  return text;
}

// A field of /proc/self/status in bytes ("VmRSS", "RssAnon", "RssFile").
size_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return size_t(std::stoull(line.substr(field.size() + 1))) * 1024;
  return 0;
}

// The weights' sizes and where a decode step's bytes stand, before any section runs.
void weight_figures(const Model& model, Report& rep, RankFigures& mine) {
  rep.active = active_weights(model.weights(), model.config());
  rep.bytes_by_format = model.weights().bytes_by_format;
  for (auto& [fmt, n] : rep.bytes_by_format) rep.weight_bytes += double(n);
  rep.routed_bytes = held_routed_bytes(model.weights());
  rep.decode_read_bytes = rep.active.bytes;
  mine.experts = model.local_experts();
  mine.weight_bytes = rep.weight_bytes;
  mine.routed_bytes = rep.routed_bytes;
}

// Resident memory and the weights' arena, read once the runs are done; then every rank's figures
// to rank 0's report (every rank calls this once, at the end).
void finish(Bench& b) {
  Report& rep = b.rep;
  rep.rss_bytes = status_bytes("VmRSS");
  rep.rss_anon_bytes = status_bytes("RssAnon");
  rep.rss_file_bytes = status_bytes("RssFile");
  rep.peak_rss_bytes = status_bytes("VmHWM");
  if (const auto& arena = b.model.weights().arena) {
    rep.arena_bytes = arena->bytes();
    rep.arena_huge_bytes = arena->huge_bytes();
  }
  if (b.ranks.many()) rep.rank_rows = gather_rank_figures(b.ranks, b.mine);
}

}  // namespace

Ids::Ids(int64_t vocab_size, std::vector<int32_t> text)
    : tok_(0, int32_t(vocab_size - 1)), text_(std::move(text)) {}

std::vector<int32_t> Ids::operator()(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) {
    if (text_.empty()) {
      x = tok_(rng_);
    } else {
      x = text_[at_];
      at_ = (at_ + 1) % text_.size();
    }
  }
  return v;
}

void Say::operator()(const std::string& s) const {
  if (!quiet) std::fprintf(stderr, "%s\n", s.c_str());
}

void forward_one(Model& model, PageTable& seq, std::span<const int32_t> ids, LatentPool& pool, const ForwardOptions& fo,
                 std::vector<float>& logits) {
  SeqSlice s{&seq, ids};
  model.forward(std::span<SeqSlice>(&s, 1), pool, fo, logits);
}

void decode_steps(Bench& b, PageTable& seq, int64_t n, LatentPool& pool, const ForwardOptions& fo) {
  for (int64_t i = 0; i < n; ++i) forward_one(b.model, seq, b.ids(1), pool, fo, b.logits);
}

void batch_step(Bench& b, std::vector<PageTable>& seqs, std::vector<std::vector<int32_t>>& toks,
                std::vector<SeqSlice>& batch, LatentPool& pool) {
  for (size_t s = 0; s < seqs.size(); ++s) {
    toks[s] = b.ids(1);
    batch[s] = {&seqs[s], toks[s]};
  }
  b.model.forward(batch, pool, b.fo, b.logits);
}

EngineOptions one_sequence_engine(int64_t tokens) {
  EngineOptions eo;
  eo.kv_pages = pages_for_tokens(tokens, 64) + 1;
  eo.max_running = 1;
  eo.prefix_cache = false;
  return eo;
}

Request greedy_request(Ids& ids, int64_t prompt, int64_t tokens) {
  Request req;
  req.prompt = ids(prompt);
  req.sampling.temperature = 0;
  req.max_new_tokens = tokens + 1;  // the first token comes from the prompt's pass
  return req;
}

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

Report run(const Options& opt) {
  Report rep;
  rep.weights = opt.weights, rep.precision = opt.precision, rep.runs = opt.runs;
  rep.prompt_tokens = opt.prompt_tokens, rep.context = opt.context, rep.decode_tokens = opt.decode_tokens;
  rep.bandwidth_bytes = opt.bandwidth_bytes;
  check_options(opt);
  Ranks ranks;
  rep.ranks = ranks.comm().size();
  const Say say{opt.quiet || !ranks.lead()};  // rank 0 speaks for the job
  const cpu::Context ctx = context_of(opt);
  rep.threads = ctx.num_threads();
  const std::unique_ptr<Model> model = load_checkpoint(opt, ctx, ranks, say, rep);
  RankFigures mine;
  weight_figures(*model, rep, mine);
  Ids ids(model->config().vocab_size, text_ids(opt, model->config(), rep));
  Bench b{.opt = opt, .rep = rep, .model = *model, .ctx = ctx, .ranks = ranks, .ids = ids, .say = say, .mine = mine,
          .loop = nullptr, .fo = {}, .logits = {}};
  b.fo.last_logits_only = true;

  if (!opt.depths.empty()) {  // the depth rows instead of every other section
    measure_depths(b);
    finish(b);
    if (ranks.lead()) {
      say("read bandwidth ...");
      rep.bandwidth_gbps = read_bandwidth_gbps(opt.bandwidth_bytes, opt.runs, ctx.threads);
    }
    return rep;
  }
  std::optional<ReadLoop> loop;  // the probes run on rank 0 (see bench.h)
  if (ranks.lead()) b.loop = &loop.emplace(opt.bandwidth_bytes, ctx.threads);
  measure_decode(b);
  measure_speculative(b);
  measure_prompt(b);
  measure_scaling(b);
  measure_batched(b);
  finish(b);
  if (ranks.lead()) {
    say("read bandwidth ...");
    rep.bandwidth_gbps = loop->measure(opt.runs);
  }
  return rep;
}

}  // namespace mla::bench
