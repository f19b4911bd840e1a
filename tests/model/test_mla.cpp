// The model's MLA attention unit (model/mla.h): each form (expand, chunked, absorb) of a ragged
// batch over a poisoned latent pool with random page tables, against the naive reference in
// double (backend/cpu/attention_reference.h) reading the same pages; f32, bf16 and fp8 pools.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention/attention_reference.h"
#include "model/mla.h"
#include "model/random_mla_layer.h"

namespace mla {
namespace {

struct Seq {
  int64_t cached, n;
};

// Runs `form` over a batch of sequences and returns max |form - reference| / max |reference|.
double form_vs_reference(MlaForm form, KvDType dtype, int64_t page_size, const std::vector<Seq>& seqs, int64_t H,
                         int64_t chunk = 16) {
  const int64_t kvr = 192, rope = 32, nope = 64, v = 48, qk = nope + rope;
  test::RandomMlaLayer layer(H, kvr, rope, nope, v, 11);
  std::mt19937 rng(uint32_t(page_size * 5 + int(dtype)));
  std::vector<int64_t> lengths;
  int64_t pages = 1, T = 0;
  for (auto& s : seqs) {
    lengths.push_back(s.cached + s.n);
    pages += (s.cached + s.n + page_size - 1) / page_size;
    T += s.n;
  }
  LatentPool pool(2, kvr, rope, pages, page_size, dtype);
  test::poison_pool(pool);
  auto tables = test::random_page_tables(pool, lengths, rng);
  for (size_t b = 0; b < seqs.size(); ++b) {
    test::fill_rows(pool, 1, tables[b], lengths[b], kvr, rng);
    tables[b].length = seqs[b].cached;  // the new tokens' rows are written, not yet counted
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(size_t(T * H * qk));
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> ids(static_cast<size_t>(T), 0);
  std::vector<SeqSlice> batch;
  std::vector<int64_t> first{0};
  for (size_t b = 0; b < seqs.size(); ++b) {
    batch.push_back({&tables[b], std::span<const int32_t>(ids.data() + first.back(), size_t(seqs[b].n))});
    first.push_back(first.back() + seqs[b].n);
  }
  MlaAttention unit(layer.cfg);
  std::vector<float> got(size_t(T * H * v), -7.0f), want(got.size());
  unit.attend(cpu::Context{}, layer.W, pool, 1, batch, first.data(), form, chunk, q.data(), got.data());
  for (size_t b = 0; b < seqs.size(); ++b) {
    const cpu::ref::MlaProblem p{q.data() + first[b] * H * qk, layer.kv_b.data(), seqs[b].n, lengths[b], H, nope, rope,
                                 v, kvr, seqs[b].cached, 0, float(layer.cfg.softmax_scale())};
    std::vector<float> lse(size_t(seqs[b].n * H));
    cpu::ref::mla_naive(p, cpu::ref::LatentRows(pool, 1, tables[b]), want.data() + first[b] * H * v, lse.data());
  }
  double maxdiff = 0, maxabs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    maxdiff = std::max(maxdiff, double(std::fabs(got[i] - want[i])));
    maxabs = std::max(maxabs, double(std::fabs(want[i])));
  }
  EXPECT_GT(maxabs, 0.0);
  return maxdiff / maxabs;
}

const char* form_name(MlaForm f) {
  switch (f) {
    case MlaForm::Expand: return "expand";
    case MlaForm::Chunked: return "chunked";
    case MlaForm::Absorb: return "absorb";
    case MlaForm::Reference: return "reference";
  }
  return "?";
}

// Every form computes with float32 products of at most kv_lora = 192 terms chained three deep
// (q_nope~ or k_nope, the scores, W_UV's product): lambda sqrt(192) u = 3.3e-6 of each product's
// absolute terms per product (lambda = 4, u = 2^-24), and those terms run up to a few times the
// result on these Gaussian inputs: 3e-5 of the outputs' scale covers three of them with that
// factor; a wrong mask, page or scale moves outputs by 1e-2 and more.
constexpr double kFormTol = 3e-5;

TEST(MlaUnit, EveryFormMatchesTheNaiveReferenceOverARaggedPagedBatch) {
  // Prefill, a decode step, an extend, an empty sequence's neighbour and a long cached prefix
  // (chunks of 16 keys, a partial last chunk).
  const std::vector<Seq> seqs = {{0, 9}, {30, 1}, {0, 0}, {21, 5}, {53, 3}};
  for (MlaForm form : {MlaForm::Expand, MlaForm::Chunked, MlaForm::Absorb})
    for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8})
      for (int64_t page : {1, 4, 64}) {
        SCOPED_TRACE(std::string(form_name(form)) + " " + kv_dtype_name(dt) + " page " + std::to_string(page));
        EXPECT_LT(form_vs_reference(form, dt, page, seqs, 4), kFormTol);
      }
}

TEST(MlaUnit, ReferenceFormIsTheReference) {
  EXPECT_LT(form_vs_reference(MlaForm::Reference, KvDType::FP8, 4, {{5, 3}, {0, 4}}, 2), 1e-6);
}

TEST(MlaUnit, ChunkOfOneKeyAndChunkPastThePrefix) {
  for (int64_t chunk : {1, 1000}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    EXPECT_LT(form_vs_reference(MlaForm::Chunked, KvDType::BF16, 8, {{13, 4}, {2, 1}}, 3, chunk), kFormTol);
  }
}

TEST(MlaUnit, FormOfPath) {
  EXPECT_EQ(mla_form(AttnPath::Expand), MlaForm::Expand);
  EXPECT_EQ(mla_form(AttnPath::Chunked), MlaForm::Chunked);
  EXPECT_EQ(mla_form(AttnPath::Absorb), MlaForm::Absorb);
  EXPECT_THROW(mla_form(AttnPath::Auto), std::invalid_argument);
}

}  // namespace
}  // namespace mla
