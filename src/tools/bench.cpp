// The CPU benchmark behind `mla bench` (see bench.h).
#include "tools/bench.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>

#include "backend/cpu/compute_peak.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/index_score.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/precision.h"
#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/weight_memory.h"
#include "engine/engine.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"
#include "tools/checkpoint_writer.h"
#include "model/model.h"
#include "kv/latent_pool.h"
#include "model/indexer.h"
#include "model/presets.h"
#include "parallel/comm.h"

namespace mla::bench {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A field of /proc/self/status in bytes ("VmRSS", "RssAnon", "RssFile").
size_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return size_t(std::stoull(line.substr(field.size() + 1))) * 1024;
  return 0;
}

double view_bytes(const MatrixView& m) { return double(m.bytes() + m.scale_bytes()); }
double view_params(const MatrixView& m) { return double(m.rows) * double(m.cols); }

// The first routed expert of a layer that this process holds (expert-parallel, the others are
// empty views); null when it holds none, or for a dense layer.
const Mlp* first_held_expert(const LayerWeights& L) {
  for (const Mlp& e : L.experts)
    if (e.gate.data) return &e;
  return nullptr;
}

// The routed experts' bytes this process holds, every layer's and the MTP module's.
double held_routed_bytes(const ModelWeights& w) {
  double n = 0;
  auto layer = [&](const LayerWeights& L) {
    for (const Mlp& e : L.experts)
      for (const MatrixView* m : {&e.gate, &e.up, &e.down})
        if (m->data) n += view_bytes(*m);
  };
  for (const auto& L : w.layers) layer(L);
  for (const auto& M : w.mtp) layer(M.layer);
  return n;
}

// Whether the routed experts this process holds are INT4 / INT8 groups (the prompt's VNNI path).
bool held_int_experts(const ModelWeights& w) {
  for (const auto& L : w.layers)
    if (const Mlp* e = first_held_expert(L)) return is_int_group(e->gate.format);
  return false;
}

// Faults in every page of a weight view so timed runs do not pay for first touches.
uint64_t touch(const MatrixView& m) {
  uint64_t s = 0;
  const volatile uint8_t* p = static_cast<const uint8_t*>(m.data);
  for (size_t i = 0; i < m.bytes(); i += 4096) s += p[i];
  if (m.scales) {
    const volatile uint8_t* q = static_cast<const uint8_t*>(m.scales);
    for (size_t i = 0; i < m.scale_bytes(); i += 4096) s += q[i];
  }
  return s;
}

uint64_t touch_all(const ModelWeights& w) {
  uint64_t s = touch(w.embed) + touch(w.lm_head);
  for (const auto& L : w.layers) {
    for (const MatrixView* m : {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.kv_b, &L.o, &L.router})
      if (m->data) s += touch(*m);
    for (const auto& m : L.w_uk_t) s += touch(m);
    auto mlp = [&](const Mlp& p) {
      if (p.gate.data) s += touch(p.gate) + touch(p.up) + touch(p.down);
    };
    mlp(L.dense);
    mlp(L.shared);
    for (const auto& e : L.experts) mlp(e);
  }
  return s;
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  return buf;
}

// Milliseconds per pass in each part of a profile, the parts that took any time.
std::vector<std::pair<std::string, double>> per_pass_ms(const ForwardProfile& p, double passes) {
  std::vector<std::pair<std::string, double>> out;
  if (passes <= 0) return out;
  for (int i = 0; i < ForwardProfile::kParts; ++i)
    if (p.seconds[i] > 0) out.push_back({ForwardProfile::name(i), p.seconds[i] * 1e3 / passes});
  return out;
}

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

// Adds the 64-byte lines of [p, p + n) to four accumulators (loads of whole lines only: a span's
// last partial line, at most 63 bytes, is left out), touching each page two pages ahead as the
// decode GEMVs do (stream_prefetch.h): the fastest plain read measured, so that the limit is one.
inline void read_lines(const uint8_t* p, size_t n, __m512& a0, __m512& a1, __m512& a2, __m512& a3) {
  const uint8_t* const end = p + n / 64 * 64;
  for (; p + 256 <= end; p += 256) {
    cpu::touch_page_ahead<256>(p);
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(reinterpret_cast<const float*>(p)));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 64)));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 128)));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 192)));
  }
  for (; p < end; p += 64) a0 = _mm512_add_ps(a0, _mm512_loadu_ps(reinterpret_cast<const float*>(p)));
}

// Every weight one decoded token reads but its routed experts and its embedding row, with the
// part of the model it belongs to: f(part, view) for each view that holds data.
// The same for one decoder layer.
template <class F>
void each_fixed_layer_weight(const LayerWeights& L, F&& f) {
  auto visit = [&](const char* part, const MatrixView& m) {
    if (m.data) f(part, m);
  };
  auto mlp = [&](const char* part, const Mlp& p) {
    for (const MatrixView* m : {&p.gate, &p.up, &p.down}) visit(part, *m);
  };
  for (const MatrixView* m : {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.kv_b, &L.o}) visit("attention", *m);
  if (L.moe) {
    visit("router", L.router);
    if (L.has_shared) mlp("shared experts", L.shared);
  } else {
    mlp("dense mlp", L.dense);
  }
}

template <class F>
void each_fixed_weight(const ModelWeights& w, F&& f) {
  for (const auto& L : w.layers) each_fixed_layer_weight(L, f);
  if (w.lm_head.data) f("lm_head", w.lm_head);
}

// The MTP module beside the benchmark's checkpoint: the decoder layer `layers` of the same
// config one layer longer (random, seed 2), eh_proj (random) and enorm / hnorm /
// shared_head.norm (ones), written to mtp.safetensors and added to the index and to config.json
// (num_nextn_predict_layers 1). The main layers' files are not touched. Every weight format: the
// int4 checkpoint is a kimi_k25 wrapper, so there the names carry its "language_model." prefix,
// the count goes into text_config, and eh_proj (bf16 here) joins the INT4 ignore list, which
// would otherwise ask for it packed as an nn.Linear outside the listed exceptions.
// `cfg`: the main checkpoint's config with num_hidden_layers layers + 1.
void add_mtp_module(const std::string& dir, int64_t layers, const nlohmann::json& cfg, RandomWeights kind) {
  RandomCheckpointOptions ro;
  ro.weights = kind;
  ro.seed = 2;
  const std::string pre = std::string(kind == RandomWeights::INT4_EXPERTS ? "language_model." : "") + "model.layers." +
                          std::to_string(layers) + ".";
  std::vector<TensorSpec> mine;
  for (auto& t : random_tensors(cfg, ro))
    if (t.name.compare(0, pre.size(), pre) == 0) mine.push_back(std::move(t));
  const int64_t D = cfg["hidden_size"].get<int64_t>();
  auto ones = [](std::string name, int64_t n) {
    return TensorSpec{std::move(name), DType::BF16, {n}, [n](uint8_t* out) {
                        for (int64_t i = 0; i < n; ++i) {
                          const uint16_t one = f32_to_bf16(1.0f);
                          std::memcpy(out + 2 * i, &one, 2);
                        }
                      }};
  };
  for (const char* norm : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"}) mine.push_back(ones(pre + norm, D));
  mine.push_back(TensorSpec{pre + "eh_proj.weight", DType::BF16, {D, 2 * D}, [D](uint8_t* out) {
                              std::mt19937 rng(3);
                              std::normal_distribution<float> nd(0.0f, 0.02f);
                              for (int64_t i = 0; i < D * 2 * D; ++i) {
                                const uint16_t v = f32_to_bf16(nd(rng));
                                std::memcpy(out + 2 * i, &v, 2);
                              }
                            }});
  std::sort(mine.begin(), mine.end(), [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  std::vector<const TensorSpec*> ptrs;
  for (auto& t : mine) ptrs.push_back(&t);
  write_safetensors(dir + "/mtp.safetensors", ptrs);
  const std::string index = dir + "/model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    nlohmann::json idx;
    std::ifstream(index) >> idx;
    for (auto& t : mine) idx["weight_map"][t.name] = "mtp.safetensors";
    std::ofstream(index) << idx.dump(2) << "\n";
  }
  nlohmann::json c;
  std::ifstream(dir + "/config.json") >> c;
  if (c.contains("text_config")) {  // the kimi_k25 wrapper of the int4 checkpoint
    c["text_config"]["num_nextn_predict_layers"] = 1;
    if (c.contains("quantization_config") && c["quantization_config"].contains("ignore"))
      c["quantization_config"]["ignore"].push_back("re:.*eh_proj.*");
  } else {
    c["num_nextn_predict_layers"] = 1;
  }
  std::ofstream(dir + "/config.json") << c.dump(2) << "\n";
}

// Fills `seq` with `S` random cached tokens in every layer of the pool: latent rows and indexer
// keys of unit scale (normed c_KV, rotated k_pe, normed and rotated keys). Rows differ by one
// fresh value each, so filling 64k tokens draws no more than it writes.
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

}  // namespace

ReadLoop::ReadLoop(size_t bytes, int threads) {
  bytes_ = std::max<size_t>(bytes / 4096 * 4096, 4096);
  mem_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem_ == MAP_FAILED) throw std::runtime_error("read loop: cannot map " + std::to_string(bytes_) + " bytes");
  madvise(mem_, bytes_, MADV_HUGEPAGE);  // best effort
  threads_ = cpu::threads_or_default(threads);
  per_ = bytes_ / size_t(threads_) / 256 * 256;
  // First touch by the thread that reads it; then huge pages asked for where faults got none.
#pragma omp parallel num_threads(threads_)
  std::memset(static_cast<uint8_t*>(mem_) + per_ * size_t(omp_get_thread_num()), 1, per_);
  madvise(mem_, bytes_, 25 /* MADV_COLLAPSE, Linux 6.1 */);
}

