// Long context through the real loader and every attention path, against a reference that never
// forms a T x T matrix.
//
// Each case writes a tiny one-layer checkpoint of a family (its released rope_theta, rope scaling,
// qk_rope_head_dim and max_position_embeddings; small everything else) and runs N tokens
// (32,768 by default; MLA_LONG_CONTEXT_TOKENS=n raises it, =max runs each family's
// max_position_embeddings: scripts/long_context.sh) through
//   prefill expand, prefill absorb           one pass over all N tokens,
//   chunked / extend / decode                 the first N - R tokens prefilled, then the last R
//                                             through the chunked path (prefix chunk 3001),
//                                             the policy's extend choice, or one token at a time.
// The reference (Reference below) reads the checkpoint's tensors itself and computes, in float64,
// the logits at the last R positions and a few earlier ones: each query against the earlier keys,
// with its own YaRN angles in long double. With one layer every key depends on the embeddings
// only, so a query's reference costs O(N). bf16 and fp8 caches are held to twice the error the
// same case has at 1,024 tokens (measured in the test).
//
// Quantized weights (DeepSeek-V3's block FP8; Kimi K2.5's INT4 routed experts on a one-layer MoE)
// run the extend and decode paths against the same reference, which dequantizes them itself.
//
// DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) is checked in two parts, at 8,192 tokens
// here: every path against the model's own float64 attention (ForwardOptions::reference_attention:
// each query against its top-k in double) over the same selection, and that selection against
// an independent float64 lightning indexer (IndexReference) at the checked positions, where they
// may differ only at near-ties of the k-th score.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>

#include "format/safetensors.h"
#include "model/model.h"
#include "model/presets.h"
#include "tensor/dtype.h"
#include "test_util.h"
#include "tools/checkpoint_writer.h"

namespace mla {
namespace {

using nlohmann::json;

constexpr int64_t kLast = 128;         // R: the last positions every path is compared at
constexpr int64_t kPrefixChunk = 3001;  // an awkward chunk: neither a power of two nor a divisor of N

// The sequence length: MLA_LONG_CONTEXT_TOKENS, "max" for the family's max_position_embeddings,
// else `fallback`.
int64_t tokens(int64_t fallback, int64_t max_positions) {
  const char* e = std::getenv("MLA_LONG_CONTEXT_TOKENS");
  if (!e || !*e) return fallback;
  if (std::string(e) == "max") return max_positions;
  return std::min(std::stoll(e), (long long)max_positions);
}

json text_config(const std::string& preset) {
  json c = find_preset(preset).config;
  return c.contains("text_config") ? c["text_config"] : c;
}

// A family's config with tiny sizes and one dense layer; rope and context kept as released.
json tiny(json c, int64_t nope, int64_t v) {
  c.update({{"vocab_size", 64},
            {"hidden_size", 64},
            {"intermediate_size", 64},
            {"moe_intermediate_size", 16},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 2},
            {"q_lora_rank", 32},
            {"kv_lora_rank", 32},
            {"qk_nope_head_dim", nope},
            {"v_head_dim", v},
            {"n_routed_experts", 4},
            {"num_experts_per_tok", 2},
            {"n_group", 1},
            {"topk_group", 1},
            {"first_k_dense_replace", 1},
            {"bos_token_id", 0},
            {"eos_token_id", 1}});
  c.erase("quantization_config");
  return c;
}

// The dense families' shapes: DeepSeek-V3 (YaRN factor 40 over 4096; mscale 0.9 against
// mscale_all_dim 0.707 so that cos/sin carry their ratio: the release has both 1), Kimi K2.5
// (YaRN factor 64, rope_theta 50000, 262,144 positions), GLM-4.7-Flash (rope_theta 1e6 without
// scaling, 202,752 positions, qk_nope > v).
json family_config(const std::string& family) {
  if (family == "deepseek-v3") {
    json c = tiny(text_config("deepseek-v3"), 16, 16);
    c["rope_scaling"]["mscale"] = 0.9;
    c["rope_scaling"]["mscale_all_dim"] = 0.707;
    return c;
  }
  if (family == "kimi-k2.5") return tiny(text_config("kimi-k2.5"), 16, 16);
  if (family == "glm-4.7-flash") return tiny(text_config("glm-4.7-flash"), 24, 16);
  if (family == "kimi-k2.5-moe") {
    // Kimi K2.5 with its one layer an MoE (4 routed experts, top 2, one shared), for its INT4
    // experts: moe_intermediate_size 32 so that down_proj's in-features fill a group of 32.
    json c = tiny(text_config("kimi-k2.5"), 16, 16);
    c["first_k_dense_replace"] = 0;
    c["moe_intermediate_size"] = 32;
    return c;
  }
  throw std::invalid_argument(family);
}

// ---- the reference ----

// A compressed-tensors pack-quantized INT4 matrix as double, written out here rather than through
// the loader: eight 4-bit codes per int32, the i-th at bits 4i, offset by 8 (code - 8 in -8..7),
// times the BF16 scale of its group of in-features (cols / the scale's columns: 32 in Kimi K2.5).
std::vector<double> read_int4(const SafetensorsFile& f, const std::string& base) {
  const TensorInfo* packed = f.find(base + ".weight_packed");
  const TensorInfo* scale = f.find(base + ".weight_scale");
  const TensorInfo* shape = f.find(base + ".weight_shape");
  if (!scale || !shape || packed->dtype != DType::I32 || scale->dtype != DType::BF16)
    throw std::runtime_error("reference: INT4 tensors of " + base);
  int32_t rc[2];
  std::memcpy(rc, shape->data, 8);
  const int64_t rows = rc[0], cols = rc[1], group = cols / scale->shape[1];
  std::vector<double> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t word;
      std::memcpy(&word, packed->data + 4 * (r * cols / 8 + c / 8), 4);
      uint16_t s;
      std::memcpy(&s, scale->data + 2 * (r * (cols / group) + c / group), 2);
      const int code = int((word >> (4 * (c % 8))) & 0xF) - 8;
      out[size_t(r * cols + c)] = double(code) * bf16_to_f32(s);
    }
  return out;
}

