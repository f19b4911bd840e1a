// Every fast CPU attention kernel held to its plain reference (backend/cpu/attention_reference.h)
// over many shapes: heads, new tokens T, cached prefix, key counts, page sizes, ragged
// sequences sharing a pool, f32 / bf16 / fp8 pages. Unused page slots hold NaN and page tables
// are random (FlashMLA's habit): a kernel reading a row it should not returns NaN. A kernel the
// CPU cannot run is a reported skip, never a pass through another kernel.
//
// Tolerances (u = 2^-24, float32's unit roundoff; lambda = 4, the probabilistic rounding-error
// bound of Higham and Mary, which holds but with probability ~1e-7 per sum):
//  score s = scale q.k over d terms in float32: |ds| <= lambda sqrt(d) u scale |q| |k|;
//  p = exp(s - lse): relative error <= 2 |ds| + 2^-20 (the vectorised exp) + the sum's
//  lambda sqrt(S) u; the output, a p-weighted mean of the values, moves by at most that times
//  max |v|; lse by |ds| + 2^-20 + lambda sqrt(S) u. The bf16 kernel's own bound is at its test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/attention/attention_reference.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/ops.h"
#include "kv/latent_pool.h"
#include "model/random_mla_layer.h"

namespace mla {
namespace {

constexpr double kU = 1.0 / (1 << 24), kLambda = 4, kExpErr = 1.0 / (1 << 20);

double norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

// The float32 bound above for queries of norm <= q_norm, keys of norm <= k_norm, values of
// magnitude <= v_max, d terms per score and S keys: {output tolerance, lse tolerance}.
std::pair<double, double> f32_bounds(double q_norm, double k_norm, double v_max, int64_t d, int64_t S, double scale) {
  const double ds = kLambda * std::sqrt(double(d)) * kU * scale * q_norm * k_norm;
  const double sum = kLambda * std::sqrt(double(S)) * kU;
  return {(2 * ds + kExpErr + sum) * v_max + 1e-30, ds + kExpErr + sum};
}

struct Diff {
  double max_abs = 0;
  int64_t bad = 0, nan = 0, first_bad = -1;
};
Diff diff(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  Diff d;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i]) || (std::isinf(want[i]) && got[i] != want[i])) {
      ++d.nan;
      if (d.first_bad < 0) d.first_bad = int64_t(i);
      continue;
    }
    if (std::isinf(want[i])) continue;
    const double e = std::fabs(double(got[i]) - double(want[i]));
    d.max_abs = std::max(d.max_abs, e);
    if (e > tol) {
      ++d.bad;
      if (d.first_bad < 0) d.first_bad = int64_t(i);
    }
  }
  return d;
}

#define EXPECT_CLOSE(got, want, tol, what)                                                                  \
  do {                                                                                                      \
    const Diff d_ = diff(got, want, tol);                                                                   \
    if (std::getenv("MLA_TEST_SHOW_ERRORS"))                                                                \
      std::printf("%s: max |error| %.3e, tolerance %.3e\n", what, d_.max_abs, double(tol));                 \
    EXPECT_EQ(d_.nan, 0) << what << ": NaN or inf where the reference has none (first at " << d_.first_bad \
                         << ")";                                                                            \
    EXPECT_EQ(d_.bad, 0) << what << ": max |error| " << d_.max_abs << " > tolerance " << (tol)             \
                         << " (first at " << d_.first_bad << ")";                                           \
  } while (0)

// A context of n threads (the precise precision, as every kernel here is checked in float32).
cpu::Context threads(int n) {
  cpu::Context ctx;
  ctx.threads = n;
  return ctx;
}
const cpu::Context kOneThread = threads(1);

// ---- absorb --------------------------------------------------------------------------------

struct AbsorbCase {
  int64_t H, kvr, rope, T, cached, page_size;
  KvDType dtype;
  int threads;
};

std::string name(const AbsorbCase& c) {
  return "H" + std::to_string(c.H) + " kvr" + std::to_string(c.kvr) + " rope" + std::to_string(c.rope) + " T" +
         std::to_string(c.T) + " cached" + std::to_string(c.cached) + " page" + std::to_string(c.page_size) + " " +
         kv_dtype_name(c.dtype) + " threads" + std::to_string(c.threads);
}

