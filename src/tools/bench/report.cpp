// The report of `mla bench` (see tools/bench.h): its lines in the order of the sections.
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  return buf;
}

// "  WHAT: TOTAL ms:" and each part's milliseconds and share of the total.
std::string parts_line(const char* what, const std::vector<std::pair<std::string, double>>& parts) {
  std::ostringstream o;
  char buf[256];
  double total = 0;
  for (auto& [k, v] : parts) total += v;
  std::snprintf(buf, sizeof buf, "  %s: %.2f ms:", what, total);
  o << buf;
  for (auto& [k, v] : parts) {
    std::snprintf(buf, sizeof buf, " %s %.2f (%.0f%%);", k.c_str(), v, total > 0 ? 100 * v / total : 0.0);
    o << buf;
  }
  o << "\n";
  return o.str();
}

// "WHAT: tokens/s (median, range)", with `digits` decimals.
std::string tps_line(const std::string& what, const Summary& s, int digits) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %.*f tokens/s (median, range %.*f-%.*f)\n", what.c_str(), digits, s.median, digits,
                s.min, digits, s.max);
  return buf;
}

// A decode limit: a bandwidth measured after each run (median, range), the tokens/s it allows
// for `bytes` per token, and decode's ratio to it per run.
std::string limit_line(const std::string& what, const Summary& bw, const Summary& ratio, double bytes) {
  char buf[192];
  std::snprintf(buf, sizeof buf,
                " %.1f GB/s (median, range %.1f-%.1f) -> %.2f tokens/s; ratio to it per run %.2f (median, range "
                "%.2f-%.2f)\n",
                bw.median, bw.min, bw.max, bw.median * 1e9 / bytes, ratio.median, ratio.min, ratio.max);
  return "  " + what + buf;
}

// The run: the model, the machine, the checkpoint, memory, the weights and the read loop.
void header_lines(std::ostringstream& o, const Report& r) {
  char buf[256];
  o << "mla bench: " << r.shape << (r.own_model ? ", its weights as stored" : ", random " + r.weights + " weights")
    << ", precision " << r.precision << ", " << r.threads << " threads";
  if (r.ranks > 1) o << " per rank, " << r.ranks << " ranks (expert-parallel under mpirun; rank 0's timings)";
  for (const char* v : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* e = std::getenv(v)) o << ", " << v << "=" << e;
  o << "\n";
  o << "checkpoint: " << r.dir;
  if (r.write_seconds > 0) {
    std::snprintf(buf, sizeof buf, " (written in %.1f s)", r.write_seconds);
    o << buf;
  }
  std::snprintf(buf, sizeof buf, ", loaded and paged in in %.1f s\n", r.load_seconds);
  o << buf;
  o << "ids fed: " << (r.text.empty() ? std::string("random") : "consecutive tokens of " + r.text) << "\n";
  std::snprintf(buf, sizeof buf, "resident memory: %.2f GiB RSS (%.2f GiB anonymous, %.2f GiB file-mapped)",
                double(r.rss_bytes) / (1 << 30), double(r.rss_anon_bytes) / (1 << 30), double(r.rss_file_bytes) / (1 << 30));
  o << buf;
  if (r.peak_rss_bytes) {
    std::snprintf(buf, sizeof buf, ", peak %.2f GiB (VmHWM)", double(r.peak_rss_bytes) / (1 << 30));
    o << buf;
  }
  if (r.arena_bytes) {
    std::snprintf(buf, sizeof buf, "; weights copied at load: %s, %s of them on huge pages", gb(double(r.arena_bytes)).c_str(),
                  gb(double(r.arena_huge_bytes)).c_str());
    o << buf;
  } else {
    o << "; weights memory-mapped from the checkpoint";
  }
  o << "\nweights by format:";
  for (auto& [k, v] : r.bytes_by_format) o << " " << k << " " << gb(double(v)) << ";";
  std::snprintf(buf, sizeof buf, "\nweights held%s: %.3f MB, of which routed experts %.3f MB%s\n", r.ranks > 1 ? " by rank 0" : "",
                r.weight_bytes / 1e6, r.routed_bytes / 1e6,
                r.ranks > 1 ? "" : " (split across the ranks under mpirun; the rest is replicated)");
  o << buf;
  std::snprintf(buf, sizeof buf, "read bandwidth (AVX-512 read loop over %.1f GiB, %d threads, best of runs at the end): %.1f GB/s\n",
                double(r.bandwidth_bytes) / (1 << 30), r.threads, r.bandwidth_gbps);
  o << buf;
  std::snprintf(buf, sizeof buf, "active weights per token: %.1f M parameters, %s (", r.active.params / 1e6,
                gb(r.active.bytes).c_str());
  o << buf;
  bool first = true;
  for (auto& [k, v] : r.active.bytes_by_part) {
    o << (first ? "" : ", ") << k << " " << gb(v);
    first = false;
  }
  o << ")\n";
}

