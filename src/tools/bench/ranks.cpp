// Expert-parallel runs of `mla bench`: the MoE combine's share of the timed runs, and every
// rank's figures gathered for rank 0's report (see tools/bench.h).
#include "tools/bench/sections.h"

namespace mla::bench {

void add_combine(CombineShare& to, const parallel::CombineCounters& before, const parallel::CombineCounters& after,
                 double seconds) {
  to.bytes += after.bytes_received - before.bytes_received;
  to.seconds += after.seconds - before.seconds;
  to.step_seconds += seconds;
}

CombineShare per_one(CombineShare c, double n) {
  if (n > 0) c.bytes /= n, c.seconds /= n, c.step_seconds /= n;
  return c;
}

std::vector<RankFigures> gather_rank_figures(Ranks& ranks, const RankFigures& mine) {
  constexpr size_t K = 12;
  const double v[K] = {double(mine.experts.begin), double(mine.experts.end), mine.weight_bytes, mine.routed_bytes,
                       mine.decode_read_bytes, mine.decode_experts_per_layer, mine.decode.bytes, mine.decode.seconds,
                       mine.decode.step_seconds, mine.prompt.bytes, mine.prompt.seconds, mine.prompt.step_seconds};
  const size_t n = size_t(ranks.comm().size());
  std::vector<double> all(K * n);
  ranks.comm().allgather(v, sizeof v, all.data());
  std::vector<RankFigures> out(n);
  for (size_t r = 0; r < n; ++r) {
    const double* x = all.data() + K * r;
    RankFigures& f = out[r];
    f.experts = {int64_t(x[0]), int64_t(x[1])};
    f.weight_bytes = x[2], f.routed_bytes = x[3], f.decode_read_bytes = x[4], f.decode_experts_per_layer = x[5];
    f.decode = {x[6], x[7], x[8]};
    f.prompt = {x[9], x[10], x[11]};
  }
  return out;
}

}  // namespace mla::bench