// Two ragged sequences in one poisoned pool of c's geometry and dtype, with random page tables
// and random rows in layer 1: `other` keys, then the attended one's cached + T.
struct TwoSequences {
  LatentPool pool;
  std::vector<PageTable> tables;
};
TwoSequences two_sequences(const AbsorbCase& c, int64_t other, std::mt19937& rng) {
  const int64_t S = c.cached + c.T;
  const int64_t pages = (S + c.page_size - 1) / c.page_size + (other + c.page_size - 1) / c.page_size + 2;
  TwoSequences t{LatentPool(2, c.kvr, c.rope, pages, c.page_size, c.dtype), {}};
  test::poison_pool(t.pool);
  t.tables = test::random_page_tables(t.pool, {other, S}, rng);
  test::fill_rows(t.pool, 1, t.tables[0], other, c.kvr, rng);
  test::fill_rows(t.pool, 1, t.tables[1], S, c.kvr, rng);
  return t;
}

// The second of two sequences (two_sequences) is attended, from the pool through the gather
// callback and from its gathered rows.
void check_absorb(const AbsorbCase& c) {
  SCOPED_TRACE(name(c));
  const cpu::Context ctx = threads(c.threads);
  std::mt19937 rng(uint32_t(c.H * 131 + c.T * 17 + c.cached + c.page_size * 7 + int(c.dtype)));
  const int64_t S = c.cached + c.T, dim = c.kvr + c.rope;
  TwoSequences two = two_sequences(c, 2 * S / 3 + 3, rng);
  const LatentPool& pool = two.pool;
  const PageTable& seq = two.tables[1];

  std::normal_distribution<float> nd(0.0f, 1.0f);
  // q_lat and q_pe, q_pe inside rows of [H, 2 rope] (stride between heads 2 rope, as q's layout).
  std::vector<float> q_lat(size_t(c.T * c.H * c.kvr)), q_pe(size_t(c.T * c.H * 2 * c.rope));
  for (auto& x : q_lat) x = nd(rng) * 0.3f;
  for (auto& x : q_pe) x = nd(rng);
  const float scale = 1.0f / std::sqrt(float(192));
  cpu::AbsorbArgs a{q_lat.data(), q_pe.data() + c.rope, c.H * 2 * c.rope, 2 * c.rope, nullptr, c.T, S, c.H, c.kvr,
                    c.rope, c.cached, 0, scale};
  std::vector<float> want(size_t(c.T * c.H * c.kvr)), want_lse(size_t(c.T * c.H));
  cpu::ref::attention_absorb(a, cpu::ref::LatentRows(pool, 1, seq), want.data(), want_lse.data());

  std::vector<float> rows(size_t(S * dim));
  pool.gather(1, seq, 0, S, rows.data());
  double q_norm = 0, k_norm = 0, v_max = 0;
  std::vector<float> qrow(static_cast<size_t>(dim));
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      std::copy_n(q_lat.data() + (t * c.H + h) * c.kvr, c.kvr, qrow.data());
      std::copy_n(a.q_pe + t * a.ld_qpe + h * a.head_stride_qpe, c.rope, qrow.data() + c.kvr);
      q_norm = std::max(q_norm, norm(qrow.data(), dim));
    }
  for (int64_t j = 0; j < S; ++j) {
    k_norm = std::max(k_norm, norm(rows.data() + j * dim, dim));
    for (int64_t i = 0; i < c.kvr; ++i) v_max = std::max(v_max, double(std::fabs(rows[size_t(j * dim + i)])));
  }
  const auto [tol, lse_tol] = f32_bounds(q_norm, k_norm, v_max, dim, S, scale);

  for (bool paged : {true, false}) {
    SCOPED_TRACE(paged ? "keys gathered from the pages block by block" : "keys as one array");
    cpu::AbsorbArgs b = a;
    if (paged) b.gather = [&](int64_t s0, int64_t n, float* out) { pool.gather(1, seq, s0, n, out); };
    else b.latent = rows.data();
    std::vector<float> got(want.size(), -7.0f), got_lse(want_lse.size(), -7.0f);
    cpu::attention_absorb(ctx, b, got.data(), got_lse.data());
    EXPECT_CLOSE(got, want, tol, "out_lat");
    EXPECT_CLOSE(got_lse, want_lse, lse_tol, "lse");
  }
}

TEST(AttentionAbsorb, MatchesTheReferenceOverShapesAndPages) {
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8})
    for (int64_t page : {1, 7, 64})
      for (const auto& [H, T, cached] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 1, 0}, {16, 1, 37}, {3, 5, 250}, {8, 17, 40}, {2, 40, 0}})
        check_absorb({H, 512, 64, T, cached, page, dt, 1});
  // A latent that is not a whole number of fp8 scale blocks, a short rope part.
  for (KvDType dt : {KvDType::F32, KvDType::FP8}) check_absorb({4, 192, 16, 6, 300, 16, dt, 1});
}

