// The MTP module's forward pass over a ragged batch (see mtp.h).
#include "model/mtp.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"
#include "model/model.h"

namespace mla {

void mtp_input(const cpu::Context& ctx, const MtpWeights& m, const float* emb, const float* hidden, int64_t T,
               int64_t D, float eps, float* x) {
  cpu::rmsnorm(ctx, emb, T, D, D, m.enorm.data(), eps, x, 2 * D);
  cpu::rmsnorm(ctx, hidden, T, D, D, m.hnorm.data(), eps, x + D, 2 * D);
}

LatentPool Model::make_mtp_pool(int64_t num_pages, int64_t page_size, KvDType dtype) const {
  return LatentPool(1, cfg_.kv_lora_rank, cfg_.qk_rope_head_dim, num_pages, page_size, dtype);
}

void Model::mtp_forward(std::span<const MtpSlice> batch, LatentPool& pool, bool last_only, std::vector<float>& logits,
                        std::vector<float>* out_hidden, const cpu::Context* ctx) {
  if (w_.mtp.empty()) throw std::logic_error("mtp_forward: the model has no MTP module loaded");
  pass_ctx_ = ctx ? ctx : &ctx_;
  const cpu::Context& cx = this->ctx();
  const ModelConfig& c = cfg_;
  const MtpWeights& M = w_.mtp[0];
  const LayerWeights& W = M.layer;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, qk = c.qk_head_dim(), vd = c.v_head_dim;
  const float eps = float(c.rms_norm_eps);
  if (pool.num_layers() != 1 || pool.row_dim() != c.latent_dim())
    throw std::invalid_argument("mtp_forward: the MTP pool's geometry does not match the model");
  auto& slices = mtp_slices_;
  slices.clear();
  for (auto& s : batch) slices.push_back({s.seq, s.ids});
  ForwardScratch& f = mtp_fwd_;
  admit(slices, pool, "MTP cache", f.first);
  const int64_t T = f.first.back();
  f.pos.resize(size_t(T));
  for (size_t b = 0; b < batch.size(); ++b)
    for (int64_t i = 0; i < int64_t(batch[b].ids.size()); ++i) f.pos[size_t(f.first[b] + i)] = batch[b].pos0 + i;
  // Shown to the observer as a pass; the module's input (embeddings, norms, eh_proj) is Other.
  if (observer_) observer_->begin_pass(PassShape{int64_t(batch.size()), T, 0, AttnPath::Absorb, false});
  enter(ForwardProfile::Other);
  // Embeddings and the main model's hidden states, side by side, through eh_proj.
  f.x.resize(size_t(T * D));
  f.xn.resize(size_t(T * 2 * D));
  f.delta.resize(size_t(T * D));
  for (size_t b = 0; b < batch.size(); ++b)
    for (int64_t i = 0; i < int64_t(batch[b].ids.size()); ++i)
      w_.embed.dequant_row(batch[b].ids[size_t(i)], f.x.data() + (f.first[b] + i) * D);
  for (size_t b = 0; b < batch.size(); ++b)
    std::copy(batch[b].hidden, batch[b].hidden + int64_t(batch[b].ids.size()) * D, f.delta.data() + f.first[b] * D);
  mtp_input(cx, M, f.x.data(), f.delta.data(), T, D, eps, f.xn.data());
  f.h.resize(size_t(T * D));
  cpu::matmul(cx, f.xn.data(), T, M.eh_proj, f.h.data());

  // The decoder layer, as Model::forward runs one, on the absorbed path over the MTP cache.
  f.q.resize(size_t(T * H * qk));
  f.kv.resize(size_t(T * c.latent_dim()));
  f.attn.resize(size_t(T * H * vd));
  const Pass p{slices, pool, f, T, MlaForm::Absorb, 0, false};
  attention_block(p, W, 0);
  ffn_block(p, W);
  for (auto& s : batch) s.seq->length += int64_t(s.ids.size());

  // shared_head: norm, then the head on the rows asked for.
  enter(ForwardProfile::LmHead);
  f.xn.resize(size_t(T * D));
  cpu::rmsnorm(cx, f.h.data(), T, D, D, M.head_norm.data(), eps, f.xn.data(), D);
  if (out_hidden) out_hidden->assign(f.xn.begin(), f.xn.begin() + T * D);
  ForwardOptions rows;
  rows.last_logits_only = last_only;
  logits_rows(p, rows);
  f.x.resize(f.rows.size() * size_t(D));
  for (size_t r = 0; r < f.rows.size(); ++r)
    std::copy(f.xn.begin() + f.rows[r] * D, f.xn.begin() + (f.rows[r] + 1) * D, f.x.begin() + int64_t(r) * D);
  logits.resize(f.rows.size() * size_t(c.vocab_size));
  cpu::matmul(cx, f.x.data(), int64_t(f.rows.size()), mtp_draft_head(), logits.data());
  if (observer_) observer_->end_pass();
  pass_ctx_ = &ctx_;
}

const MatrixView& Model::mtp_draft_head() const {
  if (w_.mtp.empty()) throw std::logic_error("mtp_draft_head: the model has no MTP module loaded");
  return mtp_head_copy_ ? mtp_head_view_ : w_.mtp[0].head;
}

double Model::set_mtp_draft_head(quant::QuantFormat f) {
  if (w_.mtp.empty()) throw std::logic_error("set_mtp_draft_head: the model has no MTP module loaded");
  const MatrixView& head = w_.mtp[0].head;
  const WeightFormat want = f == quant::QuantFormat::INT4  ? WeightFormat::INT4_GROUP
                            : f == quant::QuantFormat::FP8 ? WeightFormat::FP8_BLOCK128
                                                           : head.format;
  // INT4 groups need whole groups of 32 per row: another width keeps the head as stored.
  if (want == head.format || (want == WeightFormat::INT4_GROUP && head.cols % 32 != 0)) {
    mtp_head_copy_.reset();
    return 0;
  }
  if (mtp_head_copy_ && mtp_head_copy_->format == want) return std::sqrt(mtp_head_copy_->err2 / mtp_head_copy_->ref2);
  mtp_head_copy_ = std::make_unique<quant::QuantizedMatrix>(
      quant::quantize_matrix(head, f, quant::ScaleRule::Search, 32, ctx_.threads));
  mtp_head_view_ = mtp_head_copy_->view();
  return mtp_head_copy_->ref2 > 0 ? std::sqrt(mtp_head_copy_->err2 / mtp_head_copy_->ref2) : 0;
}

}  // namespace mla
