// The MLA arithmetic behind `mla analyze`: KV-cache sizes (kv/cache_size.h), path FLOPs
// (through mla::MlaCosts, the formulas the path policy uses) and decode intensity, for a config
// or an entry of the preset table (model/presets.h).
#include "tools/analyze.h"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "kv/cache_size.h"
#include "model/presets.h"
#include "model/path_policy.h"

namespace mla {

using nlohmann::json;

namespace {

// All the figures, computed once for both the JSON and the report.
struct Figures {
  // kv, per layer in elements
  int64_t latent, expanded, mha, gqa8, mqa;
  // all layers, bytes per token
  int64_t latent_bf16, latent_fp8, expanded_bf16;
  MlaCosts costs;
  // absorbed decode, FLOP per byte of the latent row
  double intensity_bf16, intensity_fp8;
};

Figures figures(const ModelConfig& c) {
  Figures f{};
  const CacheShape s = CacheShape::of(c);
  f.latent = latent_row_elems(c.kv_lora_rank, c.qk_rope_head_dim);
  f.expanded = expanded_elems_per_layer(s);
  // The DeepSeek-V2 paper's Table 1 counts keys and values of head size d_h = qk_nope_head_dim:
  // MHA 2 n_h d_h, GQA 2 n_g d_h (8 groups here), MQA 2 d_h; MLA (d_c + d_h^R).
  f.mha = mha_elems_per_layer(s);
  f.gqa8 = gqa_elems_per_layer(s, 8);
  f.mqa = mqa_elems_per_layer(s);
  const int64_t bf16_row = latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim, KvDType::BF16);
  const int64_t fp8_row = latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim, KvDType::FP8);
  f.latent_bf16 = latent_bytes_per_token(s, KvDType::BF16);
  f.latent_fp8 = latent_bytes_per_token(s, KvDType::FP8);
  f.expanded_bf16 = expanded_bytes_per_token(s, 2);
  f.costs = MlaCosts::of(c);
  // Absorbed decode reads each cached latent row once per step and every head uses it: per
  // head kv_lora + rope multiply-adds for the score q~.c_KV + q_pe.k_pe and kv_lora for the
  // weighted sum of c_KV, i.e. pair_absorb = 2H(2 kv_lora + rope) FLOP per cached token and
  // layer, against one row of the cache in that format. DeepSeek-V3 in bf16:
  // 2*128*(1024+64) = 278528 FLOP / (576*2) = 1152 bytes = 241.8 FLOP/byte, the ~242 quoted for
  // MLA decode: H (2 kv_lora + rope) / (kv_lora + rope) = 1.89 H for a bf16 cache, whatever the
  // sequence length, so 128 heads sit near an H800's ridge (~990 TFLOP/s / 3.35 TB/s = 295)
  // where MHA decode is 1 and GQA H / groups (e.g. 64 / 8 = 8) in bf16. Analyses that also
  // charge the query's bytes at batch 1 land a little lower (~230). The W_UK / W_UV projections are per new token and read weights, not
  // the cache, so they are not in this figure. FP8 here is the pool's FlashMLA layout (512
  // e4m3 values, 4 float scales, bf16 k_pe = 656 bytes): 424.6 FLOP/byte; counting 1 byte per
  // element (576 bytes, as some papers do) would give 483.6.
  f.intensity_bf16 = f.costs.pair_absorb / double(bf16_row);
  f.intensity_fp8 = f.costs.pair_absorb / double(fp8_row);
  return f;
}

// DeepSeek Sparse Attention's lightning indexer, per layer: the key it caches per token, its
// projections per new token, its score per (query, key) pair, and the attention pairs left
// after the top-k (per query min(index_topk, visible keys) instead of every visible key).
struct DsaFigures {
  double key_bytes_bf16 = 0, key_bytes_fp8 = 0;
  double proj_per_new_token = 0, score_per_pair = 0;
};

DsaFigures dsa_figures(const ModelConfig& c) {
  DsaFigures d;
  const double Hi = double(c.index_n_heads), D = double(c.index_head_dim);
  d.key_bytes_bf16 = double(index_row_bytes(c.index_head_dim, KvDType::BF16));
  d.key_bytes_fp8 = double(index_row_bytes(c.index_head_dim, KvDType::FP8));
  d.proj_per_new_token = 2 * double(c.q_lora_rank) * Hi * D + 2 * double(c.hidden_size) * D + 2 * double(c.hidden_size) * Hi;
  d.score_per_pair = 2 * Hi * D + 2 * Hi;  // the per-head dots, then the weighted ReLU sum
  return d;
}