// From 1024 keys on the kernel splits the key blocks across the threads and merges the partial
// results by log-sum-exp; the new tokens see different key counts.
TEST(AttentionAbsorb, KeysSplitAcrossThreadsMatchTheReference) {
  for (KvDType dt : {KvDType::BF16, KvDType::FP8}) {
    check_absorb({16, 512, 64, 1, 1100, 64, dt, 2});
    check_absorb({4, 512, 64, 3, 2600, 16, dt, 2});
  }
}

// The fast precision's bf16 kernel over a bf16 cache's rows as stored. The keys are exact (the
// cache holds bf16); the scaled queries and the softmax weights are rounded to bf16, a relative
// error uniform within +-2^-9 each. A score's error is then a sum of independent terms q_i k_i
// e_i, rms 2^-9 sqrt(1/3) scale sqrt(sum_i (q_i k_i)^2) <= 2^-9 0.58 scale |q| max|k|; ds = 4
// rms bounds it (as for the AMX expand kernel below). The output moves by 2 ds max|v| through the
// softmax and 2^-9 max|v| from the rounded weights, the lse by ds; the float32 sums add the
// float32 bound above.
void check_absorb_bf16(const AbsorbCase& c) {
  SCOPED_TRACE(name(c));
  cpu::Context ctx = threads(c.threads);
  ctx.precision = cpu::Precision::Fast;
  std::mt19937 rng(uint32_t(c.H * 131 + c.T * 17 + c.cached + c.page_size * 7 + 5));
  const int64_t S = c.cached + c.T, dim = c.kvr + c.rope;
  TwoSequences two = two_sequences(c, S / 2 + 5, rng);
  const LatentPool& pool = two.pool;
  const PageTable& seq = two.tables[1];
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q_lat(size_t(c.T * c.H * c.kvr)), q_pe(size_t(c.T * c.H * c.rope));
  for (auto& x : q_lat) x = nd(rng) * 0.3f;
  for (auto& x : q_pe) x = nd(rng);
  const float scale = 1.0f / std::sqrt(float(192));
  cpu::AbsorbArgs a{q_lat.data(), q_pe.data(), c.H * c.rope, c.rope, nullptr, c.T, S, c.H, c.kvr, c.rope, c.cached, 0, scale};
  std::vector<float> want(size_t(c.T * c.H * c.kvr)), want_lse(size_t(c.T * c.H));
  cpu::ref::attention_absorb(a, cpu::ref::LatentRows(pool, 1, seq), want.data(), want_lse.data());
  a.gather = [&](int64_t s0, int64_t n, float* out) { pool.gather(1, seq, s0, n, out); };
  a.gather_bf16 = [&](int64_t s0, int64_t n, uint16_t* out) { pool.gather_bf16(1, seq, s0, n, out); };
  ASSERT_EQ(cpu::absorb_kernel(ctx, a), cpu::AbsorbKernel::Dpbf16);

  std::vector<float> rows(size_t(S * dim)), qrow(static_cast<size_t>(dim));
  pool.gather(1, seq, 0, S, rows.data());
  double q_norm = 0, k_norm = 0, k_max = 0, v_max = 0;
  for (int64_t r = 0; r < c.T * c.H; ++r) {
    std::copy_n(q_lat.data() + r * c.kvr, c.kvr, qrow.data());
    std::copy_n(q_pe.data() + r * c.rope, c.rope, qrow.data() + c.kvr);
    q_norm = std::max(q_norm, norm(qrow.data(), dim));
  }
  for (int64_t j = 0; j < S; ++j) {
    k_norm = std::max(k_norm, norm(rows.data() + j * dim, dim));
    for (int64_t i = 0; i < dim; ++i) k_max = std::max(k_max, double(std::fabs(rows[size_t(j * dim + i)])));
    for (int64_t i = 0; i < c.kvr; ++i) v_max = std::max(v_max, double(std::fabs(rows[size_t(j * dim + i)])));
  }
  const auto [tol, lse_tol] = f32_bounds(q_norm, k_norm, v_max, dim, S, scale);
  const double ds = 4 * std::ldexp(1.0, -9) * 0.58 * scale * q_norm * k_max;
  std::vector<float> got(want.size(), -7.0f), got_lse(want_lse.size(), -7.0f);
  cpu::attention_absorb(ctx, a, got.data(), got_lse.data());
  EXPECT_CLOSE(got, want, tol + (2 * ds + std::ldexp(1.0, -9)) * v_max, "out_lat");
  EXPECT_CLOSE(got_lse, want_lse, lse_tol + ds, "lse");
  // Sharper: against the reference on the queries the kernel multiplies (scaled, rounded to bf16,
  // scaled back), only the weights' rounding is left: the output within 2^-9 max|v| of it, the
  // lse (summed from the unrounded weights) within the float32 bound. A key left out of either
  // product, or a wrong one in it, moves the lse or the output past these.
  std::vector<float> q_lat_r(q_lat), q_pe_r(q_pe);
  for (auto* v : {&q_lat_r, &q_pe_r})
    for (auto& x : *v) x = bf16_to_f32(f32_to_bf16(x * scale)) / scale;
  cpu::AbsorbArgs r = a;
  r.q_lat = q_lat_r.data(), r.q_pe = q_pe_r.data();
  std::vector<float> want_r(want.size()), want_r_lse(want_lse.size());
  cpu::ref::attention_absorb(r, cpu::ref::LatentRows(pool, 1, seq), want_r.data(), want_r_lse.data());
  EXPECT_CLOSE(got, want_r, tol + std::ldexp(1.0, -9) * v_max, "out_lat against the rounded queries");
  EXPECT_CLOSE(got_lse, want_r_lse, lse_tol, "lse against the rounded queries");
  // The bf16 kernel ran, not the float32 one: their lse differ (one key's output is that key's
  // row in both).
  std::vector<float> f32(want.size()), f32_lse(want_lse.size());
  cpu::attention_absorb(threads(c.threads), a, f32.data(), f32_lse.data());
  EXPECT_GT(diff(got_lse, f32_lse, 0).max_abs, 0.0);
  // The rows read where they lie (pages of whole groups of 32 keys, as the model does): the same
  // products of the same values in the same order, so the same bits as over the copies.
  if (c.page_size % 32 == 0) {
    cpu::AbsorbArgs in_place = a;
    in_place.gather_bf16 = nullptr;
    in_place.bf16_rows = [&](int64_t s) { return pool.bf16_row(1, seq, s); };
    ASSERT_EQ(cpu::absorb_kernel(ctx, in_place), cpu::AbsorbKernel::Dpbf16);
    std::vector<float> got2(want.size(), -7.0f), got2_lse(want_lse.size(), -7.0f);
    cpu::attention_absorb(ctx, in_place, got2.data(), got2_lse.data());
    EXPECT_EQ(got2, got);
    EXPECT_EQ(got2_lse, got_lse);
  }
}

