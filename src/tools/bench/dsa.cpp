// `mla bench --dsa`: DeepSeek Sparse Attention against dense attention, one layer and a model
// (see tools/bench.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "backend/cpu/index_score.h"
#include "backend/cpu/precision.h"
#include "model/indexer.h"
#include "model/mla.h"
#include "model/presets.h"
#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// DeepSeek-V3.2's attention and indexer on DeepSeek-V3's config (the two share every other
// attention size).
nlohmann::json v32_config() {
  nlohmann::json j = find_preset("deepseek-v3").config;
  j["model_type"] = "deepseek_v32";
  j["index_n_heads"] = 64;
  j["index_head_dim"] = 128;
  j["index_topk"] = 2048;
  return j;
}

ModelConfig layer_config() {
  nlohmann::json j = v32_config();
  j["num_hidden_layers"] = 1;
  j["first_k_dense_replace"] = 1;
  return ModelConfig::from_json(j, "the DSA benchmark's config");
}

// One layer of V3.2's attention with random weights, timed per decoded token over a pool of
// random cached tokens: dense absorbed attention, the indexer's pass plus absorbed attention over
// its top-k, and each scoring kernel alone, each on keys the read loop has evicted.
struct DsaLayer {
  const cpu::Context& ctx;
  const DsaOptions& opt;
  std::mt19937& rng;
  const ModelConfig c = layer_config();
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim,
                kvr = c.kv_lora_rank, qk = nope + rope, Hi = c.index_n_heads, D = c.index_head_dim, K = c.index_topk;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  // W_UK^T and W_UV per head as float32 views: all the absorbed attention reads of the layer.
  std::vector<float> uk = randn(size_t(H * kvr * nope), 0.05f), uv = randn(size_t(H * vd * kvr), 0.05f);
  LayerWeights W{};
  MlaAttention mla{c};
  Indexer ix{c};
  KvDType dt = parse_kv_dtype(opt.kv_dtype);
  // 512 MB, twice the largest last-level caches this runs on: a pass leaves none of the keys cached.
  ReadLoop loop{size_t(512) << 20, opt.threads};
  std::vector<double> loop_passes{};
  std::vector<cpu::IndexKernel> kernels{};

  std::vector<float> randn(size_t n, float sd) {
    std::vector<float> v(n);
    for (auto& x : v) x = sd * nd(rng);
    return v;
  }

  void prepare() {
    for (int64_t h = 0; h < H; ++h) {
      MatrixView a, b;
      a.format = b.format = WeightFormat::F32;
      a.rows = kvr, a.cols = nope, a.data = reinterpret_cast<const uint8_t*>(uk.data() + h * kvr * nope);
      b.rows = vd, b.cols = kvr, b.data = reinterpret_cast<const uint8_t*>(uv.data() + h * vd * kvr);
      W.w_uk_t.push_back(a);
      W.w_uv.push_back(b);
    }
    for (auto k : {cpu::IndexKernel::F32, cpu::IndexKernel::Bf16, cpu::IndexKernel::Amx})
      if (cpu::index_kernel_supported(k, D)) kernels.push_back(k);
  }

  DsaRow row(int64_t S) {
    const int64_t page = 64;
    LatentPool pool(1, kvr, rope, pages_for_tokens(S, page), page, dt, D);
    PageTable seq;
    fill_random_cache(pool, kvr, seq, S, rng);
    seq.length = S - 1;  // the decoded token is the last row
    const SeqKeys keys{&pool, 0, &seq, S - 1, 1};
    const cpu::IndexKeyPages key_pages{pool.index_data(0), seq.pages.data(), page, pool.index_bytes_per_row(), D, dt};
    std::vector<float> q = randn(size_t(H * qk), 0.1f), out(size_t(H * vd));
    std::vector<float> qi = randn(size_t(Hi * D), 0.1f), wi = randn(size_t(Hi), 0.1f), scores(static_cast<size_t>(S));
    std::vector<int32_t> sel(static_cast<size_t>(K));
    std::vector<int64_t> count(1);
    DsaRow row;
    row.context = S;
    row.index_read_bytes = double(S) * double(index_row_bytes(D, dt));
    row.pool_bytes = double(pool.total_bytes());
    std::vector<double> dense, sparse, index, topk;
    std::vector<std::vector<double>> per_kernel(kernels.size());
    cpu::IndexQuery iq;
    for (int r = 0; r <= opt.runs; ++r) {
      auto t0 = Clock::now();
      mla.absorb(ctx, W, keys, q.data(), out.data());
      const double td = seconds_since(t0);
      loop_passes.push_back(loop.measure(1));  // evicts the keys
      t0 = Clock::now();
      ix.select(ctx, keys, qi.data(), wi.data(), sel.data(), count.data());
      const double ti = seconds_since(t0);
      const cpu::KeySelection ks{sel.data(), K, count.data()};
      mla.absorb_sparse(ctx, W, keys, ks, q.data(), out.data());
      const double ts = seconds_since(t0);
      // Each scoring kernel alone on evicted keys, and the top-k alone.
      std::vector<double> tk(kernels.size());
      for (size_t i = 0; i < kernels.size(); ++i) {
        iq.prepare(kernels[i], qi.data(), wi.data(), Hi, D);
        loop_passes.push_back(loop.measure(1));
        t0 = Clock::now();
        cpu::index_scores(ctx, iq, key_pages, S, scores.data());
        tk[i] = seconds_since(t0);
      }
      t0 = Clock::now();
      cpu::topk_positions(ctx, scores.data(), S, K, sel.data());
      const double tt = seconds_since(t0);
      if (r == 0) continue;  // warm-up
      dense.push_back(td * 1e3);
      sparse.push_back(ts * 1e3);
      index.push_back(ti * 1e3);
      topk.push_back(tt * 1e3);
      for (size_t i = 0; i < kernels.size(); ++i) per_kernel[i].push_back(tk[i] * 1e3);
    }
    row.dense_ms = summarize(dense);
    row.sparse_ms = summarize(sparse);
    row.indexer_ms = summarize(index);
    row.topk_ms = summarize(topk);
    for (size_t i = 0; i < kernels.size(); ++i)
      row.kernel_ms.push_back({cpu::index_kernel_name(kernels[i]), summarize(per_kernel[i])});
    return row;
  }
};