// (query, key) pairs of T new tokens at total length S: every visible key, and the top-k's.
std::pair<double, double> dsa_pairs(int64_t T, int64_t S, int64_t k) {
  double all = 0, kept = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double vis = double(S - T + t + 1);
    all += vis;
    kept += std::min(vis, double(k));
  }
  return {all, kept};
}

const char* bound(double intensity, double ridge) { return intensity < ridge ? "memory" : "compute"; }

std::string num(double v, int prec = 1) {
  char buf[64];
  if (std::fabs(v) >= 1e15) std::snprintf(buf, sizeof buf, "%.3e", v);
  else std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  // thousands separators on the integer part
  std::string s = buf;
  if (s.find('e') != std::string::npos) return s;
  const size_t dot = s.find('.');
  const size_t end = dot == std::string::npos ? s.size() : dot;
  const size_t begin = s[0] == '-' ? 1 : 0;
  std::string out = s.substr(0, begin);
  for (size_t i = begin; i < end; ++i) {
    out += s[i];
    size_t left = end - i - 1;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out + s.substr(end);
}

std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

}  // namespace

AnalyzeCase parse_analyze_case(const std::string& s) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument("--case '" + s + "': " + why + " (expected T,S: T new tokens, S total tokens, 1 <= T <= S)");
  };
  size_t comma = s.find(',');
  if (comma == std::string::npos) bad("no comma");
  AnalyzeCase c;
  auto parse = [&](const std::string& part, const char* what) -> int64_t {
    try {
      size_t used = 0;
      long long v = std::stoll(part, &used);
      if (used != part.size()) throw std::invalid_argument("");
      return v;
    } catch (const std::exception&) {
      bad(std::string(what) + " '" + part + "' is not an integer");
    }
    return 0;
  };
  c.new_tokens = parse(s.substr(0, comma), "T");
  c.total_tokens = parse(s.substr(comma + 1), "S");
  if (c.new_tokens < 1) bad("T must be at least 1");
  if (c.total_tokens < c.new_tokens) bad("S counts the new tokens, so S must be at least T");
  return c;
}

json analyze_json(const ModelConfig& c, const std::vector<AnalyzeCase>& cases, const std::optional<Roofline>& roofline) {
  const Figures f = figures(c);
  json kv = {
      {"latent_elems_per_layer", f.latent},
      {"expanded_elems_per_layer", f.expanded},
      {"mha_elems_per_layer", f.mha},
      {"gqa8_elems_per_layer", f.gqa8},
      {"mqa_elems_per_layer", f.mqa},
      {"latent_bytes_per_token_bf16", f.latent_bf16},
      {"latent_bytes_per_token_fp8", f.latent_fp8},
      {"expanded_bytes_per_token_bf16", f.expanded_bf16},
  };
  json jc = json::array();
  for (auto& k : cases) {
    double T = double(k.new_tokens), S = double(k.total_tokens);
    double e = f.costs.expand(T, S), a = f.costs.absorb(T, S);
    jc.push_back({{"new_tokens", k.new_tokens},
                  {"total_tokens", k.total_tokens},
                  {"expand", e},
                  {"absorb", a},
                  {"cheaper", e < a ? "expand" : "absorb"}});
  }
  json flops = {
      {"pair_expand", f.costs.pair_expand},
      {"pair_absorb", f.costs.pair_absorb},
      {"expand_per_cached_token", f.costs.expand_per_cached_token},
      {"absorb_per_new_token", f.costs.absorb_per_new_token},
      {"crossover_new_tokens", f.costs.crossover_new_tokens()},
      {"cases", jc},
  };
  json di = {{"bf16", f.intensity_bf16}, {"fp8", f.intensity_fp8}};
  if (roofline) {
    double ridge = roofline->ridge();
    di["ridge"] = ridge;
    di["bf16_bound"] = bound(f.intensity_bf16, ridge);
    di["fp8_bound"] = bound(f.intensity_fp8, ridge);
  }
  json out = {{"kv", kv}, {"flops", flops}, {"decode_intensity", di}};
  if (c.dsa()) {
    const DsaFigures d = dsa_figures(c);
    json dc = json::array();
    for (auto& k : cases) {
      auto [all, kept] = dsa_pairs(k.new_tokens, k.total_tokens, c.index_topk);
      const double indexer = d.proj_per_new_token * double(k.new_tokens) + d.score_per_pair * all;
      dc.push_back({{"new_tokens", k.new_tokens},
                    {"total_tokens", k.total_tokens},
                    {"indexer", indexer},
                    {"sparse_absorb", f.costs.absorb_per_new_token * double(k.new_tokens) + f.costs.pair_absorb * kept},
                    {"dense_absorb", f.costs.absorb(double(k.new_tokens), double(k.total_tokens))}});
    }
    out["dsa"] = {{"index_n_heads", c.index_n_heads},
                  {"index_head_dim", c.index_head_dim},
                  {"index_topk", c.index_topk},
                  {"key_bytes_per_token_bf16", d.key_bytes_bf16 * double(c.num_hidden_layers)},
                  {"key_bytes_per_token_fp8", d.key_bytes_fp8 * double(c.num_hidden_layers)},
                  {"indexer_proj_per_new_token", d.proj_per_new_token},
                  {"indexer_score_per_pair", d.score_per_pair},
                  {"cases", dc}};
  }
  return out;
}