ReadLoop::~ReadLoop() { munmap(mem_, bytes_); }

double ReadLoop::measure(int passes) {
  double best = 0;
  for (int r = 0; r < std::max(1, passes); ++r) {
    auto t0 = Clock::now();
    float total = 0;
#pragma omp parallel num_threads(threads_) reduction(+ : total)
    {
      const uint8_t* b = static_cast<const uint8_t*>(mem_) + per_ * size_t(omp_get_thread_num());
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      read_lines(b, per_, a0, a1, a2, a3);
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
      total += lanes[0];
    }
    best = std::max(best, double(per_) * threads_ / seconds_since(t0) / 1e9);
    sink_ += total;
  }
  return best;
}

TokenRead::TokenRead(const ModelWeights& w, const ModelConfig& c, uint32_t seed, int threads)
    : w_(w), experts_per_token_(c.num_experts_per_tok), rng_state_(seed), threads_(cpu::threads_or_default(threads)) {
  each_fixed_weight(w, [&](const char*, const MatrixView& m) { add(fixed_, m); });
}

void TokenRead::add(std::vector<Span>& to, const MatrixView& m) {
  to.push_back({static_cast<const uint8_t*>(m.data), m.bytes()});
  if (m.scales) to.push_back({static_cast<const uint8_t*>(m.scales), m.scale_bytes()});
}

void TokenRead::draw() {
  std::mt19937 rng(rng_state_++);
  spans_ = fixed_;
  for (const auto& L : w_.layers) {
    if (!L.moe || L.experts.empty()) continue;
    std::vector<int64_t> order(L.experts.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t k = 0; k < std::min<int64_t>(experts_per_token_, int64_t(order.size())); ++k) {
      const Mlp& e = L.experts[size_t(order[size_t(k)])];
      if (!e.gate.data) continue;  // expert-parallel: another rank's expert
      for (const MatrixView* m : {&e.gate, &e.up, &e.down}) add(spans_, *m);
    }
  }
  const int64_t row = int64_t(rng() % uint32_t(std::max<int64_t>(1, w_.embed.rows)));
  spans_.push_back({static_cast<const uint8_t*>(w_.embed.data) + size_t(row) * w_.embed.row_bytes(), w_.embed.row_bytes()});
  bytes_ = 0;
  for (const Span& s : spans_) bytes_ += double(s.n);
}

double TokenRead::measure(int passes) {
  double best = 0;
  for (int r = 0; r < std::max(1, passes); ++r) {
    draw();
    const auto& spans = spans_;
    const double total = bytes_;
    auto t0 = Clock::now();
    float sum = 0;
    // Each thread reads an equal share of the spans laid end to end.
#pragma omp parallel num_threads(threads_) reduction(+ : sum)
    {
      const int nt = omp_get_num_threads(), me = omp_get_thread_num();
      const double lo = total * me / nt, hi = total * (me + 1) / nt;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      double at = 0;
      for (const Span& s : spans) {
        const double s0 = std::max(lo, at), s1 = std::min(hi, at + double(s.n));
        if (s1 > s0) read_lines(s.p + size_t(s0 - at), size_t(s1 - s0), a0, a1, a2, a3);
        at += double(s.n);
      }
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
      sum += lanes[0];
    }
    best = std::max(best, total / seconds_since(t0) / 1e9);
    sink_ += sum;
  }
  return best;
}

double read_bandwidth_gbps(size_t bytes, int runs, int threads) {
  ReadLoop loop(bytes, threads);
  return loop.measure(runs);
}

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

ActiveWeights active_weights(const ModelWeights& w, const ModelConfig& c) {
  ActiveWeights a;
  auto add = [&](const std::string& part, const MatrixView& m, double times = 1) {
    a.bytes += times * view_bytes(m);
    a.params += times * view_params(m);
    a.bytes_by_part[part] += times * view_bytes(m);
    a.params_by_part[part] += times * view_params(m);
  };
  each_fixed_weight(w, [&](const char* part, const MatrixView& m) { add(part, m); });
  // The routed experts at one held expert's size (expert-parallel: this rank's first).
  for (const auto& L : w.layers)
    if (const Mlp* e = L.moe ? first_held_expert(L) : nullptr)
      for (const MatrixView* m : {&e->gate, &e->up, &e->down})
        if (m->data) add("routed experts", *m, double(c.num_experts_per_tok));
  a.bytes += double(w.embed.row_bytes());
  a.params += double(w.embed.cols);
  a.bytes_by_part["embedding row"] += double(w.embed.row_bytes());
  a.params_by_part["embedding row"] += double(w.embed.cols);
  return a;
}

double prompt_flops(const ActiveWeights& a, const ModelConfig& c, int64_t T) {
  double per_token = 0;
  for (auto& [part, params] : a.params_by_part)
    if (part != "lm_head" && part != "embedding row") per_token += params;
  const double lm = a.params_by_part.count("lm_head") ? a.params_by_part.at("lm_head") : 0;
  const double pairs = double(T) * double(T + 1) / 2;
  const double attn = 2 * pairs * double(c.num_attention_heads) * double(c.qk_head_dim() + c.v_head_dim) *
                      double(c.num_hidden_layers);
  return 2 * per_token * double(T) + 2 * lm + attn;
}

GemmProbe::GemmProbe(int64_t n, const cpu::Context& ctx) : n_(n), ctx_(ctx), a_(size_t(n * n)), b_(size_t(n * n)), c_(size_t(n * n)) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : a_) v = f32_to_bf16(u(rng));
  for (auto& v : b_) v = f32_to_bf16(u(rng));
}

double GemmProbe::measure(int passes) {
  double best = 0;
  for (int p = 0; p <= passes; ++p) {  // pass 0 creates the primitive and warms up
    auto t = Clock::now();
    cpu::gemm_bf16_nt(ctx_, a_.data(), n_, n_, b_.data(), n_, n_, n_, c_.data(), n_);
    const double s = seconds_since(t);
    if (p > 0) best = std::max(best, 2.0 * double(n_) * double(n_) * double(n_) / s / 1e9);
  }
  return best;
}

