// The expand-vs-absorb equivalence experiment (`mla verify`): runs, error statistics, cache
// byte accounting, and the report as JSON or a readable table.
#include "tools/verify.h"

#include "backend/cpu/context.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>

namespace mla {

using nlohmann::json;

ErrorStats compare_outputs(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    throw std::invalid_argument("compare_outputs: " + std::to_string(a.size()) + " values against " +
                                std::to_string(b.size()));
  ErrorStats s;
  s.count = int64_t(a.size());
  if (a.empty()) return s;
  std::vector<double> err(a.size());
  double sum = 0;
  int64_t equal = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double e = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(e)) e = INFINITY;  // a NaN on either side is as far apart as it gets
    err[i] = e;
    sum += e;
    equal += a[i] == b[i];
    s.max_abs = std::max(s.max_abs, e);
  }
  s.mean_abs = sum / double(a.size());
  s.frac_equal = double(equal) / double(a.size());
  // p99: the smallest error that at least 99% of the values are at or below.
  size_t k = size_t(std::ceil(0.99 * double(a.size()))) - 1;
  std::nth_element(err.begin(), err.begin() + ptrdiff_t(k), err.end());
  s.p99_abs = err[k];
  return s;
}

namespace {

struct PathRun {
  std::vector<float> logits;               // [rows, vocab]
  std::vector<std::vector<float>> attn;    // per layer, [rows, hidden]
  CacheBytes cache;
};

int32_t argmax(const float* x, int64_t n) { return int32_t(std::max_element(x, x + n) - x); }

// Prefill `prompt` then feed `decoded` one token at a time (when `generate`, each fed token is
// first chosen greedily from the previous row and appended to `decoded`, K of them).
PathRun run_path(Model& model, const std::vector<int32_t>& prompt, std::vector<int32_t>& decoded, bool generate,
                 int64_t K, AttnPath path, KvDType dtype, int64_t page_size, const cpu::Context& ctx,
                 bool reference = false) {
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size, L = c.num_hidden_layers, n = int64_t(prompt.size()), total = n + K;
  LatentPool pool = model.make_pool(pages_for_tokens(total, page_size), page_size, dtype);
  PageTable seq;
  PathRun r;
  r.attn.resize(size_t(L));
  std::vector<float> out;
  ForwardCapture capture;
  const std::vector<std::vector<float>>& attn = capture.attention_outputs;
  ScopedObserver watch(model, &capture);
  ForwardOptions fo;
  fo.path = path;
  fo.reference_attention = reference;
  fo.context = &ctx;
  auto step = [&](std::span<const int32_t> ids) {
    SeqSlice s{&seq, ids};
    model.forward(std::span<SeqSlice>(&s, 1), pool, fo, out);
    r.logits.insert(r.logits.end(), out.begin(), out.end());
    for (int64_t l = 0; l < L; ++l) r.attn[size_t(l)].insert(r.attn[size_t(l)].end(), attn[size_t(l)].begin(), attn[size_t(l)].end());
  };
  step(prompt);
  for (int64_t k = 0; k < K; ++k) {
    if (generate) decoded.push_back(argmax(r.logits.data() + (n + k - 1) * V, V));
    step(std::span<const int32_t>(&decoded[size_t(k)], 1));
  }
  // Cache bytes: the latent rows the pool holds for these tokens, against the expanded K/V
  // (H (nope + rope) keys and H v values per token and layer) in the same element width.
  CacheBytes& cb = r.cache;
  cb.active_tokens = seq.length;
  cb.page_size = pool.page_size();
  cb.pages_used = int64_t(seq.pages.size());
  cb.bytes_per_token = pool.bytes_per_token();
  cb.bytes_per_page = pool.bytes_per_page();
  cb.latent_active = cb.active_tokens * cb.bytes_per_token;
  cb.latent_allocated = cb.pages_used * cb.bytes_per_page;
  cb.expanded_elem_bytes = dtype == KvDType::F32 ? 4 : dtype == KvDType::BF16 ? 2 : 1;
  const int64_t expanded_per_token = expanded_bytes_per_token(CacheShape::of(c), cb.expanded_elem_bytes);
  cb.expanded_active = cb.active_tokens * expanded_per_token;
  cb.expanded_allocated = cb.pages_used * cb.page_size * expanded_per_token;
  return r;
}

json stats_json(const ErrorStats& s) {
  return {{"count", s.count}, {"max_abs", s.max_abs}, {"mean_abs", s.mean_abs}, {"p99_abs", s.p99_abs},
          {"frac_equal", s.frac_equal}};
}

std::string ids_str(const std::vector<int32_t>& ids, size_t limit = 16) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < limit; ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  if (ids.size() > limit) s += ",... (" + std::to_string(ids.size()) + ")";
  return s;
}

}  // namespace

