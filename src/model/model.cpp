#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/repack.h"
#include "backend/cpu/weight_memory.h"
#include "format/progress.h"
#include "model/fingerprint.h"
#include "parallel/comm.h"

namespace mla {

using cpu::matmul;

namespace {

// Every weight view of the model, for copying the weights onto huge pages.
std::vector<MatrixView*> weight_views(ModelWeights& w) {
  std::vector<MatrixView*> v{&w.embed, &w.lm_head};
  auto mlp = [&](Mlp& m) { v.insert(v.end(), {&m.gate, &m.up, &m.down}); };
  auto layer = [&](LayerWeights& L) {
    v.insert(v.end(), {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.kv_b, &L.o, &L.router});
    for (auto& m : L.w_uk_t) v.push_back(&m);
    for (auto& m : L.w_uv) v.push_back(&m);
    mlp(L.dense);
    mlp(L.shared);
    for (auto& e : L.experts) mlp(e);
  };
  for (auto& L : w.layers) layer(L);
  for (auto& m : w.mtp) {
    layer(m.layer);
    v.push_back(&m.eh_proj);
    if (m.head.data != w.lm_head.data) v.push_back(&m.head);  // else it is lm_head: set after the copy
  }
  return v;
}

double sum_parts(const ForwardProfile& p) {
  double s = 0;
  for (int i = 0; i < ForwardProfile::kParts; ++i) s += p.seconds[i];
  return s;
}

}  // namespace

const char* ForwardProfile::name(int part) {
  static const char* const names[kParts] = {"embedding", "attention projections", "attention", "o_proj", "dense mlp",
                                            "router",    "experts (shared and routed)", "lm_head", "other"};
  return part >= 0 && part < kParts ? names[part] : "?";
}

std::unique_ptr<Model> Model::load(const std::string& dir, const cpu::Context& ctx, bool show_progress, bool with_mtp) {
  return load(dir, ctx, show_progress, LoadQuantization{}, with_mtp);
}

std::unique_ptr<Model> Model::load(const std::string& dir, const cpu::Context& ctx, bool show_progress,
                                   const LoadQuantization& quantize, bool with_mtp) {
  std::unique_ptr<Model> m(new Model());
  m->ctx_ = ctx;
  m->cfg_ = ModelConfig::load(dir);
  // Expert-parallel (mpirun -np N): every rank must run the same checkpoint; this rank maps
  // and reads only its block of the routed experts (parallel/expert_parallel.h).
  parallel::Comm& comm = parallel::world();
  parallel::ExpertRange experts;
  if (comm.size() > 1) {
    parallel::require_same_on_all_ranks(comm, "checkpoint", checkpoint_fingerprint(dir).hex());
    experts = parallel::expert_range(m->cfg_.n_routed_experts, comm.rank(), comm.size());
  }
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  // Reading the whole checkpoint in up front would fault in the other ranks' experts too.
  if (show_progress && !quantize.any() && experts.all()) {
    Progress bar("loading weights");
    m->ckpt_->prefault([&](size_t done, size_t total) { bar.update(done, total); });
  }
  if (!quantize.any()) {
    m->w_ = load_weights(*m->ckpt_, m->cfg_, with_mtp, experts);
  } else {
    Progress bar("quantizing at load (" + quantize.str() + ")", show_progress);
    m->w_ = load_weights(*m->ckpt_, m->cfg_, quantize, [&](size_t done, size_t total) { bar.update(done, total); },
                         with_mtp, experts);
    bar.finish();
  }
  size_t resident = 0;  // quantized or expert-parallel: the bytes kept, not the checkpoint's
  for (auto& [fmt, n] : m->w_.bytes_by_format) resident += n;
  bool repacked = false;
  if (cpu::should_copy_weights(ctx.weights, quantize.any() || !experts.all() ? resident : m->ckpt_->total_bytes())) {
    std::vector<bool> head_is_lm_head;
    for (auto& mtp : m->w_.mtp) head_is_lm_head.push_back(mtp.head.data == m->w_.lm_head.data);
    m->w_.arena = std::make_shared<cpu::WeightArena>();
    m->w_.arena->adopt(ctx, weight_views(m->w_));
    for (size_t i = 0; i < m->w_.mtp.size(); ++i)
      if (head_is_lm_head[i]) m->w_.mtp[i].head = m->w_.lm_head;
    m->ckpt_->release_pages();  // the copies are what runs now: RSS counts the weights once
    if (quantize.any()) m->w_.owned.clear();  // every view points into the arena now
    repacked = m->repack_weights();
  }
  m->ctx_.repack_weights = repacked;  // what the kernels run on (the computation fingerprint reads it)
  if (!experts.all())
    std::fprintf(stderr, "mla: rank %d of %d holds routed experts [%lld, %lld) of %lld: %s\n", comm.rank(), comm.size(),
                 (long long)experts.begin, (long long)experts.end, (long long)m->cfg_.n_routed_experts,
                 weight_bytes_summary(m->w_).c_str());
  m->mla_ = std::make_unique<MlaAttention>(m->cfg_);
  m->moe_ = std::make_unique<MoeLayer>(m->cfg_, &comm);
  if (m->cfg_.dsa()) m->indexer_ = std::make_unique<Indexer>(m->cfg_);
  m->costs_ = MlaCosts::of(m->cfg_);
  if (comm.size() > 1) {
    // Every rank has its weights: from here on the ranks run in step, and a rank that takes
    // longer than the timeout to reach a collective hangs (loading had none: disks differ).
    comm.barrier();
    comm.set_timeout(parallel::rank_timeout_from_env());
  }
  return m;
}

bool Model::repack_weights() {
  const bool pairs = cpu::reads_pairs32(ctx_), words = cpu::reads_words16(ctx_);
  if (!pairs && !words) return false;
  // The products that only matmul reads: every MLP; the attention's projections but kv_b, whose
  // rows the absorbed attention reads head by head as stored (w_uv); lm_head unless the
  // embedding shares it (its rows are read one by one). The MTP module's head is lm_head's view.
  std::vector<MatrixView*> views;
  auto mlp = [&](Mlp& p) { views.insert(views.end(), {&p.gate, &p.up, &p.down}); };
  auto layer = [&](LayerWeights& L) {
    views.insert(views.end(), {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.o});
    mlp(L.dense);
    mlp(L.shared);
    for (Mlp& e : L.experts) mlp(e);
  };
  for (LayerWeights& L : w_.layers) layer(L);
  for (MtpWeights& t : w_.mtp) layer(t.layer);
  if (w_.lm_head.data != w_.embed.data) {
    views.push_back(&w_.lm_head);
    for (MtpWeights& t : w_.mtp)
      if (t.head.data == w_.lm_head.data) views.push_back(&t.head);
  }
  size_t bf16_bytes = 0, int4_bytes = 0, int8_bytes = 0;
  std::set<const void*> done;  // a view sharing another's memory takes its format, not a second rewrite
  for (MatrixView* v : views) {
    const bool to_pairs = pairs && cpu::pairs32_eligible(*v), to_words = words && cpu::words16_eligible(*v);
    if (!to_pairs && !to_words) continue;
    const WeightFormat to = to_pairs ? WeightFormat::BF16_PAIRS32
                            : v->format == WeightFormat::INT8_GROUP ? WeightFormat::INT8_WORDS16
                                                                    : WeightFormat::INT4_WORDS16;
    if (!done.insert(v->data).second) {
      v->format = to;
      continue;
    }
    if (to_pairs) {
      cpu::repack_pairs32(ctx_, *v);
      bf16_bytes += v->bytes();
    } else {
      cpu::repack_words16(ctx_, *v);
      (to == WeightFormat::INT8_WORDS16 ? int8_bytes : int4_bytes) += v->bytes() + v->scale_bytes();
    }
  }
  if (bf16_bytes + int4_bytes + int8_bytes == 0) return false;
  // The bytes move to their new format's line of the load summary, from the lines they came from.
  auto& by = w_.bytes_by_format;
  auto move = [&](size_t bytes, std::initializer_list<const char*> from, const char* to) {
    if (bytes == 0) return;
    by[to] += bytes;
    for (const char* f : from) {
      auto it = by.find(f);
      if (it == by.end()) continue;
      const size_t n = std::min(bytes, it->second);
      if ((it->second -= n) == 0) by.erase(it);
      if ((bytes -= n) == 0) break;
    }
  };
  move(bf16_bytes, {"bf16"}, "bf16 as column pairs (repacked at load)");
  move(int4_bytes, {"int4-group", "int4-group (quantized at load)"}, "int4 in blocks of 16 rows (repacked at load)");
  move(int8_bytes, {"int8-group", "int8-group (quantized at load)"}, "int8 in blocks of 16 rows (repacked at load)");
  return true;
}

LatentPool Model::make_pool(int64_t num_pages, int64_t page_size, KvDType dtype) const {
  return LatentPool(cfg_.num_hidden_layers, cfg_.kv_lora_rank, cfg_.qk_rope_head_dim, num_pages, page_size, dtype,
                    cfg_.index_cache_dim(), cfg_.ue8m0_scales);
}

void Model::admit(std::span<const SeqSlice> batch, LatentPool& pool, const char* cache, std::vector<int64_t>& first) const {
  for (auto& s : batch)
    for (int32_t id : s.ids)
      if (id < 0 || id >= cfg_.vocab_size)
        throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                    std::to_string(cfg_.vocab_size) + ")");
  // Every sequence's pages first, all or nothing.
  int64_t need = 0;
  for (auto& s : batch) need += pool.pages_needed(*s.seq, s.seq->length + int64_t(s.ids.size()));
  if (need > pool.free_pages())
    throw KvCacheExhausted(std::string(cache) + " exhausted: the batch needs " + std::to_string(need) +
                           " more pages, " + std::to_string(pool.free_pages()) + " are free");
  for (auto& s : batch) pool.reserve(*s.seq, s.seq->length + int64_t(s.ids.size()));
  first.assign(batch.size() + 1, 0);
  for (size_t b = 0; b < batch.size(); ++b) first[b + 1] = first[b] + int64_t(batch[b].ids.size());
}

