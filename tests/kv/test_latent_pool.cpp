// The paged latent pool: allocation, exhaustion, reuse, prefix sharing, page-table edges and
// the byte layout of each storage dtype.
#include <gtest/gtest.h>

#include <random>

#include "kv/latent_pool.h"
#include "tensor/dtype.h"

namespace mla {
namespace {

std::vector<float> random_row(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(LatentPool, BytesPerTokenOfEachDtype) {
  // DeepSeek-V3: 512 + 64 values per token and layer.
  EXPECT_EQ(latent_row_bytes(512, 64, KvDType::F32), 576 * 4);
  EXPECT_EQ(latent_row_bytes(512, 64, KvDType::BF16), 576 * 2);
  EXPECT_EQ(latent_row_bytes(512, 64, KvDType::FP8), 512 + 4 * 4 + 64 * 2);  // 656, FlashMLA's layout
  LatentPool pool(61, 512, 64, 10, 64, KvDType::FP8);
  EXPECT_EQ(pool.bytes_per_token(), 656 * 61);
  EXPECT_EQ(pool.bytes_per_page(), 656 * 61 * 64);
  EXPECT_EQ(pool.total_bytes(), 656 * 61 * 64 * 10);
  EXPECT_EQ(LatentPool::pages_for_budget(656.0 * 61 * 64 * 10 + 5, 61, 512, 64, 64, KvDType::FP8), 10);
}

TEST(LatentPool, ReserveIsAllOrNothingAndExhaustionIsReported) {
  LatentPool pool(2, 16, 4, 3, 4);
  PageTable a, b;
  EXPECT_TRUE(pool.reserve(a, 9));  // 3 pages
  EXPECT_EQ(a.pages.size(), 3u);
  EXPECT_EQ(pool.free_pages(), 0);
  EXPECT_FALSE(pool.reserve(b, 1));
  EXPECT_TRUE(b.pages.empty());
  EXPECT_FALSE(pool.reserve(a, 13));  // would need a 4th page
  EXPECT_EQ(a.pages.size(), 3u);
  EXPECT_TRUE(pool.reserve(a, 12));  // fits in what it has
}

TEST(LatentPool, FreedPagesAreReused) {
  LatentPool pool(1, 8, 2, 4, 2);
  PageTable a, b;
  ASSERT_TRUE(pool.reserve(a, 8));
  a.length = 8;
  auto pages = a.pages;
  pool.release(a);
  EXPECT_EQ(pool.free_pages(), 4);
  EXPECT_TRUE(a.pages.empty());
  ASSERT_TRUE(pool.reserve(b, 8));
  std::sort(pages.begin(), pages.end());
  auto got = b.pages;
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, pages);
}

class PoolDtype : public ::testing::TestWithParam<KvDType> {};

TEST_P(PoolDtype, WriteGatherRoundTripAcrossPages) {
  const int64_t kvr = 300, rope = 6, ps = 4;  // kvr not a multiple of 128: a partial fp8 scale block
  LatentPool pool(2, kvr, rope, 8, ps, GetParam());
  std::mt19937 rng(1);
  PageTable seq;
  const int64_t n = 10;
  ASSERT_TRUE(pool.reserve(seq, n));
  std::vector<std::vector<float>> rows;
  for (int64_t i = 0; i < n; ++i) {
    rows.push_back(random_row(rng, kvr + rope, 3.0f));
    pool.write(1, seq, i, rows.back().data(), rows.back().data() + kvr);
  }
  seq.length = n;
  std::vector<float> out(size_t(n * (kvr + rope)));
  pool.gather(1, seq, 0, n, out.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < kvr + rope; ++k) {
      float want = rows[size_t(i)][size_t(k)], got = out[size_t(i * (kvr + rope) + k)];
      float tol = 0;
      if (GetParam() == KvDType::BF16 || (GetParam() == KvDType::FP8 && k >= kvr))
        tol = std::fabs(want) * (1.0f / 256);  // bf16: 8 significant bits, half an ulp is 2^-9 relative
      if (GetParam() == KvDType::FP8 && k < kvr) {
        // e4m3: 3 mantissa bits, half an ulp is 2^-4 relative; values far below the block's
        // amax fall in the subnormal range, whose spacing is amax/448 * 2^-9.
        float amax = 0;
        int64_t b0 = (k / 128) * 128;
        for (int64_t j = b0; j < std::min(kvr, b0 + 128); ++j) amax = std::max(amax, std::fabs(rows[size_t(i)][size_t(j)]));
        tol = std::fabs(want) / 16 + amax / 448 * std::ldexp(1.0f, -10);
      }
      ASSERT_LE(std::fabs(got - want), tol) << "token " << i << " value " << k;
    }
  // The other layer is untouched (zero).
  pool.gather(0, seq, 0, 1, out.data());
  for (int64_t k = 0; k < kvr + rope; ++k) EXPECT_EQ(out[size_t(k)], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PoolDtype, ::testing::Values(KvDType::F32, KvDType::BF16, KvDType::FP8),
                         [](const auto& i) { return std::string(kv_dtype_name(i.param)); });

TEST(LatentPool, ForkSharesFullPagesAndCopiesThePartialOne) {
  const int64_t kvr = 8, rope = 2, ps = 4;
  LatentPool pool(1, kvr, rope, 6, ps, KvDType::F32);
  std::mt19937 rng(2);
  PageTable a;
  ASSERT_TRUE(pool.reserve(a, 10));  // pages: full, full, partial(2)
  std::vector<std::vector<float>> rows;
  for (int64_t i = 0; i < 10; ++i) {
    rows.push_back(random_row(rng, kvr + rope));
    pool.write(0, a, i, rows.back().data(), rows.back().data() + kvr);
  }
  a.length = 10;
  PageTable b;
  ASSERT_TRUE(pool.fork(a, 10, &b));
  EXPECT_EQ(b.length, 10);
  EXPECT_EQ(b.pages[0], a.pages[0]);
  EXPECT_EQ(b.pages[1], a.pages[1]);
  EXPECT_NE(b.pages[2], a.pages[2]);
  EXPECT_EQ(pool.refcount(a.pages[0]), 2);
  EXPECT_EQ(pool.refcount(a.pages[2]), 1);
  std::vector<float> out(size_t(10 * (kvr + rope)));
  pool.gather(0, b, 0, 10, out.data());
  for (int64_t i = 0; i < 10; ++i)
    for (int64_t k = 0; k < kvr + rope; ++k) EXPECT_EQ(out[size_t(i * (kvr + rope) + k)], rows[size_t(i)][size_t(k)]);
  // b extends on its own pages; writing into a shared page is refused.
  ASSERT_TRUE(pool.reserve(b, 13));
  auto row = random_row(rng, kvr + rope);
  pool.write(0, b, 12, row.data(), row.data() + kvr);
  EXPECT_THROW(pool.write(0, b, 1, row.data(), row.data() + kvr), std::logic_error);
  // Releasing a keeps the shared pages alive for b.
  int64_t free_before = pool.free_pages();
  pool.release(a);
  EXPECT_EQ(pool.free_pages(), free_before + 1);  // only a's private partial page came back
  pool.gather(0, b, 0, 8, out.data());
  EXPECT_EQ(out[0], rows[0][0]);
  pool.release(b);
  EXPECT_EQ(pool.free_pages(), 6);
}

TEST(LatentPool, ForkWithNoFreePageForThePartialCopyFails) {
  LatentPool pool(1, 8, 2, 2, 4, KvDType::BF16);
  PageTable a, b;
  ASSERT_TRUE(pool.reserve(a, 6));
  a.length = 6;
  EXPECT_FALSE(pool.fork(a, 6, &b));
  EXPECT_TRUE(pool.fork(a, 4, &b));  // page-aligned prefix: shared, no copy needed
  EXPECT_EQ(pool.refcount(a.pages[0]), 2);
}

TEST(LatentPool, PageTableEdges) {
  LatentPool pool(1, 8, 2, 4, 4, KvDType::F32);
  PageTable a;
  std::vector<float> row(10, 1.0f), out(30);
  EXPECT_THROW(pool.write(0, a, 0, row.data(), row.data() + 8), std::out_of_range);  // no page yet
  ASSERT_TRUE(pool.reserve(a, 4));                                                    // exactly one page
  pool.write(0, a, 3, row.data(), row.data() + 8);                                   // last slot
  EXPECT_THROW(pool.write(0, a, 4, row.data(), row.data() + 8), std::out_of_range);  // first slot of a page not held
  EXPECT_THROW(pool.write(0, a, -1, row.data(), row.data() + 8), std::out_of_range);
  EXPECT_THROW(pool.gather(0, a, 2, 3, out.data()), std::out_of_range);
  a.length = 4;
  EXPECT_THROW(pool.fork(a, 5, &a), std::out_of_range);
  ASSERT_TRUE(pool.reserve(a, 5));
  EXPECT_EQ(a.pages.size(), 2u);
  pool.truncate(a, 4);  // back to one page
  EXPECT_EQ(a.pages.size(), 1u);
  EXPECT_EQ(pool.free_pages(), 3);
  EXPECT_THROW(LatentPool(1, 8, 2, 4, 0), std::invalid_argument);
  EXPECT_THROW(parse_kv_dtype("int8"), std::invalid_argument);
}

TEST(Fp8, E4M3RoundTripAndSaturation) {
  for (int b = 0; b < 256; ++b) {
    float v = fp8e4m3_to_f32(uint8_t(b));
    if (std::isnan(v)) continue;
    EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(v)), v) << b;
  }
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(1000.0f)), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(-1000.0f)), -448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(1.0625f)), 1.0f);  // tie between 1 and 1.125 goes to even
}

}  // namespace
}  // namespace mla
