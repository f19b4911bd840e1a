// Decode, batch 1: a short prompt, then runs of decode_tokens single-token steps, each set
// against the machine's read limits measured just after it; then the same decode through the
// engine (see tools/bench.h).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// Expert-parallel: the bytes a step read on this rank, the routed experts it ran (counted) and
// every other weight it computes with (not the shared experts, but on rank 0).
double rank_read_bytes(const Bench& b) {
  const ActiveWeights& a = b.rep.active;
  auto part = [&](const char* name) { return a.bytes_by_part.count(name) ? a.bytes_by_part.at(name) : 0.0; };
  double fixed = a.bytes - part("routed experts"), expert = 0, moe_layers = 0;
  if (b.ranks.comm().rank() != 0) fixed -= part("shared experts");  // rank 0 runs them
  for (const auto& L : b.model.weights().layers)
    if (L.moe) moe_layers += 1, expert = std::max(expert, expert_bytes(L));
  return fixed + moe_layers * b.mine.decode_experts_per_layer * expert;
}

// The model-level runs on `seq`. Each timed run is followed by a pass of the read loop: on shared
// cores the bandwidth moves with the load, so each run is set against the limit measured next
// to it.
void model_decode(Bench& b, LatentPool& pool, PageTable& seq) {
  const Options& opt = b.opt;
  Report& rep = b.rep;
  std::vector<double> tps, bws, ratios, token_bws, token_bytes, token_ratios;
  std::optional<TokenRead> token_read;
  if (b.ranks.lead()) token_read.emplace(b.model.weights(), b.model.config(), 7, b.ctx.threads);
  ForwardProfile prof;
  for (int r = 0; r <= opt.runs; ++r) {
    b.ranks.sync();
    const parallel::CombineCounters c0 = b.model.combine_counters();
    double sec = 0;
    {
      const Profiled profiled(b.model, r > 0 ? &prof : nullptr);
      auto t = Clock::now();
      decode_steps(b, seq, opt.decode_tokens, pool, b.fo);
      sec = seconds_since(t);
    }
    if (r == 0) continue;  // run 0 warms up
    tps.push_back(double(opt.decode_tokens) / sec);
    add_combine(b.mine.decode, c0, b.model.combine_counters(), sec);
    if (!b.ranks.lead()) continue;
    // The limit for this run: one pass just after it, when the caches hold the model's weights
    // as they do for decode, so the pass reads DRAM. (Passes back to back find part of their
    // own buffer in a large L3 and read faster: the figure at the end.)
    bws.push_back(b.loop->measure(1));
    // And one read of a token's own weights where they lie: the same bytes, the same pages.
    token_bws.push_back(token_read->measure(1));
    token_bytes.push_back(token_read->bytes_per_pass());
  }
  b.mine.decode = per_one(b.mine.decode, double(opt.runs) * double(opt.decode_tokens));
  b.mine.decode_experts_per_layer = prof.moe_layers ? double(prof.local_routed_experts) / double(prof.moe_layers) : 0;
  if (b.ranks.many()) rep.decode_read_bytes = rank_read_bytes(b);
  b.mine.decode_read_bytes = rep.decode_read_bytes;
  for (size_t i = 0; i < bws.size(); ++i) {
    ratios.push_back(tps[i] / (bws[i] * 1e9 / rep.decode_read_bytes));
    token_ratios.push_back(tps[i] / (token_bws[i] * 1e9 / token_bytes[i]));
  }
  rep.decode_parts_ms = per_pass_ms(prof, double(prof.passes));
  rep.decode_tps = summarize(tps);
  rep.decode_bandwidth = summarize(bws);
  rep.decode_ratio = summarize(ratios);
  rep.token_bandwidth = summarize(token_bws);
  rep.token_ratio = summarize(token_ratios);
  b.say("  " + std::to_string(rep.decode_tps.median) + " tokens/s");
}

// The engine's decode: one greedy request of `context` prompt tokens and decode_tokens passes
// after its prompt's, each run right after a model-level run on `seq`, so that each ratio
// compares two runs that saw the same machine.
void engine_decode(Bench& b, LatentPool& pool, PageTable& seq) {
  const Options& opt = b.opt;
  b.say("decode through the engine (batch 1, greedy) ...");
  Engine engine(b.model, nullptr, one_sequence_engine(opt.context + opt.decode_tokens + 1));
  std::vector<double> etps, eratios;
  for (int r = 0; r <= opt.runs; ++r) {
    b.ranks.sync();
    auto t = Clock::now();
    decode_steps(b, seq, opt.decode_tokens, pool, b.fo);
    const double model_tps = double(opt.decode_tokens) / seconds_since(t);
    const RequestResult res = engine.generate(greedy_request(b.ids, opt.context, opt.decode_tokens));
    if (r == 0) continue;  // warm-up
    etps.push_back(res.generated_tokens_per_second());
    eratios.push_back(etps.back() / model_tps);
  }
  b.rep.engine_decode_tps = summarize(etps);
  b.rep.engine_ratio = summarize(eratios);
  b.say("  " + std::to_string(b.rep.engine_decode_tps.median) + " tokens/s");
}

}  // namespace

void measure_decode(Bench& b) {
  const Options& opt = b.opt;
  if (opt.decode_tokens <= 0) return;
  b.say("decode (batch 1) ...");
  if (opt.context < 1) throw std::invalid_argument("--context must be at least 1");
  // The model-level runs, then as many again beside the engine's.
  const int64_t total = opt.context + 2 * (opt.runs + 1) * opt.decode_tokens;
  LatentPool pool = b.model.make_pool(pages_for_tokens(total, 64) + 1, 64);
  PageTable seq;
  forward_one(b.model, seq, b.ids(opt.context), pool, b.fo, b.logits);
  model_decode(b, pool, seq);
  engine_decode(b, pool, seq);
}

}  // namespace mla::bench