// Decode (one token of 16, 20 or 128 heads: 20 leaves a block of 4 query rows), a verify pass's
// few tokens, a prompt's many, page sizes that cut the key blocks anywhere, key counts that leave
// a partial block of 32 and an odd last key, the split across threads from 1024 keys on, 8k keys,
// and a small latent (kv_lora 64, rope 32).
TEST(AttentionAbsorb, Bf16KernelOnABf16CacheMatchesTheReference) {
  for (const auto& [H, T, cached, page, thr] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>>{
           {16, 1, 0, 64, 1}, {16, 1, 37, 7, 1}, {128, 1, 300, 64, 1}, {16, 2, 255, 16, 1}, {3, 5, 250, 1, 1},
           {8, 17, 40, 64, 1}, {16, 1, 1100, 64, 2}, {4, 3, 2600, 16, 2}, {20, 1, 700, 32, 2}, {16, 1, 8190, 64, 2}})
    check_absorb_bf16({H, 512, 64, T, cached, page, KvDType::BF16, thr});
  check_absorb_bf16({4, 64, 32, 6, 301, 16, KvDType::BF16, 1});
}

// The bf16 kernel runs only in the fast precision, over a bf16 cache's rows, where its shapes
// allow; everything else stays on float32.
TEST(AttentionAbsorb, KernelChoice) {
  cpu::AbsorbArgs a{nullptr, nullptr, 0, 0, nullptr, 1, 1, 16, 512, 64, 0, 0, 1.0f};
  cpu::Context fast;
  fast.precision = cpu::Precision::Fast;
  EXPECT_EQ(cpu::absorb_kernel(fast, a), cpu::AbsorbKernel::F32);  // no bf16 rows to read
  a.gather_bf16 = [](int64_t, int64_t, uint16_t*) {};
  EXPECT_EQ(cpu::absorb_kernel(fast, a), cpu::AbsorbKernel::Dpbf16);
  EXPECT_EQ(cpu::absorb_kernel(cpu::Context{}, a), cpu::AbsorbKernel::F32);  // precise: float32 always
  a.rope = 16;  // 528 values a row: not a multiple of 32
  EXPECT_EQ(cpu::absorb_kernel(fast, a), cpu::AbsorbKernel::F32);
  a.rope = 56, a.kv_lora = 520;  // 576 values a row, but kv_lora not a multiple of 16
  EXPECT_EQ(cpu::absorb_kernel(fast, a), cpu::AbsorbKernel::F32);
  LatentPool fp8(1, 512, 64, 2, 64, KvDType::FP8);
  PageTable seq;
  std::vector<uint16_t> out(576);
  EXPECT_THROW(fp8.gather_bf16(0, seq, 0, 1, out.data()), std::logic_error);
  EXPECT_THROW(fp8.bf16_row(0, seq, 0), std::logic_error);
  // Rows in place instead of copies choose the same kernel.
  a.rope = 64, a.kv_lora = 512;
  a.gather_bf16 = nullptr;
  a.bf16_rows = [](int64_t) -> const uint16_t* { return nullptr; };
  EXPECT_EQ(cpu::absorb_kernel(fast, a), cpu::AbsorbKernel::Dpbf16);
}