// A tensor of the checkpoint as double: BF16 / F32, F8_E4M3 times its 128 x 128 block scale_inv,
// or INT4 pack-quantized; under the Kimi K2.5 wrapper's language_model. prefix where it has one.
std::vector<double> read_weight(const SafetensorsFile& f, const std::string& plain_name) {
  const std::string name = f.find("language_model.lm_head.weight") ? "language_model." + plain_name : plain_name;
  if (f.find(name + ".weight_packed")) return read_int4(f, name);
  const TensorInfo* t = f.find(name + ".weight");
  if (!t) t = f.find(name);
  if (!t) throw std::runtime_error("reference: no tensor " + name);
  std::vector<double> out(size_t(t->numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t->dtype == DType::BF16) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    } else if (t->dtype == DType::F32) {
      float x;
      std::memcpy(&x, t->data + 4 * i, 4);
      out[i] = x;
    } else if (t->dtype == DType::F8_E4M3) {
      out[i] = fp8e4m3_to_f32(t->data[i]);
    } else {
      throw std::runtime_error("reference: dtype of " + name);
    }
  }
  if (t->dtype == DType::F8_E4M3) {
    const TensorInfo* s = f.find(name + ".weight_scale_inv");
    const int64_t rows = t->shape[0], cols = t->shape[1], bc = (cols + 127) / 128;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float x;
        std::memcpy(&x, s->data + 4 * ((r / 128) * bc + c / 128), 4);
        out[size_t(r * cols + c)] *= x;
      }
  }
  return out;
}

// y = W x, W [rows, cols].
std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows);
  for (size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (size_t c = 0; c < cols; ++c) s += w[r * cols + c] * x[c];
    y[r] = s;
  }
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// DeepSeek's YaRN (model.py precompute_freqs_cis, yarn_get_mscale) in long double: the inverse
// frequencies, the cos/sin factor mscale(factor, mscale) / mscale(factor, mscale_all_dim) and the
// MLA's softmax scale.
struct YarnRope {
  std::vector<long double> inv_freq;
  long double attention_factor = 1;
  double softmax_scale = 1;

  explicit YarnRope(const ModelConfig& c) {
    const int64_t dim = c.qk_rope_head_dim;
    const long double base = c.rope_theta, pi = 3.141592653589793238462643383279502884L;
    const RopeScaling& rs = c.rope_scaling;
    auto mscale = [](long double f, long double m) { return f <= 1 ? 1.0L : 0.1L * m * std::log(f) + 1.0L; };
    long double low = 0, high = 0;
    if (rs.yarn) {
      auto corr = [&](long double rot) {
        return (long double)(dim) * std::log((long double)(rs.original_max_position_embeddings) / (rot * 2 * pi)) /
               (2 * std::log(base));
      };
      low = std::max(std::floor(corr(rs.beta_fast)), 0.0L);
      high = std::min(std::ceil(corr(rs.beta_slow)), (long double)(dim - 1));
      if (low == high) high += 0.001L;
      attention_factor = mscale(rs.factor, rs.mscale) / mscale(rs.factor, rs.mscale_all_dim);
    }
    for (int64_t i = 0; i < dim / 2; ++i) {
      const long double freq = 1 / std::pow(base, (long double)(2 * i) / (long double)(dim));
      if (!rs.yarn) {
        inv_freq.push_back(freq);
        continue;
      }
      const long double ramp = std::clamp(((long double)(i) - low) / (high - low), 0.0L, 1.0L);
      inv_freq.push_back(freq / (long double)(rs.factor) * ramp + freq * (1 - ramp));
    }
    softmax_scale = 1.0 / std::sqrt(double(c.qk_head_dim()));
    if (rs.yarn && rs.mscale_all_dim != 0)
      softmax_scale *= double(mscale(rs.factor, rs.mscale_all_dim) * mscale(rs.factor, rs.mscale_all_dim));
  }

  // Rotates the 2 * inv_freq.size() values at v for position pos: (even, odd) pairs as the MLA
  // does, or halves (i, i + d/2; NeoX) as DeepSeek's indexer does.
  void rotate(double* v, int64_t pos, bool halves = false) const {
    const size_t half = inv_freq.size();
    for (size_t i = 0; i < half; ++i) {
      const long double a = (long double)(pos) * inv_freq[i];
      const double c = double(std::cos(a) * attention_factor), s = double(std::sin(a) * attention_factor);
      double& x = halves ? v[i] : v[2 * i];
      double& y = halves ? v[i + half] : v[2 * i + 1];
      const double x0 = x, y0 = y;
      x = x0 * c - y0 * s;
      y = x0 * s + y0 * c;
    }
  }
};

