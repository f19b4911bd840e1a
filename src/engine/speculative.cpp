// Draft sources, the acceptance rule and the adaptive gate of speculative decoding (see
// speculative.h).
#include "engine/speculative.h"

#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace mla {

bool parse_speculative_method(const std::string& s) {
  if (s == "mtp") return true;
  if (s.empty() || s == "none") return false;
  throw std::invalid_argument("unknown speculative method '" + s + "' (mtp, none)");
}

// ---- acceptance ----

bool accept_draft(std::span<const float> p, std::span<const float> q, int32_t d, double u) {
  if (d < 0 || size_t(d) >= p.size()) return false;
  const double pd = p[size_t(d)];
  if (q.empty()) return u < pd;
  const double qd = q[size_t(d)];
  if (qd <= 0) return pd > 0;  // cannot happen for a draft drawn from q
  return u < pd / qd;
}

std::vector<float> residual_distribution(std::span<const float> p, std::span<const float> q, int32_t d) {
  std::vector<float> r(p.begin(), p.end());
  if (q.empty()) {
    if (d >= 0 && size_t(d) < r.size()) r[size_t(d)] = 0;
  } else {
    for (size_t i = 0; i < r.size(); ++i) r[i] = std::max(0.0f, p[i] - (i < q.size() ? q[i] : 0.0f));
  }
  double sum = 0;
  for (float v : r) sum += v;
  if (!(sum > 0)) return std::vector<float>(p.begin(), p.end());
  for (float& v : r) v = float(v / sum);
  return r;
}

// ---- injected drafts ----

InjectedDrafts::InjectedDrafts(Fn fn)
    : fill_([fn = std::move(fn)](Sequence& s, int64_t k) {
        s.draft = fn(s, k);
        s.draft_probs.clear();
      }) {}

std::shared_ptr<InjectedDrafts> InjectedDrafts::filling(FillFn fill) {
  std::shared_ptr<InjectedDrafts> d(new InjectedDrafts());
  d->fill_ = std::move(fill);
  return d;
}

void InjectedDrafts::propose(std::span<Sequence* const> seqs, int64_t k) {
  for (Sequence* s : seqs) {
    s->draft.clear();
    s->draft_probs.clear();
    fill_(*s, k);
    if (int64_t(s->draft.size()) > k) s->draft.resize(size_t(k));
    if (s->draft_probs.size() > s->draft.size()) s->draft_probs.resize(s->draft.size());
  }
}

// ---- MTP drafts ----

MtpDrafts::MtpDrafts(Model& model, int64_t pages, int64_t page_size, KvDType dtype, const cpu::Context* ctx)
    : model_(model), pool_(model.make_mtp_pool(pages, page_size, dtype)), ctx_(ctx),
      D_(model.config().hidden_size), V_(model.config().vocab_size) {
  if (!model.has_mtp()) throw std::invalid_argument("MTP drafts: the model has no MTP module loaded");
}

void MtpDrafts::reset(State& st, int64_t pos) {
  pool_.release(st.table);
  st.table = PageTable();
  st.first = pos;
  st.hidden.clear();
}

int64_t MtpDrafts::cached_rows(int64_t id) const {
  auto it = states_.find(id);
  return it == states_.end() ? -1 : it->second.table.length;
}

void MtpDrafts::forget(const Sequence& s) {
  auto it = states_.find(s.id);
  if (it == states_.end()) return;
  pool_.release(it->second.table);
  states_.erase(it);
}

void MtpDrafts::observe(const Sequence& s, int64_t pos0, int64_t n, int64_t kept, const float* hidden) {
  (void)n;
  if (!hidden || kept <= 0) return;
  auto [it, fresh] = states_.try_emplace(s.id);
  State& st = it->second;
  if (fresh) st.first = pos0;
  // The rows must continue the MTP state; otherwise (recomputed after preemption, or started
  // past a shared prefix) a fresh MTP cache begins here.
  if (!fresh && st.first + st.table.length + pending_rows(st) != pos0) reset(st, pos0);
  st.hidden.insert(st.hidden.end(), hidden, hidden + kept * D_);
}

