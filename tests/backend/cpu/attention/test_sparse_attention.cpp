// The sparse attention kernels (sparse_attention.h) held to the plain references over many
// shapes and random selections: each query's result equals dense attention over its own listed
// keys (the reference on the compacted rows); a selection of every causal position equals the
// dense causal kernels; the expand form over key ranges merges to the whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/attention/attention_reference.h"
#include "backend/cpu/sparse_attention.h"
#include "test_util.h"

namespace mla::cpu {
namespace {

using test::randn;

struct Selection {
  std::vector<int32_t> pos;
  std::vector<int64_t> count;
  int64_t ld = 0;
  KeySelection view() const { return {pos.data(), ld, count.data()}; }
};

// Query t at position q_pos0 + t keeps min(k, visible) random positions of [0, q_pos0 + t]; with
// k >= every visible count, all of them.
Selection random_selection(std::mt19937& g, int64_t T, int64_t q_pos0, int64_t k) {
  Selection s;
  s.ld = k;
  s.pos.assign(static_cast<size_t>(T * k), -1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t vis = q_pos0 + t + 1;
    std::vector<int32_t> all(static_cast<size_t>(vis));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), g);
    const int64_t n = std::min(k, vis);
    std::sort(all.begin(), all.begin() + n);
    std::copy(all.begin(), all.begin() + n, s.pos.begin() + t * k);
    s.count.push_back(n);
  }
  return s;
}

TEST(SparseAttention, AbsorbEqualsDenseOverEachQuerysRows) {
  std::mt19937 g(3);
  const Context ctx;
  for (auto [T, S, H, kvr, rope, k] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {1, 40, 4, 32, 16, 8}, {5, 70, 3, 64, 16, 17}, {12, 12, 2, 32, 8, 4}, {3, 300, 8, 128, 32, 64}}) {
    const int64_t dim = kvr + rope, q_pos0 = S - T;
    auto lat = randn(g, static_cast<size_t>(S * dim));
    auto q_lat = randn(g, static_cast<size_t>(T * H * kvr), 0.3f), q_pe = randn(g, static_cast<size_t>(T * H * rope), 0.3f);
    Selection sel = random_selection(g, T, q_pos0, k);
    SparseAbsorbArgs a{q_lat.data(), q_pe.data(), H * rope, rope, T, H, kvr, rope, 0.2f, sel.view(), nullptr};
    a.gather = [&](const int32_t* pos, int64_t n, float* rows) {
      for (int64_t i = 0; i < n; ++i) std::copy(&lat[static_cast<size_t>(pos[i] * dim)], &lat[static_cast<size_t>((pos[i] + 1) * dim)], rows + i * dim);
    };
    std::vector<float> out(static_cast<size_t>(T * H * kvr)), lse(static_cast<size_t>(T * H));
    attention_absorb_sparse(ctx, a, out.data(), lse.data());
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = sel.count[static_cast<size_t>(t)];
      std::vector<float> rows(static_cast<size_t>(n * dim));
      a.gather(sel.pos.data() + t * k, n, rows.data());
      AbsorbArgs d{q_lat.data() + t * H * kvr, q_pe.data() + t * H * rope, H * rope, rope, nullptr, 1, n, H, kvr, rope,
                   n - 1, 0, 0.2f};
      std::vector<float> want(static_cast<size_t>(H * kvr)), want_lse(static_cast<size_t>(H));
      ref::attention_absorb(d, ref::LatentRows(rows.data(), dim, dim), want.data(), want_lse.data());
      std::vector<float> got(out.begin() + t * H * kvr, out.begin() + (t + 1) * H * kvr);
      std::vector<float> got_lse(lse.begin() + t * H, lse.begin() + (t + 1) * H);
      EXPECT_LE(test::max_abs_diff(got, want), 1e-4f) << "T " << T << " S " << S << " t " << t;
      EXPECT_LE(test::max_abs_diff(got_lse, want_lse), 1e-4f);
    }
  }
}

TEST(SparseAttention, EveryCausalPositionIsDenseAbsorb) {
  std::mt19937 g(5);
  const Context ctx;
  const int64_t T = 6, S = 50, H = 4, kvr = 64, rope = 16, dim = kvr + rope, q_pos0 = S - T;
  auto lat = randn(g, static_cast<size_t>(S * dim));
  auto q_lat = randn(g, static_cast<size_t>(T * H * kvr), 0.3f), q_pe = randn(g, static_cast<size_t>(T * H * rope), 0.3f);
  Selection sel = random_selection(g, T, q_pos0, S);  // k >= S: every visible position
  SparseAbsorbArgs a{q_lat.data(), q_pe.data(), H * rope, rope, T, H, kvr, rope, 0.2f, sel.view(), nullptr};
  a.gather = [&](const int32_t* pos, int64_t n, float* rows) {
    for (int64_t i = 0; i < n; ++i) std::copy(&lat[static_cast<size_t>(pos[i] * dim)], &lat[static_cast<size_t>((pos[i] + 1) * dim)], rows + i * dim);
  };
  std::vector<float> got(static_cast<size_t>(T * H * kvr)), got_lse(static_cast<size_t>(T * H)), want(got.size()), want_lse(got_lse.size());
  attention_absorb_sparse(ctx, a, got.data(), got_lse.data());
  AbsorbArgs d{q_lat.data(), q_pe.data(), H * rope, rope, lat.data(), T, S, H, kvr, rope, q_pos0, 0, 0.2f};
  attention_absorb(ctx, d, want.data(), want_lse.data());
  EXPECT_LE(test::max_abs_diff(got, want), 1e-4f);
  EXPECT_LE(test::max_abs_diff(got_lse, want_lse), 1e-4f);
}