// A one-layer MLA model in float64 from its checkpoint: model.py's naive attention, YaRN in long
// double, (even, odd) rope pairs; a dense MLP, or an MoE (first_k_dense_replace 0) with its
// routed experts dequantized here.
class Reference {
 public:
  Reference(const std::string& dir, const std::vector<int32_t>& ids)
      : c_(ModelConfig::load(dir)), ids_(ids), rope_(c_) {
    SafetensorsFile f(dir + "/model.safetensors");
    const std::string a = "model.layers.0.self_attn.";
    embed_ = read_weight(f, "model.embed_tokens");
    norm_ = read_weight(f, "model.norm");
    lm_head_ = read_weight(f, "lm_head");
    in_norm_ = read_weight(f, "model.layers.0.input_layernorm");
    post_norm_ = read_weight(f, "model.layers.0.post_attention_layernorm");
    q_a_ = read_weight(f, a + "q_a_proj");
    q_a_norm_ = read_weight(f, a + "q_a_layernorm");
    q_b_ = read_weight(f, a + "q_b_proj");
    kv_a_ = read_weight(f, a + "kv_a_proj_with_mqa");
    kv_a_norm_ = read_weight(f, a + "kv_a_layernorm");
    kv_b_ = read_weight(f, a + "kv_b_proj");
    o_ = read_weight(f, a + "o_proj");
    const std::string m = "model.layers.0.mlp.";
    moe_ = c_.n_routed_experts > 0 && c_.first_k_dense_replace == 0;
    if (!moe_) {
      dense_ = SwiGlu(f, m);
    } else {
      if (c_.n_group > 1 || c_.scoring_func != ScoringFunc::Sigmoid)
        throw std::runtime_error("reference: sigmoid routing over one expert group only");
      router_ = read_weight(f, m + "gate");
      router_bias_ = read_weight(f, m + "gate.e_score_correction_bias");
      for (int64_t e = 0; e < c_.n_routed_experts; ++e) experts_.emplace_back(f, m + "experts." + std::to_string(e) + ".");
      if (c_.n_shared_experts > 0) shared_ = SwiGlu(f, m + "shared_experts.");
    }
    keys();
  }

  // The logits at position t, [vocab].
  std::vector<double> logits(int64_t t) const {
    const int64_t H = c_.num_attention_heads, nope = c_.qk_nope_head_dim, rope = c_.qk_rope_head_dim,
                  vd = c_.v_head_dim, qk = nope + rope, N = int64_t(ids_.size());
    const std::vector<double> x = embedding(t), h = rmsnorm(x, in_norm_, c_.rms_norm_eps);
    std::vector<double> q = matvec(q_b_, rmsnorm(matvec(q_a_, h), q_a_norm_, c_.rms_norm_eps));
    std::vector<double> attn(size_t(H * vd)), s(size_t(t + 1));
    for (int64_t hd = 0; hd < H; ++hd) {
      double* qh = q.data() + hd * qk;
      rope_.rotate(qh + nope, t);
      double m = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        const double* k = k_nope_.data() + (hd * N + j) * nope;
        const double* kpe = k_pe_.data() + j * rope;
        double d = 0;
        for (int64_t i = 0; i < nope; ++i) d += qh[i] * k[i];
        for (int64_t i = 0; i < rope; ++i) d += qh[nope + i] * kpe[i];
        s[size_t(j)] = d * rope_.softmax_scale;
        m = std::max(m, s[size_t(j)]);
      }
      double z = 0;
      for (int64_t j = 0; j <= t; ++j) z += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
      for (int64_t j = 0; j <= t; ++j) {
        const double p = s[size_t(j)] / z;
        const double* v = v_.data() + (hd * N + j) * vd;
        for (int64_t i = 0; i < vd; ++i) attn[size_t(hd * vd + i)] += p * v[i];
      }
    }
    std::vector<double> x1 = matvec(o_, attn);
    for (size_t i = 0; i < x1.size(); ++i) x1[i] += x[i];
    const std::vector<double> h2 = rmsnorm(x1, post_norm_, c_.rms_norm_eps);
    const std::vector<double> mlp = moe_ ? moe(h2) : dense_(h2);
    for (size_t i = 0; i < x1.size(); ++i) x1[i] += mlp[i];
    return matvec(lm_head_, rmsnorm(x1, norm_, c_.rms_norm_eps));
  }

 private:
  // down(silu(gate x) * up x), the weights dequantized to double.
  struct SwiGlu {
    std::vector<double> gate, up, down;
    SwiGlu() = default;
    SwiGlu(const SafetensorsFile& f, const std::string& p)
        : gate(read_weight(f, p + "gate_proj")), up(read_weight(f, p + "up_proj")), down(read_weight(f, p + "down_proj")) {}
    std::vector<double> operator()(const std::vector<double>& x) const {
      std::vector<double> g = matvec(gate, x);
      const std::vector<double> u = matvec(up, x);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      return matvec(down, g);
    }
  };

  // DeepSeek-V3's MoE (model.py Gate, MoE) with one expert group: sigmoid scores, the top
  // num_experts_per_tok by score + e_score_correction_bias (the lower index first on a tie),
  // weighted by their unbiased scores (normalised with norm_topk_prob) times
  // routed_scaling_factor, plus the shared experts.
  std::vector<double> moe(const std::vector<double>& x) const {
    const std::vector<double> logits = matvec(router_, x);
    std::vector<double> score(logits.size()), choice(logits.size());
    for (size_t e = 0; e < logits.size(); ++e) {
      score[e] = 1 / (1 + std::exp(-logits[e]));
      choice[e] = score[e] + router_bias_[e];
    }
    std::vector<int> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[size_t(a)] > choice[size_t(b)]; });
    order.resize(size_t(c_.num_experts_per_tok));
    double sum = 0;
    for (int e : order) sum += score[size_t(e)];
    std::vector<double> out = c_.n_shared_experts > 0 ? shared_(x) : std::vector<double>(x.size(), 0.0);
    for (int e : order) {
      const double w = (c_.norm_topk_prob ? score[size_t(e)] / sum : score[size_t(e)]) * c_.routed_scaling_factor;
      const std::vector<double> y = experts_[size_t(e)](x);
      for (size_t i = 0; i < out.size(); ++i) out[i] += w * y[i];
    }
    return out;
  }

  std::vector<double> embedding(int64_t t) const {
    const int64_t D = c_.hidden_size;
    return std::vector<double>(embed_.begin() + ids_[size_t(t)] * D, embed_.begin() + (ids_[size_t(t)] + 1) * D);
  }

  // Every position's key and value per head: k_nope = W_UK c_KV, v = W_UV c_KV, k_pe rotated.
  void keys() {
    const int64_t N = int64_t(ids_.size()), H = c_.num_attention_heads, nope = c_.qk_nope_head_dim,
                  rope = c_.qk_rope_head_dim, vd = c_.v_head_dim, kvr = c_.kv_lora_rank;
    k_nope_.resize(size_t(H * N * nope));
    v_.resize(size_t(H * N * vd));
    k_pe_.resize(size_t(N * rope));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < N; ++j) {
      const std::vector<double> kv = matvec(kv_a_, rmsnorm(embedding(j), in_norm_, c_.rms_norm_eps));
      const std::vector<double> ckv =
          rmsnorm(std::vector<double>(kv.begin(), kv.begin() + kvr), kv_a_norm_, c_.rms_norm_eps);
      std::copy(kv.begin() + kvr, kv.end(), k_pe_.begin() + j * rope);
      rope_.rotate(k_pe_.data() + j * rope, j);
      const std::vector<double> kvb = matvec(kv_b_, ckv);  // [H, nope + v]
      for (int64_t h = 0; h < H; ++h) {
        std::copy_n(kvb.begin() + h * (nope + vd), nope, k_nope_.begin() + (h * N + j) * nope);
        std::copy_n(kvb.begin() + h * (nope + vd) + nope, vd, v_.begin() + (h * N + j) * vd);
      }
    }
  }

  ModelConfig c_;
  std::vector<int32_t> ids_;
  std::vector<double> embed_, norm_, lm_head_, in_norm_, post_norm_, q_a_, q_a_norm_, q_b_, kv_a_, kv_a_norm_, kv_b_, o_;
  bool moe_ = false;
  SwiGlu dense_, shared_;
  std::vector<SwiGlu> experts_;
  std::vector<double> router_, router_bias_;
  YarnRope rope_;
  std::vector<double> k_nope_, k_pe_, v_;
};