bool MtpDrafts::choose(Sequence& s, std::span<float> row) {
  std::vector<int32_t>& ctx = tokens_;
  ctx.assign(s.tokens.begin(), s.tokens.end());
  ctx.insert(ctx.end(), s.draft.begin(), s.draft.end());
  try {
    if (s.req.logits_processor) s.req.logits_processor(row, ctx);
    if (s.sampler->params().greedy()) {
      s.draft.push_back(s.sampler->sample(row));  // the argmax: no draw
    } else {
      std::vector<float> q = s.sampler->probabilities(row);
      s.draft.push_back(s.sampler->sample_from(q));
      s.draft_probs.push_back(std::move(q));
    }
  } catch (const std::exception&) {
    return false;  // no token the processor allows, or no finite logit: no (further) draft
  }
  return true;
}

void MtpDrafts::propose(std::span<Sequence* const> seqs, int64_t k) {
  // The catch-up: every pending row whose next token is known, one pass for all sequences.
  std::vector<MtpSlice> batch;
  std::vector<Sequence*> who;
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(seqs.size());
  int64_t need = 0;
  for (Sequence* s : seqs) {
    s->draft.clear();
    s->draft_probs.clear();
    auto it = states_.find(s->id);
    if (it == states_.end()) continue;
    State& st = it->second;
    const int64_t pos0 = st.first + st.table.length, rows = pending_rows(st);
    // Row p pairs h_p with the token at p + 1: all pending rows once the last token is sampled.
    if (rows == 0 || pos0 + rows != int64_t(s->tokens.size()) - 1) {
      if (rows > 0 && pos0 + rows > int64_t(s->tokens.size()) - 1) reset(st, int64_t(s->tokens.size()));
      continue;
    }
    need += pool_.pages_needed(st.table, st.table.length + rows + k);
    if (need > pool_.free_pages()) {  // the MTP cache is full: this sequence starts over later
      reset(st, int64_t(s->tokens.size()));
      continue;
    }
    ids.emplace_back(s->tokens.begin() + pos0 + 1, s->tokens.end());
    batch.push_back({&st.table, ids.back(), st.hidden.data(), pos0});
    who.push_back(s);
  }
  if (batch.empty()) return;
  std::vector<int64_t> before(who.size()), last_row(who.size());
  int64_t row = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    before[b] = batch[b].seq->length + int64_t(batch[b].ids.size());  // the MTP cache after the catch-up
    row += int64_t(batch[b].ids.size());
    last_row[b] = row - 1;
  }
  model_.mtp_forward(batch, pool_, true, logits_, &hid_, ctx_);
  for (size_t b = 0; b < who.size(); ++b) states_[who[b]->id].hidden.clear();
  std::vector<char> going(who.size(), 1);
  for (size_t b = 0; b < who.size(); ++b)
    going[b] = choose(*who[b], std::span<float>(logits_.data() + b * size_t(V_), size_t(V_)));
  // Chained drafts: the module on its own shared_head.norm output and its last draft.
  for (int64_t j = 1; j < k; ++j) {
    std::vector<MtpSlice> chain;
    std::vector<size_t> idx;
    std::vector<int32_t> toks;
    toks.reserve(who.size());
    for (size_t b = 0; b < who.size(); ++b) {
      if (!going[b]) continue;
      State& st = states_[who[b]->id];
      toks.push_back(who[b]->draft.back());
      chain.push_back({&st.table, std::span<const int32_t>(&toks.back(), 1), hid_.data() + last_row[b] * D_,
                       st.first + st.table.length});
      idx.push_back(b);
    }
    if (chain.empty()) break;
    model_.mtp_forward(chain, pool_, true, logits_, &hid2_, ctx_);
    for (size_t c = 0; c < idx.size(); ++c) {
      const size_t b = idx[c];
      last_row[b] = int64_t(c);
      going[b] = choose(*who[b], std::span<float>(logits_.data() + c * size_t(V_), size_t(V_)));
    }
    hid_.swap(hid2_);
  }
  // The chained rows were the module's own guesses: out of the MTP cache again.
  for (size_t b = 0; b < who.size(); ++b) pool_.truncate(states_[who[b]->id].table, before[b]);
}

