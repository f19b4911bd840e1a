// The DeepSeek Sparse Attention indexer's kernels (index_score.h) held to their plain references:
// every scoring kernel over many shapes (heads not a multiple of 16, key counts not a multiple
// of a tile or a page, random page tables, unused page slots poisoned with NaN, every key
// format), and the radix top-k against nth_element, ties included. A kernel this CPU cannot run
// is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/index_score.h"
#include "kv/latent_pool.h"
#include "test_util.h"

namespace mla::cpu {
namespace {

using test::randn;

// A pool whose every slot first holds a NaN key (a sequence written over all pages, then
// released), then a sequence of n random keys on a shuffled page table: its last page's unused
// slots and every other page keep the NaNs.
struct PoisonedKeys {
  LatentPool pool;
  PageTable seq;
  std::vector<float> keys;  // [n, dim] as written
  PoisonedKeys(std::mt19937& g, int64_t n, int64_t dim, int64_t page, KvDType dt)
      : pool(1, 32, 0, pages_for_tokens(n, page) + 3, page, dt, dim) {
    PageTable all;
    pool.reserve(all, pool.num_pages() * page);
    const std::vector<float> nan(size_t(dim), std::numeric_limits<float>::quiet_NaN());
    for (int64_t p = 0; p < pool.num_pages() * page; ++p) pool.write_index(0, all, p, nan.data());
    all.length = pool.num_pages() * page;
    pool.release(all);
    pool.reserve(seq, n);
    std::shuffle(seq.pages.begin(), seq.pages.end(), g);
    keys = randn(g, size_t(n * dim));
    for (int64_t s = 0; s < n; ++s) pool.write_index(0, seq, s, keys.data() + s * dim);
    seq.length = n;
  }
  IndexKeyPages view() const {
    return {pool.index_data(0), seq.pages.data(), pool.page_size(), pool.index_bytes_per_row(), pool.index_dim(),
            pool.dtype()};
  }
};

// The bound on |kernel - reference| for one key: M = sum_h |w_h| sum_i |q_hi k_i| (the
// reference's magnitudes, k as decoded), times the relative error of the kernel's sums. Float32
// sums of dim products, then of `heads` weighted terms and a scale: at most (dim + heads + 3)
// roundings of unit 2^-24 on M (the gamma_n bound). The bf16 kernels round q to bf16 (unit
// 2^-9: each product's relative error) and f32 keys as well (another 2^-9); bf16 keys are
// exact, and fp8 keys too where one scale covers the row (dim <= 128: the scale multiplies the
// dot products); past that the scaled values are rounded to bf16 (another 2^-9).
double error_bound(IndexKernel k, KvDType dt, int64_t dim, int64_t heads, double M) {
  double rel = double(dim + heads + 3) * std::ldexp(1.0, -24);
  const bool keys_rounded = dt == KvDType::F32 || (dt == KvDType::FP8 && dim > 128);
  if (k != IndexKernel::F32) rel += std::ldexp(1.0, -9) * (keys_rounded ? 2.0 : 1.0) * 1.01;
  return rel * M;
}

void check_kernel(IndexKernel kernel) {
  if (!index_kernel_supported(kernel, 128))
    GTEST_SKIP() << index_kernel_name(kernel) << " cannot run on this CPU (no AMX tiles granted to the process: "
                 << "CPUID.7.0:EDX bits 22/24 and arch_prctl(ARCH_REQ_XCOMP_PERM))";
  std::mt19937 g(17);
  Context one, two;
  one.threads = 1;
  two.threads = 2;
  int cases = 0;
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8})
    for (auto [heads, dim, n, page] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {1, 32, 1, 16},     {8, 32, 5, 16},    {17, 64, 33, 48},  {32, 128, 100, 64},
             {64, 128, 1000, 64}, {80, 128, 257, 32}, {64, 128, 2500, 64}, {3, 96, 70, 7},
             {64, 256, 300, 64},  {16, 128, 4099, 128}}) {
      PoisonedKeys pk(g, n, dim, page, dt);
      const IndexKeyPages keys = pk.view();
      const auto q = randn(g, size_t(heads * dim), 0.3f), w = randn(g, size_t(heads));
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
      index_scores_reference(keys, q.data(), w.data(), heads, n, want.data());
      // The magnitudes, from the keys as the reference decodes them.
      std::vector<float> kd(size_t(n * dim));
      pk.pool.gather_index(0, pk.seq, 0, n, kd.data());
      IndexQuery iq;
      iq.prepare(kernel, q.data(), w.data(), heads, dim);
      for (const Context* ctx : {&one, &two}) {
        index_scores(*ctx, iq, keys, n, got.data());
        for (int64_t s = 0; s < n; ++s) {
          double M = 0;
          for (int64_t h = 0; h < heads; ++h) {
            double a = 0;
            for (int64_t i = 0; i < dim; ++i) a += std::fabs(double(q[size_t(h * dim + i)]) * kd[size_t(s * dim + i)]);
            M += std::fabs(w[size_t(h)]) * a;
          }
          ASSERT_LE(std::fabs(double(got[size_t(s)]) - want[size_t(s)]), error_bound(kernel, dt, dim, heads, M))
              << index_kernel_name(kernel) << " " << kv_dtype_name(dt) << " heads " << heads << " dim " << dim
              << " n " << n << " page " << page << " key " << s << " threads " << ctx->num_threads();
        }
      }
      ++cases;
    }
  EXPECT_EQ(cases, 30);
}