// ---- the model's paths ----

// A model and a token sequence, with the logits rows of `checked` positions collected per run.
struct LongRun {
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
  std::vector<int64_t> checked;  // sorted: a few early positions, then the last kLast
  int64_t V = 0;

  LongRun(const std::string& dir, int64_t n, uint64_t seed) : model(Model::load(dir)), V(model->config().vocab_size) {
    std::mt19937_64 g(seed);
    for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t(g() % uint64_t(V)));
    for (int64_t p : {int64_t(0), int64_t(1000), int64_t(4095), int64_t(4096), int64_t(4097), int64_t(16384), n / 2})
      if (p < n - kLast && (checked.empty() || p > checked.back())) checked.push_back(p);
    for (int64_t p = std::max<int64_t>(0, n - kLast); p < n; ++p)
      if (checked.empty() || p > checked.back()) checked.push_back(p);
  }
  int64_t n() const { return int64_t(ids.size()); }
  int64_t split() const { return std::max<int64_t>(1, n() - kLast); }  // tokens prefilled before the last ones
  LatentPool pool(KvDType dt) const { return model->make_pool(pages_for_tokens(n(), 64), 64, dt); }

  // Feeds ids [b, e) and copies the checked rows among them into rows.
  void pass(LatentPool& pool, PageTable& seq, int64_t b, int64_t e, const ForwardOptions& fo, std::vector<float>& rows) {
    std::vector<float> out;
    SeqSlice s{&seq, std::span<const int32_t>(ids.data() + b, size_t(e - b))};
    model->forward(std::span<SeqSlice>(&s, 1), pool, fo, out);
    for (size_t k = 0; k < checked.size(); ++k)
      if (checked[k] >= b && checked[k] < e)
        std::copy_n(out.begin() + (checked[k] - b) * V, V, rows.begin() + int64_t(k) * V);
  }
  std::vector<float> empty_rows() const { return std::vector<float>(checked.size() * size_t(V), NAN); }

  static ForwardOptions on(AttnPath p) {
    ForwardOptions fo;
    fo.path = p;
    fo.policy.prefix_chunk = kPrefixChunk;
    return fo;
  }

  // One pass over all tokens on path p.
  std::vector<float> prefill(AttnPath p, KvDType dt = KvDType::F32) {
    auto rows = empty_rows();
    LatentPool pl = pool(dt);
    PageTable seq;
    pass(pl, seq, 0, n(), on(p), rows);
    return rows;
  }

  // The first split() tokens prefilled (the policy's path), the rest as `rest` names:
  // "chunked", "extend" (the policy's choice for the whole rest at once) or "decode".
  struct Continued {
    std::string name;
    std::vector<float> rows;
    AttnPath path;
  };
  std::vector<Continued> continued(const std::vector<std::string>& rest, KvDType dt = KvDType::F32) {
    auto prefix_rows = empty_rows();
    LatentPool pool0 = pool(dt);
    PageTable seq0;
    pass(pool0, seq0, 0, split(), on(AttnPath::Auto), prefix_rows);
    std::vector<Continued> out;
    for (const std::string& r : rest) {
      LatentPool pl = pool0;
      PageTable seq = seq0;
      Continued c{r, prefix_rows, AttnPath::Auto};
      if (r == "decode") {
        for (int64_t t = split(); t < n(); ++t) pass(pl, seq, t, t + 1, on(AttnPath::Absorb), c.rows);
      } else {
        pass(pl, seq, split(), n(), on(r == "chunked" ? AttnPath::Chunked : AttnPath::Auto), c.rows);
      }
      c.path = model->last_path();
      out.push_back(std::move(c));
    }
    return out;
  }
};

