// The prefix cache's second tier: pages that left the latent pool, kept in host RAM up to a
// budget of bytes and dropped least recently used first (kv/prefix_cache.h moves pages here
// when the pool needs room, and back into the pool on a hit). Thread-safe: the engine thread
// moves pages in and out, a submitting thread asks which pages it holds (prefetch).
#pragma once
#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/page_hash.h"

namespace mla {

// One page out of the pool: its key, its tokens (checked on every hit, so a hash collision can
// never hand out another prefix's rows) and its bytes as LatentPool::copy_page_out gives them.
enum class PageSource : uint8_t { Ram = 1, Disk = 2 };  // where a block was read from (CacheTier's numbers)

struct PageBlock {
  Hash128 key;
  PageSource source = PageSource::Ram;
  std::vector<int32_t> tokens;
  std::span<const uint8_t> bytes;  // in `memory`
  std::shared_ptr<void> memory;    // owns the bytes; blocks allocated together share it
  int64_t size() const { return int64_t(bytes.size() + tokens.size() * sizeof(int32_t)); }
  bool holds(std::span<const int32_t> t) const {
    return t.size() == tokens.size() && std::equal(t.begin(), t.end(), tokens.begin());
  }
};
using PageBlockPtr = std::shared_ptr<const PageBlock>;

// `count` blocks of `page_bytes` uninitialised bytes each, laid out one after another from
// *data, for the caller to fill; they share one allocation, freed with the last of them. When
// it is large (2 MiB and more, and not an eighth larger rounded to 2 MiB), it is a mapping of
// transparent huge pages: the first touch of fresh memory costs a fault per 4 KiB page, and on
// a VM with shadow page tables that cost more than reading the disk (docs/prompt-cache.md);
// with 2 MiB pages it is 512 times fewer. Otherwise, or when the mapping fails, the heap.
std::vector<std::shared_ptr<PageBlock>> new_page_blocks(int64_t count, int64_t page_bytes, uint8_t** data);

class HostTier {
 public:
  explicit HostTier(int64_t budget_bytes) : budget_(budget_bytes) {}

  int64_t budget() const { return budget_; }
  // Keeps the block as the most recently used (replacing one under the same key); returns the
  // blocks dropped to stay within the budget (a block larger than the budget is not kept and
  // comes back itself).
  std::vector<PageBlockPtr> put(PageBlockPtr block);
  // The block under key holding these tokens, taken out of the tier; null when absent.
  PageBlockPtr take(const Hash128& key, std::span<const int32_t> tokens);
  bool contains(const Hash128& key) const;
  void clear();

  int64_t bytes() const;
  int64_t blocks() const;

 private:
  using Lru = std::list<PageBlockPtr>;  // most recently used first
  mutable std::mutex mu_;
  const int64_t budget_;
  int64_t bytes_ = 0;
  Lru lru_;
  std::unordered_map<Hash128, Lru::iterator, Hash128Hasher> index_;
};

}  // namespace mla