TEST(SparseAttention, ExpandOverRangesMergesToTheReference) {
  std::mt19937 g(7);
  const Context ctx;
  for (auto [T, S, H, nope, rope, v, k] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {4, 30, 3, 16, 8, 12, 6}, {9, 90, 2, 32, 16, 32, 20}, {1, 64, 5, 8, 8, 8, 64}}) {
    const int64_t qk = nope + rope, q_pos0 = S - T;
    auto kv = randn(g, static_cast<size_t>(S * H * (nope + v)));
    auto kpe = randn(g, static_cast<size_t>(S * rope));
    auto q = randn(g, static_cast<size_t>(T * H * qk), 0.3f);
    Selection sel = random_selection(g, T, q_pos0, k);
    // Whole, and in three key ranges merged by log-sum-exp.
    std::vector<float> whole(static_cast<size_t>(T * H * v)), whole_lse(static_cast<size_t>(T * H));
    ExpandArgs a{q.data(), kv.data(), kpe.data(), rope, T, S, H, nope, rope, v, q_pos0, 0, 0.25f};
    attention_expand_sparse(ctx, a, sel.view(), whole.data(), whole_lse.data());
    std::vector<float> acc(whole.size(), 0.0f), acc_lse(whole_lse.size(), -std::numeric_limits<float>::infinity());
    const int64_t cuts[] = {0, S / 3, S / 2, S};
    for (int r = 0; r < 3; ++r) {
      const int64_t k0 = cuts[r], k1 = cuts[r + 1];
      ExpandArgs ar{q.data(), kv.data() + k0 * H * (nope + v), kpe.data() + k0 * rope, rope, T, k1 - k0, H, nope, rope, v,
                    q_pos0, k0, 0.25f};
      std::vector<float> part(whole.size()), part_lse(whole_lse.size());
      attention_expand_sparse(ctx, ar, sel.view(), part.data(), part_lse.data());
      merge_partial(acc.data(), acc_lse.data(), part.data(), part_lse.data(), T * H, v);
    }
    EXPECT_LE(test::max_abs_diff(acc, whole), 1e-4f);
    // Each query against the reference over its compacted keys.
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = sel.count[static_cast<size_t>(t)];
      std::vector<float> kvc(static_cast<size_t>(n * H * (nope + v))), kpec(static_cast<size_t>(n * rope));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = sel.pos[static_cast<size_t>(t * k + j)];
        std::copy(&kv[static_cast<size_t>(p * H * (nope + v))], &kv[static_cast<size_t>((p + 1) * H * (nope + v))], &kvc[static_cast<size_t>(j * H * (nope + v))]);
        std::copy(&kpe[static_cast<size_t>(p * rope)], &kpe[static_cast<size_t>((p + 1) * rope)], &kpec[static_cast<size_t>(j * rope)]);
      }
      ExpandArgs d{q.data() + t * H * qk, kvc.data(), kpec.data(), rope, 1, n, H, nope, rope, v, n - 1, 0, 0.25f};
      std::vector<float> want(static_cast<size_t>(H * v)), want_lse(static_cast<size_t>(H));
      ref::attention_expand(d, want.data(), want_lse.data());
      std::vector<float> got(whole.begin() + t * H * v, whole.begin() + (t + 1) * H * v);
      EXPECT_LE(test::max_abs_diff(got, want), 1e-4f) << "t " << t;
    }
  }
}

// The model-level reference (mla_naive_sparse) with every causal position is mla_naive.
TEST(SparseAttention, NaiveSparseWithEveryPositionIsNaive) {
  std::mt19937 g(9);
  const int64_t T = 5, S = 20, H = 3, nope = 8, rope = 8, v = 8, kvr = 16, dim = kvr + rope;
  auto lat = randn(g, static_cast<size_t>(S * dim));
  auto kv_b = randn(g, static_cast<size_t>(H * (nope + v) * kvr), 0.3f);
  auto q = randn(g, static_cast<size_t>(T * H * (nope + rope)), 0.3f);
  const ref::MlaProblem p{q.data(), kv_b.data(), T, S, H, nope, rope, v, kvr, S - T, 0, 0.3f};
  Selection all = random_selection(g, T, S - T, S);
  std::vector<float> a(static_cast<size_t>(T * H * v)), b(a.size()), la(static_cast<size_t>(T * H)), lb(la.size());
  ref::mla_naive(p, ref::LatentRows(lat.data(), dim, dim), a.data(), la.data());
  ref::mla_naive_sparse(p, ref::LatentRows(lat.data(), dim, dim), all.view(), b.data(), lb.data());
  EXPECT_LE(test::max_abs_diff(a, b), 1e-6f);
  Selection some = random_selection(g, T, S - T, 4);
  ref::mla_naive_sparse(p, ref::LatentRows(lat.data(), dim, dim), some.view(), b.data(), lb.data());
  EXPECT_GT(test::max_abs_diff(a, b), 1e-3f);  // a real subset changes the result
}

}  // namespace
}  // namespace mla::cpu