struct Diff {
  double max_abs = 0, ref_scale = 0;
};

// Over the checked rows from `from` on (0: all).
Diff diff(const std::vector<float>& rows, const std::vector<std::vector<double>>& ref, size_t from = 0) {
  Diff d;
  const size_t V = ref[0].size();
  for (size_t k = from; k < ref.size(); ++k)
    for (size_t i = 0; i < V; ++i) {
      d.max_abs = std::max(d.max_abs, std::fabs(double(rows[k * V + i]) - ref[k][i]));
      d.ref_scale = std::max(d.ref_scale, std::fabs(ref[k][i]));
    }
  if (rows.size() != ref.size() * V) d.max_abs = INFINITY;
  return d;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// float32 compute over float32 cache against float64: the differences come from float32
// summation over the hidden and latent dimensions (logits about 0.1-0.3 here, errors about 1e-6
// at 1k tokens); 2e-5 leaves room for the longer softmax sums without hiding a wrong angle or a
// wrong key, which move logits by 1e-3 and more.
constexpr double kF32Tolerance = 2e-5;

// Every path of one family at N tokens against the reference, then bf16 and fp8 caches against
// twice their error at 1,024 tokens.
void check_family(const std::string& family, RandomWeights weights = RandomWeights::BF16) {
  const json config = family_config(family);
  const int64_t N = tokens(32768, config["max_position_embeddings"].get<int64_t>());
  test::TempDir dir("long-" + family);
  RandomCheckpointOptions opt;
  opt.weights = weights;
  opt.seed = 7;
  write_random_checkpoint(dir.str(), config, opt);

  auto reference_of = [&](const LongRun& run) {
    Reference ref(dir.str(), run.ids);
    std::vector<std::vector<double>> rows(run.checked.size());
#pragma omp parallel for schedule(dynamic)
    for (size_t k = 0; k < run.checked.size(); ++k) rows[k] = ref.logits(run.checked[k]);
    return rows;
  };

  auto t0 = std::chrono::steady_clock::now();
  LongRun run(dir.str(), N, 11);
  const auto ref = reference_of(run);
  std::printf("%s, %lld tokens: reference %.1f s\n", family.c_str(), (long long)N, seconds_since(t0));
  auto report = [&](const std::string& what, const std::vector<float>& rows, double tol, size_t from = 0) {
    const Diff d = diff(rows, ref, from);
    std::printf("  %-28s max |logit - reference| %.2e (logits up to %.2f)\n", what.c_str(), d.max_abs, d.ref_scale);
    EXPECT_LE(d.max_abs, tol) << family << " " << N << " tokens, " << what;
    return d.max_abs;
  };

  if (weights == RandomWeights::BF16) {
    t0 = std::chrono::steady_clock::now();
    report("prefill expand", run.prefill(AttnPath::Expand), kF32Tolerance);
    EXPECT_EQ(run.model->last_path(), AttnPath::Expand);
    report("prefill absorb", run.prefill(AttnPath::Absorb), kF32Tolerance);
    EXPECT_EQ(run.model->last_path(), AttnPath::Absorb);
    for (auto& c : run.continued({"chunked", "extend", "decode"}))
      report(c.name + " (" + attn_path_name(c.path) + ")", c.rows, kF32Tolerance);
    std::printf("  paths %.1f s\n", seconds_since(t0));
  } else {
    // Quantized weights (block FP8, INT4 experts): the reference dequantizes them itself
    // (read_weight); the extend and decode paths read them at length.
    for (auto& c : run.continued({"extend", "decode"}))
      report(c.name + " (" + attn_path_name(c.path) + ")", c.rows, kF32Tolerance);
    return;
  }

  // Compressed caches: the bound is the error of the same case at 1,024 tokens, doubled (the
  // rounding of a cached value does not grow with the number of keys a query averages over).
  // Both are taken over the last kLast rows only, the ones read from the compressed cache at
  // each length (the early checked rows are the same positions in both runs).
  t0 = std::chrono::steady_clock::now();
  LongRun short_run(dir.str(), std::min<int64_t>(1024, N), 11);
  const auto short_ref = reference_of(short_run);
  auto last_of = [](const LongRun& r) { return r.checked.size() - size_t(std::min<int64_t>(kLast, r.n() - 1)); };
  for (auto [dt, name] : {std::pair{KvDType::BF16, "bf16"}, std::pair{KvDType::FP8, "fp8"}}) {
    const double at_short =
        diff(short_run.continued({"extend"}, dt)[0].rows, short_ref, last_of(short_run)).max_abs;
    std::printf("  %s cache at 1024 tokens, last %lld rows: %.2e\n", name, (long long)kLast, at_short);
    ASSERT_GT(at_short, 0.0) << name << ": a compressed cache should differ from float64 at all";
    for (auto& c : run.continued({"extend", "decode"}, dt))
      report(std::string(name) + " cache, " + c.name + ", last rows", c.rows, 2 * at_short, last_of(run));
  }
  std::printf("  caches %.1f s\n", seconds_since(t0));
}

TEST(LongContext, DeepSeekV3YarnEveryPath) { check_family("deepseek-v3"); }
TEST(LongContext, KimiK25YarnEveryPath) { check_family("kimi-k2.5"); }
TEST(LongContext, Glm47FlashEveryPath) { check_family("glm-4.7-flash"); }
TEST(LongContext, DeepSeekV3BlockFp8Weights) { check_family("deepseek-v3", RandomWeights::FP8); }
TEST(LongContext, KimiK25Int4Experts) { check_family("kimi-k2.5-moe", RandomWeights::INT4_EXPERTS); }

// ---- DeepSeek Sparse Attention ----

// A DSA fixture's config with one layer, the release's YaRN (V3.2) and context, and a top-k of
// 512: sparse from the 513th token on.
json dsa_config(const std::string& fixture, int64_t max_positions) {
  std::ifstream in(test::source_dir() / "tests/fixtures" / fixture / "config.json");
  json c = json::parse(in);
  c.erase("quantization_config");
  c["num_hidden_layers"] = 1;
  c["max_position_embeddings"] = max_positions;
  c["index_topk"] = 512;
  if (c.contains("indexer_types")) c["indexer_types"] = {"full"};
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) c["rope_scaling"] = text_config("deepseek-v3")["rope_scaling"];
  return c;
}