void Model::forward(std::span<SeqSlice> batch, LatentPool& pool, const ForwardOptions& opt, std::vector<float>& logits) {
  pass_ctx_ = opt.context ? opt.context : &ctx_;
  const cpu::Context& cx = ctx();
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, qk = c.qk_head_dim(), vd = c.v_head_dim,
                L = c.num_hidden_layers;
  if (pool.num_layers() != L || pool.row_dim() != c.latent_dim() || pool.index_dim() != c.index_cache_dim())
    throw std::invalid_argument("forward: the latent pool's geometry does not match the model");

  std::vector<int64_t>& first = fwd_.first;
  admit(batch, pool, "KV cache", first);
  const int64_t T = first.back();
  std::vector<int64_t>& pos = fwd_.pos;
  pos.resize(size_t(T));
  std::vector<SeqShape>& shapes = fwd_.shapes;
  shapes.clear();
  for (size_t b = 0; b < batch.size(); ++b) {
    for (int64_t i = 0; i < int64_t(batch[b].ids.size()); ++i) pos[size_t(first[b] + i)] = batch[b].seq->length + i;
    shapes.push_back({int64_t(batch[b].ids.size()), batch[b].seq->length});
  }
  AttnPath path = opt.path == AttnPath::Auto ? choose_attn_path(costs_, shapes, opt.policy) : opt.path;
  last_path_ = path;
  static const bool debug = std::getenv("MLA_DEBUG") && std::string(std::getenv("MLA_DEBUG")) != "0";
  if (debug) {
    int64_t longest = 0;
    for (auto& sh : shapes) longest = std::max(longest, sh.cached_tokens);
    std::fprintf(stderr, "[mla] batch of %zu sequences, %lld new tokens, longest cached prefix %lld: %s%s\n",
                 batch.size(), (long long)T, (long long)longest, attn_path_name(path),
                 opt.path == AttnPath::Auto ? " (auto)" : "");
  }
  (path == AttnPath::Expand ? counters_.expand : path == AttnPath::Absorb ? counters_.absorb : counters_.chunked)++;

  PartTimer whole(profile_, ForwardProfile::Other);  // the rest is what the parts leave
  const double parts_before = profile_ ? sum_parts(*profile_) : 0;
  std::optional<PartTimer> part;
  part.emplace(profile_, ForwardProfile::Embed);
  // Sized to this batch (capacity kept); every element is written before it is read.
  ForwardScratch& f = fwd_;
  for (auto* v : {&f.h, &f.x, &f.delta}) v->resize(size_t(T * D));
  f.q.resize(size_t(T * H * qk));
  f.kv.resize(size_t(T * c.latent_dim()));
  f.attn.resize(size_t(T * H * vd));
  std::vector<float>&h = f.h, &x = f.x, &q = f.q, &kv = f.kv, &attn = f.attn, &delta = f.delta;
  std::vector<int32_t>& all_ids = f.ids;
  all_ids.resize(size_t(T));
  for (size_t b = 0; b < batch.size(); ++b) std::copy(batch[b].ids.begin(), batch[b].ids.end(), all_ids.begin() + first[b]);
  // A prompt's rows lie scattered over the table, each a fresh page: on the development VM 512 of
  // them took 18-24 ms on one thread, 10-12 ms on two.
  cpu::parallel_for(cx, T, T >= 64, [&](int64_t t) { w_.embed.dequant_row(all_ids[size_t(t)], h.data() + t * D); });
  if (opt.hidden) opt.hidden->assign(1, h);
  if (opt.attn) opt.attn->clear();
  if (capture_sel_) capture_sel_->clear();
  // h += delta over the batch's rows.
  auto add_residual = [&] {
    float* hp = h.data();
    const float* dp = delta.data();
    cpu::parallel_for(cx, T * D, T * D >= (int64_t(1) << 16), [&](int64_t i) { hp[i] += dp[i]; });
  };

  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& W = w_.layers[size_t(l)];
    part.emplace(profile_, ForwardProfile::AttnProj);
    cpu::rmsnorm(cx, h.data(), T, D, D, W.input_norm.data(), float(c.rms_norm_eps), x.data(), D);
    mla_->project(cx, W, x.data(), T, pos.data(), q.data(), kv.data());
    mla_->write_cache(pool, l, batch, first.data(), kv.data());
    part.emplace(profile_, ForwardProfile::Attention);
    const MlaForm form = opt.reference_attention ? MlaForm::Reference : mla_form(path);
    if (c.dsa() && !opt.dense_attention) {
      if (W.indexer.present) index_layer(W, pool, l, batch, first.data(), x.data(), T, pos.data());
      mla_->attend_sparse(cx, W, pool, l, batch, first.data(), form, opt.policy.prefix_chunk, dsa_.views, q.data(), attn.data());
      if (capture_sel_) capture_sel_->push_back(dsa_.sel);
    } else {
      mla_->attend(cx, W, pool, l, batch, first.data(), form, opt.policy.prefix_chunk, q.data(), attn.data());
    }
    part.emplace(profile_, ForwardProfile::OProj);
    mla_->o_proj(cx, W, attn.data(), T, delta.data());
    if (opt.attn) opt.attn->push_back(delta);
    add_residual();

    cpu::rmsnorm(cx, h.data(), T, D, D, W.post_attention_norm.data(), float(c.rms_norm_eps), x.data(), D);
    part.reset();
    if (W.moe) {
      part.emplace(profile_, ForwardProfile::Router);
      moe_->route(cx, W, x.data(), T);
      count_routed_experts(T);
      part.emplace(profile_, ForwardProfile::Experts);
      moe_->experts(cx, W, x.data(), T, delta.data(), mlp_scratch_);
      part.reset();
    } else {
      PartTimer t(profile_, ForwardProfile::DenseMlp);
      mlp(W.dense, x.data(), T, delta.data(), false);
    }
    add_residual();
    if (opt.hidden && l + 1 < L) opt.hidden->push_back(h);
  }
  if (opt.final_hidden) {
    opt.final_hidden->resize(size_t(T * D));
    cpu::rmsnorm(cx, h.data(), T, D, D, w_.final_norm.data(), float(c.rms_norm_eps), opt.final_hidden->data(), D);
  }
  for (auto& s : batch) s.seq->length += int64_t(s.ids.size());

  // Final norm and lm_head, on every new token or on each sequence's last one.
  std::vector<int64_t>& rows = f.rows;
  rows.clear();
  if (!opt.logits_last.empty()) {
    if (opt.logits_last.size() != batch.size()) throw std::invalid_argument("forward: logits_last needs one count per sequence");
    for (size_t b = 0; b < batch.size(); ++b)
      for (int64_t i = first[b + 1] - std::min(first[b + 1] - first[b], opt.logits_last[b]); i < first[b + 1]; ++i)
        rows.push_back(i);
  } else if (opt.last_logits_only) {
    for (size_t b = 0; b < batch.size(); ++b)
      if (first[b + 1] > first[b]) rows.push_back(first[b + 1] - 1);
  } else {
    rows.resize(size_t(T));
    std::iota(rows.begin(), rows.end(), 0);
  }
  part.emplace(profile_, ForwardProfile::LmHead);
  std::vector<float>& xn = f.xn;
  xn.resize(rows.size() * size_t(D));
  for (size_t r = 0; r < rows.size(); ++r)
    cpu::rmsnorm(cx, h.data() + rows[r] * D, 1, D, D, w_.final_norm.data(), float(c.rms_norm_eps), xn.data() + r * size_t(D), D);
  if (opt.hidden) opt.hidden->push_back(xn);
  logits.resize(rows.size() * size_t(c.vocab_size));
  matmul(cx, xn.data(), int64_t(rows.size()), w_.lm_head, logits.data());
  part.reset();
  if (profile_) {
    // `whole` adds the pass's full time to Other at scope end: take the parts' share back out.
    profile_->seconds[ForwardProfile::Other] -= sum_parts(*profile_) - parts_before;
    profile_->passes++;
  }
}