VerifyReport verify_paths(Model& model, const VerifyOptions& opt, const std::string& model_name) {
  if (opt.ids.empty()) throw std::invalid_argument("verify: no prompt token ids");
  if (opt.decode_steps < 0) throw std::invalid_argument("verify: decode steps must be >= 0");
  if (opt.page_size <= 0) throw std::invalid_argument("verify: page size must be positive");
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size;
  VerifyReport rep;
  rep.model = model_name;
  rep.num_layers = c.num_hidden_layers;
  rep.prompt = opt.ids;
  rep.page_size = opt.page_size;
  const int64_t K = opt.decode_steps;

  std::vector<float> f32_absorb_logits;
  std::map<KvDType, std::vector<float>> reference_logits;  // per cache dtype
  struct ModeSpec {
    const char* name;
    KvDType dtype;
    bool fast;
  };
  for (const ModeSpec& spec : {ModeSpec{"f32", KvDType::F32, false}, ModeSpec{"bf16 cache", KvDType::BF16, false},
                               ModeSpec{"fast", KvDType::BF16, true}, ModeSpec{"fp8 cache", KvDType::FP8, false},
                               ModeSpec{"fast fp8", KvDType::FP8, true}}) {
    // The f32 expand run is the first one: it chooses the decoded tokens all runs are fed.
    const bool generate = rep.decoded.empty() && K > 0;
    PathRun ex, ab;
    cpu::Context ctx = model.context(), precise = model.context();  // its threads, this mode's precision
    ctx.precision = spec.fast ? cpu::Precision::Fast : cpu::Precision::Precise;
    precise.precision = cpu::Precision::Precise;
    ex = run_path(model, rep.prompt, rep.decoded, generate, K, AttnPath::Expand, spec.dtype, opt.page_size, ctx);
    ab = run_path(model, rep.prompt, rep.decoded, false, K, AttnPath::Absorb, spec.dtype, opt.page_size, ctx);
    if (!reference_logits.count(spec.dtype))
      reference_logits[spec.dtype] = run_path(model, rep.prompt, rep.decoded, false, K, AttnPath::Absorb, spec.dtype,
                                              opt.page_size, precise, true)
                                         .logits;
    const std::vector<float>& ref = reference_logits[spec.dtype];
    VerifyMode m;
    m.kv_dtype = spec.dtype;
    m.fast = spec.fast;
    m.name = spec.name;
    m.cache = ab.cache;
    m.logits = compare_outputs(ex.logits, ab.logits);
    for (size_t l = 0; l < ex.attn.size(); ++l) m.attn.push_back(compare_outputs(ex.attn[l], ab.attn[l]));
    m.rows = int64_t(ex.logits.size()) / V;
    for (int64_t i = 0; i < m.rows; ++i)
      m.argmax_agree += argmax(ex.logits.data() + i * V, V) == argmax(ab.logits.data() + i * V, V);
    if (spec.dtype == KvDType::F32 && !spec.fast) {
      f32_absorb_logits = ab.logits;
    } else {
      m.absorb_vs_f32 = compare_outputs(ab.logits, f32_absorb_logits);
      for (int64_t i = 0; i < m.rows; ++i)
        m.argmax_agree_f32 += argmax(ab.logits.data() + i * V, V) == argmax(f32_absorb_logits.data() + i * V, V);
    }
    m.expand_vs_reference = compare_outputs(ex.logits, ref);
    m.absorb_vs_reference = compare_outputs(ab.logits, ref);
    for (int64_t i = 0; i < m.rows; ++i)
      m.argmax_agree_reference += argmax(ab.logits.data() + i * V, V) == argmax(ref.data() + i * V, V);
    rep.modes.push_back(std::move(m));
  }
  return rep;
}