// The lightning indexer of a one-layer DSA checkpoint (model/indexer.h) in float64, from the
// checkpoint's tensors, written apart from model/indexer.cpp:
//   x = RMSNorm(embedding) (layer 0's normed input), qr = q_a_layernorm(q_a_proj(x)),
//   q[h] = wq_b(qr)[h], k = LayerNorm(wk(x)) (weight, bias, eps 1e-6),
//   RoPE on the FIRST qk_rope_head_dim values of q[h] and k with the MLA's YaRN frequencies
//   (YarnRope), in halves (NeoX) unless indexer_rope_interleave,
//   w[h] = weights_proj(x)[h] * n_heads^-0.5 * head_dim^-0.5,
//   I[t, s] = sum_h w[t, h] relu(q[t, h] . k[s]) over s <= t.
// The Hadamard rotation of q and k is left out: the Walsh-Hadamard matrix scaled head_dim^-0.5 is
// orthogonal, so q . k, and every score, is the same exactly (the model applies it, and rounds).
class IndexReference {
 public:
  IndexReference(const std::string& dir, const std::vector<int32_t>& ids)
      : c_(ModelConfig::load(dir)), ids_(ids), rope_(c_), Hi_(c_.index_n_heads), D_(c_.index_head_dim) {
    SafetensorsFile f(dir + "/model.safetensors");
    const std::string a = "model.layers.0.self_attn.", ix = a + "indexer.";
    embed_ = read_weight(f, "model.embed_tokens");
    in_norm_ = read_weight(f, "model.layers.0.input_layernorm");
    q_a_ = read_weight(f, a + "q_a_proj");
    q_a_norm_ = read_weight(f, a + "q_a_layernorm");
    wq_b_ = read_weight(f, ix + "wq_b");
    wk_ = read_weight(f, ix + "wk");
    k_norm_ = read_weight(f, ix + "k_norm.weight");
    k_bias_ = read_weight(f, ix + "k_norm.bias");
    weights_proj_ = read_weight(f, ix + "weights_proj");
    const int64_t N = int64_t(ids_.size());
    k_.resize(size_t(N * D_));
    std::vector<double> k_norms(static_cast<size_t>(N));
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < N; ++s) {
      std::vector<double> k = matvec(wk_, normed_input(s));
      double mu = 0, var = 0;
      for (double v : k) mu += v;
      mu /= double(D_);
      for (double v : k) var += (v - mu) * (v - mu);
      var /= double(D_);
      for (int64_t i = 0; i < D_; ++i) k[size_t(i)] = (k[size_t(i)] - mu) / std::sqrt(var + 1e-6) * k_norm_[size_t(i)] + k_bias_[size_t(i)];
      rotate(k.data(), s);
      double n2 = 0;
      for (double v : k) n2 += v * v;
      k_norms[size_t(s)] = std::sqrt(n2);
      std::copy(k.begin(), k.end(), k_.begin() + s * D_);
    }
    max_k_norm_ = *std::max_element(k_norms.begin(), k_norms.end());
  }

  int64_t topk() const { return c_.index_topk; }

  // I[t, s] for s = 0..t, and in *scale sum_h |w[t, h]| |q[t, h]| max_s |k[s]| (the max over the
  // whole sequence): by Cauchy-Schwarz a
  // bound on every |I[t, s]|, and the size float32 rounding of the terms is relative to.
  std::vector<double> scores(int64_t t, double* scale) const {
    const std::vector<double> x = normed_input(t);
    std::vector<double> q = matvec(wq_b_, rmsnorm(matvec(q_a_, x), q_a_norm_, c_.rms_norm_eps));
    std::vector<double> w = matvec(weights_proj_, x);
    *scale = 0;
    for (int64_t h = 0; h < Hi_; ++h) {
      double* qh = q.data() + h * D_;
      rotate(qh, t);
      w[size_t(h)] /= std::sqrt(double(Hi_)) * std::sqrt(double(D_));
      double n2 = 0;
      for (int64_t i = 0; i < D_; ++i) n2 += qh[i] * qh[i];
      *scale += std::fabs(w[size_t(h)]) * std::sqrt(n2) * max_k_norm_;
    }
    std::vector<double> out(size_t(t + 1));
    for (int64_t s = 0; s <= t; ++s) {
      const double* k = k_.data() + s * D_;
      double sum = 0;
      for (int64_t h = 0; h < Hi_; ++h) {
        const double* qh = q.data() + h * D_;
        double d = 0;
        for (int64_t i = 0; i < D_; ++i) d += qh[i] * k[i];
        sum += w[size_t(h)] * std::max(d, 0.0);
      }
      out[size_t(s)] = sum;
    }
    return out;
  }

 private:
  std::vector<double> normed_input(int64_t t) const {
    const int64_t H = c_.hidden_size, id = ids_[size_t(t)];
    return rmsnorm(std::vector<double>(embed_.begin() + id * H, embed_.begin() + (id + 1) * H), in_norm_, c_.rms_norm_eps);
  }
  void rotate(double* v, int64_t pos) const { rope_.rotate(v, pos, !c_.indexer_rope_interleave); }

  ModelConfig c_;
  std::vector<int32_t> ids_;
  YarnRope rope_;
  int64_t Hi_, D_;
  std::vector<double> embed_, in_norm_, q_a_, q_a_norm_, wq_b_, wk_, k_norm_, k_bias_, weights_proj_;
  std::vector<double> k_;  // [N, D]: every position's key, rotated
  double max_k_norm_ = 0;
};