// One routed expert's bytes (gate, up, down) in a layer; 0 for a dense layer (or a layer of
// which this rank holds no expert).
double expert_bytes(const LayerWeights& L) {
  const Mlp* e = L.moe ? first_held_expert(L) : nullptr;
  if (!e) return 0;
  return view_bytes(e->gate) + view_bytes(e->up) + view_bytes(e->down);
}

// Where a speculative step's time goes (Report::spec_costs), batch 1, k draft tokens: passes of
// the three kinds in turn (spec_tokens / 4 of each per run, at least 4, after a warm-up run),
// each profiled by part. A plain pass decodes one sequence; the verify pass runs the 1 + k rows
// of another as the engine does (one-token kernels, absorbed attention, logits of every row, the
// final hidden rows) and keeps one row, as a step whose drafts were all wrong; the draft runs
// the MTP module on the row the verify pass kept (the catch-up), then chains k - 1 more and takes
// them out of the MTP cache, as MtpDrafts does. Bytes: each pass's weights with the routed
// experts at the count it read.
SpecCosts measure_spec_costs(Model& model, const Options& opt, const ActiveWeights& active,
                             const std::function<std::vector<int32_t>(int64_t)>& ids) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const int64_t k = opt.draft_tokens, passes = std::max<int64_t>(opt.spec_tokens / 4, 4), D = c.hidden_size;
  const int64_t total = opt.context + (opt.runs + 1) * passes + k + 1;
  LatentPool pool = model.make_pool(2 * (pages_for_tokens(total, 64) + 1), 64);
  // Without an MTP module only the plain and verify passes are measured (draft.ms stays 0).
  const bool with_draft = model.has_mtp();
  std::optional<LatentPool> mtp_store;
  if (with_draft) mtp_store.emplace(model.make_mtp_pool(pages_for_tokens(total, 64) + 1, 64));
  // Two sequences of the same prompt: one decoded plainly, one speculatively.
  PageTable plain, spec, mtp_seq;
  int64_t mtp_first = -1;  // the position of the MTP cache's row 0
  std::vector<float> logits, hidden, mtp_hidden, h;
  auto prompt = ids(opt.context);
  ForwardOptions fo;
  fo.last_logits_only = true;
  for (PageTable* t : {&plain, &spec}) {
    SeqSlice s{t, prompt};
    model.forward(std::span<SeqSlice>(&s, 1), pool, fo, logits);
  }
  cpu::Context one = model.context();
  one.one_token_kernels = true;
  ForwardOptions vo;
  vo.context = &one;
  vo.path = AttnPath::Absorb;
  const std::vector<int64_t> last{k + 1};
  vo.logits_last = last;
  vo.final_hidden = &hidden;
  ForwardProfile pp, pv, pd;
  for (int r = 0; r <= opt.runs; ++r)
    for (int64_t i = 0; i < passes; ++i) {
      auto tok = ids(1);
      SeqSlice d{&plain, tok};
      model.set_profile(r > 0 ? &pp : nullptr);
      model.forward(std::span<SeqSlice>(&d, 1), pool, fo, logits);
      const int64_t pos = spec.length;
      auto rows = ids(k + 1);
      SeqSlice v{&spec, rows};
      model.set_profile(r > 0 ? &pv : nullptr);
      model.forward(std::span<SeqSlice>(&v, 1), pool, vo, logits);
      model.set_profile(nullptr);
      pool.truncate(spec, pos + 1);  // every draft rejected: the last token's row stays
      if (!with_draft) continue;
      LatentPool& mtp_pool = *mtp_store;
      if (mtp_first < 0) mtp_first = pos;
      auto next = ids(1);
      MtpSlice m{&mtp_seq, next, hidden.data(), pos};
      model.set_profile(r > 0 ? &pd : nullptr);
      model.mtp_forward(std::span<const MtpSlice>(&m, 1), mtp_pool, true, logits, &mtp_hidden);
      for (int64_t j = 1; j < k; ++j) {
        auto t = ids(1);
        h.assign(mtp_hidden.end() - D, mtp_hidden.end());
        MtpSlice chain{&mtp_seq, t, h.data(), mtp_first + mtp_seq.length};
        model.mtp_forward(std::span<const MtpSlice>(&chain, 1), mtp_pool, true, logits, &mtp_hidden);
      }
      model.set_profile(nullptr);
      mtp_pool.truncate(mtp_seq, pos + 1 - mtp_first);  // the chained rows out again
    }
  // Bytes. Routed experts: the main layers' at the measured count per MoE layer, the module's
  // likewise; the embedding rows of the pass's tokens.
  double routed = 0, expert = 0;
  int64_t moe_layers = 0;
  for (const auto& L : w.layers)
    if (expert_bytes(L) > 0) expert = expert_bytes(L), ++moe_layers;
  if (active.bytes_by_part.count("routed experts")) routed = active.bytes_by_part.at("routed experts");
  // per: module passes per step (the draft's k).
  auto fill = [&](PassCost& pc, const ForwardProfile& p, int64_t per) {
    pc.parts_ms = per_pass_ms(p, double(p.passes) / double(per));
    for (auto& [part, ms] : pc.parts_ms) pc.ms += ms;
    pc.experts_per_layer = p.moe_layers ? double(p.routed_experts) / double(p.moe_layers) : 0;
  };
  SpecCosts sc;
  fill(sc.plain, pp, 1);
  fill(sc.verify, pv, 1);
  fill(sc.draft, pd, k);
  const double embed_row = double(w.embed.row_bytes());
  sc.plain.bytes = active.bytes - routed + double(moe_layers) * sc.plain.experts_per_layer * expert;
  sc.verify.bytes = sc.plain.bytes - double(moe_layers) * sc.plain.experts_per_layer * expert +
                    double(moe_layers) * sc.verify.experts_per_layer * expert + double(k) * embed_row;
  if (model.has_mtp()) {
    const MtpWeights& M = w.mtp[0];
    double layer = 0;
    each_fixed_layer_weight(M.layer, [&](const char*, const MatrixView& m) { layer += view_bytes(m); });
    const double per_pass = layer + view_bytes(M.eh_proj) + sc.draft.experts_per_layer * expert_bytes(M.layer) +
                            view_bytes(model.mtp_draft_head()) + embed_row;
    sc.draft.bytes = double(k) * per_pass;
    sc.draft_head = weight_format_name(model.mtp_draft_head().format);
  }
  return sc;
}

// The ranks of the job as the benchmark uses them (one process: a world of one rank).
class Ranks {
 public:
  bool lead() const { return comm_.rank() == 0; }  // writes the checkpoint, probes, reports
  bool many() const { return comm_.size() > 1; }
  parallel::Comm& comm() { return comm_; }
  // Before each timed run: every rank has arrived (rank 0 from its probes) before any starts.
  void sync() {
    if (many()) comm_.barrier();
  }

 private:
  parallel::Comm& comm_ = parallel::world();
};

// Adds one timed run to a CombineShare: the combine counters before and after it, its seconds.
void add_combine(CombineShare& to, const parallel::CombineCounters& before, const parallel::CombineCounters& after,
                 double seconds) {
  to.bytes += after.bytes_received - before.bytes_received;
  to.seconds += after.seconds - before.seconds;
  to.step_seconds += seconds;
}

// The sums of `n` steps or prompts as the figures of one.
CombineShare per_one(CombineShare c, double n) {
  if (n > 0) c.bytes /= n, c.seconds /= n, c.step_seconds /= n;
  return c;
}