// The depth rows (Options::depths): a row per depth and batch, then each row's decode step by part.
void depth_lines(std::ostringstream& o, const Report& r) {
  if (r.depth_rows.empty()) return;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "at depth: a %lld-token prompt and %lld decode steps after DEPTH tokens in the cache (random %s "
                "latent rows), alternating, median of %d timed run(s) (range); attention kernels: %s:\n",
                (long long)r.prompt_tokens, (long long)r.decode_tokens, r.kv_dtype.c_str(), r.runs,
                r.attention_kernels.c_str());
  o << buf;
  const bool ep = r.ranks > 1;
  std::snprintf(buf, sizeof buf, "  %8s  %5s  %22s  %20s  %30s  %15s  %16s", "depth", "batch", "prompt tokens/s",
                "decode tokens/s", "attention ms of a step (share)", "latent MB/step", "weights MB/token");
  o << buf;
  if (ep) {
    std::snprintf(buf, sizeof buf, "  %22s  %21s", "combine ms (share)", "DP-attention bound");
    o << buf;
  }
  o << "\n";
  for (const DepthRow& d : r.depth_rows) {
    char pp[64] = "-", tg[64] = "-", attn[64] = "-", lat[32] = "-", comb[64] = "-", dp[64] = "-";
    if (d.prompt_tps.median > 0)
      std::snprintf(pp, sizeof pp, "%.1f (%.1f-%.1f)", d.prompt_tps.median, d.prompt_tps.min, d.prompt_tps.max);
    if (d.decode_tps.median > 0) {
      std::snprintf(tg, sizeof tg, "%.2f (%.2f-%.2f)", d.decode_tps.median, d.decode_tps.min, d.decode_tps.max);
      std::snprintf(attn, sizeof attn, "%.2f of %.2f (%.1f%%)", d.attention_ms, d.step_ms,
                    d.step_ms > 0 ? 100 * d.attention_ms / d.step_ms : 0.0);
      std::snprintf(lat, sizeof lat, "%.2f", d.latent_bytes / 1e6);
      std::snprintf(comb, sizeof comb, "%.2f (%.1f%%)", d.combine_ms, d.step_ms > 0 ? 100 * d.combine_ms / d.step_ms : 0.0);
      // Data-parallel attention: each rank attends for ceil(B / N) of the B sequences instead
      // of all B; at best the step loses that share of its attention (and of its projections).
      const double kept = double((d.batch + r.ranks - 1) / r.ranks) / double(d.batch), f = 1 - kept;
      const double a = d.step_ms / (d.step_ms - f * d.attention_ms),
                   ap = d.step_ms / (d.step_ms - f * (d.attention_ms + d.attn_proj_ms));
      std::snprintf(dp, sizeof dp, "%.3fx (%.3fx)", a, ap);
    }
    std::snprintf(buf, sizeof buf, "  %8lld  %5lld  %22s  %20s  %30s  %15s  %16.2f", (long long)d.depth,
                  (long long)d.batch, pp, tg, attn, lat, r.active.bytes / 1e6);
    o << buf;
    if (ep) {
      std::snprintf(buf, sizeof buf, "  %22s  %21s", comb, dp);
      o << buf;
    }
    o << "\n";
  }
  o << "  (attention: the profile's attention part over the cache, per decode step, mean of the timed runs;\n"
       "   latent MB: the cache rows a decode step attends over, as stored, all layers and sequences; weights MB:\n"
       "   the weights a decoded token reads, as above";
  if (ep)
    o << ";\n   combine: rank 0's time in the MoE combine across the ranks per step; DP-attention bound: the\n"
         "   step's speed-up at best if each rank attended for its ceil(B / N) sequences only (in brackets: the\n"
         "   attention projections and o_proj split too), the exchange that would need not counted";
  o << ")\n";
  for (const DepthRow& d : r.depth_rows)
    if (!d.decode_parts_ms.empty())
      o << parts_line(("depth " + std::to_string(d.depth) + (d.batch > 1 ? ", batch " + std::to_string(d.batch) : "") +
                       ", time per decode step by part")
                          .c_str(),
                      d.decode_parts_ms);
}

