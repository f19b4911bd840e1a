// Scaling: the same decode and prompt on one thread and on all of the context's, in
// alternating runs (see tools/bench.h).
#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// Seconds of one decode run of decode_tokens steps after `context` tokens on a fresh sequence, in
// the pass context pc (null: the model's).
double decode_seconds(Bench& b, const cpu::Context* pc) {
  ForwardOptions po = b.fo;
  po.context = pc;
  LatentPool pool = b.model.make_pool(pages_for_tokens(b.opt.context + b.opt.decode_tokens, 64), 64);
  PageTable seq;
  forward_one(b.model, seq, b.ids(b.opt.context), pool, po, b.logits);
  auto t = Clock::now();
  decode_steps(b, seq, b.opt.decode_tokens, pool, po);
  return seconds_since(t);
}

// Tokens/s of `tokens` in `seconds(pc)` on all threads, then on one: into n, one and ratio (after
// the warm-up run).
template <class F>
void pair_run(bool timed, double tokens, F&& seconds, const cpu::Context& single, std::vector<double>& n,
              std::vector<double>& one, std::vector<double>& ratio) {
  const double all = tokens / seconds(nullptr);
  const double s = tokens / seconds(&single);
  if (timed) n.push_back(all), one.push_back(s), ratio.push_back(all / s);
}

}  // namespace

void measure_scaling(Bench& b) {
  const Options& opt = b.opt;
  Report& rep = b.rep;
  if (!opt.scaling || rep.threads <= 1 || (opt.decode_tokens <= 0 && opt.prompt_tokens <= 0)) return;
  b.say("scaling: 1 thread against " + std::to_string(rep.threads) + " ...");
  cpu::Context single = b.ctx;
  single.threads = 1;
  std::vector<double> d1, dn, dr, p1, pn, pr;
  auto decode = [&](const cpu::Context* pc) { return decode_seconds(b, pc); };
  auto prompt = [&](const cpu::Context* pc) { return prompt_seconds(b, pc); };
  for (int r = 0; r <= opt.runs; ++r) {  // run 0 warms up
    b.ranks.sync();
    if (opt.decode_tokens > 0) pair_run(r > 0, double(opt.decode_tokens), decode, single, dn, d1, dr);
    if (opt.prompt_tokens > 0) pair_run(r > 0, double(opt.prompt_tokens), prompt, single, pn, p1, pr);
  }
  rep.scale_decode_1 = summarize(d1);
  rep.scale_decode_n = summarize(dn);
  rep.scale_decode_ratio = summarize(dr);
  rep.scale_prompt_1 = summarize(p1);
  rep.scale_prompt_n = summarize(pn);
  rep.scale_prompt_ratio = summarize(pr);
}

}  // namespace mla::bench
