#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>

#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/repack.h"
#include "backend/cpu/weight_memory.h"
#include "format/progress.h"
#include "model/fingerprint.h"
#include "model/gguf_model.h"
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

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const cpu::Context& ctx, bool show_progress, bool with_mtp) {
  return load(dir, LoadOptions{ctx, show_progress, LoadQuantization{}, with_mtp});
}

std::unique_ptr<Model> Model::load(const std::string& dir, const cpu::Context& ctx, bool show_progress,
                                   const LoadQuantization& quantize, bool with_mtp) {
  return load(dir, LoadOptions{ctx, show_progress, quantize, with_mtp});
}

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& opt) {
  const cpu::Context& ctx = opt.ctx;
  const bool show_progress = opt.show_progress, with_mtp = opt.with_mtp;
  const LoadQuantization& quantize = opt.quantize;
  std::unique_ptr<Model> m(new Model());
  m->ctx_ = ctx;
  m->cfg_ = ModelConfig::load(dir);
  // Expert-parallel (mpirun -np N): every rank must run the same checkpoint; this rank maps
  // and reads only its block of the routed experts (parallel/expert_parallel.h).
  parallel::Comm* comm = opt.comm && opt.comm->size() > 1 ? opt.comm : nullptr;  // null: one process
  parallel::ExpertRange experts;
  if (comm) {
    parallel::require_same_on_all_ranks(*comm, "checkpoint", checkpoint_fingerprint(dir).hex());
    experts = parallel::expert_range(m->cfg_.n_routed_experts, comm->rank(), comm->size());
  }
  m->ckpt_ = open_checkpoint(dir);
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
    std::fprintf(stderr, "mla: rank %d of %d holds routed experts [%lld, %lld) of %lld: %s\n", comm->rank(), comm->size(),
                 (long long)experts.begin, (long long)experts.end, (long long)m->cfg_.n_routed_experts,
                 weight_bytes_summary(m->w_).c_str());
  m->mla_ = std::make_unique<MlaAttention>(m->cfg_);
  m->moe_ = std::make_unique<MoeLayer>(m->cfg_, comm);
  if (m->cfg_.dsa()) m->indexer_ = std::make_unique<Indexer>(m->cfg_);
  m->costs_ = MlaCosts::of(m->cfg_);
  if (comm) {
    // Every rank has its weights: from here on the ranks run in step, and a rank that takes
    // longer than the timeout to reach a collective hangs (loading had none: disks differ).
    comm->barrier();
    comm->set_timeout(parallel::rank_timeout_from_env());
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
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size, L = c.num_hidden_layers;
  if (pool.num_layers() != L || pool.row_dim() != c.latent_dim() || pool.index_dim() != c.index_cache_dim())
    throw std::invalid_argument("forward: the latent pool's geometry does not match the model");
  ForwardScratch& f = fwd_;
  admit(batch, pool, "KV cache", f.first);
  const int64_t T = f.first.back();
  f.pos.resize(size_t(T));
  f.shapes.clear();
  for (size_t b = 0; b < batch.size(); ++b) {
    for (int64_t i = 0; i < int64_t(batch[b].ids.size()); ++i) f.pos[size_t(f.first[b] + i)] = batch[b].seq->length + i;
    f.shapes.push_back({int64_t(batch[b].ids.size()), batch[b].seq->length});
  }
  const AttnPath path = opt.path == AttnPath::Auto ? choose_attn_path(costs_, f.shapes, opt.policy) : opt.path;
  last_path_ = path;
  (path == AttnPath::Expand ? counters_.expand : path == AttnPath::Absorb ? counters_.absorb : counters_.chunked)++;
  if (observer_) observer_->begin_pass(pass_shape(f.shapes, path, opt.path == AttnPath::Auto));

  const Pass p{batch, pool, f, T, opt.reference_attention ? MlaForm::Reference : mla_form(path), opt.policy.prefix_chunk,
               c.dsa() && !opt.dense_attention};
  embed(p);
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& W = w_.layers[size_t(l)];
    attention_block(p, W, l);
    if (observer_) observer_->attention(l, std::span<const float>(f.delta.data(), size_t(T * D)));
    ffn_block(p, W);
    if (observer_ && l + 1 < L) observer_->hidden(l + 1, std::span<const float>(f.h.data(), size_t(T * D)));
  }
  for (auto& s : batch) s.seq->length += int64_t(s.ids.size());
  enter(ForwardProfile::Other);
  if (opt.final_hidden) {
    opt.final_hidden->resize(size_t(T * D));
    cpu::rmsnorm(ctx(), f.h.data(), T, D, D, w_.final_norm.data(), float(c.rms_norm_eps), opt.final_hidden->data(), D);
  }
  logits_rows(p, opt);
  head(p, logits);
  if (observer_) {
    observer_->hidden(L, p.f.xn);
    observer_->end_pass();
  }
}

PassShape Model::pass_shape(std::span<const SeqShape> shapes, AttnPath path, bool chosen) {
  PassShape s{int64_t(shapes.size()), 0, 0, path, chosen};
  for (const SeqShape& sh : shapes) s.tokens += sh.new_tokens, s.longest_cached = std::max(s.longest_cached, sh.cached_tokens);
  return s;
}