void Model::count_routed_experts(int64_t T) {
  if (!profile_) return;
  const auto& picks = moe_->choices();
  const int64_t n = std::min<int64_t>(int64_t(picks.size()), T * cfg_.num_experts_per_tok);
  std::vector<int64_t> seen;
  seen.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) seen.push_back(picks[size_t(i)].expert);
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  const parallel::ExpertRange mine = moe_->local_experts();
  profile_->routed_experts += int64_t(seen.size());
  profile_->local_routed_experts += std::count_if(seen.begin(), seen.end(), [&](int64_t e) { return mine.has(e); });
  profile_->moe_layers++;
}

void Model::index_layer(const LayerWeights& W, LatentPool& pool, int64_t layer, std::span<SeqSlice> batch,
                        const int64_t* first, const float* x, int64_t T, const int64_t* pos) {
  const cpu::Context& cx = ctx();
  Indexer& ix = *indexer_;
  const int64_t Hi = ix.n_heads(), D = ix.head_dim(), K = ix.topk();
  dsa_.q.resize(size_t(T * Hi * D));
  dsa_.w.resize(size_t(T * Hi));
  dsa_.k.resize(size_t(T * D));
  // Every new token's key is cached (later queries score it); queries only where a sequence's
  // context exceeds index_topk.
  ix.project(cx, W.indexer, x, mla_->q_a(), T, pos, dsa_.q.data(), dsa_.w.data(), dsa_.k.data());
  ix.write_cache(pool, layer, batch, first, dsa_.k.data());
  dsa_.sel.resize(batch.size());
  dsa_.views.resize(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const int64_t n = first[b + 1] - first[b], cached = batch[b].seq->length;
    Selection& s = dsa_.sel[b];
    if (n == 0 || !ix.needed(cached, n)) {
      s.pos.clear();
      s.count.clear();
      dsa_.views[b] = {nullptr, 0, nullptr};
      if (n > 0) dsa_counters_.dense_skips++;
      continue;
    }
    s.pos.resize(size_t(n * K));
    s.count.resize(size_t(n));
    const SeqKeys keys{&pool, layer, batch[b].seq, cached, n};
    ix.select(cx, keys, dsa_.q.data() + first[b] * Hi * D, dsa_.w.data() + first[b] * Hi, s.pos.data(), s.count.data());
    dsa_.views[b] = {s.pos.data(), K, s.count.data()};
    dsa_counters_.selections++;
  }
}

void Model::mlp(const Mlp& m, const float* x, int64_t T, float* out, bool accumulate, const float* row_weights) {
  const int64_t I = m.gate.rows, D = cfg_.hidden_size;
  const size_t scratch = size_t(T * (3 * I + D));
  if (mlp_scratch_.size() < scratch) mlp_scratch_.resize(scratch);
  float* const gu = mlp_scratch_.data();
  float* const act = gu + T * 2 * I;
  float* const y = act + T * I;
  std::vector<cpu::MatmulJob>& jobs = mlp_jobs_;
  jobs.clear();
  push_gate_up(jobs, m, x, T, D, gu);
  cpu::matmul_batch(ctx(), jobs);
  cpu::silu_mul(ctx(), gu, T, I, act);
  matmul(ctx(), act, T, m.down, y);
  for (int64_t t = 0; t < T; ++t) {
    float w = row_weights ? row_weights[t] : 1.0f;
    for (int64_t i = 0; i < D; ++i) {
      float v = w * y[t * D + i];
      out[t * D + i] = accumulate ? out[t * D + i] + v : v;
    }
  }
}

}  // namespace mla