// The depth rows (Options::depths, Options::depth_batches). At each depth and batch size B, B
// sequences of `depth` random cached rows each (fill_random_cache: the timed work does not
// depend on the rows' values, and filling 32k tokens this way takes a moment where a prefill
// would take minutes); then per run (B = 1) a prompt of prompt_tokens and a decode run of
// decode_tokens steps of B tokens, one per sequence, each taken out of the cache again, so every
// run starts at the same depth. Run 0 warms up. The decode runs are profiled by part: the
// attention's share of a step, beside the cache bytes a step attends over.
void measure_depths(Model& model, const Options& opt, Report& rep, Ranks& ranks,
                    const std::function<std::vector<int32_t>(int64_t)>& ids,
                    const std::function<void(const std::string&)>& say) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(5);
  ForwardOptions fo;
  fo.last_logits_only = true;
  std::vector<float> logits;
  for (int64_t d : opt.depths)
    for (int64_t B : opt.depth_batches) {
      say("depth " + std::to_string(d) + (B > 1 ? ", batch " + std::to_string(B) : "") + " ...");
      const bool prompt = opt.prompt_tokens > 0 && B == 1;
      const int64_t extra = std::max<int64_t>({prompt ? opt.prompt_tokens : 0, opt.decode_tokens, 1});
      LatentPool pool = model.make_pool(B * pages_for_tokens(d + extra, 64) + 1, 64);
      rep.kv_dtype = kv_dtype_name(pool.dtype());
      rep.attention_kernels = MlaAttention::kernel_names(model.context(), c, pool.dtype());
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
          ranks.sync();
          auto ptoks = ids(opt.prompt_tokens);
          SeqSlice s{&seqs[0], ptoks};
          const auto t = Clock::now();
          model.forward(std::span<SeqSlice>(&s, 1), pool, fo, logits);
          const double sec = seconds_since(t);
          pool.truncate(seqs[0], d);
          if (r > 0) ptps.push_back(double(opt.prompt_tokens) / sec);
        }
        if (opt.decode_tokens > 0) {
          ranks.sync();
          const parallel::CombineCounters c0 = model.combine_counters();
          model.set_profile(r > 0 ? &prof : nullptr);
          const auto t = Clock::now();
          for (int64_t i = 0; i < opt.decode_tokens; ++i) {
            for (size_t b = 0; b < size_t(B); ++b) {
              toks[b] = ids(1);
              batch[b] = {&seqs[b], toks[b]};
            }
            model.forward(batch, pool, fo, logits);
          }
          const double sec = seconds_since(t);
          model.set_profile(nullptr);
          for (PageTable& seq : seqs) pool.truncate(seq, d);
          if (r > 0) {
            dtps.push_back(double(B * opt.decode_tokens) / sec), decode_seconds += sec;
            add_combine(combine, c0, model.combine_counters(), sec);
          }
        }
      }
      row.prompt_tps = summarize(ptps);
      row.decode_tps = summarize(dtps);
      if (opt.decode_tokens > 0) {
        const double steps = double(opt.runs) * double(opt.decode_tokens);
        row.step_ms = decode_seconds * 1e3 / steps;
        row.attention_ms = prof.seconds[ForwardProfile::Attention] * 1e3 / steps;
        row.attn_proj_ms = (prof.seconds[ForwardProfile::AttnProj] + prof.seconds[ForwardProfile::OProj]) * 1e3 / steps;
        row.combine_ms = combine.seconds * 1e3 / steps;
        row.decode_parts_ms = per_pass_ms(prof, double(prof.passes));
        // Step i (0-based) attends over d + i + 1 rows per sequence, its own included: d + (n + 1) / 2
        // on average.
        row.latent_bytes = double(B) * double(pool.bytes_per_token()) * (double(d) + double(opt.decode_tokens + 1) / 2);
      }
      rep.depth_rows.push_back(row);
      char buf[160];
      std::snprintf(buf, sizeof buf, "  prompt %.1f tokens/s, decode %.2f tokens/s", row.prompt_tps.median,
                    row.decode_tps.median);
      say(buf);
    }
}

// Expert-parallel: every rank's RankFigures gathered on every rank (all must call it).
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