// Decode, batch 1: tokens/s against the read limits, by part, and through the engine.
void decode_lines(std::ostringstream& o, const Report& r) {
  if (!(r.decode_tps.median > 0)) return;
  char buf[256];
  o << tps_line("decode, batch 1, after " + std::to_string(r.context) + " tokens", r.decode_tps, 2);
  if (r.ranks > 1) {
    std::snprintf(buf, sizeof buf, "  rank 0 reads %s per step (its share of the routed experts; the limits below are "
                  "for these bytes, probed on rank 0 alone)\n", gb(r.decode_read_bytes).c_str());
    o << buf;
  }
  o << limit_line("bandwidth limit: read loop just after each run (from DRAM)", r.decode_bandwidth, r.decode_ratio,
                  r.decode_read_bytes);
  o << limit_line("read of a token's own weights where they lie (the same bytes, routed experts drawn afresh each "
                  "pass) just after each run",
                  r.token_bandwidth, r.token_ratio, r.decode_read_bytes);
  std::snprintf(buf, sizeof buf, "  against the read loop at the end (best of back-to-back passes, partly from L3: %.1f GB/s -> %.2f tokens/s): %.2f\n",
                r.bandwidth_gbps, r.limit_tps(), r.limit_tps() > 0 ? r.decode_tps.median / r.limit_tps() : 0.0);
  o << buf;
  o << parts_line("time per token by part", r.decode_parts_ms);
  if (r.engine_decode_tps.median > 0) {
    std::snprintf(buf, sizeof buf,
                  "  through the engine (scheduling, greedy sampling, stop checks): %.2f tokens/s (median, range "
                  "%.2f-%.2f), %.3f of the model's decode in alternating runs (range %.3f-%.3f)\n",
                  r.engine_decode_tps.median, r.engine_decode_tps.min, r.engine_decode_tps.max, r.engine_ratio.median,
                  r.engine_ratio.min, r.engine_ratio.max);
    o << buf;
  }
}

