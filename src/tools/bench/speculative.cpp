// Speculative decoding, batch 1, greedy, through the engine: plain decode against injected
// drafts and the MTP module's drafts, in alternating runs; then where a speculative step's time
// goes, from model-level passes (see tools/bench.h).
#include <algorithm>
#include <cmath>
#include <optional>

#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// Where a speculative step's time goes (Report::spec_costs), batch 1, k draft tokens: passes of
// the three kinds in turn (spec_tokens / 4 of each per run, at least 4, after a warm-up run),
// each profiled by part. A plain pass decodes one sequence; the verify pass runs the 1 + k rows
// of another as the engine does (one-token kernels, absorbed attention, logits of every row, the
// final hidden rows) and keeps one row, as a step whose drafts were all wrong; the draft runs
// the MTP module on the row the verify pass kept (the catch-up), then chains k - 1 more and takes
// them out of the MTP cache, as MtpDrafts does.
struct SpecPasses {
  Model& model;
  const Options& opt;
  Ids& ids;
  const int64_t k = opt.draft_tokens, passes = std::max<int64_t>(opt.spec_tokens / 4, 4);
  const int64_t total = opt.context + (opt.runs + 1) * passes + k + 1;
  LatentPool pool = model.make_pool(2 * (pages_for_tokens(total, 64) + 1), 64);
  // Without an MTP module only the plain and verify passes are measured (draft.ms stays 0).
  std::optional<LatentPool> mtp_pool{};
  // Two sequences of the same prompt: one decoded plainly, one speculatively.
  PageTable plain{}, spec{}, mtp_seq{};
  int64_t mtp_first = -1;  // the position of the MTP cache's row 0
  std::vector<float> logits{}, hidden{}, mtp_hidden{}, h{};
  ForwardOptions fo{}, vo{};
  cpu::Context one = model.context();
  const std::vector<int64_t> last{k + 1};
  ForwardProfile pp{}, pv{}, pd{};

  void prepare() {
    if (model.has_mtp()) mtp_pool.emplace(model.make_mtp_pool(pages_for_tokens(total, 64) + 1, 64));
    auto prompt = ids(opt.context);
    fo.last_logits_only = true;
    for (PageTable* t : {&plain, &spec}) forward_one(model, *t, prompt, pool, fo, logits);
    one.one_token_kernels = true;
    vo.context = &one;
    vo.path = AttnPath::Absorb;
    vo.logits_last = last;
    vo.final_hidden = &hidden;
  }

  // One pass of each kind; profiled in the timed runs.
  void step(bool timed) {
    profiled_pass(timed ? &pp : nullptr, plain, ids(1), fo);
    const int64_t pos = spec.length;
    profiled_pass(timed ? &pv : nullptr, spec, ids(k + 1), vo);
    pool.truncate(spec, pos + 1);  // every draft rejected: the last token's row stays
    if (!mtp_pool) return;
    if (mtp_first < 0) mtp_first = pos;
    {
      const Profiled profiled(model, timed ? &pd : nullptr);
      auto next = ids(1);
      mtp_pass(next, hidden.data(), pos);
      for (int64_t j = 1; j < k; ++j) {
        auto t = ids(1);
        h.assign(mtp_hidden.end() - model.config().hidden_size, mtp_hidden.end());
        mtp_pass(t, h.data(), mtp_first + mtp_seq.length);
      }
    }
    mtp_pool->truncate(mtp_seq, pos + 1 - mtp_first);  // the chained rows out again
  }

  // One pass of the model over `tokens` of `seq`, profiled into prof (null: unprofiled).
  void profiled_pass(ForwardProfile* prof, PageTable& seq, std::vector<int32_t> tokens, const ForwardOptions& o) {
    const Profiled profiled(model, prof);
    forward_one(model, seq, tokens, pool, o, logits);
  }

  // One pass of the MTP module: `token` at position pos, after the hidden row prev_hidden.
  void mtp_pass(std::span<const int32_t> token, const float* prev_hidden, int64_t pos) {
    MtpSlice m{&mtp_seq, token, prev_hidden, pos};
    model.mtp_forward(std::span<const MtpSlice>(&m, 1), *mtp_pool, true, logits, &mtp_hidden);
  }
};

// A pass kind's figures from its profile; per: module passes per step (the draft's k).
void fill(PassCost& pc, const ForwardProfile& p, int64_t per) {
  pc.parts_ms = per_pass_ms(p, double(p.passes) / double(per));
  for (auto& [part, ms] : pc.parts_ms) pc.ms += ms;
  pc.experts_per_layer = p.moe_layers ? double(p.routed_experts) / double(p.moe_layers) : 0;
}

// Bytes: each pass's weights with the routed experts at the count it read (the main layers' per
// MoE layer, the module's likewise); the embedding rows of the pass's tokens.
void count_bytes(SpecCosts& sc, const Model& model, const ActiveWeights& active, int64_t k) {
  const ModelWeights& w = model.weights();
  double routed = 0, expert = 0;
  int64_t moe_layers = 0;
  for (const auto& L : w.layers)
    if (expert_bytes(L) > 0) expert = expert_bytes(L), ++moe_layers;
  if (active.bytes_by_part.count("routed experts")) routed = active.bytes_by_part.at("routed experts");
  const double embed_row = double(w.embed.row_bytes());
  sc.plain.bytes = active.bytes - routed + double(moe_layers) * sc.plain.experts_per_layer * expert;
  sc.verify.bytes = sc.plain.bytes - double(moe_layers) * sc.plain.experts_per_layer * expert +
                    double(moe_layers) * sc.verify.experts_per_layer * expert + double(k) * embed_row;
  if (model.has_mtp()) {
    const MtpWeights& M = w.mtp[0];
    double layer = 0;
    each_fixed_layer_weight(M.layer, [&](const char*, const MatrixView& m) { layer += view_bytes(m); });
    const double per_pass = layer + view_bytes(M.eh_proj) + sc.draft.experts_per_layer * expert_bytes(M.layer) +
                            view_bytes(model.mtp_draft_head()) + embed_row;
    sc.draft.bytes = double(k) * per_pass;
    sc.draft_head = weight_format_name(model.mtp_draft_head().format);
  }
}