Report run(const Options& opt) {
  Report rep;
  rep.weights = opt.weights;
  rep.precision = opt.precision;
  rep.prompt_tokens = opt.prompt_tokens;
  rep.context = opt.context;
  rep.bandwidth_bytes = opt.bandwidth_bytes;
  RandomWeights kind;
  if (opt.weights == "bf16") kind = RandomWeights::BF16;
  else if (opt.weights == "fp8") kind = RandomWeights::FP8;
  else if (opt.weights == "int4") kind = RandomWeights::INT4_EXPERTS;
  else if (opt.weights == "int4-fp8") kind = RandomWeights::INT4_FP8;
  else if (opt.weights == "int8") kind = RandomWeights::INT8;
  else throw std::invalid_argument("--weights: unknown '" + opt.weights + "' (bf16, fp8, int4, int4-fp8, int8)");
  if (opt.layers < 2) throw std::invalid_argument("--layers must be at least 2 (a dense layer, then MoE)");
  if (opt.runs < 1) throw std::invalid_argument("--runs must be at least 1");
  for (int64_t d : opt.depths)
    if (d < 0) throw std::invalid_argument("--depth: a depth is a count of tokens, not " + std::to_string(d));
  if (!opt.depths.empty() && opt.prompt_tokens <= 0 && opt.decode_tokens <= 0)
    throw std::invalid_argument("--depth needs --prompt-tokens or --decode-tokens above 0");
  for (int64_t b : opt.depth_batches)
    if (b < 1) throw std::invalid_argument("--depth-batches: a batch holds at least one sequence, not " + std::to_string(b));
  Ranks ranks;
  rep.ranks = ranks.comm().size();
  const bool quiet = opt.quiet || !ranks.lead();  // rank 0 speaks for the job
  auto say = [&](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "%s\n", s.c_str());
  };
  cpu::Context ctx;
  ctx.threads = std::max(0, opt.threads);
  if (opt.huge_pages == "auto") ctx.weights = cpu::WeightPlacement::Auto;
  else if (opt.huge_pages == "on") ctx.weights = cpu::WeightPlacement::HugePages;
  else if (opt.huge_pages == "off") ctx.weights = cpu::WeightPlacement::Mapped;
  else throw std::invalid_argument("--huge-pages: unknown '" + opt.huge_pages + "' (auto, on, off)");
  ctx.precision = cpu::parse_precision(opt.precision);
  ctx.amx = opt.amx;
  ctx.vector_gemm = opt.vector_gemm;
  ctx.int8_activations = opt.int8_activations;
  ctx.repack_weights = opt.repack;
  rep.threads = ctx.num_threads();

  rep.own_model = !opt.model.empty();
  if (rep.own_model) {
    if (!opt.dir.empty() || !opt.checkpoint_config.is_null())
      throw std::invalid_argument("--model measures a checkpoint as it is: --dir and --config describe the random one");
    if (!std::filesystem::exists(opt.model + "/config.json"))
      throw std::invalid_argument("--model " + opt.model + ": no config.json there");
    rep.dir = opt.model;
    rep.shape = "the checkpoint's own shape";
  } else {
    rep.dir = opt.dir.empty() ? (std::filesystem::temp_directory_path() /
                                 ("mla-bench-v2lite-" + std::to_string(opt.layers) + "L-" + opt.weights))
                                    .string()
                              : opt.dir;
    const std::string stamp = rep.dir + "/mla-bench.json";
    // The checkpoint's config at n layers: the benchmark's own unless the caller gave one.
    auto checkpoint_config = [&](int64_t n) {
      if (opt.checkpoint_config.is_null()) return bench_checkpoint_config(n);
      nlohmann::json c = opt.checkpoint_config;
      c["num_hidden_layers"] = n;
      return c;
    };
    const nlohmann::json want = {{"config", opt.checkpoint_config.is_null() ? nlohmann::json("v2_lite") : opt.checkpoint_config},
                                 {"layers", opt.layers}, {"weights", opt.weights}, {"seed", 1}};
    if (!opt.checkpoint_config.is_null()) {
      const ModelConfig given = ModelConfig::from_json(checkpoint_config(opt.layers), "the benchmark's checkpoint config");
      char buf[160];
      std::snprintf(buf, sizeof buf, "the given config's shape (hidden %lld, %lld routed experts, top-%lld)",
                    (long long)given.hidden_size, (long long)given.n_routed_experts, (long long)given.num_experts_per_tok);
      rep.shape = buf;
    }
    auto holds_ours = [&] {
      if (!std::filesystem::exists(rep.dir + "/config.json")) return false;
      nlohmann::json have;
      if (std::ifstream f(stamp); f) f >> have;
      if (have != want)
        throw std::runtime_error(rep.dir + " holds a checkpoint that is not the benchmark's " + want.dump() +
                                 " (mla-bench.json says " + have.dump() + "); choose another --dir");
      return true;
    };
    // Under mpirun rank 0 writes a missing checkpoint and the others wait for it here: the
    // ranks' collectives wait without a timeout until the model is loaded.
    if (ranks.lead()) {
      if (holds_ours()) {
        say("reusing the checkpoint in " + rep.dir);
      } else {
        say("writing a random " + opt.weights + " checkpoint of " + rep.shape + " with " + std::to_string(opt.layers) +
            " layers to " + rep.dir + " ...");
        auto t0 = Clock::now();
        RandomCheckpointOptions ro;
        ro.weights = kind;
        ro.seed = 1;
        ro.shards = 4;
        ro.progress = !quiet;
        write_random_checkpoint(rep.dir, checkpoint_config(opt.layers), ro);
        std::ofstream(stamp) << want.dump() << "\n";
        rep.write_seconds = seconds_since(t0);
      }
      if (!std::filesystem::exists(rep.dir + "/mtp.safetensors")) {
        say("adding an MTP module (mtp.safetensors) ...");
        add_mtp_module(rep.dir, opt.layers, checkpoint_config(opt.layers + 1), kind);
      }
    }
    ranks.sync();
    if (!ranks.lead() && (!holds_ours() || !std::filesystem::exists(rep.dir + "/mtp.safetensors")))
      throw std::runtime_error("no benchmark checkpoint in " + rep.dir + " on this rank's host: rank 0 writes it on its own; "
                               "give --dir a folder every host shares, or write it on each host first (mla bench --dir "
                               "... without mpirun)");
  }
  auto t0 = Clock::now();
  auto model = Model::load(rep.dir, ctx, false, opt.quantize, /*with_mtp=*/true);
  volatile uint64_t sink = touch_all(model->weights());
  (void)sink;
  rep.load_seconds = seconds_since(t0);
  const ModelConfig& c = model->config();
  rep.active = active_weights(model->weights(), c);
  rep.bytes_by_format = model->weights().bytes_by_format;
  for (auto& [fmt, n] : rep.bytes_by_format) rep.weight_bytes += double(n);
  rep.routed_bytes = held_routed_bytes(model->weights());
  rep.decode_read_bytes = rep.active.bytes;
  RankFigures mine;
  mine.experts = model->local_experts();
  mine.weight_bytes = rep.weight_bytes;
  mine.routed_bytes = rep.routed_bytes;
  // The rank's figures to rank 0's report (every rank calls this once, at the end).
  auto gather = [&] {
    if (ranks.many()) rep.rank_rows = gather_rank_figures(ranks, mine);
  };

  if (rep.own_model) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s (%lld layers, hidden %lld, %lld routed experts, top-%lld)", c.model_type.c_str(),
                  (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.n_routed_experts,
                  (long long)c.num_experts_per_tok);
    rep.shape = buf;
  }

  // The ids every section feeds: random, or consecutive tokens of --text (wrapping at its end).
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab_size - 1));
  std::vector<int32_t> text;
  size_t text_at = 0;
  if (!opt.text.empty()) {
    std::ifstream f(opt.text, std::ios::binary);
    if (!f) throw std::invalid_argument("--text " + opt.text + ": cannot read it");
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    text = Tokenizer::load(rep.dir).encode(s, false);
    for (int32_t t : text)
      if (t < 0 || t >= c.vocab_size)
        throw std::invalid_argument("--text: token " + std::to_string(t) + " is outside the model's vocabulary of " +
                                    std::to_string(c.vocab_size) + ": the tokenizer is not the model's");
    if (text.size() < 2) throw std::invalid_argument("--text " + opt.text + ": fewer than 2 tokens");
    rep.text = opt.text + " (" + std::to_string(text.size()) + " tokens)";
  }
  auto ids = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) {
      if (text.empty()) {
        x = tok(rng);
      } else {
        x = text[text_at];
        text_at = (text_at + 1) % text.size();
      }
    }
    return v;
  };
  std::vector<float> logits;
  ForwardOptions fo;
  fo.last_logits_only = true;

  // Resident memory and the weights' arena, read once the runs are done.
  auto memory_figures = [&] {
    rep.rss_bytes = status_bytes("VmRSS");
    rep.rss_anon_bytes = status_bytes("RssAnon");
    rep.rss_file_bytes = status_bytes("RssFile");
    rep.peak_rss_bytes = status_bytes("VmHWM");
    if (model->weights().arena) {
      rep.arena_bytes = model->weights().arena->bytes();
      rep.arena_huge_bytes = model->weights().arena->huge_bytes();
    }
  };
  rep.decode_tokens = opt.decode_tokens;
  rep.runs = opt.runs;
  if (!opt.depths.empty()) {  // the depth rows instead of every other section
    measure_depths(*model, opt, rep, ranks, ids, say);
    memory_figures();
    gather();
    if (ranks.lead()) {
      say("read bandwidth ...");
      rep.bandwidth_gbps = read_bandwidth_gbps(opt.bandwidth_bytes, opt.runs, ctx.threads);
    }
    return rep;
  }

  std::optional<ReadLoop> loop;  // the probes run on rank 0 (see bench.h)
  if (ranks.lead()) loop.emplace(opt.bandwidth_bytes, ctx.threads);

  // Decode, batch 1: a short prompt, then runs of decode_tokens single-token steps.
  if (opt.decode_tokens > 0) {
    say("decode (batch 1) ...");
    if (opt.context < 1) throw std::invalid_argument("--context must be at least 1");
    // The runs below, then as many again beside the engine's.
    const int64_t total = opt.context + 2 * (opt.runs + 1) * opt.decode_tokens;
    LatentPool pool = model->make_pool(pages_for_tokens(total, 64) + 1, 64);
    PageTable seq;
    auto prompt = ids(opt.context);
    SeqSlice s{&seq, prompt};
    model->forward(std::span<SeqSlice>(&s, 1), pool, fo, logits);
    // Each timed run is followed by a pass of the read loop: on shared cores the bandwidth
    // moves with the load, so each run is set against the limit measured next to it.
    std::vector<double> tps, bws, ratios, token_bws, token_bytes, token_ratios;
    std::optional<TokenRead> token_read;
    if (ranks.lead()) token_read.emplace(model->weights(), c, 7, ctx.threads);
    ForwardProfile prof;
    for (int r = 0; r <= opt.runs; ++r) {
      ranks.sync();
      const parallel::CombineCounters c0 = model->combine_counters();
      model->set_profile(r > 0 ? &prof : nullptr);
      auto t = Clock::now();
      for (int64_t i = 0; i < opt.decode_tokens; ++i) {
        auto one = ids(1);
        SeqSlice d{&seq, one};
        model->forward(std::span<SeqSlice>(&d, 1), pool, fo, logits);
      }
      if (r == 0) continue;  // run 0 warms up
      const double sec = seconds_since(t);
      tps.push_back(double(opt.decode_tokens) / sec);
      add_combine(mine.decode, c0, model->combine_counters(), sec);
      if (!ranks.lead()) continue;
      // The limit for this run: one pass just after it, when the caches hold the model's weights
      // as they do for decode, so the pass reads DRAM. (Passes back to back find part of their
      // own buffer in a large L3 and read faster: the figure at the end.)
      bws.push_back(loop->measure(1));
      // And one read of a token's own weights where they lie: the same bytes, the same pages.
      token_bws.push_back(token_read->measure(1));
      token_bytes.push_back(token_read->bytes_per_pass());
    }
    model->set_profile(nullptr);
    mine.decode = per_one(mine.decode, double(opt.runs) * double(opt.decode_tokens));
    // What a step read here: expert-parallel, the routed experts this rank ran (counted), every
    // other weight it computes with (not the shared experts, but on rank 0).
    mine.decode_experts_per_layer =
        prof.moe_layers ? double(prof.local_routed_experts) / double(prof.moe_layers) : 0;
    if (ranks.many()) {
      auto part = [&](const char* name) {
        return rep.active.bytes_by_part.count(name) ? rep.active.bytes_by_part.at(name) : 0.0;
      };
      double fixed = rep.active.bytes - part("routed experts"), expert = 0, moe_layers = 0;
      if (ranks.comm().rank() != 0) fixed -= part("shared experts");  // rank 0 runs them
      for (const auto& L : model->weights().layers)
        if (L.moe) moe_layers += 1, expert = std::max(expert, expert_bytes(L));
      rep.decode_read_bytes = fixed + moe_layers * mine.decode_experts_per_layer * expert;
    }
    mine.decode_read_bytes = rep.decode_read_bytes;
    for (size_t i = 0; i < bws.size(); ++i) {
      ratios.push_back(tps[i] / (bws[i] * 1e9 / rep.decode_read_bytes));
      token_ratios.push_back(tps[i] / (token_bws[i] * 1e9 / token_bytes[i]));
    }
    rep.decode_parts_ms = per_pass_ms(prof, double(prof.passes));
    rep.decode_tps = summarize(tps);
    rep.decode_bandwidth = summarize(bws);
    rep.decode_ratio = summarize(ratios);
    rep.token_bandwidth = summarize(token_bws);
    rep.token_ratio = summarize(token_ratios);
    say("  " + std::to_string(rep.decode_tps.median) + " tokens/s");

    // The engine's decode: one greedy request of `context` prompt tokens and decode_tokens
    // passes after its prompt's, each run right after a model-level run on the cache above, so
    // that each ratio compares two runs that saw the same machine.
    say("decode through the engine (batch 1, greedy) ...");
    EngineOptions eo;
    eo.kv_pages = pages_for_tokens(opt.context + opt.decode_tokens + 1, 64) + 1;
    eo.max_running = 1;
    eo.prefix_cache = false;
    Engine engine(*model, nullptr, eo);
    std::vector<double> etps, eratios;
    for (int r = 0; r <= opt.runs; ++r) {
      ranks.sync();
      auto t = Clock::now();
      for (int64_t i = 0; i < opt.decode_tokens; ++i) {
        auto one = ids(1);
        SeqSlice d{&seq, one};
        model->forward(std::span<SeqSlice>(&d, 1), pool, fo, logits);
      }
      const double model_tps = double(opt.decode_tokens) / seconds_since(t);
      Request req;
      req.prompt = ids(opt.context);
      req.sampling.temperature = 0;
      req.max_new_tokens = opt.decode_tokens + 1;  // the first token comes from the prompt's pass
      const RequestResult res = engine.generate(std::move(req));
      if (r == 0) continue;  // warm-up
      etps.push_back(res.generated_tokens_per_second());
      eratios.push_back(etps.back() / model_tps);
    }
    rep.engine_decode_tps = summarize(etps);
    rep.engine_ratio = summarize(eratios);
    say("  " + std::to_string(rep.engine_decode_tps.median) + " tokens/s");
  }

  // Speculative decoding, batch 1, greedy, through the engine: plain decode and decode with
  // injected drafts right with probability a (a low-discrepancy pattern over the output
  // positions, so a run's acceptance is a), in alternating runs; then the MTP module's drafts.
  if (opt.spec_tokens > 0 && ranks.many()) {
    rep.skipped.push_back("the speculative decoding rows (--spec-tokens): the engine's adaptive gate decides from each "
                          "rank's own timings, so the ranks would run different passes");
  } else if (opt.spec_tokens > 0) {
    say("speculative decoding (batch 1, greedy, " + std::to_string(opt.draft_tokens) + " draft tokens) ...");
    rep.draft_tokens = opt.draft_tokens;
    EngineOptions eo;
    eo.kv_pages = pages_for_tokens(opt.context + opt.spec_tokens + opt.draft_tokens + 2, 64) + 1;
    eo.max_running = 1;
    eo.prefix_cache = false;
    Engine plain(*model, nullptr, eo);
    Request req;
    req.prompt = ids(opt.context);
    req.sampling.temperature = 0;
    req.max_new_tokens = opt.spec_tokens + 1;  // the first token comes from the prompt's pass
    const std::vector<int32_t> cont = plain.generate(req).tokens;
    const size_t plen = req.prompt.size();
    const int32_t V = int32_t(c.vocab_size);
    auto measure = [&](SpecRow& row, EngineOptions so) {
      Engine spec(*model, nullptr, so);
      std::vector<double> ptps, stps, ratio;
      for (int r = 0; r <= opt.runs; ++r) {
        const RequestResult p = plain.generate(req), s = spec.generate(req);
        row.identical = row.identical && s.tokens == p.tokens;
        if (r == 0) continue;  // warm-up
        ptps.push_back(p.generated_tokens_per_second());
        stps.push_back(s.generated_tokens_per_second());
        ratio.push_back(stps.back() / ptps.back());
      }
      const EngineStats st = spec.stats();
      row.acceptance = st.spec_acceptance_rate();
      row.tokens_per_step = st.spec_tokens_per_step();
      row.plain_tps = summarize(ptps);
      row.spec_tps = summarize(stps);
      row.ratio = summarize(ratio);
      return st;
    };
    for (auto [a, adaptive] : std::vector<std::pair<double, bool>>{{1.0, true}, {0.8, true}, {0.5, true}, {0.0, true}, {0.0, false}}) {
      SpecRow row;
      row.target_acceptance = a;
      row.adaptive = adaptive;
      EngineOptions so = eo;
      so.speculative.enabled = true;
      so.speculative.draft_tokens = opt.draft_tokens;
      so.speculative.adaptive = adaptive;
      so.draft_source = std::make_shared<InjectedDrafts>([&cont, plen, a, V](const Sequence& s, int64_t k) {
        std::vector<int32_t> d;
        for (int64_t j = 0; j < k; ++j) {
          const size_t at = s.tokens.size() - plen + size_t(j);
          if (at >= cont.size()) break;
          const double u = std::fmod(double(at) * 0.6180339887498949, 1.0);
          d.push_back(u < a ? cont[at] : (cont[at] + 1) % V);
        }
        return d;
      });
      measure(row, so);
      rep.spec.push_back(row);
      say("  acceptance " + std::to_string(a) + (adaptive ? "" : " (gate off)") + ": " + std::to_string(row.ratio.median) + "x plain");
    }
    const quant::QuantFormat head = quant::parse_quant_format(opt.draft_head, "--draft-head");
    if (!model->has_mtp()) {
      rep.mtp_missing = "the checkpoint in " + rep.dir + " has no MTP module (num_nextn_predict_layers 0 or no eh_proj)";
      say("  skipping the MTP module's drafts: " + rep.mtp_missing);
    } else {
      rep.have_mtp = true;
      EngineOptions so = eo;
      so.speculative.enabled = true;
      so.speculative.draft_tokens = opt.draft_tokens;
      so.speculative.draft_head = head;
      so.speculative.adaptive = false;  // every step drafts: the draft's cost per step
      const EngineStats st = measure(rep.mtp, so);
      rep.mtp.adaptive = false;
      rep.mtp_draft_ms = st.spec_steps ? 1e3 * st.spec_draft_seconds / double(st.spec_steps) : 0;
      rep.mtp_cost_ratio = rep.mtp.plain_tps.median > 0 ? rep.mtp_draft_ms / (1e3 / rep.mtp.plain_tps.median) : 0;
      rep.mtp_acceptance = st.spec_acceptance_rate();
      say("  MTP drafts: " + std::to_string(rep.mtp_draft_ms) + " ms per step");
    }
    say("  where a speculative step's time goes (model-level passes) ...");
    const double head_error = model->has_mtp() ? model->set_mtp_draft_head(head) : 0;
    rep.spec_costs = measure_spec_costs(*model, opt, rep.active, ids);
    rep.spec_costs.draft_head_error = head_error;
  }

  // One prompt of prompt_tokens on a fresh sequence (logits of the last token) in the pass
  // context pc (nullptr: the model's), and one decode run of decode_tokens steps after `context`
  // tokens: their seconds.
  auto prompt_seconds = [&](const cpu::Context* pc) {
    ForwardOptions po = fo;
    po.context = pc;
    LatentPool pool = model->make_pool(pages_for_tokens(opt.prompt_tokens, 64), 64);
    PageTable seq;
    auto prompt = ids(opt.prompt_tokens);
    SeqSlice s{&seq, prompt};
    auto t = Clock::now();
    model->forward(std::span<SeqSlice>(&s, 1), pool, po, logits);
    return seconds_since(t);
  };
  auto decode_seconds = [&](const cpu::Context* pc) {
    ForwardOptions po = fo;
    po.context = pc;
    LatentPool pool = model->make_pool(pages_for_tokens(opt.context + opt.decode_tokens, 64), 64);
    PageTable seq;
    auto prompt = ids(opt.context);
    SeqSlice s{&seq, prompt};
    model->forward(std::span<SeqSlice>(&s, 1), pool, po, logits);
    auto t = Clock::now();
    for (int64_t i = 0; i < opt.decode_tokens; ++i) {
      auto one = ids(1);
      SeqSlice d{&seq, one};
      model->forward(std::span<SeqSlice>(&d, 1), pool, po, logits);
    }
    return seconds_since(t);
  };

  // Prompt processing: a fresh sequence of prompt_tokens per run, logits of the last token.
  if (opt.prompt_tokens > 0) {
    say("prompt processing (" + std::to_string(opt.prompt_tokens) + " tokens) ...");
    std::vector<double> tps, gemm, ratios, peaks, peak_ratios;
    ForwardProfile prof;
    std::optional<GemmProbe> probe;  // rank 0's, as the read loop
    if (ranks.lead()) probe.emplace(opt.gemm_n, ctx);
    rep.gemm_n = opt.gemm_n;
    rep.prompt_flops = prompt_flops(rep.active, c, opt.prompt_tokens);
    // The compute peak of the instruction the prompt's products run on, a loop of about 20 ms.
    // INT4 / INT8 routed experts (the larger share of a prompt's products) as written or as
    // quantized at load: the VNNI GEMM's peak where the dispatch sends them there.
    const bool int_experts = opt.quantize.experts
                                 ? (*opt.quantize.experts == quant::QuantFormat::INT4 ||
                                    *opt.quantize.experts == quant::QuantFormat::INT8)
                             : rep.own_model ? held_int_experts(model->weights())
                                             : kind == RandomWeights::INT4_EXPERTS || kind == RandomWeights::INT4_FP8 ||
                                                   kind == RandomWeights::INT8;
    const cpu::PeakPath path = cpu::prompt_peak_path(ctx, int_experts);
    rep.peak_path = cpu::peak_path_name(path);
    const int64_t peak_iters = cpu::peak_iters(path, 20);
    auto peak = [&] { return cpu::peak_gflops(path, rep.threads, 2, peak_iters); };
    for (int r = 0; r <= opt.runs; ++r) {
      // Like decode against the read loop: each run is set against the GEMM rate and the peak
      // around it (the better of before and after the run).
      double g = 0, pk = 0;
      if (ranks.lead()) g = probe->measure(2), pk = peak();
      ranks.sync();
      const parallel::CombineCounters c0 = model->combine_counters();
      model->set_profile(r > 0 ? &prof : nullptr);
      const double sec = prompt_seconds(nullptr);
      if (r == 0) continue;
      add_combine(mine.prompt, c0, model->combine_counters(), sec);
      const double gflops = rep.prompt_flops / sec / 1e9;
      tps.push_back(double(opt.prompt_tokens) / sec);
      if (!ranks.lead()) continue;
      gemm.push_back(std::max(g, probe->measure(2)));
      ratios.push_back(gflops / gemm.back());
      peaks.push_back(std::max(pk, peak()));
      peak_ratios.push_back(gflops / peaks.back());
    }
    mine.prompt = per_one(mine.prompt, double(opt.runs));
    rep.prompt_gemm_gflops = summarize(gemm);
    rep.prompt_ratio = summarize(ratios);
    rep.prompt_peak_gflops = summarize(peaks);
    rep.prompt_peak_ratio = summarize(peak_ratios);
    if (ranks.lead())
      for (int n = 1; n <= rep.threads; n = n < rep.threads ? std::min(2 * n, rep.threads) : n + 1)
        rep.peak_by_threads.push_back({n, cpu::peak_gflops(path, n, 3, peak_iters)});
    model->set_profile(nullptr);
    rep.prompt_parts_ms = per_pass_ms(prof, double(prof.passes));
    rep.prompt_tps = summarize(tps);
    say("  " + std::to_string(rep.prompt_tps.median) + " tokens/s");
  }

  // Scaling: the same decode and prompt on one thread and on all of ctx's, alternating.
  if (opt.scaling && rep.threads > 1 && (opt.decode_tokens > 0 || opt.prompt_tokens > 0)) {
    say("scaling: 1 thread against " + std::to_string(rep.threads) + " ...");
    cpu::Context one = ctx;
    one.threads = 1;
    std::vector<double> d1, dn, dr, p1, pn, pr;
    for (int r = 0; r <= opt.runs; ++r) {  // run 0 warms up
      ranks.sync();
      if (opt.decode_tokens > 0) {
        const double n = double(opt.decode_tokens) / decode_seconds(nullptr);
        const double s = double(opt.decode_tokens) / decode_seconds(&one);
        if (r > 0) dn.push_back(n), d1.push_back(s), dr.push_back(n / s);
      }
      if (opt.prompt_tokens > 0) {
        const double n = double(opt.prompt_tokens) / prompt_seconds(nullptr);
        const double s = double(opt.prompt_tokens) / prompt_seconds(&one);
        if (r > 0) pn.push_back(n), p1.push_back(s), pr.push_back(n / s);
      }
    }
    rep.scale_decode_1 = summarize(d1);
    rep.scale_decode_n = summarize(dn);
    rep.scale_decode_ratio = summarize(dr);
    rep.scale_prompt_1 = summarize(p1);
    rep.scale_prompt_n = summarize(pn);
    rep.scale_prompt_ratio = summarize(pr);
  }

  // Batched decode: B sequences (8 cached tokens each), batch_steps steps of one token each.
  for (int64_t B : opt.batches) {
    if (B <= 0) throw std::invalid_argument("batch sizes must be positive");
    say("batched decode, batch " + std::to_string(B) + " ...");
    const int64_t per_seq = 8 + (opt.runs + 1) * opt.batch_steps;
    LatentPool pool = model->make_pool(B * pages_for_tokens(per_seq, 64), 64);
    std::vector<PageTable> seqs(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> toks(static_cast<size_t>(B));
    std::vector<SeqSlice> batch(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      toks[size_t(b)] = ids(8);
      batch[size_t(b)] = {&seqs[size_t(b)], toks[size_t(b)]};
    }
    model->forward(batch, pool, fo, logits);
    std::vector<double> tps;
    for (int r = 0; r <= opt.runs; ++r) {
      ranks.sync();
      auto t = Clock::now();
      for (int64_t i = 0; i < opt.batch_steps; ++i) {
        for (int64_t b = 0; b < B; ++b) {
          toks[size_t(b)] = ids(1);
          batch[size_t(b)] = {&seqs[size_t(b)], toks[size_t(b)]};
        }
        model->forward(batch, pool, fo, logits);
      }
      if (r > 0) tps.push_back(double(B * opt.batch_steps) / seconds_since(t));
    }
    rep.batched_tps.push_back({B, summarize(tps)});
    say("  " + std::to_string(rep.batched_tps.back().second.median) + " tokens/s");
  }

  memory_figures();
  gather();
  if (ranks.lead()) {
    say("read bandwidth ...");
    rep.bandwidth_gbps = loop->measure(opt.runs);
  }
  return rep;
}