// How far the model's float32 selection may stray from the float64 reference's: a position may
// be in one and not the other only where its reference score is within kIndexTieTolerance x scale
// (IndexReference::scores) of the k-th largest. If the model's scores are within e of the
// reference's, a swap of positions a (in the reference's top-k) and b (not) needs I[b] + e >=
// I[a] - e, so both lie within 2e of the k-th score. The model's scores (Indexer::project, then
// cpu::index_scores on the pool's float32 keys; float32 rounding through the norms, the
// projections of 64 and 48 terms, the LayerNorm, RoPE, the Hadamard's 5 butterfly levels, the
// 32-term dots and the 8-head sum) were measured within 1.2e-7 x scale of this reference at
// 8,192 tokens for both fixtures, so 2e is about 2.4e-7; 1e-6 leaves room for other summation
// orders (SIMD widths, thread splits). It stays below the spacing of neighbouring scores near
// the k-th (about 5e-6 x scale at 8,192 tokens), so a swap a few ranks deep fails, and a wrong
// rope pairing, frequency, norm or scale, which moves scores by a fair fraction of the scale,
// fails by far.
constexpr double kIndexTieTolerance = 1e-6;

struct SelectionStats {
  int64_t queries = 0, selected = 0, common = 0, swaps = 0;
  int64_t near_ties = 0;  // positions besides the k-th within the tolerance of its score (could swap)
  double worst = 0;  // the largest |score - k-th score| / scale over the symmetric differences
};

// Compares the model's selection of query t (count positions at sel) with the reference's top-k.
void compare_selection(const IndexReference& ref, int64_t t, const int32_t* sel, int64_t count, SelectionStats& st) {
  const int64_t K = std::min(ref.topk(), t + 1);
  ASSERT_EQ(count, K) << "query " << t;
  double scale = 0;
  const std::vector<double> sc = ref.scores(t, &scale);
  std::vector<int32_t> order(sc.size());
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + (K - 1), order.end(),
                   [&](int32_t a, int32_t b) { return sc[size_t(a)] > sc[size_t(b)] || (sc[size_t(a)] == sc[size_t(b)] && a < b); });
  const double kth = sc[size_t(order[size_t(K - 1)])];
  std::vector<char> in_ref(sc.size(), 0), in_model(sc.size(), 0);
  for (int64_t i = 0; i < K; ++i) in_ref[size_t(order[size_t(i)])] = 1;
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(sel[i] >= 0 && sel[i] <= t) << "query " << t << " selects position " << sel[i];
    in_model[size_t(sel[i])] = 1;
  }
  st.queries++;
  st.selected += K;
  int64_t beyond = 0;  // positions of the symmetric difference farther than the tolerance from the k-th
  size_t worst_pos = 0;
  double worst = 0;
  for (size_t s = 0; s < sc.size(); ++s) {
    if (int32_t(s) != order[size_t(K - 1)] && std::fabs(sc[s] - kth) <= kIndexTieTolerance * scale) st.near_ties++;
    if (in_ref[s] && in_model[s]) st.common++;
    if (in_ref[s] == in_model[s]) continue;
    st.swaps += in_model[s];  // both sets hold K: each extra position of the model's swaps out one of the reference's
    const double off = std::fabs(sc[s] - kth) / scale;
    beyond += off > kIndexTieTolerance;
    if (off > worst) worst = off, worst_pos = s;
  }
  st.worst = std::max(st.worst, worst);
  EXPECT_EQ(beyond, 0) << "query " << t << ": " << beyond << " positions selected by one side only beyond the tolerance;"
                       << " the worst, " << worst_pos << (in_model[worst_pos] ? " (the model's)" : " (the reference's)")
                       << ", scores " << sc[worst_pos] << " against the k-th " << kth << " (scale " << scale << ")";
}

