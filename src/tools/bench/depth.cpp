// The depth rows (Options::depths): prompt and decode after many tokens already in the cache, as
// llama-bench -d measures (see tools/bench.h).
#include <algorithm>
#include <cstdio>

#include "model/mla.h"
#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// The decode runs' profile and seconds as the row's figures: a step's time, the attention's share
// of it, and the cache bytes a step attends over.
void decode_figures(DepthRow& row, const Options& opt, const ForwardProfile& prof, double decode_seconds,
                    const CombineShare& combine, const LatentPool& pool) {
  const double steps = double(opt.runs) * double(opt.decode_tokens);
  row.step_ms = decode_seconds * 1e3 / steps;
  row.attention_ms = prof.seconds[ForwardProfile::Attention] * 1e3 / steps;
  row.attn_proj_ms = (prof.seconds[ForwardProfile::AttnProj] + prof.seconds[ForwardProfile::OProj]) * 1e3 / steps;
  row.combine_ms = combine.seconds * 1e3 / steps;
  row.decode_parts_ms = per_pass_ms(prof, double(prof.passes));
  // Step i (0-based) attends over d + i + 1 rows per sequence, its own included: d + (n + 1) / 2
  // on average.
  row.latent_bytes =
      double(row.batch) * double(pool.bytes_per_token()) * (double(row.depth) + double(opt.decode_tokens + 1) / 2);
}

// One row: B sequences of `d` cached rows, then per run (B = 1) a prompt and a decode run, each
// taken out of the cache again.
DepthRow depth_row(Bench& b, int64_t d, int64_t B, std::mt19937& rng) {
  const Options& opt = b.opt;
  const ModelConfig& c = b.model.config();
  const bool prompt = opt.prompt_tokens > 0 && B == 1;
  const int64_t extra = std::max<int64_t>({prompt ? opt.prompt_tokens : 0, opt.decode_tokens, 1});
  LatentPool pool = b.model.make_pool(B * pages_for_tokens(d + extra, 64) + 1, 64);
  b.rep.kv_dtype = kv_dtype_name(pool.dtype());
  b.rep.attention_kernels = MlaAttention::kernel_names(b.model.context(), c, pool.dtype());
  std::vector<PageTable> seqs(static_cast<size_t>(B));
  for (PageTable& seq : seqs) fill_random_cache(pool, c.kv_lora_rank, seq, d, rng);
  DepthRow row;
  row.depth = d;
  row.batch = B;
  std::vector<double> ptps, dtps;
  double decode_seconds = 0;
  CombineShare combine;
  ForwardProfile prof;
  std::vector<std::vector<int32_t>> toks(static_cast<size_t>(B));
  std::vector<SeqSlice> batch(static_cast<size_t>(B));
  for (int r = 0; r <= opt.runs; ++r) {
    if (prompt) {
      b.ranks.sync();
      auto ptoks = b.ids(opt.prompt_tokens);
      const auto t = Clock::now();
      forward_one(b.model, seqs[0], ptoks, pool, b.fo, b.logits);
      const double sec = seconds_since(t);
      pool.truncate(seqs[0], d);
      if (r > 0) ptps.push_back(double(opt.prompt_tokens) / sec);
    }
    if (opt.decode_tokens > 0) {
      b.ranks.sync();
      const parallel::CombineCounters c0 = b.model.combine_counters();
      double sec = 0;
      {
        const Profiled profiled(b.model, r > 0 ? &prof : nullptr);
        const auto t = Clock::now();
        for (int64_t i = 0; i < opt.decode_tokens; ++i) batch_step(b, seqs, toks, batch, pool);
        sec = seconds_since(t);
      }
      for (PageTable& seq : seqs) pool.truncate(seq, d);
      if (r > 0) {
        dtps.push_back(double(B * opt.decode_tokens) / sec), decode_seconds += sec;
        add_combine(combine, c0, b.model.combine_counters(), sec);
      }
    }
  }
  row.prompt_tps = summarize(ptps);
  row.decode_tps = summarize(dtps);
  if (opt.decode_tokens > 0) decode_figures(row, opt, prof, decode_seconds, combine, pool);
  return row;
}

}  // namespace

void fill_random_cache(LatentPool& pool, int64_t kvr, PageTable& seq, int64_t S, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t dim = pool.row_dim(), D = pool.index_dim();
  pool.reserve(seq, S);
  std::vector<float> row(static_cast<size_t>(dim)), key(static_cast<size_t>(std::max<int64_t>(D, 1)));
  for (auto& x : row) x = nd(rng);
  for (auto& x : key) x = nd(rng);
  for (int64_t l = 0; l < pool.num_layers(); ++l)
    for (int64_t p = 0; p < S; ++p) {
      row[size_t(p % dim)] = nd(rng);
      pool.write(l, seq, p, row.data(), row.data() + kvr);
      if (D > 0) {
        key[size_t(p % D)] = nd(rng);
        pool.write_index(l, seq, p, key.data());
      }
    }
  seq.length = S;
}

// At each depth and batch size B, B sequences of `depth` random cached rows each
// (fill_random_cache: the timed work does not depend on the rows' values, and filling 32k tokens
// this way takes a moment where a prefill would take minutes); then per run (B = 1) a prompt of
// prompt_tokens and a decode run of decode_tokens steps of B tokens, one per sequence, so every
// run starts at the same depth. Run 0 warms up. The decode runs are profiled by part: the
// attention's share of a step, beside the cache bytes a step attends over.
void measure_depths(Bench& b) {
  std::mt19937 rng(5);
  for (int64_t d : b.opt.depths)
    for (int64_t B : b.opt.depth_batches) {
      b.say("depth " + std::to_string(d) + (B > 1 ? ", batch " + std::to_string(B) : "") + " ...");
      b.rep.depth_rows.push_back(depth_row(b, d, B, rng));
      const DepthRow& row = b.rep.depth_rows.back();
      char buf[160];
      std::snprintf(buf, sizeof buf, "  prompt %.1f tokens/s, decode %.2f tokens/s", row.prompt_tps.median,
                    row.decode_tps.median);
      b.say(buf);
    }
}

}  // namespace mla::bench