std::string format_report(const Report& r) {
  std::ostringstream o;
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
  if (!r.depth_rows.empty()) {
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
  if (r.decode_tps.median > 0) {
    std::snprintf(buf, sizeof buf, "decode, batch 1, after %lld tokens: %.2f tokens/s (median, range %.2f-%.2f)\n",
                  (long long)r.context, r.decode_tps.median, r.decode_tps.min, r.decode_tps.max);
    o << buf;
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
  if (!r.spec.empty()) {
    std::snprintf(buf, sizeof buf,
                  "speculative decoding, batch 1, greedy, %lld draft token(s) per verify pass, through the engine "
                  "(alternating runs with plain decode; the machine's other load moves both):\n",
                  (long long)r.draft_tokens);
    o << buf;
    const SpecCosts& sc = r.spec_costs;
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
  if (r.prompt_tps.median > 0) {
    std::snprintf(buf, sizeof buf, "prompt processing (%lld tokens): %.1f tokens/s (median, range %.1f-%.1f)\n",
                  (long long)r.prompt_tokens, r.prompt_tps.median, r.prompt_tps.min, r.prompt_tps.max);
    o << buf;
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
  if (!r.batched_tps.empty()) {
    o << "batched decode (tokens/s over all sequences, median and range):";
    for (auto& [b, s] : r.batched_tps) {
      std::snprintf(buf, sizeof buf, " batch %lld: %.1f (%.1f-%.1f);", (long long)b, s.median, s.min, s.max);
      o << buf;
    }
    o << "\n";
  }
  if (!r.rank_rows.empty()) {
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
  for (const std::string& why : r.skipped) o << "skipped under mpirun: " << why << "\n";
  return o.str();
}

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

}  // namespace

DsaReport run_dsa(const DsaOptions& opt) {
  cpu::Context ctx;
  ctx.threads = opt.threads;
  ctx.precision = cpu::parse_precision(opt.precision);
  nlohmann::json j = v32_config();
  j["num_hidden_layers"] = 1;
  j["first_k_dense_replace"] = 1;
  const ModelConfig c = ModelConfig::from_json(j, "the DSA benchmark's config");
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim,
                kvr = c.kv_lora_rank, qk = nope + rope, Hi = c.index_n_heads, D = c.index_head_dim, K = c.index_topk;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto randn = [&](size_t n, float sd) {
    std::vector<float> v(n);
    for (auto& x : v) x = sd * nd(rng);
    return v;
  };
  // W_UK^T and W_UV per head as float32 views: all the absorbed attention reads of the layer.
  std::vector<float> uk = randn(size_t(H * kvr * nope), 0.05f), uv = randn(size_t(H * vd * kvr), 0.05f);
  LayerWeights W;
  for (int64_t h = 0; h < H; ++h) {
    MatrixView a, b;
    a.format = b.format = WeightFormat::F32;
    a.rows = kvr, a.cols = nope, a.data = reinterpret_cast<const uint8_t*>(uk.data() + h * kvr * nope);
    b.rows = vd, b.cols = kvr, b.data = reinterpret_cast<const uint8_t*>(uv.data() + h * vd * kvr);
    W.w_uk_t.push_back(a);
    W.w_uv.push_back(b);
  }
  MlaAttention mla(c);
  Indexer ix(c);
  DsaReport rep;
  rep.threads = ctx.num_threads();
  rep.kv_dtype = opt.kv_dtype;
  rep.precision = opt.precision;
  rep.kernel = cpu::index_kernel_name(ix.kernel(ctx));
  const KvDType dt = parse_kv_dtype(opt.kv_dtype);
  // 512 MB, twice the largest last-level caches this runs on: a pass leaves none of the keys cached.
  ReadLoop loop(size_t(512) << 20, opt.threads);
  rep.bandwidth_gbps = loop.measure(3);
  std::vector<double> loop_passes;
  std::vector<cpu::IndexKernel> kernels;
  for (auto k : {cpu::IndexKernel::F32, cpu::IndexKernel::Bf16, cpu::IndexKernel::Amx})
    if (cpu::index_kernel_supported(k, D)) kernels.push_back(k);
  for (int64_t S : opt.contexts) {
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
    rep.rows.push_back(row);
  }
  rep.loop_gbps = summarize(loop_passes);
  if (opt.layers <= 0) return rep;

  // ---- the model: V3.2's attention and indexer, a small MoE and vocabulary ----
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
  const std::string stamp = rep.model_dir + "/mla-bench.json";
  const nlohmann::json want = {{"config", "v32"}, {"layers", opt.layers}, {"weights", "bf16"}, {"seed", 1}};
  if (std::filesystem::exists(rep.model_dir + "/config.json")) {
    nlohmann::json have;
    if (std::ifstream f(stamp); f) f >> have;
    if (have != want)
      throw std::runtime_error(rep.model_dir + " holds a checkpoint that is not the DSA benchmark's " + want.dump() +
                               "; choose another --dir");
  } else {
    std::fprintf(stderr, "writing a random bf16 DeepSeek-V3.2-shaped checkpoint of %lld layers to %s ...\n",
                 (long long)opt.layers, rep.model_dir.c_str());
    RandomCheckpointOptions ro;
    ro.seed = 1;
    ro.shards = 2;
    write_random_checkpoint(rep.model_dir, mj, ro);
    std::ofstream(stamp) << want.dump() << "\n";
  }
  auto model = Model::load(rep.model_dir, ctx);
  const ModelConfig& mc = model->config();
  char desc[400];
  std::snprintf(desc, sizeof desc,
                "%lld layers of DeepSeek-V3.2's attention and indexer (hidden 7168, 128 heads, q LoRA 1536, kv LoRA "
                "512 + 64, indexer 64 x 128, top-%lld), bf16; not the release's FFN: the first layer a dense MLP of "
                "%lld, then MoE of %lld experts of %lld (top-%lld, 1 shared), vocabulary %lld, so that it fits in "
                "memory and writes quickly",
                (long long)mc.num_hidden_layers, (long long)mc.index_topk, (long long)mc.intermediate_size,
                (long long)mc.n_routed_experts, (long long)mc.moe_intermediate_size,
                (long long)mc.num_experts_per_tok, (long long)mc.vocab_size);
  rep.model_desc = desc;
  std::uniform_int_distribution<int32_t> tok(0, int32_t(mc.vocab_size - 1));
  std::vector<float> logits;
  for (int64_t S : opt.contexts) {
    LatentPool pool = model->make_pool(pages_for_tokens(S + 1, 64) + 1, 64, dt);
    PageTable seq;
    fill_random_cache(pool, mc.kv_lora_rank, seq, S, rng);
    DsaModelRow row;
    row.context = S;
    ForwardProfile prof[2];
    std::vector<double> tps[2];
    // Alternating steps, DSA (0) then dense (1); each step decodes the token at position S and
    // is truncated away again, so every step sees the same S cached tokens.
    for (int r = 0; r <= opt.runs; ++r)
      for (int mode = 0; mode < 2; ++mode) {
        ForwardOptions fo;
        fo.last_logits_only = true;
        fo.dense_attention = mode == 1;
        const int32_t id = tok(rng);
        SeqSlice d{&seq, std::span<const int32_t>(&id, 1)};
        model->set_profile(r > 0 ? &prof[mode] : nullptr);
        const auto t0 = Clock::now();
        model->forward(std::span<SeqSlice>(&d, 1), pool, fo, logits);
        const double t = seconds_since(t0);
        model->set_profile(nullptr);
        pool.truncate(seq, S);
        if (r > 0) tps[mode].push_back(1.0 / t);
      }
    row.dsa_tps = summarize(tps[0]);
    row.dense_tps = summarize(tps[1]);
    row.dsa_attn_ms = prof[0].seconds[ForwardProfile::Attention] / double(std::max<int64_t>(1, prof[0].passes)) * 1e3;
    row.dense_attn_ms = prof[1].seconds[ForwardProfile::Attention] / double(std::max<int64_t>(1, prof[1].passes)) * 1e3;
    rep.model_rows.push_back(row);
  }
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