// ---- expand --------------------------------------------------------------------------------

struct ExpandProblem {
  int64_t T, S, H, nope, rope, v, q_pos0, k_pos0;
  std::vector<float> q, kvx, kpe;  // q [T, H, nope + rope], kvx [S, H, nope + v], kpe [S, rope + 3]
  cpu::ExpandArgs args() const {
    return {q.data(), kvx.data(), kpe.data(), rope + 3, T, S, H, nope, rope, v, q_pos0, k_pos0,
            1.0f / std::sqrt(float(nope + rope))};
  }
  ExpandProblem(int64_t T_, int64_t S_, int64_t H_, int64_t nope_, int64_t rope_, int64_t v_, int64_t q_pos0_,
                int64_t k_pos0_, uint32_t seed)
      : T(T_), S(S_), H(H_), nope(nope_), rope(rope_), v(v_), q_pos0(q_pos0_), k_pos0(k_pos0_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(size_t(T * H * (nope + rope)));
    kvx.resize(size_t(S * H * (nope + v)));
    kpe.resize(size_t(S * (rope + 3)));
    for (auto* x : {&q, &kvx, &kpe})
      for (auto& e : *x) e = nd(rng);
  }
  std::pair<double, double> f32_tolerance() const {
    const int64_t qk = nope + rope, hd = nope + v;
    double qn = 0, kn = 0, vm = 0;
    for (int64_t r = 0; r < T * H; ++r) qn = std::max(qn, norm(q.data() + r * qk, qk));
    std::vector<float> k(static_cast<size_t>(qk));
    for (int64_t j = 0; j < S; ++j)
      for (int64_t h = 0; h < H; ++h) {
        const float* kv = kvx.data() + (j * H + h) * hd;
        std::copy_n(kv, nope, k.data());
        std::copy_n(kpe.data() + j * (rope + 3), rope, k.data() + nope);
        kn = std::max(kn, norm(k.data(), qk));
        for (int64_t i = 0; i < v; ++i) vm = std::max(vm, double(std::fabs(kv[nope + i])));
      }
    return f32_bounds(qn, kn, vm, qk, S, args().scale);
  }
};

struct ExpandShape {
  int64_t T, S, H, nope, rope, v, q_pos0, k_pos0;
};
// Prefill (q_pos0 = 0 over S = T keys), extends, decode, a key range that starts later (a chunk
// of the cached prefix: k_pos0 > 0), ranges some queries see none of, more than one block of 64
// query rows, odd head sizes, and DeepSeek-V3's own (qk 192, v 128).
const std::vector<ExpandShape> kExpandShapes = {
    {1, 1, 1, 32, 16, 32, 0, 0},       {7, 7, 3, 32, 16, 32, 0, 0},      {1, 300, 4, 64, 32, 64, 299, 0},
    {5, 45, 2, 48, 16, 40, 40, 0},     {70, 70, 2, 32, 32, 32, 0, 0},    {150, 200, 4, 128, 64, 128, 50, 0},
    {9, 30, 3, 32, 32, 32, 60, 30},    {9, 30, 3, 32, 32, 32, 35, 30},   {4, 16, 2, 20, 12, 24, 3, 10},
    {33, 97, 16, 128, 64, 128, 64, 0},
};

