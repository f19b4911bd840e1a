// The prompt cache's pool tier on its own over a small latent pool: it shares a sequence's full
// pages by reference count (never the partial page), a match takes the longest page-aligned
// prefix and sees the rows written through the original, sessions that share a first part
// share its pages, eviction is least recently used page by page and shortens a chain from its
// end, and evicting returns pages.
#include <gtest/gtest.h>

#include <numeric>

#include "kv/prefix_cache.h"

namespace mla {
namespace {

constexpr int64_t kRank = 4, kRope = 2, kPage = 4;

// A sequence of n tokens whose rows hold (position + 1) * 10 + value index.
PageTable written(LatentPool& pool, int64_t n) {
  PageTable t;
  EXPECT_TRUE(pool.reserve(t, n));
  for (int64_t pos = 0; pos < n; ++pos) {
    std::vector<float> c(kRank), k(kRope);
    for (int64_t i = 0; i < kRank; ++i) c[size_t(i)] = float((pos + 1) * 10 + i);
    for (int64_t i = 0; i < kRope; ++i) k[size_t(i)] = float(-(pos + 1));
    pool.write(0, t, pos, c.data(), k.data());
    t.length = pos + 1;
  }
  return t;
}

std::vector<int32_t> ids(int n, int32_t first = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PrefixCache, SharesFullPagesAndMatchesTheLongestAlignedPrefix) {
  LatentPool pool(1, kRank, kRope, 10, kPage, KvDType::F32);
  PrefixCache cache(pool);
  auto tokens = ids(10);
  PageTable a = written(pool, 10);  // 3 pages, the last holds 2 tokens
  ASSERT_EQ(pool.free_pages(), 7);
  cache.insert(tokens, a);
  EXPECT_EQ(cache.entries(), 2) << "two full pages";
  EXPECT_EQ(pool.refcount(a.pages[0]), 2);
  EXPECT_EQ(pool.refcount(a.pages[1]), 2);
  EXPECT_EQ(pool.refcount(a.pages[2]), 1) << "the partial page stays the sequence's own";
  EXPECT_EQ(pool.free_pages(), 7) << "sharing takes no page";

  // The same first 9 tokens, then another: 8 shared (two pages), never more than max_len.
  auto b_tokens = ids(9);
  b_tokens.push_back(7);
  PageTable b;
  EXPECT_EQ(cache.match(b_tokens, int64_t(b_tokens.size()) - 1, &b), 8);
  ASSERT_EQ(b.pages.size(), 2u);
  EXPECT_EQ(b.pages[0], a.pages[0]);
  EXPECT_EQ(b.pages[1], a.pages[1]);
  EXPECT_EQ(b.length, 8);
  EXPECT_EQ(pool.refcount(a.pages[0]), 3);
  std::vector<float> rows(size_t(8 * (kRank + kRope)));
  pool.gather(0, b, 0, 8, rows.data());
  EXPECT_EQ(rows[size_t(7 * (kRank + kRope))], 80.0f) << "the shared rows are the ones written through a";
  PageTable c;
  EXPECT_EQ(cache.match(b_tokens, 7, &c), 4) << "max_len 7: one page";
  PageTable d;
  EXPECT_EQ(cache.match(ids(10, 5), 9, &d), 0) << "another first token: a miss";
  EXPECT_TRUE(d.pages.empty());
  auto second_page_differs = ids(8);
  second_page_differs[5] = 1;
  PageTable e;
  EXPECT_EQ(cache.match(second_page_differs, 8, &e), 4) << "the chain ends at the first page that differs";
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Pool)], 8 + 4 + 4);

  // Everything back: the sequences, then the cache.
  pool.release(a);
  pool.release(b);
  pool.release(c);
  pool.release(e);
  EXPECT_EQ(cache.pages_held_alone(), 2);
  EXPECT_EQ(pool.free_pages(), 8);
  cache.clear();
  EXPECT_EQ(pool.free_pages(), 10);
  EXPECT_EQ(cache.entries(), 0);
}

TEST(PrefixCache, SessionsSharingASystemPromptShareItsPages) {
  LatentPool pool(1, kRank, kRope, 12, kPage, KvDType::F32);
  PrefixCache cache(pool);
  auto one = ids(12), two = ids(12);
  two[9] = 7;  // the third page differs: two pages of "system prompt" in common
  PageTable a = written(pool, 12), b;
  cache.insert(one, a);
  ASSERT_EQ(cache.match(two, 11, &b), 8);
  ASSERT_TRUE(pool.reserve(b, 12));
  for (int64_t pos = 8; pos < 12; ++pos) {
    std::vector<float> c(kRank, 1.0f), k(kRope, 2.0f);
    pool.write(0, b, pos, c.data(), k.data());
  }
  b.length = 12;
  cache.insert(two, b);
  EXPECT_EQ(cache.entries(), 4) << "the shared two pages once, then each session's own";
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.free_pages(), 8);
}

TEST(PrefixCache, EvictionIsLeastRecentlyUsedAndShortensAChainFromItsEnd) {
  LatentPool pool(1, kRank, kRope, 12, kPage, KvDType::F32);
  PrefixCache cache(pool);
  PageTable a = written(pool, 12), x = written(pool, 4);
  cache.insert(ids(12), a);
  cache.insert(ids(4, 500), x);
  pool.release(a);
  pool.release(x);
  EXPECT_EQ(cache.entries(), 4);
  PageTable hit;
  EXPECT_EQ(cache.match(ids(12), 12, &hit), 12) << "refreshes the long chain";
  EXPECT_TRUE(cache.evict_one());  // evicts x's page: the least recently used held by no one
  PageTable miss;
  EXPECT_EQ(cache.match(ids(4, 500), 4, &miss), 0);
  EXPECT_EQ(cache.entries(), 3);
  EXPECT_FALSE(cache.evict_one()) << "every other page is held by a sequence";
  pool.release(hit);
  EXPECT_TRUE(cache.evict_one());  // the chain's last page goes first
  PageTable shorter;
  EXPECT_EQ(cache.match(ids(12), 12, &shorter), 8);
  pool.release(shorter);
  EXPECT_TRUE(cache.evict_one());
  EXPECT_TRUE(cache.evict_one());
  EXPECT_FALSE(cache.evict_one());
  EXPECT_EQ(pool.free_pages(), 12);
}

}  // namespace
}  // namespace mla