// ---- the adaptive gate ----

bool SpecGate::preferred() const {
  if (!have_[0] || !have_[1]) return true;
  return tokens_ * seconds_[0] >= seconds_[1];  // E / (t_spec / t_plain) >= 1
}

bool SpecGate::speculate_next() const {
  if (!adaptive_) return true;
  const bool pref = preferred();
  const bool explore = passes_ >= kFirstExplore && since_explore_ >= (have_[!pref] ? kExplore : kFirstExplore);
  return explore ? !pref : pref;
}

void SpecGate::record(bool speculated, int64_t sequences, int64_t tokens, double seconds) {
  if (!(seconds > 0) || sequences <= 0) return;
  const bool pref = preferred();
  auto average = [&](double& e, double v) { e = have_[speculated] ? 0.75 * e + 0.25 * v : v; };
  average(seconds_[speculated], seconds);
  if (speculated) average(tokens_, double(tokens) / double(sequences));
  have_[speculated] = true;
  ++passes_;
  if (speculated == pref) ++since_explore_;
  else since_explore_ = 0;
}

// ---- Speculation: the engine's step ----

Speculation::Speculation(Model& model, const SpeculativeOptions& opt, std::shared_ptr<DraftSource> source,
                         LatentPool& pool)
    : model_(model), pool_(pool), opt_(opt), source_(std::move(source)), gate_(opt.adaptive), one_token_ctx_(model.context()) {
  one_token_ctx_.one_token_kernels = true;
  if (opt_.draft_tokens < 1)
    throw std::invalid_argument("speculative decoding needs at least one draft token, got " +
                                std::to_string(opt_.draft_tokens));
  if (!source_) {
    if (!model_.has_mtp())
      throw std::invalid_argument(
          "speculative decoding with MTP: the model has no MTP module loaded (the checkpoint has none, or it was "
          "loaded without it)");
    model_.set_mtp_draft_head(opt_.draft_head);
    source_ = std::make_shared<MtpDrafts>(model_, pool.num_pages(), pool.page_size(), pool.dtype());
  }
}

void Speculation::shape(const Batch& batch, std::vector<SeqSlice>& slices, ForwardOptions& fo) {
  const size_t parts = batch.parts.size();
  drafts_.assign(parts, 0);
  logits_last_.resize(parts);
  first_row_.resize(parts);
  pos0_.resize(parts);
  first_token_.resize(parts);
  new_tokens_.resize(parts);
  verify_ids_.resize(parts);
  prefill_rows_ = any_drafts_ = false;
  int64_t tokens = 0, logits_rows = 0;
  for (size_t b = 0; b < parts; ++b) {
    Sequence& s = *batch.parts[b].seq;
    const int64_t n = batch.parts[b].n, pending = s.pending();
    pos0_[b] = s.table.length;
    new_tokens_[b] = n;
    first_token_[b] = tokens;
    first_row_[b] = logits_rows;
    tokens += n;
    if (pending == 1 && n > 1) {  // the pending token and n - 1 drafts
      drafts_[b] = n - 1;
      any_drafts_ = true;
      auto& ids = verify_ids_[b];
      ids.assign(1, s.tokens.back());
      ids.insert(ids.end(), s.draft.begin(), s.draft.begin() + drafts_[b]);
      slices[b].ids = ids;
    }
    if (pending > 1) prefill_rows_ = true;
    logits_last_[b] = 1 + drafts_[b];
    logits_rows += logits_last_[b];
  }
  fo.logits_last = logits_last_;
  // Decoding sequences only: every row as a one-token decode step computes it.
  if (!prefill_rows_ && tokens <= opt_.max_verify_rows) {
    fo.context = &one_token_ctx_;
    if (fo.path == AttnPath::Auto) fo.path = AttnPath::Absorb;
  }
  if (source_->wants_hidden()) fo.final_hidden = &hidden_;
  if (any_drafts_ && prefill_rows_) ++counters_.passes_with_prefill;
}