std::string shape_name(const ExpandShape& s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "T%lld S%lld H%lld qk%lld v%lld q_pos0 %lld k_pos0 %lld", (long long)s.T, (long long)s.S,
                (long long)s.H, (long long)(s.nope + s.rope), (long long)s.v, (long long)s.q_pos0, (long long)s.k_pos0);
  return buf;
}

TEST(AttentionExpand, Float32KernelMatchesTheReference) {
  for (const auto& s : kExpandShapes) {
    SCOPED_TRACE(shape_name(s));
    ExpandProblem p(s.T, s.S, s.H, s.nope, s.rope, s.v, s.q_pos0, s.k_pos0, uint32_t(s.T * 7 + s.S));
    std::vector<float> want(size_t(s.T * s.H * s.v)), want_lse(size_t(s.T * s.H));
    cpu::ref::attention_expand(p.args(), want.data(), want_lse.data());
    std::vector<float> got(want.size(), -7.0f), got_lse(want_lse.size(), -7.0f);
    cpu::attention_expand_f32(kOneThread, p.args(), got.data(), got_lse.data());
    const auto [tol, lse_tol] = p.f32_tolerance();
    EXPECT_CLOSE(got, want, tol, "out");
    EXPECT_CLOSE(got_lse, want_lse, lse_tol, "lse");
  }
}

// The bf16 kernels (AMX tiles, VDPBF16PS). Q scale, K, P and V are rounded to bf16, a relative
// error uniform within +-2^-9 each. A score's error is then a sum of independent terms q_i k_i
// (e_q + e_k), rms 2^-9 sqrt(2/3) scale sqrt(sum_i (q_i k_i)^2) <= 2^-9 0.82 scale |q| max|k|;
// ds = 4 rms bounds it. The output moves by 2 ds from the scores and 2 2^-9 from P's and V's
// roundings, relative to max |v|; the lse by ds.
using ExpandFn = void (*)(const cpu::Context&, const cpu::ExpandArgs&, float*, float*);
void expect_bf16_expand_matches_the_reference(ExpandFn kernel, bool (*supported)(const cpu::ExpandArgs&),
                                              const cpu::Context& ctx) {
  int ran = 0;
  for (const auto& s : kExpandShapes) {
    ExpandProblem p(s.T, s.S, s.H, s.nope, s.rope, s.v, s.q_pos0, s.k_pos0, uint32_t(s.T * 7 + s.S));
    if (!supported(p.args())) {
      std::vector<float> o(static_cast<size_t>(s.T * s.H * s.v)), l(static_cast<size_t>(s.T * s.H));
      EXPECT_THROW(kernel(ctx, p.args(), o.data(), l.data()), std::logic_error);
      continue;
    }
    SCOPED_TRACE(shape_name(s));
    ++ran;
    std::vector<float> want(size_t(s.T * s.H * s.v)), want_lse(size_t(s.T * s.H));
    cpu::ref::attention_expand(p.args(), want.data(), want_lse.data());
    std::vector<float> got(want.size(), -7.0f), got_lse(want_lse.size(), -7.0f);
    kernel(ctx, p.args(), got.data(), got_lse.data());
    const int64_t qk = s.nope + s.rope;
    double qn = 0, km = 0, vm = 0;
    for (int64_t r = 0; r < s.T * s.H; ++r) qn = std::max(qn, norm(p.q.data() + r * qk, qk));
    for (int64_t j = 0; j < s.S; ++j)
      for (int64_t h = 0; h < s.H; ++h) {
        const float* kv = p.kvx.data() + (j * s.H + h) * (s.nope + s.v);
        for (int64_t i = 0; i < s.nope; ++i) km = std::max(km, double(std::fabs(kv[i])));
        for (int64_t i = 0; i < s.v; ++i) vm = std::max(vm, double(std::fabs(kv[s.nope + i])));
        for (int64_t i = 0; i < s.rope; ++i) km = std::max(km, double(std::fabs(p.kpe[size_t(j * (s.rope + 3) + i)])));
      }
    const double ds = 4 * std::ldexp(1.0, -9) * 0.82 * p.args().scale * qn * km;
    EXPECT_CLOSE(got, want, (2 * std::ldexp(1.0, -9) + 2 * ds) * vm, "out");
    EXPECT_CLOSE(got_lse, want_lse, ds, "lse");
    // The bf16 kernel ran, not the float32 one: their outputs differ (where a query sees a key).
    std::vector<float> f32(want.size()), f32_lse(want_lse.size());
    cpu::attention_expand_f32(kOneThread, p.args(), f32.data(), f32_lse.data());
    if (s.q_pos0 + s.T - 1 >= s.k_pos0) {
      EXPECT_GT(diff(got, f32, 0).max_abs, 0.0);
    }
  }
  EXPECT_GE(ran, 5);
}

