// The prefix cache on its own over a small latent pool: an entry shares a sequence's full
// pages by reference count (never the partial page), a match forks the longest page-aligned
// prefix and sees the rows written through the original, an extension supersedes the entry it
// extends, eviction is least recently used (a match refreshes), and evicting returns pages.
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
  PrefixCache cache(pool, 8);
  auto tokens = ids(10);
  PageTable a = written(pool, 10);  // 3 pages, the last holds 2 tokens
  ASSERT_EQ(pool.free_pages(), 7);
  cache.insert(tokens, a);
  EXPECT_EQ(cache.entries(), 1);
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

  // Everything back: the sequences, then the cache.
  pool.release(a);
  pool.release(b);
  pool.release(c);
  EXPECT_EQ(cache.pages_held_alone(), 2);
  EXPECT_EQ(pool.free_pages(), 8);
  cache.clear();
  EXPECT_EQ(pool.free_pages(), 10);
  EXPECT_EQ(cache.entries(), 0);
}

TEST(PrefixCache, ExtensionSupersedesAndEvictionIsLeastRecentlyUsed) {
  LatentPool pool(1, kRank, kRope, 12, kPage, KvDType::F32);
  PrefixCache cache(pool, 2);
  PageTable a = written(pool, 4);
  cache.insert(ids(4), a);
  PageTable a2 = written(pool, 8);
  cache.insert(ids(8), a2);  // extends a's entry: replaces it
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(pool.refcount(a.pages[0]), 1) << "the superseded entry let go of a's page";
  cache.insert(ids(4), a2);  // already held by the longer entry: nothing new
  EXPECT_EQ(cache.entries(), 1);
  pool.release(a);
  pool.release(a2);

  PageTable x = written(pool, 4), y = written(pool, 4);
  cache.insert(ids(4, 500), x);
  EXPECT_EQ(cache.entries(), 2);
  PageTable hit;
  EXPECT_EQ(cache.match(ids(8), 8, &hit), 8) << "refreshes the first entry";
  pool.release(hit);
  cache.insert(ids(4, 900), y);  // a third entry: the least recently used (500...) goes
  EXPECT_EQ(cache.entries(), 2);
  PageTable miss;
  EXPECT_EQ(cache.match(ids(4, 500), 4, &miss), 0);
  PageTable still;
  EXPECT_EQ(cache.match(ids(8), 8, &still), 8);
  pool.release(still);
  pool.release(x);
  pool.release(y);

  const int64_t before = pool.free_pages();
  EXPECT_TRUE(cache.evict_one());
  EXPECT_TRUE(cache.evict_one());
  EXPECT_FALSE(cache.evict_one());
  EXPECT_EQ(pool.free_pages(), 12);
  EXPECT_GT(pool.free_pages(), before);
}

}  // namespace
}  // namespace mla