VerifyMode compare_paths(Model& model, const std::vector<int32_t>& prompt, KvDType dtype, bool fast,
                         int64_t page_size) {
  if (prompt.empty()) throw std::invalid_argument("compare_paths: no prompt token ids");
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> none;
  cpu::Context ctx = model.context(), precise = model.context();
  ctx.precision = fast ? cpu::Precision::Fast : cpu::Precision::Precise;
  precise.precision = cpu::Precision::Precise;
  const PathRun ex = run_path(model, prompt, none, false, 0, AttnPath::Expand, dtype, page_size, ctx);
  const PathRun ab = run_path(model, prompt, none, false, 0, AttnPath::Absorb, dtype, page_size, ctx);
  const PathRun ref = run_path(model, prompt, none, false, 0, AttnPath::Absorb, dtype, page_size, precise, true);
  VerifyMode m;
  m.name = std::string(fast ? "fast" : "f32 compute") + ", " + kv_dtype_name(dtype) + " cache";
  m.kv_dtype = dtype;
  m.fast = fast;
  m.cache = ab.cache;
  m.logits = compare_outputs(ex.logits, ab.logits);
  for (size_t l = 0; l < ex.attn.size(); ++l) m.attn.push_back(compare_outputs(ex.attn[l], ab.attn[l]));
  m.rows = int64_t(ex.logits.size()) / V;
  for (int64_t i = 0; i < m.rows; ++i) {
    m.argmax_agree += argmax(ex.logits.data() + i * V, V) == argmax(ab.logits.data() + i * V, V);
    m.argmax_agree_reference += argmax(ab.logits.data() + i * V, V) == argmax(ref.logits.data() + i * V, V);
  }
  m.expand_vs_reference = compare_outputs(ex.logits, ref.logits);
  m.absorb_vs_reference = compare_outputs(ab.logits, ref.logits);
  return m;
}

json verify_json(const VerifyReport& r) {
  json modes = json::array();
  for (auto& m : r.modes) {
    const CacheBytes& cb = m.cache;
    json attn = json::array();
    for (auto& s : m.attn) attn.push_back(stats_json(s));
    json jm = {
        {"name", m.name},
        {"kv_dtype", kv_dtype_name(m.kv_dtype)},
        {"compute", m.fast ? "fast" : "f32"},
        {"cache",
         {{"active_tokens", cb.active_tokens},
          {"page_size", cb.page_size},
          {"pages_used", cb.pages_used},
          {"bytes_per_token", cb.bytes_per_token},
          {"bytes_per_page", cb.bytes_per_page},
          {"latent_bytes_active", cb.latent_active},
          {"latent_bytes_allocated", cb.latent_allocated},
          {"expanded_bytes_active", cb.expanded_active},
          {"expanded_bytes_allocated", cb.expanded_allocated},
          {"expanded_elem_bytes", cb.expanded_elem_bytes}}},
        {"logits", stats_json(m.logits)},
        {"attn", attn},
        {"rows", m.rows},
        {"argmax_agree", m.argmax_agree},
    };
    if (m.kv_dtype != KvDType::F32 || m.fast) {
      jm["absorb_logits_vs_f32"] = stats_json(m.absorb_vs_f32);
      jm["absorb_argmax_agree_with_f32"] = m.argmax_agree_f32;
    }
    jm["reference"] = std::string("f32 compute, naive attention in double over the same ") + kv_dtype_name(m.kv_dtype) +
                      " cache";
    jm["expand_logits_vs_reference"] = stats_json(m.expand_vs_reference);
    jm["absorb_logits_vs_reference"] = stats_json(m.absorb_vs_reference);
    jm["absorb_argmax_agree_with_reference"] = m.argmax_agree_reference;
    modes.push_back(jm);
  }
  return {{"model", r.model},     {"num_layers", r.num_layers}, {"prompt", r.prompt},
          {"decoded", r.decoded}, {"page_size", r.page_size},   {"modes", modes}};
}