TEST(DsaIndexerKernels, F32MatchesTheReference) { check_kernel(IndexKernel::F32); }
TEST(DsaIndexerKernels, Bf16MatchesTheReference) { check_kernel(IndexKernel::Bf16); }
TEST(DsaIndexerKernels, AmxMatchesTheReference) { check_kernel(IndexKernel::Amx); }

TEST(DsaIndexerKernels, DispatchRule) {
  Context precise, fast;
  fast.precision = Precision::Fast;
  const CpuFeatures amx{true, false}, vdpbf16ps{false, false}, fma{false, true};
  for (const CpuFeatures& f : {amx, vdpbf16ps, fma}) EXPECT_EQ(index_kernel(precise, 128, f), IndexKernel::F32);
  EXPECT_EQ(index_kernel(fast, 128, amx), IndexKernel::Amx);
  EXPECT_EQ(index_kernel(fast, 128, vdpbf16ps), IndexKernel::Bf16);
  EXPECT_EQ(index_kernel(fast, 128, fma), IndexKernel::F32);  // FMAs timed faster than VDPBF16PS (dispatch.cpp)
  EXPECT_EQ(index_kernel(fast, 96, amx), IndexKernel::Amx);
  EXPECT_EQ(index_kernel(fast, 48, vdpbf16ps), IndexKernel::F32);
  EXPECT_FALSE(index_kernel_supported(IndexKernel::F32, 48));  // no kernel: the reference scores
  IndexQuery q;
  const std::vector<float> v(48 * 2, 1.0f);
  EXPECT_THROW(q.prepare(IndexKernel::F32, v.data(), v.data(), 2, 48), std::logic_error);
}

// How many of the top-2048 positions of 16,384 keys (DeepSeek-V3.2's indexer: 64 heads of 128)
// change when the scores come from a bf16 kernel instead of the float32 reference, per key
// format. Random keys and queries: the gaps between neighbouring scores near the threshold are
// what a trained model's are not, so this is the count to expect at worst. Bounded at 2% of the
// positions (the fast precision's bound for the whole model in test_dsa.cpp).
TEST(DsaIndexerKernels, Bf16KernelsChangeFewSelectedPositions) {
  std::mt19937 g(5);
  const int64_t heads = 64, dim = 128, n = 16384, k = 2048;
  Context ctx;
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    PoisonedKeys pk(g, n, dim, 64, dt);
    const auto q = randn(g, size_t(heads * dim), 0.3f), w = randn(g, size_t(heads));
    std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    index_scores_reference(pk.view(), q.data(), w.data(), heads, n, ref.data());
    std::vector<int32_t> want(static_cast<size_t>(k)), sel(static_cast<size_t>(k));
    topk_positions_reference(ref.data(), n, k, want.data());
    for (IndexKernel kernel : {IndexKernel::F32, IndexKernel::Bf16, IndexKernel::Amx}) {
      if (!index_kernel_supported(kernel, dim)) continue;
      IndexQuery iq;
      iq.prepare(kernel, q.data(), w.data(), heads, dim);
      index_scores(ctx, iq, pk.view(), n, got.data());
      topk_positions(ctx, got.data(), n, k, sel.data());
      std::vector<int32_t> common;
      std::set_intersection(want.begin(), want.end(), sel.begin(), sel.end(), std::back_inserter(common));
      const int64_t changed = k - int64_t(common.size());
      std::printf("[ dsa index ] %-18s %s keys: %lld of %lld selected positions differ from the reference's\n",
                  index_kernel_name(kernel), kv_dtype_name(dt), (long long)changed, (long long)k);
      EXPECT_LE(double(changed), 0.02 * double(k)) << index_kernel_name(kernel) << " " << kv_dtype_name(dt);
    }
  }
}

TEST(DsaIndexerTopk, MatchesTheReferenceTiesIncluded) {
  std::mt19937 g(9);
  Context one, two;
  one.threads = 1;
  two.threads = 2;
  int cases = 0;
  for (int64_t n : {1, 2, 7, 100, 2049, 8192, 20000, 65536, 70001})
    for (int64_t k : {1, 3, 64, 2048})
      for (int kind = 0; kind < 4; ++kind) {
        if (k > n) continue;
        std::vector<float> s(static_cast<size_t>(n));
        std::uniform_int_distribution<int> small(-3, 3);
        for (auto& x : s) {
          switch (kind) {
            case 0: x = std::normal_distribution<float>(0, 1)(g); break;
            case 1: x = float(small(g)); break;                        // heavy ties, negatives
            case 2: x = small(g) == 0 ? -0.0f : small(g) > 0 ? 0.0f : 1e-30f; break;  // signed zeros
            case 3: x = 1.0f; break;                                   // all equal
          }
        }
        std::vector<int32_t> want(static_cast<size_t>(k)), got1(static_cast<size_t>(k), -1), got2(static_cast<size_t>(k), -1);
        topk_positions_reference(s.data(), n, k, want.data());
        topk_positions(one, s.data(), n, k, got1.data());
        topk_positions(two, s.data(), n, k, got2.data());
        ASSERT_EQ(got1, want) << "n " << n << " k " << k << " kind " << kind;
        ASSERT_EQ(got2, want) << "n " << n << " k " << k << " kind " << kind << " (2 threads)";
        ++cases;
      }
  EXPECT_GT(cases, 100);
}

}  // namespace
}  // namespace mla::cpu
