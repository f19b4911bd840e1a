// The prefix cache beside the latent pool: page-aligned token prefixes whose latent pages are
// kept after the sequence that wrote them moves on or ends. An entry holds its pages by
// reference count (LatentPool::fork of full pages: shared, never copied); a new sequence whose
// tokens start with an entry's page-aligned block forks those pages and computes only the
// rest. Entries are dropped least recently used first: when there are more than max_entries,
// and when the pool runs short (evict_one). Only full pages are kept, so a sequence that
// extends a cached one recomputes at most its last partial page.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "kv/latent_pool.h"

namespace mla {

class PrefixCache {
 public:
  // The pool must outlive the cache.
  PrefixCache(LatentPool& pool, int64_t max_entries = 64);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Keeps the full pages of `table` under the tokens they hold (tokens[0, aligned) where
  // aligned = table.length rounded down to a page). An entry already holding these tokens is
  // refreshed instead; entries the new one extends are dropped.
  void insert(std::span<const int32_t> tokens, const PageTable& table);
  // The longest cached page-aligned prefix of tokens[0, max_len): its pages are forked into
  // *out (which must be empty) and its length returned; 0 (and *out unchanged) on a miss.
  int64_t match(std::span<const int32_t> tokens, int64_t max_len, PageTable* out);
  // Drops the least recently used entry, returning its pages (those no sequence shares become
  // free). False when the cache is empty.
  bool evict_one();
  void clear();

  int64_t entries() const { return int64_t(entries_.size()); }
  // Pages only the cache holds (they come back when it gives them up).
  int64_t pages_held_alone() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;  // page-aligned
    PageTable table;
    uint64_t last_used = 0;
  };
  LatentPool& pool_;
  int64_t max_entries_;
  std::list<Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace mla