// Speculative decoding: where a step's time goes, then a row per kind of draft.
void speculative_lines(std::ostringstream& o, const Report& r) {
  if (r.spec.empty()) return;
  const SpecCosts& sc = r.spec_costs;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "speculative decoding, batch 1, greedy, %lld draft token(s) per verify pass, through the engine "
                "(alternating runs with plain decode; the machine's other load moves both):\n",
                (long long)r.draft_tokens);
  o << buf;
  // The ceilings at the row's tokens per step: by bytes, and by the model-level pass times; a
  // gated row may also decode plainly, so its ceiling is at least 1.
  auto row_line = [&](const char* what, const SpecRow& s, bool with_draft) {
    const double t = s.tokens_per_step, floor = s.adaptive ? 1.0 : 0.0;
    char line[512];
    std::snprintf(line, sizeof line,
                  "  %-34s acceptance %.2f, %.2f tokens per verify step: %.2f tokens/s against %.2f plain, ratio %.2f "
                  "(median, range %.2f-%.2f); ceiling by bytes %.2f, by pass times %.2f%s\n",
                  what, s.acceptance, t, s.spec_tps.median, s.plain_tps.median, s.ratio.median, s.ratio.min,
                  s.ratio.max, std::max(floor, sc.bytes_ratio(t, with_draft)), std::max(floor, sc.time_ratio(t, with_draft)),
                  s.identical ? "" : "  TOKENS DIFFER FROM PLAIN DECODE");
    o << line;
  };
  auto pass_line = [&](const char* what, const PassCost& p) {
    char line[160];
    std::snprintf(line, sizeof line, "%s (%s, %.1f routed experts per MoE layer)", what, gb(p.bytes).c_str(),
                  p.experts_per_layer);
    o << parts_line(line, p.parts_ms);
  };
  if (sc.plain.ms > 0) {
    o << "  where a step's time goes (model-level passes in turn, ms per pass by part; bytes read with the routed "
         "experts at the count read):\n";
    pass_line("plain decode pass", sc.plain);
    pass_line("verify pass (1 + k rows)", sc.verify);
    if (sc.draft.ms > 0) {
      char what[96];
      std::snprintf(what, sizeof what, "MTP draft (k module passes, %s head, error %.3f)", sc.draft_head.c_str(),
                    sc.draft_head_error);
      pass_line(what, sc.draft);
    }
    std::snprintf(buf, sizeof buf, "  against a plain pass: verify %.2fx by time, %.2fx by bytes",
                  sc.verify.ms / sc.plain.ms, sc.verify.bytes / sc.plain.bytes);
    o << buf;
    if (sc.draft.ms > 0) {
      std::snprintf(buf, sizeof buf, "; MTP draft %.2fx by time, %.2fx by bytes", sc.draft.ms / sc.plain.ms,
                    sc.draft.bytes / sc.plain.bytes);
      o << buf;
    }
    o << "\n";
  }
  for (const SpecRow& s : r.spec) {
    char what[64];
    std::snprintf(what, sizeof what, "injected drafts right %.0f%%%s:", 100 * s.target_acceptance,
                  s.adaptive ? "" : " (gate off)");
    row_line(what, s, false);
  }
  if (r.have_mtp) {
    row_line("the MTP module's drafts (gate off):", r.mtp, true);
    std::snprintf(buf, sizeof buf, "  MTP draft cost: %.2f ms per verify step, %.2f of a plain decode step (acceptance %s %.2f)\n",
                  r.mtp_draft_ms, r.mtp_cost_ratio, r.own_model ? "on the checkpoint's weights" : "on random weights",
                  r.mtp_acceptance);
    o << buf;
  } else if (!r.mtp_missing.empty()) {
    o << "  MTP rows skipped: " << r.mtp_missing << "\n";
  }
}

// Prompt processing against the GEMM probe and the compute peak.
void prompt_lines(std::ostringstream& o, const Report& r) {
  if (!(r.prompt_tps.median > 0)) return;
  char buf[256];
  o << tps_line("prompt processing (" + std::to_string(r.prompt_tokens) + " tokens)", r.prompt_tps, 1);
  std::snprintf(buf, sizeof buf,
                "  %.1f GFLOP per prompt: %.0f GFLOPS; oneDNN bf16 matmul %lld^3 around each run %.0f GFLOPS "
                "(median, range %.0f-%.0f); ratio to it per run %.2f (median, range %.2f-%.2f)\n",
                r.prompt_flops / 1e9, r.prompt_flops * r.prompt_tps.median / double(r.prompt_tokens) / 1e9,
                (long long)r.gemm_n, r.prompt_gemm_gflops.median, r.prompt_gemm_gflops.min, r.prompt_gemm_gflops.max,
                r.prompt_ratio.median, r.prompt_ratio.min, r.prompt_ratio.max);
  o << buf;
  std::snprintf(buf, sizeof buf,
                "  compute peak of the prompt's path, a register-only loop of %s on %d threads around each run: "
                "%.0f GFLOPS (median, range %.0f-%.0f); ratio to it per run %.3f (median, range %.3f-%.3f)\n",
                r.peak_path.c_str(), r.threads, r.prompt_peak_gflops.median, r.prompt_peak_gflops.min,
                r.prompt_peak_gflops.max, r.prompt_peak_ratio.median, r.prompt_peak_ratio.min, r.prompt_peak_ratio.max);
  o << buf;
  o << "  the peak by threads:";
  for (auto& [n, g] : r.peak_by_threads) {
    std::snprintf(buf, sizeof buf, " %d: %.0f GFLOPS (%.2fx one thread);", n, g,
                  r.peak_by_threads.front().second > 0 ? g / r.peak_by_threads.front().second : 0.0);
    o << buf;
  }
  o << "\n";
  o << parts_line("time per prompt by part", r.prompt_parts_ms);
}

