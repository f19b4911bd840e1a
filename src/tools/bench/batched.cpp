// Batched decode: B sequences of 8 cached tokens each, batch_steps steps of one token each per
// run (see tools/bench.h).
#include <stdexcept>

#include "tools/bench/sections.h"

namespace mla::bench {

void measure_batched(Bench& b) {
  const Options& opt = b.opt;
  for (int64_t B : opt.batches) {
    if (B <= 0) throw std::invalid_argument("batch sizes must be positive");
    b.say("batched decode, batch " + std::to_string(B) + " ...");
    const int64_t per_seq = 8 + (opt.runs + 1) * opt.batch_steps;
    LatentPool pool = b.model.make_pool(B * pages_for_tokens(per_seq, 64), 64);
    std::vector<PageTable> seqs(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> toks(static_cast<size_t>(B));
    std::vector<SeqSlice> batch(static_cast<size_t>(B));
    for (int64_t s = 0; s < B; ++s) {
      toks[size_t(s)] = b.ids(8);
      batch[size_t(s)] = {&seqs[size_t(s)], toks[size_t(s)]};
    }
    b.model.forward(batch, pool, b.fo, b.logits);
    std::vector<double> tps;
    for (int r = 0; r <= opt.runs; ++r) {
      b.ranks.sync();
      auto t = Clock::now();
      for (int64_t i = 0; i < opt.batch_steps; ++i) batch_step(b, seqs, toks, batch, pool);
      if (r > 0) tps.push_back(double(B * opt.batch_steps) / seconds_since(t));
    }
    b.rep.batched_tps.push_back({B, summarize(tps)});
    b.say("  " + std::to_string(b.rep.batched_tps.back().second.median) + " tokens/s");
  }
}

}  // namespace mla::bench