SpecCosts measure_spec_costs(Bench& b) {
  SpecPasses s{.model = b.model, .opt = b.opt, .ids = b.ids};
  s.prepare();
  for (int r = 0; r <= b.opt.runs; ++r)
    for (int64_t i = 0; i < s.passes; ++i) s.step(r > 0);
  SpecCosts sc;
  fill(sc.plain, s.pp, 1);
  fill(sc.verify, s.pv, 1);
  fill(sc.draft, s.pd, s.k);
  count_bytes(sc, b.model, b.rep.active, s.k);
  return sc;
}

}  // namespace

void measure_speculative(Bench& b) {
  const Options& opt = b.opt;
  Report& rep = b.rep;
  if (opt.spec_tokens <= 0) return;
  if (b.ranks.many()) {
    rep.skipped.push_back("the speculative decoding rows (--spec-tokens): the engine's adaptive gate decides from each "
                          "rank's own timings, so the ranks would run different passes");
    return;
  }
  b.say("speculative decoding (batch 1, greedy, " + std::to_string(opt.draft_tokens) + " draft tokens) ...");
  rep.draft_tokens = opt.draft_tokens;
  const EngineOptions eo = one_sequence_engine(opt.context + opt.spec_tokens + opt.draft_tokens + 2);
  Engine plain(b.model, nullptr, eo);
  const Request req = greedy_request(b.ids, opt.context, opt.spec_tokens);
  const std::vector<int32_t> cont = plain.generate(req).tokens;
  const size_t plen = req.prompt.size();
  const int32_t V = int32_t(b.model.config().vocab_size);
  // Plain decode and speculative decode with `so` in alternating runs.
  auto measure = [&](SpecRow& row, EngineOptions so) {
    Engine spec(b.model, nullptr, so);
    std::vector<double> ptps, stps, ratio;
    for (int r = 0; r <= opt.runs; ++r) {
      const RequestResult p = plain.generate(req), s = spec.generate(req);
      row.identical = row.identical && s.tokens == p.tokens;
      if (r == 0) continue;  // warm-up
      ptps.push_back(p.generated_tokens_per_second());
      stps.push_back(s.generated_tokens_per_second());
      ratio.push_back(stps.back() / ptps.back());
    }
    const EngineStats st = spec.stats();
    row.acceptance = st.spec_acceptance_rate();
    row.tokens_per_step = st.spec_tokens_per_step();
    row.plain_tps = summarize(ptps);
    row.spec_tps = summarize(stps);
    row.ratio = summarize(ratio);
    return st;
  };
  auto speculative = [&](bool adaptive) {
    EngineOptions so = eo;
    so.speculative.enabled = true;
    so.speculative.draft_tokens = opt.draft_tokens;
    so.speculative.adaptive = adaptive;
    return so;
  };
  // Injected drafts right with probability a: a low-discrepancy pattern over the output
  // positions, so that a run's acceptance is a.
  for (auto [a, adaptive] : std::vector<std::pair<double, bool>>{{1.0, true}, {0.8, true}, {0.5, true}, {0.0, true}, {0.0, false}}) {
    SpecRow row;
    row.target_acceptance = a;
    row.adaptive = adaptive;
    EngineOptions so = speculative(adaptive);
    so.draft_source = std::make_shared<InjectedDrafts>([&cont, plen, a, V](const Sequence& s, int64_t k) {
      std::vector<int32_t> d;
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = s.tokens.size() - plen + size_t(j);
        if (at >= cont.size()) break;
        const double u = std::fmod(double(at) * 0.6180339887498949, 1.0);
        d.push_back(u < a ? cont[at] : (cont[at] + 1) % V);
      }
      return d;
    });
    measure(row, so);
    rep.spec.push_back(row);
    b.say("  acceptance " + std::to_string(a) + (adaptive ? "" : " (gate off)") + ": " + std::to_string(row.ratio.median) + "x plain");
  }
  const quant::QuantFormat head = quant::parse_quant_format(opt.draft_head, "--draft-head");
  if (!b.model.has_mtp()) {
    rep.mtp_missing = "the checkpoint in " + rep.dir + " has no MTP module (num_nextn_predict_layers 0 or no eh_proj)";
    b.say("  skipping the MTP module's drafts: " + rep.mtp_missing);
  } else {
    rep.have_mtp = true;
    EngineOptions so = speculative(false);  // every step drafts: the draft's cost per step
    so.speculative.draft_head = head;
    const EngineStats st = measure(rep.mtp, so);
    rep.mtp.adaptive = false;
    rep.mtp_draft_ms = st.spec_steps ? 1e3 * st.spec_draft_seconds / double(st.spec_steps) : 0;
    rep.mtp_cost_ratio = rep.mtp.plain_tps.median > 0 ? rep.mtp_draft_ms / (1e3 / rep.mtp.plain_tps.median) : 0;
    rep.mtp_acceptance = st.spec_acceptance_rate();
    b.say("  MTP drafts: " + std::to_string(rep.mtp_draft_ms) + " ms per step");
  }
  b.say("  where a speculative step's time goes (model-level passes) ...");
  const double head_error = b.model.has_mtp() ? b.model.set_mtp_draft_head(head) : 0;
  rep.spec_costs = measure_spec_costs(b);
  rep.spec_costs.draft_head_error = head_error;
}

}  // namespace mla::bench