void check_sparse(const std::string& fixture, int64_t max_positions) {
  const json config = dsa_config(fixture, max_positions);
  const int64_t N = tokens(8192, max_positions);
  test::TempDir dir("long-dsa");
  RandomCheckpointOptions opt;
  opt.seed = 5;
  write_random_checkpoint(dir.str(), config, opt);
  auto t0 = std::chrono::steady_clock::now();
  LongRun run(dir.str(), N, 13);
  // The reference: the same prefix, then the last tokens with every query against its top-k in
  // float64 (one layer: the prefix's latents and index keys do not depend on the path).
  // The indexer's selections of those passes (the prefix's and the last tokens') are compared with
  // IndexReference at the checked positions.
  std::vector<float> ref_rows = run.empty_rows();
  std::vector<std::vector<TokenSelection>> prefix_sel, last_sel;
  {
    LatentPool pl = run.pool(KvDType::F32);
    PageTable seq;
    ForwardOptions fo = LongRun::on(AttnPath::Auto);
    ForwardCapture capture;
    ScopedObserver watch(*run.model, &capture);
    run.pass(pl, seq, 0, run.split(), fo, ref_rows);
    prefix_sel = capture.selections;
    fo.reference_attention = true;
    run.pass(pl, seq, run.split(), run.n(), fo, ref_rows);
    last_sel = capture.selections;
  }
  EXPECT_GT(run.model->dsa_counters().selections, 0) << "the indexer should select at " << N << " tokens";
  {
    const auto t1 = std::chrono::steady_clock::now();
    const IndexReference index_ref(dir.str(), run.ids);
    const int64_t K = index_ref.topk();
    ASSERT_EQ(prefix_sel.size(), 1u);
    ASSERT_EQ(last_sel.size(), 1u);
    std::vector<int64_t> queries;
    for (int64_t t : run.checked)
      if (t >= K) queries.push_back(t);
    std::vector<SelectionStats> per(queries.size());
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < queries.size(); ++i) {
      const int64_t t = queries[i];
      const bool last = t >= run.split();
      const TokenSelection& s = (last ? last_sel : prefix_sel)[0][0];
      const int64_t row = last ? t - run.split() : t;
      if (size_t(row) >= s.count.size()) {  // the pass attended densely: no selection was made
        ADD_FAILURE() << "no selection captured for query " << t;
        continue;
      }
      compare_selection(index_ref, t, s.pos.data() + row * K, s.count[size_t(row)], per[i]);
    }
    SelectionStats st;
    for (const SelectionStats& p : per) {
      st.queries += p.queries, st.selected += p.selected, st.common += p.common, st.swaps += p.swaps;
      st.near_ties += p.near_ties;
      st.worst = std::max(st.worst, p.worst);
    }
    EXPECT_EQ(st.queries, int64_t(queries.size()));
    std::printf("  indexer top-%lld against float64, %lld queries: recall %.6f (%lld of %lld), %lld swaps"
                " (worst |score - k-th| %.1e x scale; %lld positions within the tolerance of a k-th) (%.1f s)\n",
                (long long)K, (long long)st.queries, double(st.common) / double(st.selected), (long long)st.common,
                (long long)st.selected, (long long)st.swaps, st.worst, (long long)st.near_ties, seconds_since(t1));
  }
  std::vector<std::vector<double>> ref;
  const size_t first_last = run.checked.size() - size_t(std::min<int64_t>(kLast, N - 1));
  auto last_rows = [&](const std::vector<float>& rows) {
    return std::vector<float>(rows.begin() + int64_t(first_last) * run.V, rows.end());
  };
  for (size_t k = first_last; k < run.checked.size(); ++k)
    ref.emplace_back(ref_rows.begin() + int64_t(k) * run.V, ref_rows.begin() + int64_t(k + 1) * run.V);
  auto report = [&](const std::string& what, const std::vector<float>& rows) {
    const Diff d = diff(last_rows(rows), ref);
    std::printf("  %-28s max |logit - reference| %.2e (logits up to %.2f)\n", what.c_str(), d.max_abs, d.ref_scale);
    EXPECT_LE(d.max_abs, kF32Tolerance) << fixture << " " << N << " tokens, " << what;
  };
  report("prefill expand", run.prefill(AttnPath::Expand));
  report("prefill absorb", run.prefill(AttnPath::Absorb));
  for (auto& c : run.continued({"chunked", "extend", "decode"})) report(c.name + " (" + attn_path_name(c.path) + ")", c.rows);
  std::printf("%s sparse, %lld tokens: %.1f s\n", fixture.c_str(), (long long)N, seconds_since(t0));
}

TEST(LongContext, SparseDeepSeekV32EveryPath) { check_sparse("deepseek-v3.2-tiny", 163840); }
TEST(LongContext, SparseGlm5EveryPath) { check_sparse("glm-5-tiny", 202752); }

}  // namespace
}  // namespace mla