void Model::embed(const Pass& p) {
  enter(ForwardProfile::Embed);
  ForwardScratch& f = p.f;
  const ModelConfig& c = cfg_;
  const int64_t T = p.T, D = c.hidden_size;
  // Sized to this batch (capacity kept); every element is written before it is read.
  for (auto* v : {&f.h, &f.x, &f.delta}) v->resize(size_t(T * D));
  f.q.resize(size_t(T * c.num_attention_heads * c.qk_head_dim()));
  f.kv.resize(size_t(T * c.latent_dim()));
  f.attn.resize(size_t(T * c.num_attention_heads * c.v_head_dim));
  f.ids.resize(size_t(T));
  for (size_t b = 0; b < p.batch.size(); ++b)
    std::copy(p.batch[b].ids.begin(), p.batch[b].ids.end(), f.ids.begin() + f.first[b]);
  // A prompt's rows lie scattered over the table, each a fresh page: the threads share them.
  cpu::parallel_for(ctx(), T, T >= 64, [&](int64_t t) { w_.embed.dequant_row(f.ids[size_t(t)], f.h.data() + t * D); });
  if (observer_) observer_->hidden(0, std::span<const float>(f.h.data(), size_t(T * D)));
}

void Model::add_residual(const Pass& p) {
  float* hp = p.f.h.data();
  const float* dp = p.f.delta.data();
  const int64_t n = p.T * cfg_.hidden_size;
  cpu::parallel_for(ctx(), n, n >= (int64_t(1) << 16), [&](int64_t i) { hp[i] += dp[i]; });
}

void Model::attention_block(const Pass& p, const LayerWeights& W, int64_t cache_layer) {
  const cpu::Context& cx = ctx();
  ForwardScratch& f = p.f;
  const int64_t D = cfg_.hidden_size;
  enter(ForwardProfile::AttnProj);
  cpu::rmsnorm(cx, f.h.data(), p.T, D, D, W.input_norm.data(), float(cfg_.rms_norm_eps), f.x.data(), D);
  mla_->project(cx, W, f.x.data(), p.T, f.pos.data(), f.q.data(), f.kv.data());
  mla_->write_cache(p.pool, cache_layer, p.batch, f.first.data(), f.kv.data());
  enter(ForwardProfile::Attention);
  if (p.sparse) {
    if (W.indexer.present) index_layer(W, p.pool, cache_layer, p.batch, f.first.data(), f.x.data(), p.T, f.pos.data());
    mla_->attend_sparse(cx, W, p.pool, cache_layer, p.batch, f.first.data(), p.form, p.prefix_chunk, dsa_.views,
                        f.q.data(), f.attn.data());
    if (observer_) observer_->selection(cache_layer, dsa_.sel);
  } else {
    mla_->attend(cx, W, p.pool, cache_layer, p.batch, f.first.data(), p.form, p.prefix_chunk, f.q.data(), f.attn.data());
  }
  enter(ForwardProfile::OProj);
  mla_->o_proj(cx, W, f.attn.data(), p.T, f.delta.data());
  add_residual(p);
}

void Model::ffn_block(const Pass& p, const LayerWeights& W) {
  const cpu::Context& cx = ctx();
  ForwardScratch& f = p.f;
  const int64_t D = cfg_.hidden_size;
  cpu::rmsnorm(cx, f.h.data(), p.T, D, D, W.post_attention_norm.data(), float(cfg_.rms_norm_eps), f.x.data(), D);
  if (W.moe) {
    enter(ForwardProfile::Router);
    moe_->route(cx, W, f.x.data(), p.T);
    if (observer_) {
      const auto& picks = moe_->choices();
      const size_t n = std::min(picks.size(), size_t(p.T * cfg_.num_experts_per_tok));
      observer_->routed(std::span<const ExpertChoice>(picks.data(), n), moe_->local_experts());
    }
    enter(ForwardProfile::Experts);
    moe_->experts(cx, W, f.x.data(), p.T, f.delta.data(), mlp_scratch_);
  } else {
    enter(ForwardProfile::DenseMlp);
    mlp(W.dense, f.x.data(), p.T, f.delta.data(), false);
  }
  add_residual(p);
}

void Model::logits_rows(const Pass& p, const ForwardOptions& opt) {
  const std::vector<int64_t>& first = p.f.first;
  const size_t B = p.batch.size();
  std::vector<int64_t>& rows = p.f.rows;
  rows.clear();
  if (!opt.logits_last.empty()) {
    if (opt.logits_last.size() != B) throw std::invalid_argument("forward: logits_last needs one count per sequence");
    for (size_t b = 0; b < B; ++b)
      for (int64_t i = first[b + 1] - std::min(first[b + 1] - first[b], opt.logits_last[b]); i < first[b + 1]; ++i)
        rows.push_back(i);
  } else if (opt.last_logits_only) {
    for (size_t b = 0; b < B; ++b)
      if (first[b + 1] > first[b]) rows.push_back(first[b + 1] - 1);
  } else {
    rows.resize(size_t(p.T));
    std::iota(rows.begin(), rows.end(), 0);
  }
}

void Model::head(const Pass& p, std::vector<float>& logits) {
  enter(ForwardProfile::LmHead);
  ForwardScratch& f = p.f;
  const int64_t D = cfg_.hidden_size;
  const std::vector<int64_t>& rows = f.rows;
  f.xn.resize(rows.size() * size_t(D));
  for (size_t r = 0; r < rows.size(); ++r)
    cpu::rmsnorm(ctx(), f.h.data() + rows[r] * D, 1, D, D, w_.final_norm.data(), float(cfg_.rms_norm_eps), f.xn.data() + r * size_t(D), D);
  logits.resize(rows.size() * size_t(cfg_.vocab_size));
  cpu::matmul(ctx(), f.xn.data(), int64_t(rows.size()), w_.lm_head, logits.data());
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
    TokenSelection& s = dsa_.sel[b];
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