// The model part's checkpoint: V3.2's attention and indexer, a small MoE and vocabulary; written
// into rep.model_dir when missing.
void v32_checkpoint(const DsaOptions& opt, DsaReport& rep) {
  nlohmann::json mj = v32_config();
  mj["num_hidden_layers"] = opt.layers;
  mj["first_k_dense_replace"] = 1;
  mj["intermediate_size"] = 2048;
  mj["n_routed_experts"] = 16;
  mj["moe_intermediate_size"] = 256;
  mj["vocab_size"] = 16384;
  rep.model_dir = opt.dir.empty() ? (std::filesystem::temp_directory_path() /
                                     ("mla-bench-v32-" + std::to_string(opt.layers) + "L"))
                                        .string()
                                  : opt.dir;
  const nlohmann::json want = {{"config", "v32"}, {"layers", opt.layers}, {"weights", "bf16"}, {"seed", 1}};
  if (holds_checkpoint(rep.model_dir, want, "the DSA benchmark's")) return;
  std::fprintf(stderr, "writing a random bf16 DeepSeek-V3.2-shaped checkpoint of %lld layers to %s ...\n",
               (long long)opt.layers, rep.model_dir.c_str());
  RandomCheckpointOptions ro;
  ro.seed = 1;
  ro.shards = 2;
  write_random_checkpoint(rep.model_dir, mj, ro);
  stamp_checkpoint(rep.model_dir, want);
}

std::string model_desc(const ModelConfig& mc) {
  char desc[400];
  std::snprintf(desc, sizeof desc,
                "%lld layers of DeepSeek-V3.2's attention and indexer (hidden 7168, 128 heads, q LoRA 1536, kv LoRA "
                "512 + 64, indexer 64 x 128, top-%lld), bf16; not the release's FFN: the first layer a dense MLP of "
                "%lld, then MoE of %lld experts of %lld (top-%lld, 1 shared), vocabulary %lld, so that it fits in "
                "memory and writes quickly",
                (long long)mc.num_hidden_layers, (long long)mc.index_topk, (long long)mc.intermediate_size,
                (long long)mc.n_routed_experts, (long long)mc.moe_intermediate_size,
                (long long)mc.num_experts_per_tok, (long long)mc.vocab_size);
  return desc;
}

// The model's decode at `S` cached tokens: alternating steps, DSA (0) then dense (1); each step
// decodes the token at position S and is truncated away again, so every step sees the same S
// cached tokens.
DsaModelRow model_row(Model& model, const DsaOptions& opt, int64_t S, KvDType dt, std::mt19937& rng) {
  const ModelConfig& mc = model.config();
  std::uniform_int_distribution<int32_t> tok(0, int32_t(mc.vocab_size - 1));
  std::vector<float> logits;
  LatentPool pool = model.make_pool(pages_for_tokens(S + 1, 64) + 1, 64, dt);
  PageTable seq;
  fill_random_cache(pool, mc.kv_lora_rank, seq, S, rng);
  DsaModelRow row;
  row.context = S;
  ForwardProfile prof[2];
  std::vector<double> tps[2];
  for (int r = 0; r <= opt.runs; ++r)
    for (int mode = 0; mode < 2; ++mode) {
      ForwardOptions fo;
      fo.last_logits_only = true;
      fo.dense_attention = mode == 1;
      const int32_t id = tok(rng);
      double t = 0;
      {
        const Profiled profiled(model, r > 0 ? &prof[mode] : nullptr);
        const auto t0 = Clock::now();
        forward_one(model, seq, std::span<const int32_t>(&id, 1), pool, fo, logits);
        t = seconds_since(t0);
      }
      pool.truncate(seq, S);
      if (r > 0) tps[mode].push_back(1.0 / t);
    }
  row.dsa_tps = summarize(tps[0]);
  row.dense_tps = summarize(tps[1]);
  row.dsa_attn_ms = prof[0].seconds[ForwardProfile::Attention] / double(std::max<int64_t>(1, prof[0].passes)) * 1e3;
  row.dense_attn_ms = prof[1].seconds[ForwardProfile::Attention] / double(std::max<int64_t>(1, prof[1].passes)) * 1e3;
  return row;
}

}  // namespace