TEST(AttentionExpand, AmxKernelMatchesTheReference) {
  if (!cpu::amx_available()) GTEST_SKIP() << "this CPU has no AMX: the AMX expand kernel cannot run here";
  expect_bf16_expand_matches_the_reference(cpu::attention_expand_amx, cpu::amx_expand_supported, kOneThread);
}

// Every CPU the engine runs on has AVX-512 BF16; two threads split the heads.
TEST(AttentionExpand, Dpbf16KernelMatchesTheReference) {
  expect_bf16_expand_matches_the_reference(cpu::attention_expand_dpbf16, cpu::dpbf16_expand_supported, kOneThread);
  cpu::Context two;
  two.threads = 2;
  expect_bf16_expand_matches_the_reference(cpu::attention_expand_dpbf16, cpu::dpbf16_expand_supported, two);
}

// The dispatcher runs bf16 products only in the fast precision, where they can run: AMX where
// the CPU has it and the context allows it, else VDPBF16PS unless float32 FMAs outrun it.
TEST(AttentionExpand, KernelChoice) {
  ExpandProblem p(2, 2, 1, 32, 32, 32, 0, 0, 1), odd(2, 2, 1, 20, 10, 24, 0, 0, 1);
  cpu::Context fast, fast_no_amx, fast_fma, fast_dpbf16;
  fast.precision = fast_no_amx.precision = fast_fma.precision = fast_dpbf16.precision = cpu::Precision::Fast;
  fast_no_amx.amx = fast_fma.amx = fast_dpbf16.amx = false;
  fast_fma.vector_gemm = cpu::Context::VectorGemm::Fma;
  fast_dpbf16.vector_gemm = cpu::Context::VectorGemm::Vdpbf16ps;
  EXPECT_EQ(cpu::expand_kernel(cpu::Context{}, p.args()), cpu::ExpandKernel::F32);  // precise: float32 always
  const cpu::ExpandKernel no_amx = cpu::host_features().fma_gemm ? cpu::ExpandKernel::F32 : cpu::ExpandKernel::Dpbf16;
  EXPECT_EQ(cpu::expand_kernel(fast, p.args()), cpu::amx_available() ? cpu::ExpandKernel::Amx : no_amx);
  EXPECT_EQ(cpu::expand_kernel(fast_no_amx, p.args()), no_amx);
  EXPECT_EQ(cpu::expand_kernel(fast_fma, p.args()), cpu::ExpandKernel::F32);
  EXPECT_EQ(cpu::expand_kernel(fast_dpbf16, p.args()), cpu::ExpandKernel::Dpbf16);
  EXPECT_EQ(cpu::expand_kernel(cpu::Context{}, odd.args()), cpu::ExpandKernel::F32);
  EXPECT_EQ(cpu::expand_kernel(fast, odd.args()), cpu::ExpandKernel::F32);  // (nope + rope) % 32 != 0
  EXPECT_EQ(cpu::amx_expand_supported(p.args()), cpu::amx_available());
  EXPECT_FALSE(cpu::amx_expand_supported(odd.args()));
  EXPECT_TRUE(cpu::dpbf16_expand_supported(p.args()));
  EXPECT_FALSE(cpu::dpbf16_expand_supported(odd.args()));
  EXPECT_STREQ(cpu::expand_kernel_name(cpu::ExpandKernel::Dpbf16), "dpbf16");
}

// ---- chunked expand, merged by log-sum-exp -------------------------------------------------

