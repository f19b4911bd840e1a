// Throughput of the three MLA attention paths (expand, absorb, chunked) on the CPU for one
// DeepSeek-V2-Lite-sized attention layer (H 16, kv_lora 512, rope 64, nope 128, v 128, hidden
// 2048; random bf16 weights in memory), over new tokens T and cached tokens C: prefill (C = 0),
// extend and decode (T = 1). The layer runs through the model's own attention unit
// (model/mla.h, MlaAttention: projections, norm and RoPE, the cache write into a bf16 latent
// pool, expand / absorb / chunked attention, o_proj). It prints tokens/s per path and the ratio between
// paths, and where expand overtakes absorb in practice next to the FLOP model's
// crossover_new_tokens (mla::MlaCosts).
//
//   bench/attention_paths [--quick] [--threads N] [--min-time SECONDS]
//
// On cores shared with other work, OpenMP's spinning barriers make the multi-threaded absorb
// path (2H small matmuls per layer, each a parallel region) collapse; run with --threads 1 or
// OMP_WAIT_POLICY=PASSIVE there. The header line prints the load average and the wait policy.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "model/presets.h"
#include "kv/latent_pool.h"
#include "model/mla.h"
#include "model/path_policy.h"
#include "tensor/dtype.h"

namespace {

using mla::MatrixView;
using Clock = std::chrono::steady_clock;

// A random bf16 weight [rows, cols] (scaled like a trained projection: ~1/sqrt(cols)).
struct Bf16Weight {
  std::vector<uint16_t> data;
  MatrixView view;
  Bf16Weight(int64_t rows, int64_t cols, std::mt19937& rng) : data(size_t(rows * cols)) {
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(cols)));
    for (auto& x : data) x = mla::f32_to_bf16(nd(rng));
    view.format = mla::WeightFormat::BF16;
    view.rows = rows;
    view.cols = cols;
    view.data = data.data();
  }
};

// One attention layer of the model's shape: random weights as the loader would hold them, run
// by the model's attention unit.
struct Layer {
  int64_t H, nope, rope, vd, kvr, qk, dim, D;
  Bf16Weight q, kv_a, kv_b, o;
  std::vector<uint16_t> uk_data;
  mla::LayerWeights W;
  mla::MlaAttention attn;
  mla::cpu::Context ctx;  // the precise precision; threads from --threads

  Layer(const mla::ModelConfig& cfg, const mla::cpu::Context& context, std::mt19937& rng)
      : H(cfg.num_attention_heads),
        nope(cfg.qk_nope_head_dim),
        rope(cfg.qk_rope_head_dim),
        vd(cfg.v_head_dim),
        kvr(cfg.kv_lora_rank),
        qk(cfg.qk_head_dim()),
        dim(cfg.latent_dim()),
        D(cfg.hidden_size),
        q(H * qk, D, rng),
        kv_a(dim, D, rng),
        kv_b(H * (nope + vd), kvr, rng),
        o(D, H * vd, rng),
        attn(cfg),
        ctx(context) {
    if (cfg.q_lora_rank > 0) throw std::invalid_argument("bench: the layer has a plain q_proj");
    W.q = q.view;
    W.kv_a = kv_a.view;
    W.kv_b = kv_b.view;
    W.o = o.view;
    W.kv_a_norm.assign(size_t(kvr), 1.0f);
    // Weight absorption as the loader does it for bf16 kv_b: W_UV[h] is a row slice of kv_b,
    // W_UK[h]^T a transposed bf16 copy.
    uk_data.resize(size_t(H * kvr * nope));
    std::vector<float> row(static_cast<size_t>(kvr));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < nope; ++d) {
        kv_b.view.dequant_row(h * (nope + vd) + d, row.data());
        for (int64_t k = 0; k < kvr; ++k) uk_data[size_t((h * kvr + k) * nope + d)] = mla::f32_to_bf16(row[size_t(k)]);
      }
      MatrixView uk;
      uk.format = mla::WeightFormat::BF16;
      uk.rows = kvr;
      uk.cols = nope;
      uk.data = uk_data.data() + h * kvr * nope;
      W.w_uk_t.push_back(uk);
      W.w_uv.push_back(kv_b.view.slice_rows(h * (nope + vd) + nope, vd));
    }
  }

  // T new tokens at positions C..C+T-1 of `seq` (which holds C tokens): projections, the
  // latents into the pool, attention on `path`, o_proj. Returns seconds spent in the attention
  // itself (MlaAttention::attend: the part that differs between paths).
  double forward(const float* x, int64_t T, mla::LatentPool& pool, mla::PageTable& seq, mla::AttnPath path,
                 int64_t prefix_chunk, float* y) {
    const int64_t C = seq.length, S = C + T;
    std::vector<float> qv(size_t(T * H * qk)), kv(size_t(T * dim)), out(size_t(T * H * vd));
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = C + t;
    attn.project(ctx, W, x, T, pos.data(), qv.data(), kv.data());
    if (!pool.reserve(seq, S)) throw std::runtime_error("bench: pool too small");
    attn.write_cache(pool, 0, seq, C, T, kv.data());
    const std::vector<int32_t> ids(static_cast<size_t>(T), 0);  // only their count is read
    const mla::SeqSlice batch[] = {{&seq, ids}};
    const int64_t first[] = {0, T};
    auto t0 = Clock::now();
    attn.attend(ctx, W, pool, 0, batch, first, mla::mla_form(path), prefix_chunk, qv.data(), out.data());
    double attn_s = std::chrono::duration<double>(Clock::now() - t0).count();
    seq.length = S;
    attn.o_proj(ctx, W, out.data(), T, y);
    return attn_s;
  }
};

