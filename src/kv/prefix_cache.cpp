// PrefixCache: page-aligned prefixes by reference count, LRU eviction (see prefix_cache.h).
#include "kv/prefix_cache.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace mla {

PrefixCache::PrefixCache(LatentPool& pool, int64_t max_entries) : pool_(pool), max_entries_(max_entries) {
  if (max_entries_ < 1) throw std::invalid_argument("prefix cache: max_entries must be at least 1");
}

PrefixCache::~PrefixCache() { clear(); }

void PrefixCache::clear() {
  for (auto& e : entries_) pool_.release(e.table);
  entries_.clear();
}

void PrefixCache::insert(std::span<const int32_t> tokens, const PageTable& table) {
  const int64_t ps = pool_.page_size();
  const int64_t aligned = std::min<int64_t>(table.length, int64_t(tokens.size())) / ps * ps;
  if (aligned == 0) return;
  auto begin = tokens.begin(), end = tokens.begin() + aligned;
  for (auto& e : entries_)
    if (int64_t(e.tokens.size()) >= aligned && std::equal(begin, end, e.tokens.begin())) {
      e.last_used = ++clock_;  // an entry already holds these pages' tokens
      return;
    }
  Entry entry;
  entry.tokens.assign(begin, end);
  if (!pool_.fork(table, aligned, &entry.table)) return;  // full pages only: never fails
  entry.last_used = ++clock_;
  // Entries whose tokens the new one extends are superseded.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (int64_t(it->tokens.size()) <= aligned && std::equal(it->tokens.begin(), it->tokens.end(), begin)) {
      pool_.release(it->table);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  entries_.push_back(std::move(entry));
  while (int64_t(entries_.size()) > max_entries_) evict_one();
}

int64_t PrefixCache::match(std::span<const int32_t> tokens, int64_t max_len, PageTable* out) {
  const int64_t ps = pool_.page_size();
  max_len = std::min<int64_t>(max_len, int64_t(tokens.size()));
  Entry* best = nullptr;
  int64_t best_len = 0;
  for (auto& e : entries_) {
    const int64_t n = std::min<int64_t>(int64_t(e.tokens.size()), max_len);
    int64_t common = 0;
    while (common < n && e.tokens[size_t(common)] == tokens[size_t(common)]) ++common;
    common = common / ps * ps;
    if (common > best_len) best = &e, best_len = common;
  }
  if (!best) return 0;
  best->last_used = ++clock_;
  pool_.fork(best->table, best_len, out);  // full pages: shares, never copies
  return best_len;
}

bool PrefixCache::evict_one() {
  if (entries_.empty()) return false;
  auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                 [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
  pool_.release(oldest->table);
  entries_.erase(oldest);
  return true;
}

int64_t PrefixCache::pages_held_alone() const {
  std::unordered_map<int32_t, int> holders;  // page -> entries holding it
  for (auto& e : entries_)
    for (int32_t p : e.table.pages) ++holders[p];
  int64_t n = 0;
  for (auto [page, count] : holders) n += pool_.refcount(page) == count;
  return n;
}

}  // namespace mla