// Scaling: 1 thread against all.
void scaling_lines(std::ostringstream& o, const Report& r) {
  char buf[256];
  auto scale_line = [&](const char* what, const Summary& one, const Summary& n, const Summary& ratio) {
    if (ratio.median <= 0) return;
    std::snprintf(buf, sizeof buf,
                  "  %s: %.2f tokens/s on %d threads, %.2f on 1 (medians); ratio per pair %.2f (median, range "
                  "%.2f-%.2f)\n",
                  what, n.median, r.threads, one.median, ratio.median, ratio.min, ratio.max);
    o << buf;
  };
  if (r.scale_decode_ratio.median > 0 || r.scale_prompt_ratio.median > 0) {
    o << "scaling, 1 thread against " << r.threads << " (alternating runs):\n";
    scale_line("decode, batch 1", r.scale_decode_1, r.scale_decode_n, r.scale_decode_ratio);
    scale_line("prompt", r.scale_prompt_1, r.scale_prompt_n, r.scale_prompt_ratio);
  }
}

// Batched decode.
void batched_lines(std::ostringstream& o, const Report& r) {
  if (r.batched_tps.empty()) return;
  char buf[256];
  o << "batched decode (tokens/s over all sequences, median and range):";
  for (auto& [b, s] : r.batched_tps) {
    std::snprintf(buf, sizeof buf, " batch %lld: %.1f (%.1f-%.1f);", (long long)b, s.median, s.min, s.max);
    o << buf;
  }
  o << "\n";
}

// Expert parallelism: each rank's own figures.
void rank_lines(std::ostringstream& o, const Report& r) {
  if (r.rank_rows.empty()) return;
  char buf[256];
  o << "expert parallelism, " << r.ranks
    << " ranks, each rank's own figures (combine: the MoE layers' partial sums received from the other ranks and "
       "the time in that exchange, waiting for the slowest rank included; per decode step at batch 1 and per "
       "prompt, means of the timed runs):\n";
  for (size_t k = 0; k < r.rank_rows.size(); ++k) {
    const RankFigures& f = r.rank_rows[k];
    std::snprintf(buf, sizeof buf,
                  "  rank %zu: routed experts [%lld, %lld); weights held %.3f MB (routed experts %.3f MB, replicated "
                  "%.3f MB)",
                  k, (long long)f.experts.begin, (long long)f.experts.end, f.weight_bytes / 1e6, f.routed_bytes / 1e6,
                  (f.weight_bytes - f.routed_bytes) / 1e6);
    o << buf;
    if (f.decode.step_seconds > 0) {
      std::snprintf(buf, sizeof buf, "; a decode step reads %.3f MB (%.2f routed experts per MoE layer)",
                    f.decode_read_bytes / 1e6, f.decode_experts_per_layer);
      o << buf;
    }
    o << "\n";
    auto share = [&](const char* what, const CombineShare& c, double tokens) {
      if (c.step_seconds <= 0) return;
      std::snprintf(buf, sizeof buf,
                    "  rank %zu %s: combine %.3f MB received (%.4f MB per token), %.3f ms of %.3f ms (%.1f%%)\n", k, what,
                    c.bytes / 1e6, c.bytes / 1e6 / tokens, c.seconds * 1e3, c.step_seconds * 1e3, 100 * c.share());
      o << buf;
    };
    share("per decode step", f.decode, 1);
    share(("per prompt of " + std::to_string(r.prompt_tokens) + " tokens").c_str(), f.prompt, double(r.prompt_tokens));
  }
}
}  // namespace

std::string format_report(const Report& r) {
  std::ostringstream o;
  header_lines(o, r);
  depth_lines(o, r);
  decode_lines(o, r);
  speculative_lines(o, r);
  prompt_lines(o, r);
  scaling_lines(o, r);
  batched_lines(o, r);
  rank_lines(o, r);
  for (const std::string& why : r.skipped) o << "skipped under mpirun: " << why << "\n";
  return o.str();
}

}  // namespace mla::bench