std::string analyze_report(const ModelConfig& c, const std::string& name, const std::vector<AnalyzeCase>& cases,
                           const std::optional<Roofline>& roofline) {
  const Figures f = figures(c);
  const int64_t H = c.num_attention_heads, L = c.num_hidden_layers;
  std::ostringstream o;
  char line[256];
  o << "MLA arithmetic of " << name << " (model_type " << c.model_type << ")\n";
  std::snprintf(line, sizeof line,
                "  %lld layers, %lld heads, hidden %lld; kv_lora_rank %lld, q_lora_rank %lld, qk_nope %lld, "
                "qk_rope %lld, v_head %lld\n",
                (long long)L, (long long)H, (long long)c.hidden_size, (long long)c.kv_lora_rank,
                (long long)c.q_lora_rank, (long long)c.qk_nope_head_dim, (long long)c.qk_rope_head_dim,
                (long long)c.v_head_dim);
  o << line << "  Per layer, one device, no tensor parallelism; FLOPs count 2 per multiply-add.\n\n";

  o << "KV cache per token\n";
  std::snprintf(line, sizeof line, "  %-34s %12s %10s\n", "form", "elems/layer", "vs latent");
  o << line;
  auto row = [&](const char* what, int64_t elems) {
    std::snprintf(line, sizeof line, "  %-34s %12s %9.2fx\n", what, num(double(elems), 0).c_str(),
                  double(elems) / double(f.latent));
    o << line;
  };
  row("MLA latent (kv_lora + rope)", f.latent);
  row("expanded K/V (MHA form of MLA)", f.expanded);
  row("MHA, 2 H d (d = qk_nope)", f.mha);
  row("GQA 8 groups, 2*8 d", f.gqa8);
  row("MQA, 2 d", f.mqa);
  std::snprintf(line, sizeof line, "  all %lld layers: latent %s (bf16), %s (fp8 + scales); expanded %s (bf16)\n",
                (long long)L, bytes_str(double(f.latent_bf16)).c_str(), bytes_str(double(f.latent_fp8)).c_str(),
                bytes_str(double(f.expanded_bf16)).c_str());
  o << line;
  std::snprintf(line, sizeof line, "  at 128K tokens: latent %s (bf16), %s (fp8); expanded %s (bf16)\n\n",
                bytes_str(131072.0 * double(f.latent_bf16)).c_str(), bytes_str(131072.0 * double(f.latent_fp8)).c_str(),
                bytes_str(131072.0 * double(f.expanded_bf16)).c_str());
  o << line;

  o << "FLOPs per layer\n";
  std::snprintf(line, sizeof line, "  per (query, key) pair:   expand %s, absorb %s (%.2fx)\n",
                num(f.costs.pair_expand, 0).c_str(), num(f.costs.pair_absorb, 0).c_str(),
                f.costs.pair_absorb / f.costs.pair_expand);
  o << line;
  std::snprintf(line, sizeof line, "  expand, per cached token (kv_b_proj):        %s\n",
                num(f.costs.expand_per_cached_token, 0).c_str());
  o << line;
  std::snprintf(line, sizeof line, "  absorb, per new token (W_UK and W_UV):       %s\n",
                num(f.costs.absorb_per_new_token, 0).c_str());
  o << line;
  std::snprintf(line, sizeof line,
                "  crossover: over a long cached prefix, expand is cheaper from %.1f new tokens on\n",
                f.costs.crossover_new_tokens());
  o << line;
  if (cases.empty()) {
    o << "  (give --case T,S for the FLOPs of a batch shape)\n";
  } else {
    std::snprintf(line, sizeof line, "  %10s %10s %14s %14s %9s  %s\n", "new T", "total S", "expand GFLOP",
                  "absorb GFLOP", "abs/exp", "cheaper");
    o << line;
    for (auto& k : cases) {
      double T = double(k.new_tokens), S = double(k.total_tokens);
      double e = f.costs.expand(T, S), a = f.costs.absorb(T, S);
      std::snprintf(line, sizeof line, "  %10lld %10lld %14.4f %14.4f %9.3f  %s\n", (long long)k.new_tokens,
                    (long long)k.total_tokens, e / 1e9, a / 1e9, a / e, e < a ? "expand" : "absorb");
      o << line;
    }
  }
  if (c.dsa()) {
    const DsaFigures d = dsa_figures(c);
    o << "\nDeepSeek Sparse Attention: the lightning indexer, per layer\n";
    std::snprintf(line, sizeof line, "  %lld heads of %lld, top-k %lld; key cached per token: %s (bf16), %s (fp8 + scale)\n",
                  (long long)c.index_n_heads, (long long)c.index_head_dim, (long long)c.index_topk,
                  bytes_str(d.key_bytes_bf16).c_str(), bytes_str(d.key_bytes_fp8).c_str());
    o << line;
    std::snprintf(line, sizeof line, "  all %lld layers: latent + key %s (bf16) per token\n", (long long)L,
                  bytes_str(double(f.latent_bf16) + d.key_bytes_bf16 * double(L)).c_str());
    o << line;
    std::snprintf(line, sizeof line, "  projections per new token %s; score per (query, key) pair %s\n",
                  num(d.proj_per_new_token, 0).c_str(), num(d.score_per_pair, 0).c_str());
    o << line;
    if (!cases.empty()) {
      std::snprintf(line, sizeof line, "  %10s %10s %14s %14s %14s\n", "new T", "total S", "indexer GFLOP",
                    "sparse GFLOP", "dense GFLOP");
      o << line;
      for (auto& k : cases) {
        auto [all, kept] = dsa_pairs(k.new_tokens, k.total_tokens, c.index_topk);
        const double ix = d.proj_per_new_token * double(k.new_tokens) + d.score_per_pair * all;
        const double sp = f.costs.absorb_per_new_token * double(k.new_tokens) + f.costs.pair_absorb * kept;
        std::snprintf(line, sizeof line, "  %10lld %10lld %14.4f %14.4f %14.4f   (absorb form)\n", (long long)k.new_tokens,
                      (long long)k.total_tokens, ix / 1e9, sp / 1e9,
                      f.costs.absorb(double(k.new_tokens), double(k.total_tokens)) / 1e9);
        o << line;
      }
    }
  }
  o << "\nAbsorbed decode: FLOP per byte of latent cache read\n";
  std::snprintf(line, sizeof line, "  bf16 latent: %.1f   fp8 latent: %.1f\n", f.intensity_bf16, f.intensity_fp8);
  o << line;
  if (roofline) {
    double ridge = roofline->ridge();
    std::snprintf(line, sizeof line,
                  "  roofline: %.1f TFLOP/s / %.2f TB/s = ridge %.1f FLOP/byte; bf16 is %s-bound, fp8 is %s-bound\n",
                  roofline->peak_tflops, roofline->bandwidth_tbs, ridge, bound(f.intensity_bf16, ridge),
                  bound(f.intensity_fp8, ridge));
    o << line;
  } else {
    o << "  (give --peak-tflops and --bandwidth-tbs to place these against a roofline)\n";
  }
  return o.str();
}

}  // namespace mla