// The 1-minute load average: other work on the cores skews the figures (and multi-threaded
// runs most, through OpenMP barriers), so the report states it.
double load_average() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  double l = -1;
  if (f) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

struct Timing {
  double layer_s = 0, attn_s = 0;  // per forward
};

// Runs the shape until min_time has passed (at least once), returns the mean per forward.
Timing measure(Layer& L, mla::LatentPool& pool, mla::PageTable& seq, int64_t C, int64_t T, mla::AttnPath path,
               int64_t prefix_chunk, const std::vector<float>& x, double min_time) {
  std::vector<float> y(size_t(T * L.D));
  Timing sum;
  int reps = 0;
  auto start = Clock::now();
  // One warm-up run, then timed runs.
  for (int i = -1;; ++i) {
    auto t0 = Clock::now();
    double a = L.forward(x.data(), T, pool, seq, path, prefix_chunk, y.data());
    double total = std::chrono::duration<double>(Clock::now() - t0).count();
    pool.truncate(seq, C);
    if (i >= 0) {
      sum.layer_s += total;
      sum.attn_s += a;
      ++reps;
    }
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (reps > 0 && elapsed >= min_time) break;
    if (i < 0 && total > min_time) {  // a slow shape: the warm-up run counts
      sum.layer_s = total;
      sum.attn_s = a;
      reps = 1;
      break;
    }
  }
  return {sum.layer_s / reps, sum.attn_s / reps};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  double min_time = 0.25;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--min-time" && i + 1 < argc) min_time = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--threads N] [--min-time SECONDS]\n", argv[0]);
      return 2;
    }
  }
  mla::cpu::Context ctx;
  ctx.threads = threads;
  if (quick) min_time = std::min(min_time, 0.05);

  const auto bench_start = Clock::now();
  const mla::ModelConfig cfg = mla::preset_config("deepseek-v2-lite");
  const mla::MlaCosts costs = mla::MlaCosts::of(cfg);
  mla::PathPolicy policy;  // the model's defaults: prefix_chunk 1024
  std::mt19937 rng(1234);
  Layer L(cfg, ctx, rng);

  const std::vector<int64_t> cached_list = quick ? std::vector<int64_t>{0, 2048} : std::vector<int64_t>{0, 512, 2048, 4096};
  const std::vector<int64_t> new_list =
      quick ? std::vector<int64_t>{1, 16, 256} : std::vector<int64_t>{1, 4, 16, 64, 128, 256, 512};
  const int64_t max_tokens = cached_list.back() + new_list.back();
  mla::LatentPool pool(1, cfg.kv_lora_rank, cfg.qk_rope_head_dim, (max_tokens + 63) / 64, 64, mla::KvDType::BF16);

  std::printf("MLA attention paths on the CPU: one DeepSeek-V2-Lite attention layer (H %lld, kv_lora %lld, rope %lld, "
              "nope %lld, v %lld, hidden %lld), bf16 weights, bf16 latent pool, %d threads, load average %.2f, OMP_WAIT_POLICY %s\n",
              (long long)cfg.num_attention_heads, (long long)cfg.kv_lora_rank, (long long)cfg.qk_rope_head_dim,
              (long long)cfg.qk_nope_head_dim, (long long)cfg.v_head_dim, (long long)cfg.hidden_size,
              ctx.num_threads(), load_average(),
              std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "(unset)");
  std::printf("tokens/s = new tokens / time of the whole layer (projections, pool, attention, o_proj); the ratios "
              "compare the attention part alone (MlaAttention::attend), which is all that differs. chunked runs the cached "
              "prefix %lld tokens at a time.\n",
              (long long)policy.prefix_chunk);
  std::printf("FLOP model (mla::MlaCosts): pair expand %.0f, absorb %.0f; expand %.0f per cached token, absorb %.0f "
              "per new token; crossover_new_tokens = %.1f\n\n",
              costs.pair_expand, costs.pair_absorb, costs.expand_per_cached_token, costs.absorb_per_new_token,
              costs.crossover_new_tokens());

  const mla::AttnPath paths[] = {mla::AttnPath::Expand, mla::AttnPath::Absorb, mla::AttnPath::Chunked};
  std::vector<float> x(size_t(new_list.back() * cfg.hidden_size));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);

  // The FLOP model's crossover at C cached tokens: the smallest T from which expand costs no
  // more than absorb (absorb - expand grows with T). At C = 0 that is T = 1 whenever the fixed
  // costs are equal (2 kv_lora H (nope + v) per cached or per new token).
  auto model_crossover = [&](int64_t C) {
    auto expand_wins = [&](int64_t T) {
      return costs.expand(double(T), double(C + T)) <= costs.absorb(double(T), double(C + T));
    };
    int64_t hi = 1;
    while (!expand_wins(hi)) hi *= 2;
    int64_t lo = hi / 2;  // expand_wins(lo) is false unless lo == 0
    while (hi - lo > 1) {
      int64_t mid = (lo + hi) / 2;
      (expand_wins(mid) ? hi : lo) = mid;
    }
    return hi;
  };

  struct Crossing {
    int64_t C;
    int64_t last_absorb = -1, first_expand = -1;  // measured: largest T absorb won, smallest T expand (or chunked) won
  };
  std::vector<Crossing> crossings;
  for (int64_t C : cached_list) {
    mla::PageTable seq;
    // Fill the cached prefix with real latents by running the layer over it once.
    for (int64_t done = 0; done < C;) {
      int64_t n = std::min<int64_t>(C - done, new_list.back());
      std::vector<float> y(size_t(n * cfg.hidden_size));
      L.forward(x.data(), n, pool, seq, mla::AttnPath::Absorb, policy.prefix_chunk, y.data());
      done += n;
    }
    // The policy runs chunked (not expand) when the cached prefix is longer than one chunk.
    const bool chunked = C > policy.prefix_chunk;
    std::printf("cached C = %lld%s: the expand form runs %s\n", (long long)C, C == 0 ? " (prefill)" : "",
                chunked ? "chunked" : "as plain expand");
    std::printf("  %6s | %12s %12s %13s | %8s %8s | %9s | %8s %8s\n", "new T", "expand tok/s", "absorb tok/s",
                "chunked tok/s", "abs/exp", "chk/exp", "model a/e", "faster", "policy");
    Crossing cr{C};
    for (int64_t T : new_list) {
      if (C == 0 && T == 1) continue;  // a one-token prefill is decode with nothing cached
      Timing t[3];
      for (int p = 0; p < (chunked ? 3 : 2); ++p)
        t[p] = measure(L, pool, seq, C, T, paths[p], policy.prefix_chunk, x, min_time);
      const double S = double(C + T);
      const double model_ratio = costs.absorb(double(T), S) / costs.expand(double(T), S);
      const Timing& ex = chunked ? t[2] : t[0];  // the expand form the engine would run
      const bool absorb_faster = t[1].attn_s < ex.attn_s;
      const mla::AttnPath pick = mla::choose_attn_path(costs, {{T, C}}, policy);
      char chk_tps[32] = "-", chk_ratio[32] = "-";
      if (chunked) {
        std::snprintf(chk_tps, sizeof chk_tps, "%.1f", double(T) / t[2].layer_s);
        std::snprintf(chk_ratio, sizeof chk_ratio, "%.3f", t[2].attn_s / t[0].attn_s);
      }
      std::printf("  %6lld | %12.1f %12.1f %13s | %8.3f %8s | %9.3f | %8s %8s\n", (long long)T,
                  double(T) / t[0].layer_s, double(T) / t[1].layer_s, chk_tps, t[1].attn_s / t[0].attn_s, chk_ratio,
                  model_ratio, absorb_faster ? "absorb" : chunked ? "chunked" : "expand", mla::attn_path_name(pick));
      if (absorb_faster) cr.last_absorb = T;
      else if (cr.first_expand < 0) cr.first_expand = T;
    }
    pool.release(seq);
    crossings.push_back(cr);
    std::printf("\n");
  }
  std::printf("abs/exp, chk/exp: attention time of absorb, chunked over expand (measured); model a/e: absorb over\n"
              "expand FLOPs. faster: absorb or the expand form the engine would run; policy: choose_attn_path.\n\n");
  std::printf("Crossover, new tokens T from which the expand form beats absorb\n");
  std::printf("  FLOP model over a long cached prefix (crossover_new_tokens): %.1f\n", costs.crossover_new_tokens());
  for (auto& cr : crossings) {
    std::string measured;
    if (cr.first_expand < 0) measured = "absorb faster at every T measured (up to " + std::to_string(new_list.back()) + ")";
    else if (cr.last_absorb < 0) measured = "expand form faster at every T measured";
    else
      measured = "between T = " + std::to_string(cr.last_absorb) + " (absorb faster) and " +
                 std::to_string(cr.first_expand) + " (expand form faster)";
    std::printf("  C = %5lld: measured %s; FLOP model at this C: T = %lld\n", (long long)cr.C, measured.c_str(),
                (long long)model_crossover(cr.C));
  }
  std::printf("%.1f s in all; load average at the end %.2f\n",
              std::chrono::duration<double>(Clock::now() - bench_start).count(), load_average());
  return 0;
}