// The cached prefix in chunks and then the new tokens' own keys, each range through the float32
// kernel (k_pos0 = the range's start), merged by merge_partial: the reference over all keys.
// Each range's error is within its own bound, and the merge is a convex combination of the
// ranges' outputs with weights exp(lse_r - lse): the bound over S keys holds with the lse's
// error counted twice.
TEST(AttentionChunked, RangesMergedByLseMatchTheReference) {
  for (const auto& [T, cached, chunk] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 0, 4}, {3, 10, 4}, {5, 100, 32}, {40, 37, 16}, {2, 64, 64}}) {
    SCOPED_TRACE("T" + std::to_string(T) + " cached " + std::to_string(cached) + " chunk " + std::to_string(chunk));
    const int64_t S = cached + T, H = 3, nope = 32, rope = 16, v = 24;
    ExpandProblem all(T, S, H, nope, rope, v, cached, 0, uint32_t(S * 3 + chunk));
    std::vector<float> want(size_t(T * H * v)), want_lse(size_t(T * H));
    cpu::ref::attention_expand(all.args(), want.data(), want_lse.data());
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t s0 = 0; s0 < cached; s0 += chunk) ranges.push_back({s0, std::min(cached, s0 + chunk)});
    ranges.push_back({cached, S});
    std::vector<float> out(want.size(), 0.0f), lse(want_lse.size(), -std::numeric_limits<float>::infinity()),
        part(want.size()), part_lse(want_lse.size());
    for (auto [k0, k1] : ranges) {
      cpu::ExpandArgs a = all.args();
      a.kv = all.kvx.data() + k0 * H * (nope + v);
      a.k_pe = all.kpe.data() + k0 * (rope + 3);
      a.S = k1 - k0;
      a.k_pos0 = k0;
      cpu::attention_expand_f32(kOneThread, a, part.data(), part_lse.data());
      cpu::merge_partial(out.data(), lse.data(), part.data(), part_lse.data(), T * H, v);
    }
    auto [tol, lse_tol] = all.f32_tolerance();
    EXPECT_CLOSE(out, want, tol + 2 * lse_tol, "out");
    EXPECT_CLOSE(lse, want_lse, 2 * lse_tol, "lse");
  }
}

// merge_partial of two halves equals the whole, and a range a row sees nothing of (-inf) leaves
// it unchanged.
TEST(AttentionChunked, MergeOfEmptyRangeIsIdentity) {
  std::vector<float> acc{1, 2, 3, 4}, acc_lse{0.5f, -std::numeric_limits<float>::infinity()};
  const std::vector<float> part{9, 9, 5, 6}, part_lse{-std::numeric_limits<float>::infinity(), 0.25f};
  cpu::merge_partial(acc.data(), acc_lse.data(), part.data(), part_lse.data(), 2, 2);
  EXPECT_EQ(acc, (std::vector<float>{1, 2, 5, 6}));
  EXPECT_EQ(acc_lse[0], 0.5f);
  EXPECT_EQ(acc_lse[1], 0.25f);
}

// ---- the references themselves ---------------------------------------------------------------

// mla_naive (expand form) and mla_absorb (absorb form) are the same function of the latents:
// in double they agree to ~1e-12 of the outputs' scale; and the kernel-level references agree
// with them on the expanded keys / the latent rows.
TEST(AttentionReference, NaiveAndAbsorbFormsAgree) {
  const int64_t H = 3, kvr = 40, rope = 8, nope = 16, v = 12, T = 4, S = 11;
  test::RandomMlaLayer layer(H, kvr, rope, nope, v, 5, 0.2f);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  LatentPool pool(1, kvr, rope, 4, 4, KvDType::BF16);
  test::poison_pool(pool);
  auto tables = test::random_page_tables(pool, {S}, rng);
  test::fill_rows(pool, 0, tables[0], S, kvr, rng);
  std::vector<float> q(size_t(T * H * (nope + rope)));
  for (auto& x : q) x = nd(rng);
  const cpu::ref::MlaProblem p{q.data(), layer.kv_b.data(), T, S, H, nope, rope, v, kvr, S - T, 0, 0.3f};
  const cpu::ref::LatentRows keys(pool, 0, tables[0]);
  std::vector<float> naive(size_t(T * H * v)), absorb(naive.size()), lse_n(size_t(T * H)), lse_a(lse_n.size());
  cpu::ref::mla_naive(p, keys, naive.data(), lse_n.data());
  cpu::ref::mla_absorb(p, keys, absorb.data(), lse_a.data());
  double scale = 0;
  for (float x : naive) scale = std::max(scale, double(std::fabs(x)));
  EXPECT_GT(scale, 0.1);
  // The outputs are rounded to float once: half an ulp of each.
  EXPECT_CLOSE(absorb, naive, scale * 2 * kU, "mla_absorb against mla_naive");
  EXPECT_CLOSE(lse_a, lse_n, 1e-6, "lse");
  for (float x : naive) ASSERT_FALSE(std::isnan(x)) << "a poisoned slot was read";
}

}  // namespace
}  // namespace mla