DsaReport run_dsa(const DsaOptions& opt) {
  cpu::Context ctx;
  ctx.threads = opt.threads;
  ctx.precision = cpu::parse_precision(opt.precision);
  std::mt19937 rng(11);
  DsaLayer layer{.ctx = ctx, .opt = opt, .rng = rng};
  layer.prepare();
  DsaReport rep;
  rep.threads = ctx.num_threads();
  rep.kv_dtype = opt.kv_dtype;
  rep.precision = opt.precision;
  rep.kernel = cpu::index_kernel_name(layer.ix.kernel(ctx));
  rep.bandwidth_gbps = layer.loop.measure(3);
  for (int64_t S : opt.contexts) rep.rows.push_back(layer.row(S));
  rep.loop_gbps = summarize(layer.loop_passes);
  if (opt.layers <= 0) return rep;

  v32_checkpoint(opt, rep);
  auto model = Model::load(rep.model_dir, LoadOptions{ctx, false, {}, false, &parallel::world()});
  rep.model_desc = model_desc(model->config());
  for (int64_t S : opt.contexts) rep.model_rows.push_back(model_row(*model, opt, S, layer.dt, rng));
  return rep;
}

std::string format_dsa_report(const DsaReport& r) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line,
                "DeepSeek Sparse Attention, one layer of DeepSeek-V3.2's attention (128 heads, indexer 64 x 128, "
                "top-2048), %s cache, %s precision, %d threads; indexer kernel %s; read loop %.1f GB/s (best of 3), "
                "%.1f GB/s (median of the passes between indexer passes)\n",
                r.kv_dtype.c_str(), r.precision.c_str(), r.threads, r.kernel.c_str(), r.bandwidth_gbps,
                r.loop_gbps.median);
  o << line;
  std::snprintf(line, sizeof line, "  %8s %11s %11s %11s %9s %9s %12s %8s %10s\n", "context", "dense ms", "dsa ms",
                "indexer ms", "top-k ms", "dense/dsa", "indexer GB/s", "vs loop", "cache MB");
  o << line;
  for (const DsaRow& x : r.rows) {
    const double gbps = x.index_read_bytes / (x.indexer_ms.median * 1e-3) / 1e9;
    std::snprintf(line, sizeof line, "  %8lld %11.3f %11.3f %11.3f %9.3f %8.2fx %12.1f %7.2fx %10.1f\n",
                  (long long)x.context, x.dense_ms.median, x.sparse_ms.median, x.indexer_ms.median, x.topk_ms.median,
                  x.dense_ms.median / x.sparse_ms.median, gbps, gbps / r.loop_gbps.median, x.pool_bytes / 1e6);
    o << line;
  }
  o << "  scoring alone (keys evicted first), each kernel this CPU runs: ms, GB/s of the key cache, against the loop\n";
  for (const DsaRow& x : r.rows) {
    std::snprintf(line, sizeof line, "  %8lld", (long long)x.context);
    o << line;
    for (auto& [name, ms] : x.kernel_ms) {
      const double gbps = x.index_read_bytes / (ms.median * 1e-3) / 1e9;
      std::snprintf(line, sizeof line, "   %s %.3f ms %.1f GB/s %.2fx", name.c_str(), ms.median, gbps,
                    gbps / r.loop_gbps.median);
      o << line;
    }
    o << "\n";
  }
  o << "  (medians per decoded token; dsa = the indexer's pass (scores and top-k) plus absorbed attention over the\n"
       "   top-k; a shared machine's timings: read the ratios, measured in one run)\n";
  if (!r.model_rows.empty()) {
    o << "model decode, batch 1, " << r.model_desc << " (" << r.model_dir << "):\n";
    std::snprintf(line, sizeof line, "  %8s %12s %12s %9s %15s %15s %9s\n", "context", "dense tok/s", "dsa tok/s",
                  "dsa/dense", "dense attn ms", "dsa attn ms", "dense/dsa");
    o << line;
    for (const DsaModelRow& x : r.model_rows) {
      std::snprintf(line, sizeof line, "  %8lld %12.2f %12.2f %8.2fx %15.2f %15.2f %8.2fx\n", (long long)x.context,
                    x.dense_tps.median, x.dsa_tps.median, x.dsa_tps.median / x.dense_tps.median, x.dense_attn_ms,
                    x.dsa_attn_ms, x.dense_attn_ms / x.dsa_attn_ms);
      o << line;
    }
    o << "  (tokens/s: medians of alternating single-token steps; attention per token: all layers, the DSA side\n"
         "   with its indexer (projections, key write, scores, top-k); the dense side the same weights attending\n"
         "   every position without the indexer)\n";
  }
  return o.str();
}

}  // namespace mla::bench