std::string verify_text(const VerifyReport& r) {
  std::ostringstream o;
  char line[320];
  o << "mla verify " << r.model << ": " << r.prompt.size() << " prompt tokens [" << ids_str(r.prompt) << "], "
    << r.decoded.size() << " decode steps [" << ids_str(r.decoded) << "] (greedy, from the f32 expand run)\n";
  o << "Modes: \"f32\" computes in float32 on a float32 latent cache; \"bf16 cache\" stores the cache in bf16;\n"
       "\"fast\" also rounds activations to bf16 inside the matrix products (the default of mla run and serve);\n"
       "\"fp8 cache\" and \"fast fp8\" store c_KV as e4m3 with a float32 scale per 128 values (k_pe bf16).\n\n";

  o << "Cache bytes, all " << r.num_layers << " layers\n";
  std::snprintf(line, sizeof line, "  %-11s %7s %10s %11s %6s %14s %14s %16s %16s %8s\n", "mode", "tokens", "B/token",
                "B/page", "pages", "latent active", "latent alloc", "expanded active", "expanded alloc", "exp/lat");
  o << line;
  for (auto& m : r.modes) {
    const CacheBytes& cb = m.cache;
    std::snprintf(line, sizeof line, "  %-11s %7lld %10lld %11lld %6lld %14lld %14lld %16lld %16lld %7.1fx\n",
                  m.name.c_str(), (long long)cb.active_tokens, (long long)cb.bytes_per_token,
                  (long long)cb.bytes_per_page, (long long)cb.pages_used, (long long)cb.latent_active,
                  (long long)cb.latent_allocated, (long long)cb.expanded_active, (long long)cb.expanded_allocated,
                  cb.latent_active ? double(cb.expanded_active) / double(cb.latent_active) : 0.0);
    o << line;
  }
  o << "  (expanded: H (qk_nope + qk_rope) keys and H v_head values per token and layer, in the mode's width;\n"
       "   page size " << r.page_size << " tokens)\n\n";

  o << "Expand vs absorb, |expand - absorb|\n";
  std::snprintf(line, sizeof line, "  %-11s %-14s %9s %12s %12s %12s %9s\n", "mode", "output", "values", "max", "mean",
                "p99", "equal");
  o << line;
  auto row = [&](const std::string& mode, const std::string& what, const ErrorStats& s) {
    std::snprintf(line, sizeof line, "  %-11s %-14s %9lld %12.3e %12.3e %12.3e %8.2f%%\n", mode.c_str(), what.c_str(),
                  (long long)s.count, s.max_abs, s.mean_abs, s.p99_abs, 100 * s.frac_equal);
    o << line;
  };
  for (auto& m : r.modes) {
    row(m.name, "logits", m.logits);
    for (size_t l = 0; l < m.attn.size(); ++l) row(m.name, "attn layer " + std::to_string(l), m.attn[l]);
  }
  o << "\n";
  for (auto& m : r.modes) {
    std::snprintf(line, sizeof line, "  %-11s argmax agrees on %lld of %lld logits rows\n", m.name.c_str(),
                  (long long)m.argmax_agree, (long long)m.rows);
    o << line;
  }
  o << "\nAgainst the reference of each mode's cache: float32 compute, the naive attention in double reading the\n"
       "same cache pages (c_KV quantized exactly as the mode's), |path - reference| of the logits\n";
  std::snprintf(line, sizeof line, "  %-11s %12s %12s %12s %12s %14s\n", "mode", "expand max", "expand mean",
                "absorb max", "absorb mean", "absorb argmax");
  o << line;
  for (auto& m : r.modes) {
    std::snprintf(line, sizeof line, "  %-11s %12.3e %12.3e %12.3e %12.3e %7lld of %lld\n", m.name.c_str(),
                  m.expand_vs_reference.max_abs, m.expand_vs_reference.mean_abs, m.absorb_vs_reference.max_abs,
                  m.absorb_vs_reference.mean_abs, (long long)m.argmax_agree_reference, (long long)m.rows);
    o << line;
  }
  o << "\n";
  for (auto& m : r.modes)
    if (m.kv_dtype != KvDType::F32 || m.fast) {
      std::snprintf(line, sizeof line,
                    "  %-11s absorb logits against the f32 mode's: max %.3e, mean %.3e, p99 %.3e; argmax agrees on %lld "
                    "of %lld rows\n",
                    m.name.c_str(), m.absorb_vs_f32.max_abs, m.absorb_vs_f32.mean_abs, m.absorb_vs_f32.p99_abs,
                    (long long)m.argmax_agree_f32, (long long)m.rows);
      o << line;
    }
  return o.str();
}

}  // namespace mla