void Speculation::accept(Sequence& s, size_t part, float* rows, RowSampler& sampler) {
  const int64_t k = drafts_[part], n = new_tokens_[part];
  int64_t kept = n;
  if (k > 0) kept = verify(s, rows, k, sampler);
  else if (s.pending() == 0) sampler.sample(s, std::span<float>(rows, size_t(model_.config().vocab_size)));
  // else: a prefill chunk short of the end, no token yet
  if (!s.done)
    source_->observe(s, pos0_[part], n, kept,
                     source_->wants_hidden() ? hidden_.data() + first_token_[part] * model_.config().hidden_size : nullptr);
}

int64_t Speculation::verify(Sequence& s, float* rows, int64_t k, RowSampler& sampler) {
  const size_t vocab = size_t(model_.config().vocab_size);
  std::vector<int32_t> draft = std::move(s.draft);
  std::vector<std::vector<float>> q = std::move(s.draft_probs);
  s.draft.clear();
  s.draft_probs.clear();
  // The pass wrote the rows of the last token and of the k drafts; only the last token's is
  // kept so far, each accepted draft's joins it.
  const int64_t base = s.table.length - (k + 1);
  s.table.length = base + 1;
  ++counters_.steps;
  counters_.draft_tokens += k;
  const bool greedy = s.sampler->params().greedy();
  int64_t accepted = 0;
  for (int64_t j = 0; j <= k; ++j) {
    std::span<float> row(rows + size_t(j) * vocab, vocab);
    sampler.process_row(s, row);
    int32_t id;
    bool ok = false;
    if (j == k) {
      id = s.sampler->sample(row);  // every draft accepted: the bonus token
    } else if (greedy) {
      id = s.sampler->sample(row);
      ok = id == draft[size_t(j)];
    } else {
      const std::vector<float> p = s.sampler->probabilities(row);
      const std::span<const float> qj = size_t(j) < q.size() ? std::span<const float>(q[size_t(j)]) : std::span<const float>();
      ok = accept_draft(p, qj, draft[size_t(j)], s.sampler->draw());
      id = ok ? draft[size_t(j)] : s.sampler->sample_from(residual_distribution(p, qj, draft[size_t(j)]));
    }
    sampler.note_logprob(s, row, id);
    if (ok) {
      ++s.table.length;  // the draft's row is the sequence's now
      ++accepted;
    }
    ++counters_.emitted_tokens;
    if (!sampler.take(s, id) || !ok) break;  // a stop condition, or the target's own token: the end
  }
  counters_.accepted_tokens += accepted;
  if (!s.done) pool_.truncate(s.table, s.table.length);  // rejected rows out, pages past them freed
  return 1 + accepted;
}

void Speculation::end_pass(std::span<Sequence* const> running, int64_t sequences, int64_t tokens, double seconds) {
  // A speculative step costs its pass and the drafting before it.
  if (!prefill_rows_) gate_.record(any_drafts_, sequences, tokens, seconds + (any_drafts_ ? draft_seconds_ : 0.0));
  draft_next(running);
}

void Speculation::draft_next(std::span<Sequence* const> running) {
  std::vector<Sequence*> decoding;
  for (Sequence* s : running)
    if (!s->done && s->pending() == 1) decoding.push_back(s);
  draft_seconds_ = 0;
  const int64_t k = opt_.draft_tokens;
  const bool fits = int64_t(decoding.size()) * (k + 1) <= opt_.max_verify_rows;
  if (decoding.empty() || !fits || !gate_.speculate_next()) {
    for (Sequence* s : decoding) s->draft.clear(), s->draft_probs.clear();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  source_->propose(decoding, k);
  draft_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  counters_.draft_seconds += draft_seconds_;
}

void Speculation::forget(Sequence& s) {
  source_->forget(s);
  s.draft.clear();
  s.draft_probs.clear();
}

}  // namespace mla
