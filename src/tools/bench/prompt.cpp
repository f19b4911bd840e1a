// Prompt processing: a fresh sequence of prompt_tokens per run, logits of the last token, each
// run set against the GEMM probe and the compute peak measured around it (see tools/bench.h).
#include <algorithm>
#include <optional>

#include "backend/cpu/compute_peak.h"
#include "tools/bench/sections.h"

namespace mla::bench {

double prompt_seconds(Bench& b, const cpu::Context* pc) {
  ForwardOptions po = b.fo;
  po.context = pc;
  LatentPool pool = b.model.make_pool(pages_for_tokens(b.opt.prompt_tokens, 64), 64);
  PageTable seq;
  auto prompt = b.ids(b.opt.prompt_tokens);
  auto t = Clock::now();
  forward_one(b.model, seq, prompt, pool, po, b.logits);
  return seconds_since(t);
}

void measure_prompt(Bench& b) {
  const Options& opt = b.opt;
  Report& rep = b.rep;
  if (opt.prompt_tokens <= 0) return;
  b.say("prompt processing (" + std::to_string(opt.prompt_tokens) + " tokens) ...");
  std::vector<double> tps, gemm, ratios, peaks, peak_ratios;
  ForwardProfile prof;
  std::optional<GemmProbe> probe;  // rank 0's, as the read loop
  if (b.ranks.lead()) probe.emplace(opt.gemm_n, b.ctx);
  rep.gemm_n = opt.gemm_n;
  rep.prompt_flops = prompt_flops(rep.active, b.model.config(), opt.prompt_tokens);
  // The compute peak of the instruction the prompt's products run on, a loop of about 20 ms.
  // INT4 / INT8 routed experts (the larger share of a prompt's products): the VNNI GEMM's peak
  // where the dispatch sends them there.
  const cpu::PeakPath path = cpu::prompt_peak_path(b.ctx, int_experts(opt, rep, b.model));
  rep.peak_path = cpu::peak_path_name(path);
  const int64_t peak_iters = cpu::peak_iters(path, 20);
  auto peak = [&] { return cpu::peak_gflops(path, rep.threads, 2, peak_iters); };
  for (int r = 0; r <= opt.runs; ++r) {
    // Like decode against the read loop: each run is set against the GEMM rate and the peak
    // around it (the better of before and after the run).
    double g = 0, pk = 0;
    if (b.ranks.lead()) g = probe->measure(2), pk = peak();
    b.ranks.sync();
    const parallel::CombineCounters c0 = b.model.combine_counters();
    double sec = 0;
    {
      const Profiled profiled(b.model, r > 0 ? &prof : nullptr);
      sec = prompt_seconds(b, nullptr);
    }
    if (r == 0) continue;
    add_combine(b.mine.prompt, c0, b.model.combine_counters(), sec);
    const double gflops = rep.prompt_flops / sec / 1e9;
    tps.push_back(double(opt.prompt_tokens) / sec);
    if (!b.ranks.lead()) continue;
    gemm.push_back(std::max(g, probe->measure(2)));
    ratios.push_back(gflops / gemm.back());
    peaks.push_back(std::max(pk, peak()));
    peak_ratios.push_back(gflops / peaks.back());
  }
  b.mine.prompt = per_one(b.mine.prompt, double(opt.runs));
  rep.prompt_gemm_gflops = summarize(gemm);
  rep.prompt_ratio = summarize(ratios);
  rep.prompt_peak_gflops = summarize(peaks);
  rep.prompt_peak_ratio = summarize(peak_ratios);
  if (b.ranks.lead())
    for (int n = 1; n <= rep.threads; n = n < rep.threads ? std::min(2 * n, rep.threads) : n + 1)
      rep.peak_by_threads.push_back({n, cpu::peak_gflops(path, n, 3, peak_iters)});
  rep.prompt_parts_ms = per_pass_ms(prof, double(prof.passes));
  rep.prompt_tps = summarize(tps);
  b.say("  " + std::to_string(rep.prompt_tps.median) + " tokens/s");
}

}  // namespace mla::bench
